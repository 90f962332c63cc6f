"""The bundled engine: exact greedy speculation, drafters, and the server."""

from __future__ import annotations

import asyncio
import copy

import httpx
import openai
import pytest
import torch
from prometheus_client import CollectorRegistry

from backends.engine.decoding import Sampling, TreeVerifier
from backends.engine.draft_model import DraftModel
from backends.engine.generate import DecodeOptions, EngineGenerator, decode
from backends.engine.loading import load_model
from backends.engine.ngram import NgramConfig, NgramDrafter
from backends.engine.tree import DraftTree
from backends.serving import GenerationRequest, VllmMetrics, create_openai_app
from backends.serving.server import BackgroundServer
from backends.speculation import SpeculationSchedule

pytestmark = pytest.mark.slow  # torch

PROMPTS = {
    "code": "Add type hints to this code and keep everything else the same:\n\n"
            "def add(a, b):\n    total = a + b\n    return total\n\n"
            "def mul(a, b):\n    total = a * b\n    return total\n",
    "chat": "What are three good habits for staying healthy?",
    "summarisation": "Summarise this paragraph in two sentences: The river flows from the mountains to "
                     "the sea. Along the way the river feeds farms, towns and forests. In spring the river "
                     "floods the valley, and in summer the river runs low and slow.",
}


@pytest.fixture(scope="module")
def loaded():
    return load_model("default")


def prompt_ids(loaded, text: str) -> list[int]:
    return list(loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                     add_generation_prompt=True, tokenize=True, return_dict=False))


def generate(verifier, prompt, drafter=None, max_tokens=128, stop=frozenset()):
    steps = list(decode(verifier, prompt, DecodeOptions(max_tokens=max_tokens, stop_ids=stop), drafter))
    return [t for s in steps for t in s.tokens], steps


@pytest.mark.parametrize("kind", list(PROMPTS))
def test_greedy_with_a_draft_tree_is_token_for_token_plain_greedy(loaded, kind):
    verifier = TreeVerifier(loaded.model)
    prompt = prompt_ids(loaded, PROMPTS[kind])
    plain, plain_steps = generate(verifier, prompt)
    drafted, steps = generate(verifier, prompt, NgramDrafter(NgramConfig()))
    assert len(plain) == 128  # no stop token: the full 128 tokens are compared
    assert drafted == plain
    assert all(len(s.tokens) == 1 for s in plain_steps)
    if kind != "chat":  # prompts the answer copies from: drafts are accepted, steps are saved
        assert sum(s.accepted for s in steps) > 0 and len(steps) < len(plain_steps)


def test_draft_model_tree_is_exact_and_accepted(loaded):
    verifier = TreeVerifier(loaded.model)
    prompt = prompt_ids(loaded, PROMPTS["chat"])
    plain, _ = generate(verifier, prompt, max_tokens=40)
    drafted, steps = generate(verifier, prompt, DraftModel(loaded.model).drafter(), max_tokens=40)
    assert drafted == plain
    # the draft is the target itself here: nearly every draft token must be accepted
    assert sum(s.accepted for s in steps) >= 0.8 * sum(s.draft_depth for s in steps)


