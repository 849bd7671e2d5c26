"""How a failure reaches the user: one line naming the problem and the fix.

Library code raises ``ValueError`` (bad input) or ``CommandFailed`` (an expected failure whose message already says
what to do); every command runs its body through ``run_guarded``, which prints that message as one line and exits
non-zero. This module sits below the commands (``pods_rl.cli`` re-exports it), so that a command or a library
module can use it without importing a command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


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
