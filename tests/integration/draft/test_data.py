"""`specgate draft data` against a fake OpenAI server on loopback: answers, retries, resume, the dataset."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from specgate.cli import main
from specgate.draft import dataset
from specgate.draft.prompts import parse
from specgate.draft.regenerate import Asking, answered, regenerate
from tests.fakes.vllm import FakeVllm

ANSWER = "The answer is forty-two."
QUESTIONS = [f"Question number {i}: what is {i} + {i}?" for i in range(8)]


@pytest.fixture
def fake():
    with FakeVllm(model="target", kind="standard") as server:
        server.script(text=ANSWER, chunks=3)
        yield server


def prompts_file(path: Path) -> Path:
    lines = [{"messages": [{"role": "user", "content": q}], "class": "chat/low"} for q in QUESTIONS]
    lines.append(lines[0])  # a duplicate
    lines.append({"prompt": "Summarise: the cat sat on the mat.", "class": "summarise/low"})
    lines.append({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                               {"role": "user", "content": "Tell me a joke."}], "class": "chat/low"})
    text = "\n".join(json.dumps(line) for line in lines) + "\nnot json\n" + json.dumps({"messages": []}) + "\n"
    path.write_text(text)
    return path


def asking(fake: FakeVllm, **options) -> Asking:
    return Asking(fake.url + "/v1", "target", max_tokens=32, backoff_s=0.01, **options)


def chosen(path: Path):
    return [p for p in (parse(json.loads(line)) for line in path.read_text().splitlines()[:8])]


@pytest.mark.slow
def test_data_answers_dedupes_and_writes_masked_records(fake, tmp_path):
    os.environ["HF_HUB_OFFLINE"] = "1"
    out = tmp_path / "data"
    argv = ["draft", "data", "--prompts", str(prompts_file(tmp_path / "p.jsonl")), "--url", fake.url + "/v1",
            "--model", "target", "--out", str(out), "--no-progress", "--concurrency", "3"]
    assert main(argv) == 0
    assert len(fake.completion_requests()) == 10  # 8 questions, the summary, the joke; the duplicate once
    manifest = dataset.read_manifest(out)
    records = list(dataset.read_records(out))
    assert manifest["records"] == len(records) == 10
    assert manifest["masked_tokens"] == sum(sum(r.loss_mask) for r in records)
    from transformers import AutoTokenizer

    from backends.model import prepare

    tokenizer = AutoTokenizer.from_pretrained(prepare())
    for record in records:
        kept = tokenizer.decode([t for t, m in zip(record.input_ids, record.loss_mask, strict=True) if m])
        assert kept.endswith(ANSWER + "<|im_end|>")
    joke = next(r for r in records if "joke" in tokenizer.decode(r.input_ids))
    kept = tokenizer.decode([t for t, m in zip(joke.input_ids, joke.loss_mask, strict=True) if m])
    assert kept == "Hello!<|im_end|>" + ANSWER + "<|im_end|>"  # both assistant turns, nothing else
    assert {r.traffic_class for r in records} == {"chat/low", "summarise/low"}

    assert main(argv) == 0  # a rerun asks nothing again and writes the same dataset
    assert len(fake.completion_requests()) == 10
    assert list(dataset.read_records(out)) == records


def test_retryable_failures_are_retried_with_backoff(fake, tmp_path):
    prompts = chosen(prompts_file(tmp_path / "p.jsonl"))
    fake.fail_next(3, status=503)
    tally = asyncio.run(regenerate(prompts, asking(fake, concurrency=1), tmp_path / "answers.jsonl"))
    assert (tally.answered, tally.failed, tally.retried) == (8, 0, 3)
    assert tally.errors == {"http_503": 3}
    assert set(answered(tmp_path / "answers.jsonl")) == {p.id for p in prompts}


def test_a_prompt_that_keeps_failing_is_left_for_the_next_run(fake, tmp_path):
    prompts = chosen(prompts_file(tmp_path / "p.jsonl"))
    answers = tmp_path / "answers.jsonl"
    fake.fail_next(1, status=400)  # not retryable
    first = asyncio.run(regenerate(prompts, asking(fake, concurrency=1), answers))
    assert (first.answered, first.failed, first.retried) == (7, 1, 0)
    with answers.open("a") as f:
        f.write('{"id": "torn')  # a run killed mid-write
    second = asyncio.run(regenerate(prompts, asking(fake), answers))
    assert (second.answered, second.skipped, second.failed) == (1, 7, 0)
    assert len(fake.completion_requests()) == 9
    assert set(answered(answers)) == {p.id for p in prompts}


def test_an_unreachable_url_fails_each_prompt_after_its_retries(tmp_path):
    prompts = chosen(prompts_file(tmp_path / "p.jsonl"))[:2]
    closed = Asking("http://127.0.0.1:9/v1", "target", retries=2, backoff_s=0.01, timeout_s=5)
    tally = asyncio.run(regenerate(prompts, closed, tmp_path / "answers.jsonl"))
    assert (tally.answered, tally.failed, tally.retried) == (0, 2, 4)
    assert sum(tally.errors.values()) == 6
