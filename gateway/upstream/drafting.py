"""What an answer tells of its pool's drafts: tokens per verification step.

vLLM started with `--per-request-spec-decode-metrics summary` puts
`metrics.speculative_decoding` in every answer of a speculative server: on the
body of a whole answer, and on the usage chunk that ends a stream (the gateway
asks for that chunk anyway). Its `mean_acceptance_length` counts the target's
own token, so it is tokens per step; `num_spec_tokens` is the drafts per step.
A backend that does not say is read off its stream: a speculative engine sends
one event per step, so output tokens over content events is tokens per step.
The object passes to the client unchanged; only the gateway reads it here.
"""

from __future__ import annotations

import re

LENGTH = re.compile(rb'"mean_acceptance_length"\s*:\s*([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)')
STEPS = re.compile(rb'"num_spec_steps"\s*:\s*([0-9]+)')
DRAFTS = re.compile(rb'"num_spec_tokens"\s*:\s*([0-9]+)')
FRAMING_EVENTS = 2  # the role-only first event and [DONE] carry no token


class Drafting:
    """A plain class, its `__init__` written out: one is built per answer, and mypyc leaves a
    dataclass's generated `__init__` interpreted."""

    __slots__ = ("per_step", "drafts")

    def __init__(self, per_step: float, drafts: int | None = None) -> None:
        self.per_step = per_step  # output tokens per engine step, the target's own token included
        self.drafts = drafts  # tokens drafted per step, when the backend said

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Drafting) and (self.per_step, self.drafts) == (other.per_step, other.drafts)

    def __hash__(self) -> int:
        return hash((self.per_step, self.drafts))

    def __repr__(self) -> str:
        return f"Drafting(per_step={self.per_step!r}, drafts={self.drafts!r})"

    @classmethod
    def reported(cls, data: bytes) -> Drafting | None:
        """The backend's own per-request metrics in `data` (a body, or a stream's last chunk), if any.
        Looked for only after the last `"speculative_decoding"` key: generated text escapes its quotes,
        so the key cannot be matched inside it."""
        at = data.rfind(b'"speculative_decoding"')
        if at < 0:
            return None
        length, steps, drafts = LENGTH.search(data, at), STEPS.search(data, at), DRAFTS.search(data, at)
        if length is None or (steps is not None and int(steps.group(1)) == 0):
            return None  # no verification step: it tells nothing of acceptance
        return cls(float(length.group(1)), None if drafts is None else int(drafts.group(1)))

    @classmethod
    def of_events(cls, tokens: int, events: int, usage_event: bool) -> Drafting | None:
        """Read off a stream: tokens over the events that carried them."""
        content = events - FRAMING_EVENTS - int(usage_event)
        if tokens < 2 or content < 1:
            return None
        return cls(max(1.0, tokens / content))
