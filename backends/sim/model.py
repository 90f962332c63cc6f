"""A timing model of speculative and standard decoding at GPU scale.

Pure functions: nothing here sleeps or keeps state. The simulated server
(`backends.sim.engine`) drives its batch clock with them.

Acceptance. A draft token is accepted with probability `a` (Leviathan et al.
2023 call it alpha). A verification step that drafted `g` tokens emits on
average `(1 - a**(g+1)) / (1 - a)` tokens (Leviathan et al. 2023, eq. 1):
the accepted prefix plus the target model's own next token. `a` depends on
the domain (drafts predict code and math better than open chat: Spec-Bench,
Xia et al. 2024) and falls with the sampling temperature.

Step cost. Decoding is memory-bound at small batch sizes: one step costs about
one read of the weights, whatever the batch. Every sequence in the batch adds
its KV-cache read and the compute for each token verified for it. A
speculative step verifies `g + 1` tokens per sequence and first runs the
draft head `g` times, so its per-sequence cost is several times that of a
standard step: speculation wins at batch 1 and loses once the batch is
compute-bound, as vLLM measured (up to 2.8x faster at low QPS, 1.4-1.8x
slower at high QPS; vLLM blog, "How Speculative Decoding Boosts vLLM
Performance by up to 2.8x", 2024).

Constants (an 8B-parameter Llama-3-class target in bf16 on one A100-80GB,
EAGLE-style one-layer draft head, 3 speculative tokens):

- `weights_read_s` = 10 ms: 16 GB of weights / 2.0 TB/s HBM = 8 ms, plus 2 ms
  of scheduling, sampling and launch overhead per step.
- `kv_read_per_seq_s` = 0.05 ms: GQA KV cache of 128 KiB per token x ~800
  tokens of context / 2.0 TB/s.
- `compute_per_token_s` = 0.25 ms: 2 x 8e9 FLOPs per token / (312 TFLOPS bf16
  x ~20% utilisation, typical of decode-time GEMMs).
- `draft_step_s` = 0.8 ms: draft head: one decoder layer + the 128k-vocabulary
  LM head, ~1.5 GB read per draft step.
- `draft_per_seq_s` = 0.022 ms: ~0.7e9 parameters x 2 FLOPs per drafted token
  at the same utilisation.
- `num_speculative_tokens` = 3: vLLM's usual `num_speculative_tokens` for EAGLE.
- `base_acceptance` = code 0.88, math 0.84, chat 0.78: assumed per-token
  acceptance of an EAGLE-3-class draft at temperature 0 (a 3-token chain then
  averages 2.9-3.3 tokens per step); order from Spec-Bench (code and math above
  chat).
- `temperature_slope` = 0.18 per unit: Leviathan et al. 2023, Table 3: alpha
  0.75 -> 0.62 (EnDe) and 0.65 -> 0.53 (CNNDM) from T=0 to T=1, i.e. x0.82.
- `max_num_seqs` = 256: vLLM's default cap on sequences per batch; the rest wait.
- `output_tokens` = 256: natural answer length when `max_tokens` allows it.
- `default_temperature` = 1.0: vLLM's default when a request omits `temperature`.
- `draft_quality` = 1.0: multiplies every acceptance; below 1 models a weaker
  draft (a what-if knob, not a measurement).
- `prefix_cache_tokens` = 400,000: the KV cache left for cached prefixes:
  80 GB x 0.9 (vLLM's gpu_memory_utilization) - 16 GB of weights - ~4 GB of
  activations = ~52 GB / 128 KiB per token.
- `speculative_max_batch` = 32: the "dynamic" kind speculates while at most
  this many sequences decode, and decodes plainly above (engine-level dynamic
  speculation: vLLM's `num_speculative_tokens_per_batch_size`, SGLang's
  `--speculative-adaptive`). 32 sits where the model's speedup crosses 1 for
  chat between T=1 (at ~24) and T=0 (at ~64).
- `speculation_schedule` = none: when set, the "dynamic" kind drafts `k`
  tokens at the batch sizes of each `[lo, hi, k]` range instead (vLLM's
  `num_speculative_tokens_per_batch_size` format, `backends.speculation`);
  unset, it is `[[1, speculative_max_batch, g], [speculative_max_batch + 1, ., 0]]`.

With these numbers the model gives 1.4-2.5x speedups at batch 1 (chat at
temperature 2 up to code at temperature 0) and 0.55-0.97x at batch 256
(chat at temperature 1: 0.67x, i.e. 1.5x slower); docs/sim.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from backends.speculation import SpeculationSchedule
from domains.classifier import DomainClassifier, DomainRule

Kind = Literal["speculative", "standard", "dynamic"]

DOMAIN_RULES = (
    DomainRule(
        "code",
        patterns=(
            r"```", r"\bdef\s+\w+\(", r"\bclass\s+\w+", r"#include", r"\bfunction\s*\w*\(", r"=>"
        ),
        keywords=("python", "javascript", "rust", "golang", "sql", "regex", "compile", "bug"),
    ),
    DomainRule(
        "math",
        patterns=(r"\\frac", r"\d+\s*[-+*/^=]\s*\d+", r"\bx\^\d"),
        keywords=("solve", "integral", "derivative", "equation", "prove", "theorem", "sum of"),
    ),
)


def domain_classifier() -> DomainClassifier:
    """Code, math, or chat (the default): what the draft finds easy."""
    return DomainClassifier(DOMAIN_RULES, default="chat")


@dataclass(frozen=True)
class SimParams:
    """Every constant of the model; see the module docstring for sources."""

    weights_read_s: float = 0.010
    kv_read_per_seq_s: float = 0.00005
    compute_per_token_s: float = 0.00025
    draft_step_s: float = 0.0008
    draft_per_seq_s: float = 0.000022
    num_speculative_tokens: int = 3
    base_acceptance: MappingProxyType = field(
        default_factory=lambda: MappingProxyType({"code": 0.88, "math": 0.84, "chat": 0.78})
    )
    temperature_slope: float = 0.18
    max_num_seqs: int = 256
    output_tokens: int = 256
    default_temperature: float = 1.0
    draft_quality: float = 1.0
    speculative_max_batch: int = 32
    prefix_cache_tokens: int = 400_000
    speculation_schedule: SpeculationSchedule | None = None


DEFAULT_PARAMS = SimParams()

# A 70B target with a separate 1B draft model (docs/sim.md, "A second calibration"):
# Llama-3-70B in bf16 over four A100-80GB (tensor parallel), Llama-3.2-1B drafting 4 tokens.
LARGE_TARGET_PARAMS = SimParams(
    weights_read_s=0.022,
    kv_read_per_seq_s=0.000032,
    compute_per_token_s=0.00056,
    draft_step_s=0.002,
    draft_per_seq_s=0.00004,
    num_speculative_tokens=4,
    base_acceptance=MappingProxyType({"code": 0.80, "math": 0.75, "chat": 0.68}),
    speculative_max_batch=16,
    prefix_cache_tokens=420_000,  # 4 x 72 GB - 140 GB of weights - ~12 GB of activations, / 320 KiB a token
)

CALIBRATIONS = MappingProxyType({"8b-a100": DEFAULT_PARAMS, "70b-4xa100-draft1b": LARGE_TARGET_PARAMS})


def acceptance(domain: str, temperature: float, params: SimParams = DEFAULT_PARAMS) -> float:
    """Per-token draft acceptance `a` for a domain and temperature (clipped to [0, 2])."""
    base = params.base_acceptance.get(domain, params.base_acceptance["chat"])
    t = min(max(temperature, 0.0), 2.0)
    a = base * params.draft_quality * (1.0 - params.temperature_slope * t)
    return max(0.0, min(0.99, a))


def expected_tokens_per_step(a: float, num_speculative_tokens: int) -> float:
    """Leviathan et al. 2023, eq. 1: `(1 - a^(g+1)) / (1 - a)`."""
    if a >= 1.0:
        return float(num_speculative_tokens + 1)
    return (1.0 - a ** (num_speculative_tokens + 1)) / (1.0 - a)


def expected_acceptance_rate(a: float, num_speculative_tokens: int) -> float:
    """What vLLM's counters measure: accepted draft tokens / draft tokens,
    i.e. `(a + a^2 + ... + a^g) / g`."""
    g = num_speculative_tokens
    return (expected_tokens_per_step(a, g) - 1.0) / g


def schedule(params: SimParams = DEFAULT_PARAMS) -> SpeculationSchedule:
    """The dynamic kind's schedule: the one given, else a switch at `speculative_max_batch`."""
    if params.speculation_schedule is not None:
        return params.speculation_schedule
    return SpeculationSchedule.switch(params.speculative_max_batch, params.num_speculative_tokens)


