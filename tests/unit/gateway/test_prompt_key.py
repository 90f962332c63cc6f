"""Prompt block hashes: chained turn by turn, cut in blocks, the same in every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gateway
from gateway.decide.prompt_key import PromptKey

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}  # 580 characters


def chat(*messages: dict, **extra) -> PromptKey:
    return PromptKey({"messages": list(messages), **extra}, "chat")


def test_a_conversations_next_turn_begins_with_its_previous_turns_blocks():
    turn1 = chat(SYSTEM, {"role": "user", "content": "What is a KV cache?"})
    turn2 = chat(SYSTEM, {"role": "user", "content": "What is a KV cache?"},
                 {"role": "assistant", "content": "The keys and values of past tokens."},
                 {"role": "user", "content": "And prefix caching?"})
    first, second = turn1.blocks(256), turn2.blocks(256)
    assert len(first) == 3 + 1  # the system prompt in three blocks, the question in one
    assert second[:len(first)] == first
    assert len(second) == len(first) + 2


def test_long_content_is_cut_in_blocks_and_any_change_changes_every_later_hash():
    text = "x" * 1000
    blocks = chat({"role": "user", "content": text}).blocks(256)
    assert len(blocks) == 4
    changed = chat({"role": "user", "content": text[:300] + "y" + text[301:]}).blocks(256)
    assert changed[0] == blocks[0]
    assert all(a != b for a, b in zip(changed[1:], blocks[1:], strict=True))


def test_role_and_message_boundaries_count():
    assert chat({"role": "user", "content": "hi"}).blocks(256) != chat({"role": "system", "content": "hi"}).blocks(256)
    split = chat({"role": "user", "content": "ab"}, {"role": "user", "content": "c"}).blocks(256)
    joined = chat({"role": "user", "content": "a"}, {"role": "user", "content": "bc"}).blocks(256)
    assert split[1] != joined[1]


def test_text_parts_are_the_content_and_the_block_size_is_per_call():
    parts = chat({"role": "user", "content": [{"type": "text", "text": "hello"}]})
    plain = chat({"role": "user", "content": "hello"})
    assert parts.blocks(256) == plain.blocks(256)
    key = chat({"role": "user", "content": "z" * 100})
    assert len(key.blocks(64)) == 2 and len(key.blocks(256)) == 1
    assert key.blocks(64) is key.blocks(64)  # hashed once per block size


def test_completion_prompts_text_and_token_ids():
    text = PromptKey({"prompt": "p" * 600}, "completions").blocks(256)
    assert len(text) == 3
    assert PromptKey({"prompt": ["p" * 300, "q"]}, "completions").blocks(256)[0] == text[0]
    ids = PromptKey({"prompt": list(range(200))}, "completions").blocks(256)
    assert len(ids) == 4  # 64 ids a block
    nested = PromptKey({"prompt": [list(range(200))]}, "completions").blocks(256)
    assert nested == ids


def test_session_from_the_header_then_the_user_field():
    assert chat({"role": "user", "content": "hi"}).session("x-specgate-session") is None
    by_user = chat({"role": "user", "content": "hi"}, user="alice").session("x-specgate-session")
    by_header = PromptKey({"messages": [], "user": "bob"}, "chat",
                          {"x-specgate-session": "alice"}).session("X-Specgate-Session")
    assert by_user == by_header is not None
    assert chat(user="").session("x-specgate-session") is None


def test_hashes_are_the_same_in_another_process():
    code = ("from gateway.decide.prompt_key import PromptKey;"
            "print(PromptKey({'messages': [{'role': 'user', 'content': 'same'}]}, 'chat').blocks(256))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(Path(gateway.__file__).parents[1])})
    assert other.stdout.strip() == str(chat({"role": "user", "content": "same"}).blocks(256))
