"""Prompt block hashes: chained turn by turn, cut in blocks, the same in every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gateway
from gateway.upstream.prompt_key import MAX_PREFIX_CHARS, PromptKey

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}  # 580 characters


def chat(*messages: dict, **extra) -> PromptKey:
    return PromptKey({"messages": list(messages), **extra}, "chat")


def test_a_conversations_next_turn_begins_with_its_previous_turns_blocks():
    turn1 = chat(SYSTEM, {"role": "user", "content": "What is a KV cache?"})
    turn2 = chat(SYSTEM, {"role": "user", "content": "What is a KV cache?"},
                 {"role": "assistant", "content": "The keys and values of past tokens."},
                 {"role": "user", "content": "And prefix caching?"})
    first, second = turn1.blocks(256).hashes, turn2.blocks(256).hashes
    assert len(first) == 3 + 1  # the system prompt in three blocks, the question in one
    assert second[:len(first)] == first
    assert len(second) == len(first) + 2


def test_long_content_is_cut_in_blocks_and_any_change_changes_every_later_hash():
    text = "x" * 1000
    blocks = chat({"role": "user", "content": text}).blocks(256).hashes
    assert len(blocks) == 4
    changed = chat({"role": "user", "content": text[:300] + "y" + text[301:]}).blocks(256).hashes
    assert changed[0] == blocks[0]
    assert all(a != b for a, b in zip(changed[1:], blocks[1:], strict=True))


def test_role_and_message_boundaries_count():
    user, system = chat({"role": "user", "content": "hi"}), chat({"role": "system", "content": "hi"})
    assert user.blocks(256).hashes != system.blocks(256).hashes
    split = chat({"role": "user", "content": "ab"}, {"role": "user", "content": "c"}).blocks(256).hashes
    joined = chat({"role": "user", "content": "a"}, {"role": "user", "content": "bc"}).blocks(256).hashes
    assert split[1] != joined[1]


def test_text_parts_are_the_content_and_the_block_size_is_per_call():
    parts = chat({"role": "user", "content": [{"type": "text", "text": "hello"}]})
    plain = chat({"role": "user", "content": "hello"})
    assert parts.blocks(256).hashes == plain.blocks(256).hashes
    key = chat({"role": "user", "content": "z" * 100})
    assert len(key.blocks(64).hashes) == 2 and len(key.blocks(256).hashes) == 1
    assert key.blocks(64) is key.blocks(64)  # hashed once per block size


def test_completion_prompts_text_and_token_ids():
    text = PromptKey({"prompt": "p" * 600}, "completions").blocks(256).hashes
    assert len(text) == 3
    assert PromptKey({"prompt": ["p" * 300, "q"]}, "completions").blocks(256).hashes[0] == text[0]
    ids = PromptKey({"prompt": list(range(200))}, "completions").blocks(256).hashes
    assert len(ids) == 4  # 64 ids a block
    nested = PromptKey({"prompt": [list(range(200))]}, "completions").blocks(256).hashes
    assert nested == ids


def test_session_from_the_header_then_the_user_field():
    assert chat({"role": "user", "content": "hi"}).session("x-specgate-session") is None
    by_user = chat({"role": "user", "content": "hi"}, user="alice").session("x-specgate-session")
    by_header = PromptKey({"messages": [], "user": "bob"}, "chat",
                          {"x-specgate-session": "alice"}).session("X-Specgate-Session")
    assert by_user == by_header is not None
    assert chat(user="").session("x-specgate-session") is None


@pytest.mark.slow
def test_the_anchor_is_the_same_in_another_process_and_names_the_first_block():
    """Block hashes may differ between processes; the anchor, which decides
    where a prompt never seen goes, may not."""
    code = ("from gateway.upstream.prompt_key import PromptKey;"
            "print(PromptKey({'messages': [{'role': 'user', 'content': 'same'}]}, 'chat').blocks(256).anchor)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(Path(gateway.__file__).parents[1])})
    assert other.stdout.strip() == str(chat({"role": "user", "content": "same"}).blocks(256).anchor)
    longer = chat({"role": "user", "content": "same"}, {"role": "user", "content": "more"}).blocks(256)
    assert longer.anchor == chat({"role": "user", "content": "same"}).blocks(256).anchor
    assert chat({"role": "system", "content": "same"}).blocks(256).anchor != longer.anchor
    assert PromptKey({"prompt": ""}, "completions").blocks(256).anchor is None


def test_a_message_boundary_never_hashes_like_a_block_boundary():
    whole = chat({"role": "user", "content": "x" * 256 + "y"}).blocks(256).hashes
    split = chat({"role": "user", "content": "x" * 256}, {"role": "user", "content": "y"}).blocks(256).hashes
    assert whole[0] == split[0] and whole[1] != split[1]


def test_a_prompt_is_hashed_up_to_its_first_mebi_characters_only():
    blocks = MAX_PREFIX_CHARS // 256
    long = chat({"role": "user", "content": "x" * (MAX_PREFIX_CHARS - 10)}, {"role": "user", "content": "y" * 9000})
    hashes = long.blocks(256).hashes
    assert len(hashes) == blocks + 1  # the first message's last block is short; the second has 10 characters
    later = chat({"role": "user", "content": "x" * (MAX_PREFIX_CHARS - 10)}, {"role": "user", "content": "y" * 10})
    assert later.blocks(256).hashes == hashes  # what follows the first mebi characters is not hashed
    earlier = chat({"role": "user", "content": "x" * (MAX_PREFIX_CHARS - 11)}, {"role": "user", "content": "y" * 9000})
    assert earlier.blocks(256).hashes[-1] != hashes[-1]
    text = PromptKey({"prompt": "p" * (8 * MAX_PREFIX_CHARS)}, "completions").blocks(256).hashes
    ids = PromptKey({"prompt": list(range(8 * MAX_PREFIX_CHARS // 4))}, "completions").blocks(256).hashes
    assert len(text) == len(ids) == blocks
