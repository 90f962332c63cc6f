"""The tree-verify kernels on a GPU: equal to the torch reference bit for bit, and how long each takes.

Two parts, on the same device tensors:

1. Agreement. Random batches of draft trees (every shape the unit tests
   use: random, chain, star, depth one, root only) go through the Triton
   kernels and the torch reference, and every output tensor must be equal.
   Sampling runs at a large and at a five-token vocabulary (duplicate
   sibling drafts); `--seeds` batches of each.
2. Time. Each kernel and the reference at serving sizes (requests per
   step, nodes per tree, vocabulary), median of `--repeats` calls, each
   call synchronised, so the launch and the host's share count.

On a CUDA device the kernels are compiled by Triton. Without one, run Triton's
interpreter on small sizes (it is far slower than the reference, so the times
then say nothing of a GPU):

    python bench/kernels.py                      # CUDA: full sizes
    TRITON_INTERPRET=1 python bench/kernels.py --device cpu --quick
    python bench/kernels.py --json kernels.json  # also write every figure
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.kernels import build_tree, compact_kv, verify_greedy, verify_sampling  # noqa: E402 - importable once the root is on sys.path
from tests.unit.kernels.trees import random_batch, sampling_case  # noqa: E402 - as above

# (requests, nodes per tree, vocabulary) at serving sizes, and the interpreter's small ones.
FULL = {"batch": (1, 16, 64, 256), "nodes": (8, 64), "vocab": (32_000, 128_256)}
QUICK = {"batch": (2,), "nodes": (8,), "vocab": (64,)}
BACKENDS = ("torch", "triton")


def same(reference: Any, candidate: Any) -> bool:
    return all(torch.equal(getattr(reference, f), getattr(candidate, f)) for f in reference.__dataclass_fields__)


def tree_batch(seed: int, batch: int, nodes: int, device: str) -> tuple[torch.Tensor, torch.Tensor, Any]:
    parents, num_nodes = random_batch(random.Random(seed), batch=batch, width=nodes)
    parents, num_nodes = parents.to(device), num_nodes.to(device)
    seq_lens = torch.randint(0, 4000, (batch,), device=device)
    return parents, num_nodes, build_tree(parents, seq_lens, num_nodes, backend="torch")


def greedy_inputs(seed: int, batch: int, nodes: int, vocab: int, device: str) -> tuple:
    """Draft tokens the target agrees with at about 70% of nodes, so long paths are accepted."""
    parents, num_nodes, layout = tree_batch(seed, batch, nodes, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    draft = torch.randint(0, vocab, (batch, nodes), device=device, generator=generator)
    argmax = torch.randint(0, vocab, (batch, nodes), device=device, generator=generator)
    agree = (torch.rand(batch, nodes, device=device, generator=generator) < 0.7) & (parents >= 0)
    rows = torch.arange(batch, device=device)[:, None].expand(-1, nodes)
    argmax[rows[agree], parents[agree]] = draft[agree]
    return draft, argmax, layout, num_nodes


def compact_inputs(seed: int, batch: int, nodes: int, device: str) -> tuple:
    """One layer's K and V, bf16, 8 heads of 128 over 4096+nodes slots, and a greedy verify's path."""
    draft, argmax, layout, num_nodes = greedy_inputs(seed, batch, nodes, 32_000, device)
    result = verify_greedy(draft, argmax, layout, num_nodes, backend="torch")
    cache = torch.randn(2, batch, 8, 4096 + nodes, 128, device=device, dtype=torch.bfloat16)
    seq_lens = torch.randint(0, 4096, (batch,), device=device)
    return cache, seq_lens, result.accepted_nodes, result.accept_len


def agreement(device: str, seeds: int, sizes: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """[agreeing, batches] per kernel over `seeds` random batches of each size."""
    counts: dict[str, list[int]] = {}

    def tally(name: str, ok: bool) -> None:
        counts.setdefault(name, [0, 0])
        counts[name][0] += ok
        counts[name][1] += 1

    for seed in range(seeds):
        nodes = sizes["nodes"][seed % len(sizes["nodes"])]
        batch = 12
        parents, num_nodes, reference = tree_batch(seed, batch, nodes, device)
        seq_lens = reference.position_ids[:, 0]
        tally("build_tree", same(reference, build_tree(parents, seq_lens, num_nodes, backend="triton")))
        if device.startswith("cuda"):  # the default backend picks Triton for CUDA tensors
            tally("build_tree (default backend)", same(reference, build_tree(parents, seq_lens, num_nodes)))
        greedy = greedy_inputs(seed, batch, nodes, sizes["vocab"][-1], device)
        tally("verify_greedy", same(*(verify_greedy(*greedy, backend=b) for b in BACKENDS)))
        for vocab in (sizes["vocab"][-1], 5):
            sampling = sampling_case(batch, nodes, vocab, seed, device=device)
            tally(f"verify_sampling V={vocab}", same(*(verify_sampling(*sampling, backend=b) for b in BACKENDS)))
        cache, seq_lens, accepted, accept_len = compact_inputs(seed, 4, nodes, device)
        moved = [cache.clone() for _ in BACKENDS]
        for copy, backend in zip(moved, BACKENDS, strict=True):
            compact_kv(copy, seq_lens, accepted, accept_len, backend=backend)
        tally("compact_kv", torch.equal(*moved))
    return counts


def median_us(call: Callable[[], Any], device: str, repeats: int) -> float:
    """Median wall time of one synchronised call, after three untimed ones (Triton compiles on the first)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        call()
    sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def timings(device: str, repeats: int, sizes: dict[str, tuple[int, ...]]) -> list[dict[str, Any]]:
    rows = []

    def row(kernel: str, shape: str, fn: Callable[..., Any], *args: Any) -> None:
        figures = {b: median_us(partial(fn, *args, backend=b), device, repeats) for b in BACKENDS}
        rows.append({"kernel": kernel, "shape": shape, **figures, "speedup": figures["torch"] / figures["triton"]})
        print(
            f"  {kernel:16} {shape:24} torch {figures['torch']:10.1f} µs  triton {figures['triton']:8.1f} µs",
            flush=True,
        )

    for batch in sizes["batch"]:
        for nodes in sizes["nodes"]:
            shape = f"B={batch} N={nodes}"
            parents, num_nodes, _ = tree_batch(batch, batch, nodes, device)
            seq_lens = torch.zeros(batch, dtype=torch.long, device=device)
            row("build_tree", shape, build_tree, parents, seq_lens, num_nodes)
            row("verify_greedy", shape, verify_greedy, *greedy_inputs(batch, batch, nodes, 32_000, device))
            row("compact_kv", shape, compact_kv, *compact_inputs(batch, batch, nodes, device))
            for vocab in sizes["vocab"]:
                if batch * nodes * vocab <= 2**31:  # up to 8 GiB of float32 rows
                    sampling = sampling_case(batch, nodes, vocab, batch, device=device)
                    row("verify_sampling", f"{shape} V={vocab}", verify_sampling, *sampling)
    return rows


