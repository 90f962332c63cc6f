"""`specgate draft train`: an EAGLE-3 head from a draft dataset.

1. Features: the target runs once over the dataset, or several datasets
   (`specgate.draft.features`); a feature directory that already holds them is
   reused.
2. Draft vocabulary: the most frequent target tokens of the training split's
   responses (`--draft-vocab`); the lm head starts from the target's rows.
3. Training: training-time test over `--ttt-steps` draft steps (later steps
   read the head's own hidden state), loss masked to response tokens.
4. Output directory: the checkpoint (config.json, model.safetensors, which vLLM
   and the bundled engine load), training.json, eval.json (held-out acceptance
   per position), loss.png, accuracy.png and validation.png (held-out loss and
   acceptance at each validation). Validation every `--eval-every` steps stops
   training early when the held-out loss stops falling and checkpoints the run
   (`resume.pt`), which the same command resumes. `--device cuda` trains on a GPU.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from specgate.draft.train import TrainOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainOptions()
    parser.add_argument("--data", required=True, nargs="+", metavar="DIR",
                        help="dataset directory written by `specgate draft data`, or several that train together "
                             "(generated and captured prompts, say)")
    parser.add_argument("--out", required=True, help="output directory: the head, eval.json, plots")
    parser.add_argument("--model", help="target model folder (default: the prepared SmolLM2-135M-Instruct)")
    parser.add_argument("--features", help="feature directory to reuse or fill (default: OUT/features)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--ttt-steps", type=int, default=defaults.ttt_steps, help="draft steps trained")
    parser.add_argument("--draft-vocab", type=int, default=defaults.draft_vocab, help="draft vocabulary size")
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens)
    parser.add_argument("--holdout", type=float, default=defaults.holdout, help="held-out share of records")
    parser.add_argument("--held-out-data", help="a second dataset to evaluate on (then all of --data trains)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="per record")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice, one per core)")
    parser.add_argument("--device", default=defaults.device,
                        help="cpu, cuda, cuda:N, or auto: cuda when torch sees a GPU (default: %(default)s)")
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every,
                        help="steps between validations on the held-out set, each also a resumable checkpoint")
    parser.add_argument("--patience", type=int, default=defaults.patience,
                        help="stop after this many validations without a lower held-out loss")
    parser.add_argument("--validation-tokens", type=int, default=defaults.validation_tokens,
                        help="held-out tokens scored at each validation (the final evaluation scores all)")
    parser.add_argument("--stop-after", type=int, metavar="STEPS",
                        help="train at most this many steps in this run, then checkpoint and stop; run the same "
                             "command again to resume")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="start no step after this many seconds (features included): validate, write the "
                             "best head so far and stop; the same command resumes the schedule")
    parser.add_argument("--dry-run", action="store_true",
                        help="2 steps on at most 8 records each side, validating after each, on --device: "
                             "checks the whole path (features, device, checkpoint, plots) in seconds")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from backends.model import prepare
    from specgate.draft.trainer import train

    options = TrainOptions(steps=args.steps, ttt_steps=args.ttt_steps, draft_vocab=args.draft_vocab, lr=args.lr,
                           batch_tokens=args.batch_tokens, seed=args.seed, holdout=args.holdout,
                           max_tokens=args.max_tokens, eval_every=args.eval_every, patience=args.patience,
                           validation_tokens=args.validation_tokens, device=args.device)  # fmt: skip
    if args.dry_run:
        options = replace(options, steps=2, eval_every=1, max_records=8, validation_tokens=options.batch_tokens)
    if min(options.steps, options.ttt_steps, options.draft_vocab, options.batch_tokens, options.eval_every,
           options.patience) < 1:
        raise SystemExit("--steps, --ttt-steps, --draft-vocab, --batch-tokens, --eval-every and --patience "
                         "must be positive")
    if args.time_limit is not None and not args.time_limit > 0:
        raise SystemExit("--time-limit must be a positive number of seconds")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model_dir = Path(args.model).expanduser() if args.model else prepare()
    summary = train([Path(d) for d in args.data], Path(args.out), model_dir, options,
                    Path(args.features) if args.features else None, progress=not args.no_progress,
                    held_out_data=Path(args.held_out_data) if args.held_out_data else None,
                    stop_after=args.stop_after, time_limit_s=args.time_limit)  # fmt: skip
    if summary["out_of_time"]:
        print(f"out of time at step {summary['steps_done']} of {options.steps}: wrote the head of step "
              f"{summary['best_step']}; the same command resumes from {os.fspath(args.out)}/resume.pt")
    elif not summary["finished"]:
        print(f"stopped at step {summary['steps_done']} of {options.steps}; the same command resumes from "
              f"{os.fspath(args.out)}/resume.pt")
        return 0
    if summary["stopped_early"]:
        print(f"stopped early at step {summary['steps_done']}: no lower held-out loss in {options.patience} "
              f"validations; kept the head of step {summary['best_step']}")
    held = summary["held_out"]
    print(f"held-out acceptance per position {held['acceptance_per_position']}, "
          f"mean accepted length {held['mean_accepted_length']}; head in {os.fspath(args.out)}")  # fmt: skip
    return 0
