"""Prompts about the installed Python distributions, from their own metadata:
the one-line summary and the first paragraphs of the long description
(usually the README). Chat questions and summaries on prose that neither the
templates nor the standard library wrote."""

from __future__ import annotations

import random
import re
from importlib import metadata

SOURCE = "packages"
Row = dict[str, object]
MAX_CHARS = 1000

ON_SUMMARY = ["What is the Python package {n} for? Its summary says: \"{s}\"",
              "A colleague suggests the package {n} (\"{s}\"). When would I use it?",
              "Explain to a beginner what {n} does, given its description: \"{s}\""]
ON_TEXT = ["Summarise this project description in two sentences:\n\n{x}",
           "What problem does this project solve? Answer briefly.\n\n{x}",
           "Write three bullet points about this software:\n\n{x}"]


def described() -> list[tuple[str, str, str]]:
    """(name, summary, the description's first prose paragraphs), by name."""
    found = {}
    for dist in metadata.distributions():
        meta = dist.metadata.json  # PEP 566 form: the long description under "description"
        name, summary, body = (str(meta.get(key) or "") for key in ("name", "summary", "description"))
        if name and name.lower() not in found:
            found[name.lower()] = (name, summary.strip(), _prose(body))
    return [found[key] for key in sorted(found)]


def _prose(body: str) -> str:
    """Paragraphs of plain sentences (no markup lines, badges or code), up to MAX_CHARS."""
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", body):
        text = " ".join(paragraph.split())
        if len(text) < 80 or not re.match(r"[A-Za-z]", text) or re.search(r"[|<>=`{}\[\]]|\.\. |::", text):
            continue
        if sum(len(p) for p in out) + len(text) > MAX_CHARS:
            break
        out.append(text)
    return "\n\n".join(out)


def make(rng: random.Random, count: int) -> list[Row]:
    out: list[Row] = []
    for name, summary, prose in described():
        if summary:
            out.append({"class": "chat/greedy", "source": SOURCE, "messages": [
                {"role": "user", "content": rng.choice(ON_SUMMARY).format(n=name, s=summary)}]})
        if prose:
            out.append({"class": "summarization/greedy", "source": SOURCE, "messages": [
                {"role": "user", "content": rng.choice(ON_TEXT).format(x=prose)}]})
    rng.shuffle(out)
    return out[:count]