def report(device_name: str, counts: dict[str, list[int]], rows: list[dict[str, Any]]) -> str:
    lines = [f"device: {device_name}", "", "| kernel | batches equal to the reference |", "|---|---|"]
    lines += [f"| {name} | {ok} of {total} |" for name, (ok, total) in counts.items()]
    lines += ["", "| kernel | shape | torch reference (µs) | Triton (µs) | speed-up |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['kernel']} | {r['shape']} | {r['torch']:.1f} | {r['triton']:.1f} | {r['speedup']:.1f}x |" for r in rows
    ]
    return "\n".join(lines)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seeds", type=positive, default=40, help="random batches per agreement check (default 40)")
    parser.add_argument("--repeats", type=positive, default=50, help="timed calls per figure (default 50)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for Triton's CPU interpreter")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if not args.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("without a CUDA device the kernels need Triton's interpreter: set TRITON_INTERPRET=1")
    sizes = QUICK if args.quick else FULL
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu (Triton interpreter)"
    print(f"agreement on {name}: {args.seeds} random batches per check", flush=True)
    counts = agreement(args.device, args.seeds, sizes)
    print("time per call, median of", args.repeats, flush=True)
    rows = timings(args.device, args.repeats, sizes)
    print(report(name, counts, rows))
    if args.json:
        args.json.write_text(json.dumps({"device": name, "agreement": counts, "timings": rows}, indent=1))
    return 0 if all(ok == total for ok, total in counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
