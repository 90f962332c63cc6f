"""Prompt capture for draft training: sample, scrub PII and secrets, write rotated JSONL.

Beside the request path: the edge offers a request's messages with a
non-blocking put; everything else happens in a background task.
"""