def first_layers(model, count: int):
    """A smaller model sharing `model`'s tokenizer and weights: its first `count`
    layers, then its final norm and head. It disagrees with `model` often."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = count
    body = copy.copy(model.model)
    body._modules = {**model.model._modules, "layers": torch.nn.ModuleList(model.model.layers[:count])}
    body.config = config
    smaller = copy.copy(model)
    smaller._modules = {**model._modules, "model": body}
    smaller.config = config
    return smaller


def test_a_draft_model_that_often_disagrees_still_gives_exact_greedy_output(loaded):
    verifier = TreeVerifier(loaded.model)
    prompt = prompt_ids(loaded, PROMPTS["summarisation"])
    plain, _ = generate(verifier, prompt, max_tokens=40)
    draft = DraftModel(first_layers(loaded.model, 22))
    drafted, steps = generate(verifier, prompt, draft.drafter(), max_tokens=40)
    assert drafted == plain
    accepted, drafted_depth = sum(s.accepted for s in steps), sum(s.draft_depth for s in steps)
    assert 0 < accepted < drafted_depth  # both accepted and rejected drafts were verified


def test_stop_token_ends_the_output_and_is_kept(loaded):
    verifier = TreeVerifier(loaded.model)
    eos = loaded.tokenizer.eos_token_id
    prompt = prompt_ids(loaded, "What is the capital of France?")
    tokens, _ = generate(verifier, prompt, NgramDrafter(), max_tokens=64, stop=frozenset({eos}))
    assert tokens[-1] == eos and eos not in tokens[:-1]
    assert "Paris" in loaded.tokenizer.decode(tokens)


def test_an_answer_ends_at_the_templates_end_of_turn_when_eos_names_another_token(loaded):
    converted = copy.deepcopy(loaded.tokenizer)  # a GGUF conversion that names <|endoftext|> as eos
    converted.eos_token = "<|endoftext|>"
    im_end = converted.convert_tokens_to_ids("<|im_end|>")
    generator = EngineGenerator(loaded.model, converted, VllmMetrics(CollectorRegistry(), "smollm2"))
    request = GenerationRequest("chat", "r", "smollm2", messages=({"role": "user", "content": "Hi!"},),
                                max_tokens=96, temperature=0)

    async def answer() -> list:
        return [delta async for delta in generator.generate(request)]

    deltas = asyncio.run(answer())
    assert deltas[-1].finish_reason == "stop" and sum(d.tokens for d in deltas) < 96
    assert "<|im_start|>" not in "".join(d.text for d in deltas)  # it did not run on into a turn of its own
    assert generator.stop_ids == {im_end, converted.eos_token_id}


def test_sampling_is_seeded_and_stops_at_max_tokens(loaded):
    verifier = TreeVerifier(loaded.model)
    prompt = prompt_ids(loaded, PROMPTS["summarisation"])

    def sample(seed):
        options = DecodeOptions(max_tokens=24, sampling=Sampling.create(0.8, 0, 0.95, seed))
        return [t for s in decode(verifier, prompt, options, NgramDrafter()) for t in s.tokens]

    first, again, other = sample(7), sample(7), sample(8)
    assert len(first) == 24 and first == again
    assert first != other


def test_tree_pruning_keeps_shallow_nodes():
    tree = DraftTree(tokens=[9, 1, 2, 3, 4], parents=[-1, 0, 1, 0, 3])
    assert tree.depth() == 2
    assert tree.pruned(1) == DraftTree(tokens=[9, 1, 3], parents=[-1, 0, 0])
    assert tree.pruned(0) == DraftTree(tokens=[9], parents=[-1])


@pytest.mark.parametrize(("max_num_seqs", "finish_order"), [(8, ["short", "long"]), (1, ["long", "short"])])
def test_active_requests_take_turns_up_to_max_num_seqs(loaded, max_num_seqs, finish_order):
    generator = EngineGenerator(loaded.model, loaded.tokenizer, VllmMetrics(CollectorRegistry(), "smollm2"),
                                max_num_seqs=max_num_seqs)
    admitted: list[str] = []
    finished: dict[str, int] = {}

    async def complete(name: str, max_tokens: int, first_piece: asyncio.Event) -> None:
        request = GenerationRequest("completions", name, "smollm2", prompt="1, 2, 3, 4, 5,", max_tokens=max_tokens,
                                    temperature=0, mark_running=lambda: admitted.append(name))
        tokens = 0
        async for delta in generator.generate(request):
            tokens += delta.tokens
            first_piece.set()
        finished[name] = tokens

    async def long_then_short() -> None:
        long_started = asyncio.Event()
        long = asyncio.create_task(complete("long", 96, long_started))
        await long_started.wait()
        await complete("short", 4, asyncio.Event())
        await long

    asyncio.run(long_then_short())
    assert admitted == ["long", "short"]
    assert list(finished) == finish_order
    assert finished == {"long": 96, "short": 4}


def test_a_step_drafts_only_as_deep_as_the_schedule_says_and_stays_exact(loaded):
    verifier = TreeVerifier(loaded.model)
    prompt = prompt_ids(loaded, PROMPTS["code"])
    plain, _ = generate(verifier, prompt, max_tokens=48)
    asked: list[int] = []
    depths = iter([0, 1, 0, 2] * 48)

    def depth() -> int:
        asked.append(next(depths))
        return asked[-1]

    steps = list(decode(verifier, prompt, DecodeOptions(max_tokens=48), NgramDrafter(NgramConfig()), depth))
    assert [t for s in steps for t in s.tokens] == plain
    assert all(s.draft_depth <= limit for s, limit in zip(steps, asked, strict=True))
    assert all(s.draft_depth == 0 for s, limit in zip(steps, asked, strict=True) if limit == 0)
    assert any(s.draft_depth == 2 for s in steps)


@pytest.mark.parametrize(("schedule", "drafts"), [(((1, 1, 4), (2, 2, 0)), True), (((1, 1, 0), (2, 2, 4)), False)])
def test_the_engine_drafts_by_its_schedule_for_the_requests_decoding_at_once(loaded, schedule, drafts):
    metrics = VllmMetrics(CollectorRegistry(), "smollm2", num_speculative_tokens=NgramConfig().max_depth)
    generator = EngineGenerator(loaded.model, loaded.tokenizer, metrics, lambda: NgramDrafter(NgramConfig()),
                                schedule=SpeculationSchedule(schedule))
    request = GenerationRequest("completions", "alone", "smollm2", prompt="1, 2, 3, 4, 5, 1, 2, 3, 4, 5,",
                                max_tokens=32, temperature=0)

    async def drafted() -> int:
        return sum([delta.drafted async for delta in generator.generate(request)])

    assert (asyncio.run(drafted()) > 0) is drafts  # alone: a batch of 1


@pytest.fixture(scope="module")
def engine_server(loaded):
    metrics = VllmMetrics(CollectorRegistry(), "smollm2", num_speculative_tokens=NgramConfig().max_depth)
    generator = EngineGenerator(loaded.model, loaded.tokenizer, metrics, lambda: NgramDrafter(NgramConfig()))
    app = create_openai_app(generator, metrics, "smollm2", max_model_len=2048,
                            spec_decode_metrics=NgramConfig().max_depth)
    with BackgroundServer(app) as server:
        yield server.url


def test_server_answers_the_openai_client(engine_server):
    client = openai.OpenAI(base_url=engine_server + "/v1", api_key="unused", max_retries=0, timeout=120)
    before = _draft_tokens(engine_server)
    chat = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": PROMPTS["code"]}],
                                          temperature=0, max_tokens=48)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": PROMPTS["code"]}], temperature=0, max_tokens=48,
        stream=True) if c.choices)
    assert chat.choices[0].message.content and streamed == chat.choices[0].message.content
    assert chat.usage.completion_tokens == 48 and chat.choices[0].finish_reason == "length"
    spec = chat.model_extra["metrics"]["speculative_decoding"]
    assert spec["num_spec_steps"] > 0 and spec["num_spec_tokens"] == NgramConfig().max_depth
    assert spec["num_spec_steps"] + spec["num_accepted_draft_tokens"] <= 48  # a verify step's tokens are its own
    completion = client.completions.create(model="smollm2", prompt="def fibonacci(n):", max_tokens=16,
                                           temperature=0.8, seed=3)
    assert completion.choices[0].text
    assert [m.id for m in client.models.list()] == ["smollm2"]
    assert _draft_tokens(engine_server) > before


def _draft_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:spec_decode_num_draft_tokens_total{"))
