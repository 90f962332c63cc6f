"""The EAGLE-3 draft head, laid out as vLLM's `Eagle3LlamaForCausalLM` loads it.

The head drafts from the target's own hidden states. Three of the target's
layers (low, middle, high) are concatenated and projected by `fc` from 3*H to H
("fused features"). One Llama decoder layer then reads, at every position, the
embedding of the next token concatenated with that hidden state (2*H wide),
and a norm and an lm head give logits over a reduced draft vocabulary; `d2t`
maps a draft id to its target id (`target = draft + d2t[draft]`) and `t2d`
marks which target ids the draft vocabulary holds. The token embedding is the
target's own (frozen, not stored in a checkpoint).

Alignment, as in vLLM: the entry at position t holds the target's features at
t (which saw tokens 0..t) and the embedding of token t+1; its logits predict
token t+2. A later draft step feeds the head its own pre-norm output
(`forward`'s first result) in place of the fused features, one position on.

Parameter names follow the `speculators` EAGLE-3 checkpoints: `fc`,
`layers.0.{self_attn,mlp,input_layernorm,hidden_norm,post_attention_layernorm}`,
`norm`, `lm_head`, `d2t`, `t2d`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """vLLM's default target layers for EAGLE-3: low, middle and high."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    layer_ids: tuple[int, int, int]  # target layers whose input hidden states are fused
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    norm_before_residual: bool = True

    @classmethod
    def from_target(cls, target: Any, draft_vocab_size: int | None = None,
                    layer_ids: tuple[int, int, int] | None = None) -> HeadConfig:
        """A head shaped like one layer of `target` (a transformers Llama config)."""
        rope = getattr(target, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(target, "rope_theta", None) or 10000.0
        heads = int(target.num_attention_heads)
        low, mid, high = layer_ids or default_layer_ids(int(target.num_hidden_layers))
        return cls(
            hidden_size=int(target.hidden_size), vocab_size=int(target.vocab_size),
            draft_vocab_size=int(draft_vocab_size or target.vocab_size),
            layer_ids=(int(low), int(mid), int(high)),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(target, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(target, "head_dim", None) or target.hidden_size // heads),
            intermediate_size=int(target.intermediate_size), rms_norm_eps=float(target.rms_norm_eps),
            rope_theta=float(theta), max_position_embeddings=int(target.max_position_embeddings),
        )  # fmt: skip

    def __post_init__(self) -> None:
        if len(self.layer_ids) != 3:
            raise ValueError(f"EAGLE-3 fuses three target layers, got {self.layer_ids}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft vocab {self.draft_vocab_size} must be in 1..{self.vocab_size}")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32).to(x.dtype)


def rotate(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotary embedding (the neox half-split layout Llama uses); x `[B, h, T, d]`,
    positions `[B, T]`."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim))
    angles = positions.float()[..., None] * inv_freq  # [B, T, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None].to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None].to(x.dtype)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class KeyValueContext(Protocol):
    """What the new queries attend to, given the new keys and values (`[B, kv, T, d]`)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


def _expand(kv: Tensor, heads: int) -> Tensor:
    return kv.repeat_interleave(heads // kv.shape[1], dim=1) if kv.shape[1] != heads else kv


@dataclass
class HeadCache:
    """The head's keys and values of one batch of sequences, `[B, kv, S, d]`."""

    keys: Tensor | None = None
    values: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def crop(self, length: int) -> None:
        """Drop every entry from slot `length` on."""
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]


def causal_visibility(cached: int, n: int, device: torch.device | None = None) -> Tensor:
    """`n` new entries after `cached` ones: each sees the cache, itself and earlier new ones."""
    return torch.cat([torch.ones(n, cached, dtype=torch.bool, device=device),
                      torch.ones(n, n, dtype=torch.bool, device=device).tril()], 1)


@dataclass
class CachedAttention:
    """Append the new entries to `cache`; `visible` (bool `[T, S]` or `[B, T, S]`,
    S counting the new entries) says what each new entry sees; causal if None."""

    cache: HeadCache
    visible: Tensor | None = None

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        cached = len(self.cache)
        if self.cache.keys is not None and self.cache.values is not None:
            k, v = torch.cat([self.cache.keys, k], 2), torch.cat([self.cache.values, v], 2)
        self.cache.keys, self.cache.values = k, v
        visible = self.visible if self.visible is not None else causal_visibility(cached, q.shape[2], q.device)
        mask = visible[:, None] if visible.dim() == 3 else visible
        heads = q.shape[1]
        return F.scaled_dot_product_attention(q, _expand(k, heads), _expand(v, heads), attn_mask=mask)


@dataclass
class TrainingTimeTest:
    """Attention across the draft steps of training-time test.

    Step 0 is a causal pass over the sequence. At step j the entry at index t
    stands for position t+j of a draft that started after token t+1: it sees
    step 0's entries 0..t (the context) and its own chain, the entries at
    index t of steps 1..j. One instance serves all the steps of one batch.
    """

    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.keys.append(k)
        self.values.append(v)
        heads, length = q.shape[1], q.shape[2]
        scale = q.shape[-1] ** -0.5
        k0, v0 = _expand(self.keys[0], heads), _expand(self.values[0], heads)
        context = (q @ k0.transpose(-1, -2)) * scale
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        context = context.masked_fill(~causal, float("-inf"))
        chain = [(q * _expand(key, heads)).sum(-1, keepdim=True) * scale for key in self.keys[1:]]
        weights = torch.softmax(torch.cat([context, *chain], -1).float(), -1).to(q.dtype)
        out = weights[..., :length] @ v0
        for step, value in enumerate(self.values[1:]):
            out = out + weights[..., length + step : length + step + 1] * _expand(value, heads)
        return out


class Attention(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        wide, heads, kv = 2 * config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.heads, self.kv_heads, self.head_dim = heads, kv, config.head_dim
        self.theta = config.rope_theta
        self.q_proj = nn.Linear(wide, heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(wide, kv * config.head_dim, bias=False)
        self.v_proj = nn.Linear(wide, kv * config.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * config.head_dim, config.hidden_size, bias=False)

    def forward(self, x: Tensor, positions: Tensor, context: KeyValueContext) -> Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, positions, self.theta), rotate(k, positions, self.theta)
        out = context.attend(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """vLLM's first EAGLE-3 layer: attention over [norm(embedding), norm(hidden)]."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.norm_before_residual = config.norm_before_residual
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(size, eps)
        self.hidden_norm = RMSNorm(size, eps)
        self.post_attention_layernorm = RMSNorm(size, eps)

    def forward(self, embeds: Tensor, hidden: Tensor, positions: Tensor,
                context: KeyValueContext) -> tuple[Tensor, Tensor]:
        """-> (MLP output, residual): their sum is the layer's output."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        residual = self.self_attn(x, positions, context) + residual
        return self.mlp(self.post_attention_layernorm(residual)), residual


class Eagle3Head(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        size = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * size, size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(config)])
        self.norm = RMSNorm(size, config.rms_norm_eps)
        self.lm_head = nn.Linear(size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.set_draft_vocab(torch.arange(config.draft_vocab_size))

    def set_draft_vocab(self, target_ids: Tensor) -> None:
        """The draft vocabulary: `target_ids[i]` is draft id i's target id."""
        ids = torch.as_tensor(target_ids, dtype=torch.long)
        if ids.shape != (self.config.draft_vocab_size,) or len(set(ids.tolist())) != len(ids):
            raise ValueError(f"the draft vocabulary needs {self.config.draft_vocab_size} distinct ids")
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    def load_embedding(self, weight: Tensor) -> None:
        """Share the target's token embedding (`[vocab, H]`)."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight)

    def fuse(self, features: Tensor) -> Tensor:
        """The three target layers' hidden states, concatenated (`[..., 3H]`) -> `[..., H]`."""
        return self.fc(features)

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        d2t: Tensor = self.d2t
        return draft_ids + d2t[draft_ids]

    def target_to_draft(self, target_ids: Tensor) -> Tensor:
        """Draft ids of target ids; -1 where the draft vocabulary lacks the token."""
        t2d: Tensor = self.t2d
        index = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=t2d.device)
        index[t2d] = torch.arange(self.config.draft_vocab_size, device=t2d.device)
        return index[target_ids]

    def forward(self, hidden: Tensor, input_ids: Tensor, positions: Tensor,
                cache: HeadCache | None = None, visible: Tensor | None = None,
                context: KeyValueContext | None = None) -> tuple[Tensor, Tensor]:
        """One draft step over `[B, T]` entries.

        `hidden` `[B, T, H]`: fused target features or the head's own previous
        output; `input_ids` `[B, T]`: the next tokens; `positions` `[B, T]` or
        `[T]`. With `cache`, the entries are appended to it and `visible`
        (bool `[T, len(cache) + T]`) says what each sees (causal by default);
        `context` replaces both (training-time test). Returns the pre-norm
        hidden state `[B, T, H]` (the next step's `hidden`) and float32 logits
        over the draft vocabulary `[B, T, draft_vocab]`.
        """
        if positions.dim() == 1:
            positions = positions.expand(input_ids.shape[0], -1)
        if context is None:
            context = CachedAttention(cache if cache is not None else HeadCache(), visible)
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        layer: DecoderLayer = self.layers[0]
        mlp_out, residual = layer(embeds, hidden, positions, context)
        out = mlp_out + residual
        return out, self.lm_head(self.norm(out)).float()