def draft_tokens(kind: Kind, batch_size: int, params: SimParams = DEFAULT_PARAMS) -> int:
    """Draft tokens per sequence of a step over `batch_size` decoding sequences:
    `num_speculative_tokens` on the speculative kind, none on the standard one,
    and on the dynamic one what its schedule says for that batch size."""
    if kind == "dynamic":
        return schedule(params).tokens_at(batch_size, params.num_speculative_tokens)
    return params.num_speculative_tokens if kind == "speculative" else 0


def speculates(kind: Kind, batch_size: int, params: SimParams = DEFAULT_PARAMS) -> bool:
    """Whether a step over `batch_size` decoding sequences drafts at all."""
    return draft_tokens(kind, batch_size, params) > 0


def step_seconds(
    kind: Kind, batch_size: int, prefill_tokens: int = 0, params: SimParams = DEFAULT_PARAMS
) -> float:
    """Wall time of one engine step over `batch_size` decoding sequences,
    plus the prompts of newly admitted requests (compute-bound prefill)."""
    per_seq = params.kv_read_per_seq_s
    seconds = params.weights_read_s + prefill_tokens * params.compute_per_token_s
    g = draft_tokens(kind, batch_size, params)
    if g == 0:
        return seconds + batch_size * (per_seq + params.compute_per_token_s)
    verify = batch_size * (per_seq + (g + 1) * params.compute_per_token_s)
    draft = g * (params.draft_step_s + batch_size * params.draft_per_seq_s)
    return seconds + verify + (draft if batch_size else 0.0)


def speedup(a: float, batch_size: int, params: SimParams = DEFAULT_PARAMS) -> float:
    """Decoding speed of speculative over standard at a batch size:
    tokens per step over step time, relative."""
    g = params.num_speculative_tokens
    spec_rate = expected_tokens_per_step(a, g) / step_seconds("speculative", batch_size, 0, params)
    return spec_rate / (1.0 / step_seconds("standard", batch_size, 0, params))

