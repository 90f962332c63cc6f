"""Run the bundled engine: an OpenAI-compatible server with tree speculation.

It serves a Hugging Face causal LM (default: the packaged SmolLM2-135M-Instruct)
with vLLM's wire format and metric names, drafting token trees (prompt
lookup, a draft model or an EAGLE-3 head) and verifying each tree in one
forward pass with the project's kernels.
"""

from __future__ import annotations

import argparse

from backends.engine.options import DRAIN_S, MAX_NUM_SEQS, drafter_spec, positive_int, schedule_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    parser.add_argument("--model", default="default",
                        help="model folder, .gguf file, or 'default' (the packaged SmolLM2)")
    parser.add_argument("--drafter", default="ngram", type=drafter_spec,
                        help="'ngram' (prompt lookup, default), 'model:PATH' (a draft model "
                        "sharing the tokenizer), 'eagle3:PATH' (an EAGLE-3 head trained for the "
                        "model) or 'eagle3' (the head shipped for the packaged model)")
    parser.add_argument("--no-speculation", action="store_true", help="plain decoding")
    parser.add_argument("--speculation-schedule", type=schedule_arg, metavar="JSON",
                        help='draft depth by the requests decoding at once, vLLM\'s format, e.g. "[[1, 2, 2], '
                        '[3, 3, 0]]": drafts up to 2 deep while 1-2 requests decode, plain decoding above '
                        "(default: draft at every batch)")
    parser.add_argument("--served-model-name", help="model name in the API (default: the model's)")
    parser.add_argument("--max-model-len", type=positive_int, default=2048,
                        help="tokens of prompt plus output a request may use (default: %(default)s)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=MAX_NUM_SEQS,
                        help="requests decoded at once, taking turns step by step (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from prometheus_client import CollectorRegistry

    from backends.engine.drafters import make_drafter_factory, shipped_head
    from backends.engine.generate import EngineGenerator
    from backends.engine.loading import load_model
    from backends.serving import VllmMetrics, create_openai_app

    if args.drafter == "eagle3" and not args.no_speculation:
        shipped_head()  # a missing head is reported before the model loads
    loaded = load_model(args.model)
    name = args.served_model_name or loaded.source.name
    factory = None if args.no_speculation else make_drafter_factory(args.drafter, loaded.model)
    depth = factory().max_depth if factory else None
    metrics = VllmMetrics(CollectorRegistry(), name, num_speculative_tokens=depth)
    generator = EngineGenerator(loaded.model, loaded.tokenizer, metrics, factory, args.max_model_len,
                                args.max_num_seqs, args.speculation_schedule)
    app = create_openai_app(generator, metrics, name, max_model_len=args.max_model_len,
                            spec_decode_metrics=depth)  # metrics.speculative_decoding in every answer, as vLLM
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=DRAIN_S)
    return 0
