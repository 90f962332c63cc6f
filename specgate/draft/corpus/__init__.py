"""Draft-training prompts at scale, from several independent local sources.

Each source is a module with `make(rng, count) -> list[dict]`: prompts-JSONL
rows `{"class", "source", "messages"}`. Nothing is downloaded: the text is
written here (`templates`, `puzzles`) or read from what is installed with
Python (`stdlib`: the standard library's own source and docstrings;
`packages`: the descriptions of the installed distributions). The `source`
field lets a held-out split come from a source that training never saw.
`python -m specgate.draft.corpus` writes the files (`build.py`).
"""
