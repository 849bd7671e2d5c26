"""The ``pods`` command: a thin dispatcher; each sub-command's options live beside the code it runs.

    pods train [--config recipe.yaml] [--key value ...]   RL training (GRPO / GRPO-PODS) -> run directory
    pods eval  MODEL_OR_RUN_DIR [--task ...]              accuracy over checkpoints -> eval.json
    pods plot  RUN_DIR[=LABEL] ...                        accuracy vs training time, time per phase
    pods compare RUN_DIR[=LABEL] ...                      time-to-target and speed-up vs a baseline
    pods cost  [--config recipe.yaml] [--n 8,16,32] ...   seconds per step: GRPO (n = m) vs PODS (n -> m)
    pods study [--config recipe.yaml] [--seeds 4] ...     does PODS pay here? GRPO vs PODS over seeds, with CIs
    pods build-tiny                                       rebuild the embedded tiny model
    pods accelerate-config ddp|zero2|zero3|fsdp           path of a shipped `accelerate launch` config

Every sub-command reports a user error as one line on stderr (exit 2) and any other failure as one line
naming the exception (exit 1); add --debug to see the full traceback instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

COMMANDS = {
    "train": ("pods_rl.train", "main"),
    "eval": ("pods_rl.evaluate", "main"),
    "plot": ("pods_rl.plots", "plot_main"),
    "compare": ("pods_rl.plots", "compare_main"),
    "cost": ("pods_rl.cost", "main"),
    "study": ("pods_rl.study", "main"),
    "build-tiny": ("pods_rl.tiny", "main"),
    "accelerate-config": ("pods_rl.launch", "main"),
}


class CommandFailed(Exception):
    """A failure whose message already says what happened and what to do (printed as is, exit ``exit_code``)."""

    exit_code = 1


def one_line_parser_errors(parser) -> None:
    """Make ``parser`` raise a ValueError for a bad flag instead of printing its usage and exiting: argparse's
    usage for `pods train` runs to 200 lines and buries the one that matters."""
    prog = parser.prog

    def error(message):
        raise ValueError(f"{message} (see `{prog} --help`)")

    parser.error = error


def split_debug(argv: Sequence[str] | None) -> tuple[list[str], bool]:
    """``argv`` without ``--debug``, and whether it was there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return [a for a in argv if a != "--debug"], "--debug" in argv


def error_line(prog: str, err: BaseException) -> tuple[str, int]:
    """The one line (and exit code) that reports ``err``: a user error (ValueError, FileNotFoundError,
    CommandFailed) by its message; anything else also by its type, with the --debug hint."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(err, (ValueError, FileNotFoundError)):
        return f"{prog}: error: {first or type(err).__name__}", 2
    if isinstance(err, CommandFailed):
        return f"{prog}: error: {first}", err.exit_code
    return f"{prog}: error: {type(err).__name__}: {first} (--debug shows the full traceback)", 1


def run_guarded(prog: str, body: Callable[[list[str]], int | None], argv: Sequence[str] | None) -> int:
    """``body(argv)`` with every failure turned into one line on stderr and an exit code (2 for a user error,
    1 otherwise, 130 when interrupted before anything was handled); ``--debug`` re-raises instead."""
    argv, debug = split_debug(argv)
    try:
        return int(body(argv) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the CLI's one place that reports failures
        if debug:
            raise
        line, code = error_line(prog, err)
        print(line, file=sys.stderr)
        return code


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pods`` console script. With no sub-command, runs ``pods train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] in ("-V", "--version"):
        from pods_rl import __version__

        print(__version__)
        return 0
    command = "train" if not argv or argv[0].startswith("-") else argv.pop(0)
    if command not in COMMANDS:
        print(f"pods: unknown command {command!r}; choose one of: {', '.join(COMMANDS)} (see `pods --help`)",
              file=sys.stderr)
        return 2
    import importlib

    module_name, func_name = COMMANDS[command]
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
