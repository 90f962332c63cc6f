"""Seeded multi-turn chat traces with shared system prompts and a skewed load.

A conversation opens with one of a few shared system prompts, drawn by a Zipf
law so a few prompts are much hotter than the rest, and a first user turn
that pastes a document of its own (notes to discuss): what a conversation's
later turns find cached only where its first turn ran. Its later turns are
short questions, sent after a think time once the previous answer has
arrived. Conversations start as a Poisson process (open loop), or all at once
with a bound on how many run together (closed loop, for slow backends).

All text is made of plain English words, so every tokenizer cuts it alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = (
    "river", "market", "engine", "garden", "signal", "harbour", "ledger", "window", "cotton", "meadow",
    "planet", "copper", "violin", "canyon", "bridge", "lantern", "orchard", "compass", "timber", "glacier",
    "account", "invoice", "delivery", "warranty", "schedule", "customer", "shipment", "contract", "payment",
    "network", "battery", "monitor", "printer", "sensor", "archive", "balance", "package", "station",
    "weather", "journey", "kitchen", "library", "village", "harvest", "morning", "evening", "quarter",
    "careful", "quickly", "clearly", "always", "never", "usually", "politely", "briefly", "exactly",
    "check", "explain", "compare", "describe", "confirm", "suggest", "answer", "refuse", "repeat", "list",
)  # fmt: skip
QUESTIONS = (
    "What is the main point of the notes?", "Which item should come first, and why?",
    "Summarise that in two sentences.", "What would you change in the plan?",
    "Is anything missing from the list?", "Give one risk and one way to reduce it.",
    "Rewrite the second point more plainly.", "Which dates matter most here?",
)  # fmt: skip


@dataclass(frozen=True)
class Conversation:
    """One conversation: its system prompt, its user turns, when it starts and how long
    its user thinks after each answer."""

    id: int
    system_id: int
    system: str
    turns: tuple[str, ...]
    start_s: float
    think_s: tuple[float, ...]


@dataclass(frozen=True)
class TraceShape:
    """How a trace is drawn; sizes in words (about 1.3 tokens each)."""

    conversations: int
    systems: int
    zipf_s: float
    system_words: tuple[int, int]
    document_words: tuple[int, int]
    turns: tuple[int, int]  # fewest, most
    mean_turns: float  # turns follow a geometric law above the fewest, capped at the most
    think_mean_s: float
    arrival_rate: float | None  # conversations a second; None starts them all at 0


def sentences(rng: random.Random, words: int) -> str:
    out: list[str] = []
    while len(out) < words:
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        out.extend([sentence[0].capitalize(), *sentence[1:-1], sentence[-1] + "."])
    return " ".join(out[:words])


def system_prompt(rng: random.Random, index: int, words: int) -> str:
    rules = sentences(rng, words)
    return f"You are assistant number {index} of the help desk. Follow these house rules. {rules}"


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def make(shape: TraceShape, seed: int) -> list[Conversation]:
    """The trace `shape` and `seed` draw, conversations in start order."""
    rng = random.Random(seed)
    systems = [system_prompt(rng, i, rng.randint(*shape.system_words)) for i in range(shape.systems)]
    weights = zipf_weights(shape.systems, shape.zipf_s)
    low, high = shape.turns
    extra_p = 1.0 / (1.0 + max(0.0, shape.mean_turns - low))  # geometric turns above `low`
    conversations, clock = [], 0.0
    for cid in range(shape.conversations):
        system_id = rng.choices(range(shape.systems), weights)[0]
        count = low
        while count < high and rng.random() > extra_p:
            count += 1
        document = sentences(rng, rng.randint(*shape.document_words))
        first = f"Here are my notes (set {cid}):\n{document}\n\nWhat do you make of them?"
        turns = (first, *(rng.choice(QUESTIONS) for _ in range(count - 1)))
        if shape.arrival_rate:
            clock += rng.expovariate(shape.arrival_rate)
        think = tuple(rng.expovariate(1.0 / shape.think_mean_s) for _ in turns)
        conversations.append(Conversation(cid, system_id, systems[system_id], turns, clock, think))
    return conversations


# GPU scale: 64 system prompts of 1-2.1k tokens as the simulator counts them (four
# characters a token), Zipf 1.1 (the hottest is about a fifth of all conversations),
# documents of 0.4-1.2k tokens, 2-10 turns.
SIM_SHAPE = TraceShape(
    conversations=240, systems=64, zipf_s=1.1, system_words=(500, 1100), document_words=(200, 600),
    turns=(2, 10), mean_turns=3.5, think_mean_s=3.0, arrival_rate=2.5,
)  # fmt: skip
# Two CPU replicas of SmolLM2 with --max-model-len 2048: six system prompts of ~300-400
# tokens, documents of ~300-400 tokens, 3-4 turns, a few conversations at a time.
VLLM_SHAPE = TraceShape(
    conversations=32, systems=6, zipf_s=1.1, system_words=(250, 320), document_words=(230, 300),
    turns=(3, 4), mean_turns=3.5, think_mean_s=0.5, arrival_rate=None,
)  # fmt: skip
