"""Model forward passes over a KV cache with an explicit visibility mask.

transformers hands a 4-D attention mask to the attention kernel as it is, so
one forward pass can score a whole draft tree: every new token sees the
cached prefix it is allowed to see, plus itself and its tree ancestors.
Cache layers are `[B, H, S, D]` tensors (`DynamicCache.layers[i].keys/values`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from backends.kernels import compact_kv


def new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def cache_length(cache: Any) -> int:
    return cache.get_seq_length()


def run_model(
    model: Any, cache: Any, tokens: list[int], positions: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Append `tokens` to `cache` and return their logits `[n, V]` (float32).

    `visible` is bool `[n, cache_len + n]`: which cached and new tokens each
    new token attends to. `positions` is long `[n]`.
    """
    ids = torch.tensor([tokens], dtype=torch.long)
    with torch.inference_mode():
        out = model(
            input_ids=ids,
            attention_mask=visible[None, None],
            position_ids=positions[None],
            past_key_values=cache,
            use_cache=True,
        )
    return out.logits[0].float()


@contextmanager
def layer_inputs(model: Any, layers: tuple[int, ...]) -> Iterator[dict[int, torch.Tensor]]:
    """While open, each forward pass of `model` records the hidden states
    entering decoder layer `k` for every `k` in `layers` (`[1, n, H]`): the
    state after k layers, vLLM's auxiliary hidden state k for EAGLE-3. Nothing
    is hooked outside the block, so plain forwards pay nothing."""
    seen: dict[int, torch.Tensor] = {}
    decoder_layers = model.model.layers

    def recorder(layer: int) -> Any:
        def record(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen[layer] = args[0] if args else kwargs["hidden_states"]

        return record

    handles = [decoder_layers[k].register_forward_pre_hook(recorder(k), with_kwargs=True) for k in layers]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def fused_inputs(seen: dict[int, torch.Tensor], layers: tuple[int, ...]) -> torch.Tensor:
    """The recorded layer inputs side by side, `[n, len(layers) * H]` (float32)."""
    return torch.cat([seen[k][0] for k in layers], dim=-1).float()


def causal_visibility(cached: int, n: int) -> torch.Tensor:
    """The usual causal mask for `n` new tokens after `cached` ones."""
    return torch.cat(
        [torch.ones(n, cached, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], dim=1
    )


def extend_chain(model: Any, cache: Any, tokens: list[int]) -> torch.Tensor:
    """Append a plain run of tokens (a prompt, or tokens a draft model has not
    seen yet); returns their logits."""
    cached = cache_length(cache)
    positions = torch.arange(cached, cached + len(tokens))
    return run_model(model, cache, tokens, positions, causal_visibility(cached, len(tokens)))


def crop(cache: Any, length: int) -> None:
    """Drop every cached entry from slot `length` on."""
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)


def keep_accepted(cache: Any, seq_len: int, accepted_nodes: torch.Tensor, accept_len: torch.Tensor) -> None:
    """After verifying a tree written at slots `seq_len + i`: move the accepted
    path next to the root (`compact_kv`) and drop the rest of the tree."""
    seq_lens = torch.tensor([seq_len], dtype=torch.long)
    if int(accept_len[0]) > 0:
        with torch.inference_mode():  # the cache's tensors were made in inference mode
            for layer in cache.layers:
                compact_kv(layer.keys, seq_lens, accepted_nodes, accept_len)
                compact_kv(layer.values, seq_lens, accepted_nodes, accept_len)
    crop(cache, seq_len + int(accept_len[0]) + 1)
