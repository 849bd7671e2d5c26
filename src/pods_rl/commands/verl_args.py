"""``pods verl-args``: print verl's overrides for PODS in kept terms (``pods_rl.engines.verl.batch_settings``)."""

from __future__ import annotations

import argparse
import json
import sys

from pods_rl.engines.verl.batch_settings import verl_batch_settings
from pods_rl.errors import one_line_parser_errors, run_guarded, spellings

# the flags verl_batch_settings takes as ``planners``, by their argparse names
PLANNER_KEYS = ("prompt_planner", "prompt_planner_args", "rollout_planner", "rollout_planner_args", "refill_rounds")


def main(argv: list[str] | None = None) -> int:
    """`pods verl-args`: print verl's batch overrides in kept terms, one per line; returns the exit code."""
    return run_guarded("pods verl-args", _main, argv)


def build_parser() -> argparse.ArgumentParser:
    """The `pods verl-args` argument parser."""
    parser = argparse.ArgumentParser(
        prog="pods verl-args",
        description="Print verl overrides (one per line) that train PODS without padding rows; a one-line summary "
                    "goes to stderr. Use as: python3 -m verl.trainer.main_ppo ... $(pods verl-args ...)",
        epilog="Flags that mean what a `pods train` or `pods study` flag means take its spelling too: --n is "
               "--num_generations, --m --downsample_to, --oversample --oversample_prompts, --rule --downsample_rule, "
               "--tiebreak --downsample_tiebreak, --prompts --prompts-per-step; and every flag both spellings "
               "(--mini-batch, --mini_batch).")

    def add(*names, **kwargs):
        parser.add_argument(*spellings(*names), **kwargs)

    add("--prompts", "--prompts-per-step", type=int, required=True, help="B: prompt groups kept per update")
    add("--n", "--num_generations", type=int, required=True, help="rollouts generated per prompt")
    add("--m", "--downsample_to", type=int, required=True, help="rollouts kept per prompt")
    add("--dp", type=int, required=True, help="the actor's data-parallel size")
    add("--mini-batch", type=int, required=True, help="kept rows per actor mini-batch")
    add("--critic-mini-batch", type=int, default=None, help="kept rows per critic mini-batch (PPO with GAE)")
    add("--oversample", "--oversample_prompts", type=float, default=1.0, help="oversample_prompts (>= 1; default 1)")
    add("--rule", "--downsample_rule", default="max_variance", help="down-sampling rule (default max_variance)")
    add("--tiebreak", "--downsample_tiebreak", default="index", help="index, shorter or longer (default index)")
    add("--trainer-mode", default="sync", help="sync or colocate_async (default sync)")
    add("--prompt_planner", default=None, help="which prompts get rollouts: greso")
    add("--prompt_planner_args", type=_json_mapping, default=None,
        help="its settings as JSON, e.g. '{\"p_easy\": 0.3}'")
    add("--rollout_planner", default=None, help="how many rollouts: knapsack (rollout.n each on average, up to max_n) "
                                                "or reinforce_ada (rounds of n)")
    add("--rollout_planner_args", type=_json_mapping, default=None,
        help="its settings as JSON, e.g. '{\"max_n\": 128}'")
    add("--refill-rounds", type=int, default=None, help="refills per dispatch before skipped prompts are admitted "
                                                         "(default 4)")
    one_line_parser_errors(parser)
    return parser


def _json_mapping(text: str) -> dict:
    """A planner's settings: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of the planner's settings, got {text!r}")
    return value


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    oversample = int(args.oversample) if float(args.oversample).is_integer() else args.oversample
    batch = verl_batch_settings(args.prompts, args.n, args.m, args.dp, args.mini_batch,
                                critic_mini_batch=args.critic_mini_batch, oversample_prompts=oversample,
                                rule=args.rule, tiebreak=args.tiebreak, trainer_mode=args.trainer_mode,
                                planners={key: getattr(args, key) for key in PLANNER_KEYS})
    print("\n".join(batch.overrides))
    print(batch.summary(args.n, args.m, args.dp), file=sys.stderr)
    return 0
