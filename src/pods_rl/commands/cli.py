"""The ``pods`` command: a thin dispatcher; each sub-command's options live beside the code it runs.

    pods train [--config recipe.yaml] [--key value ...]   RL training (GRPO / GRPO-PODS) -> run directory
    pods eval  MODEL_OR_RUN_DIR [--task ...]              accuracy over checkpoints -> eval.json
    pods plot  RUN_DIR[=LABEL] ...                        accuracy vs training time, time per phase
    pods compare RUN_DIR[=LABEL] ...                      time-to-target and speed-up vs a baseline
    pods cost  [--config recipe.yaml] [--n 8,16,32] ...   seconds per step: GRPO (n = m) vs PODS (n -> m)
    pods study [--config recipe.yaml] [--seeds 4] ...     does PODS pay here? GRPO vs PODS over seeds, with CIs
    pods build-tiny                                       rebuild the embedded tiny model
    pods accelerate-config ddp|zero2|zero3|fsdp           path of a shipped `accelerate launch` config
    pods verl-args --prompts B --n N --m M --dp D --mini-batch R   verl overrides for PODS in kept terms

Each command module is imported only when its sub-command runs (TRL, torch and matplotlib load in seconds).
Every sub-command reports a user error as one line on stderr (exit 2) and any other failure as one line
naming the exception (exit 1); add --debug to see the full traceback instead.
"""

from __future__ import annotations

import importlib
import sys

import pods_rl
from pods_rl.errors import (  # noqa: F401  (re-exported: these lived here before pods_rl.errors)
    CommandFailed,
    error_line,
    one_line_parser_errors,
    run_guarded,
    split_debug,
)

COMMANDS = {
    "train": ("pods_rl.commands.train", "main"),
    "eval": ("pods_rl.commands.evaluate", "main"),
    "plot": ("pods_rl.commands.plots", "plot_main"),
    "compare": ("pods_rl.commands.plots", "compare_main"),
    "cost": ("pods_rl.commands.cost", "main"),
    "study": ("pods_rl.commands.study", "main"),
    "build-tiny": ("pods_rl.commands.build_tiny", "main"),
    "accelerate-config": ("pods_rl.commands.launch", "main"),
    "verl-args": ("pods_rl.commands.verl_args", "main"),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pods`` console script. With no sub-command, runs ``pods train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] in ("-V", "--version"):
        print(pods_rl.__version__)
        return 0
    command = "train" if not argv or argv[0].startswith("-") else argv.pop(0)
    if command not in COMMANDS:
        print(f"pods: unknown command {command!r}; choose one of: {', '.join(COMMANDS)} (see `pods --help`)",
              file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[command]
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
