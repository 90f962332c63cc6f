"""Is a draft model's tokenizer interchangeable with the target's (`specgate check-draft`)?

Speculative decoding compares token ids: a draft whose tokenizer differs in
vocabulary, special tokens or how it splits text proposes tokens the target
reads as something else, and acceptance collapses. `default` names the
prepared SmolLM2-135M-Instruct (`specgate model prepare`).
"""

from __future__ import annotations

from typing import Any

SAMPLES = (
    "Hello, how are you?",
    "서울의 날씨는 어떤가요? 오늘은 맑고 따뜻합니다.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n-1) + fibonacci(n-2)",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY name;",
    "  indented\ttabs\nnew lines and émojis 🚀 — dashes",
)
SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def differences(target: Any, draft: Any) -> list[str]:
    """What differs between two tokenizers; empty when they are compatible."""
    found = []
    if len(target) != len(draft):
        found.append(f"vocabulary size: target {len(target)}, draft {len(draft)}")
    for name in SPECIAL:
        ours, theirs = getattr(target, name, None), getattr(draft, name, None)
        if ours != theirs:
            found.append(f"{name}: target {ours}, draft {theirs}")
    for text in SAMPLES:
        ours, theirs = target.encode(text), draft.encode(text)
        if ours != theirs:
            found.append(f"encoding of {text!r}: target {ours[:12]}..., draft {theirs[:12]}...")
    return found


def load_tokenizer(name: str) -> Any:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from backends.model import prepare

    return AutoTokenizer.from_pretrained(prepare() if name == "default" else name)
