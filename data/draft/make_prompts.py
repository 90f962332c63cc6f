"""Write the project's own draft-training prompts: seeded templates, no outside text.

    python data/draft/make_prompts.py            # rewrites prompts.jsonl and heldout.jsonl here

Every prompt is built from the word lists and templates below, written for
this project; the same seed gives the same files. One prompt in six goes to
heldout.jsonl (for measuring acceptance), the rest to prompts.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

TOPICS = ["sleep", "running", "learning a language", "saving money", "houseplants", "bread baking", "public speaking",
          "time management", "cycling to work", "writing a diary", "chess", "birdwatching", "cooking rice",
          "remote work", "moving house", "job interviews", "reading more books", "learning to swim", "camping",
          "drinking more water", "stretching", "taking notes", "composting", "photography", "meditation"]
CHAT = ["Give me three tips for {t}.", "What are common mistakes people make with {t}?",
        "Explain {t} to a ten-year-old in a few sentences.", "Write a short, friendly paragraph encouraging a "
        "friend who wants to start {t}.", "List five questions a beginner might ask about {t}, with short answers.",
        "What is a simple weekly plan for getting better at {t}?", "Write a haiku about {t}."]
FACTS = ["What is the capital of {c}?", "Name two famous dishes from {c}.", "What languages are spoken in {c}?",
         "Describe the climate of {c} in two sentences."]
COUNTRIES = ["France", "Japan", "Kenya", "Brazil", "Canada", "Norway", "India", "Mexico", "Egypt", "Australia",
             "Chile", "Italy", "Vietnam", "Portugal"]
PEOPLE = ["Maria", "Tom", "Aisha", "Lukas", "Priya", "Kenji", "Sofia", "Omar", "Elena", "David"]
PLACES = ["the town library", "a small bakery", "the city council", "a football club", "the village school",
          "a bicycle shop", "the regional hospital", "a community garden", "the river museum", "a start-up"]
EVENTS = ["opened a new wing", "changed its opening hours", "raised money for repairs", "hired {n} new staff",
          "held a public meeting", "started a weekend programme", "won a regional award", "moved to a larger building"]
DETAILS = ["Visitors said the change was overdue.", "The work took {n} months.", "Some residents worried about "
           "the cost.", "A second phase is planned for next year.", "{p} led the project from the start.",
           "Attendance rose by {n} percent in the first month.", "The budget was approved after a long debate.",
           "Volunteers helped on weekends.", "Local newspapers covered the opening.",
           "Parking remains a problem, according to neighbours."]
SUMMARY = ["Summarise in one sentence:\n\n{x}", "Summarise the following text in three bullet points:\n\n{x}",
           "Write a short headline for this news item:\n\n{x}", "What is the main point of this text?\n\n{x}"]
FUNCS = ["reverses a string", "counts the vowels in a string", "checks whether a number is prime",
         "returns the largest of a list of numbers", "removes duplicates from a list while keeping order",
         "converts Celsius to Fahrenheit", "computes the factorial of n", "checks whether a string is a palindrome",
         "merges two sorted lists", "counts the words in a sentence", "returns the n-th Fibonacci number",
         "flattens a list of lists"]
LANGS = ["Python", "JavaScript", "Go", "Rust", "Java"]
CODE = ["Write a {l} function that {f}.", "Write a {l} function that {f}, with a short docstring or comment.",
        "Write a {l} function that {f}, and one example of calling it."]
FIX = ["Explain what this Python function does:\n```python\ndef f({a}):\n    return {body}\n```",
       "Add type hints and a docstring to this Python function and output the full code:\n"
       "```python\ndef f({a}):\n    return {body}\n```"]
BODIES = [("xs", "[x * 2 for x in xs if x > 0]"), ("s", "s.strip().lower()"), ("d", "sorted(d, key=d.get)"),
          ("n", "sum(range(n + 1))"), ("words", "' '.join(w.capitalize() for w in words)"),
          ("a, b", "a if a > b else b")]
FOLLOW_UPS = ["Can you make it shorter?", "Thanks! Can you give one more example?", "Why does that work?"]


def chat(rng: random.Random) -> list[dict[str, str]]:
    if rng.random() < 0.25:
        return [{"role": "user", "content": rng.choice(FACTS).format(c=rng.choice(COUNTRIES))}]
    return [{"role": "user", "content": rng.choice(CHAT).format(t=rng.choice(TOPICS))}]


def summary(rng: random.Random) -> list[dict[str, str]]:
    person, place = rng.choice(PEOPLE), rng.choice(PLACES)
    event = rng.choice(EVENTS).format(n=rng.randint(2, 12))
    details = " ".join(d.format(n=rng.randint(3, 40), p=person) for d in rng.sample(DETAILS, 3))
    text = f"Last week {place} {event}. {details}"
    return [{"role": "user", "content": rng.choice(SUMMARY).format(x=text)}]


def code(rng: random.Random) -> list[dict[str, str]]:
    if rng.random() < 0.35:
        args, body = rng.choice(BODIES)
        return [{"role": "user", "content": rng.choice(FIX).format(a=args, body=body)}]
    return [{"role": "user", "content": rng.choice(CODE).format(l=rng.choice(LANGS), f=rng.choice(FUNCS))}]


def multi_turn(rng: random.Random) -> list[dict[str, str]]:
    """A second user turn after a short first answer written here (the target answers the second)."""
    topic = rng.choice(TOPICS)
    return [{"role": "user", "content": f"Give me one tip for {topic}."},
            {"role": "assistant", "content": f"Start small: spend ten minutes a day on {topic} and keep at it."},
            {"role": "user", "content": rng.choice(FOLLOW_UPS)}]


KINDS = (("chat", chat, 90), ("summarization", summary, 70), ("code", code, 70), ("chat", multi_turn, 20))


def generate(seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    seen: set[str] = set()
    for domain, make, count in KINDS:
        made = 0
        while made < count:
            messages = make(rng)
            key = json.dumps(messages)
            if key in seen:
                continue
            seen.add(key)
            out.append({"class": f"{domain}/greedy", "messages": messages})
            made += 1
    rng.shuffle(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    prompts = generate(args.seed)
    files = {"prompts.jsonl": [p for i, p in enumerate(prompts) if i % 6], "heldout.jsonl": prompts[::6]}
    for name, rows in files.items():
        with (args.out / name).open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        print(f"{len(rows)} prompts -> {args.out / name}")


if __name__ == "__main__":
    main()
