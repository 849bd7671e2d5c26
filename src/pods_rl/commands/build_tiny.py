"""``pods build-tiny``: rebuild the embedded tiny model (``pods_rl.engines.trl.sft.build_tiny``)."""

from __future__ import annotations

import argparse
import os

from pods_rl.engines.trl.sft import build_tiny
from pods_rl.errors import one_line_parser_errors, run_guarded, spellings
from pods_rl.tiny import ASSETS_DIR


def main(argv: list[str] | None = None) -> int:
    """``pods build-tiny [--out DIR] [--steps N] ...``: rebuild the embedded tiny model (see ``build_tiny``);
    exit code 0, 2 on bad input, 1 on another failure."""
    return run_guarded("pods build-tiny", _main, argv)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pods build-tiny", description=build_tiny.__doc__.split("\n")[0])
    parser.add_argument("--out", dest="out_dir", metavar="OUT", default=None,
                        help=f"output directory (default: the shipped copy, {ASSETS_DIR})")
    parser.add_argument("--steps", type=int, default=4000,
                        help="SFT optimizer steps (the model shipped before issue #24, 4 heads, had 1500)")
    parser.add_argument(*spellings("--batch-size"), type=int, default=64)
    parser.add_argument("--lr", dest="learning_rate", metavar="LR", type=float, default=3e-3)
    parser.add_argument(*spellings("--wrong-fraction"), type=float, default=0.3,
                        help="share of SFT targets whose final result is off by 1..10 (makes the model partly right)")
    parser.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    parser.add_argument(*spellings("--hidden-size"), type=int, default=64)
    parser.add_argument(*spellings("--num-layers"), type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(*spellings("--num-heads"), type=int, default=None,
                        help="attention heads (default: hidden size // 32, i.e. head dim 32, which vLLM's CPU "
                             "build serves; the model shipped before issue #24 had 4, head dim 16)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for the build (the shipped model was built with 1)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    parser.add_argument(*spellings("--max-seconds"), type=float, default=None,
                        help="end the SFT after this many seconds even before --steps (a time limit)")
    parser.add_argument(*spellings("--eval-problems"), type=int, default=200,
                        help="held-out problems in build_info.json")
    one_line_parser_errors(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach for the hub
    build_tiny(**vars(args))  # each flag's dest is build_tiny's keyword
    return 0
