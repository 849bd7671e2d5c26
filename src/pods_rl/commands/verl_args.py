"""``pods verl-args``: print verl's overrides for PODS in kept terms (``pods_rl.integrations.verl_args``)."""

from __future__ import annotations

import argparse

from pods_rl.integrations.verl_args import verl_batch_settings


def main(argv: list[str] | None = None) -> int:
    """`pods verl-args`: print verl's batch overrides in kept terms, one per line; returns the exit code."""
    from pods_rl.errors import run_guarded

    return run_guarded("pods verl-args", _main, argv)


def _parser() -> argparse.ArgumentParser:
    from pods_rl.errors import one_line_parser_errors

    parser = argparse.ArgumentParser(
        prog="pods verl-args",
        description="Print verl overrides (one per line) that train PODS without padding rows; a one-line summary "
                    "goes to stderr. Use as: python3 -m verl.trainer.main_ppo ... $(pods verl-args ...)")
    parser.add_argument("--prompts", type=int, required=True, help="B: prompt groups kept per update")
    parser.add_argument("--n", type=int, required=True, help="rollouts generated per prompt")
    parser.add_argument("--m", type=int, required=True, help="rollouts kept per prompt")
    parser.add_argument("--dp", type=int, required=True, help="the actor's data-parallel size")
    parser.add_argument("--mini-batch", type=int, required=True, help="kept rows per actor mini-batch")
    parser.add_argument("--critic-mini-batch", type=int, default=None,
                        help="kept rows per critic mini-batch (PPO with GAE)")
    parser.add_argument("--oversample", type=float, default=1.0, help="oversample_prompts (>= 1)")
    parser.add_argument("--rule", default="max_variance", help="down-sampling rule (default max_variance)")
    parser.add_argument("--tiebreak", default="index", help="index, shorter or longer")
    parser.add_argument("--trainer-mode", default="sync", help="sync or colocate_async")
    one_line_parser_errors(parser)
    return parser


def _main(argv: list[str]) -> int:
    import sys

    args = _parser().parse_args(argv)
    oversample = int(args.oversample) if float(args.oversample).is_integer() else args.oversample
    batch = verl_batch_settings(args.prompts, args.n, args.m, args.dp, args.mini_batch,
                                critic_mini_batch=args.critic_mini_batch, oversample_prompts=oversample,
                                rule=args.rule, tiebreak=args.tiebreak, trainer_mode=args.trainer_mode)
    print("\n".join(batch.overrides))
    print(batch.summary(args.n, args.m, args.dp), file=sys.stderr)
    return 0
