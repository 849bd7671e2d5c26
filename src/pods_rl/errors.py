"""How a failure reaches the user: one line naming the problem and the fix.

Library code raises ``ValueError`` (bad input) or ``CommandFailed`` (an expected failure whose message already says what
to do); every command runs its body through ``run_guarded``, which prints that message as one line and exits non-zero.
This module sits below the commands (``pods_rl.commands.cli`` re-exports it), so that a command or a library module can
use it without importing a command."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Sequence

# How storage failures read when a library does not raise an OSError with its errno (safetensors' SafetensorError,
# torch's zip writer, tokenizers' Exception...): (errno, words in messages, what it is, the way on).
_STORAGE_FAULTS = (
    (errno.ENOSPC, ("No space left on device", "file write failed"), "disk full", "free some space"),
    (getattr(errno, "EDQUOT", -1), ("Disk quota exceeded",), "disk quota exceeded", "free some of your quota"),
    (errno.EROFS, ("Read-only file system",), "the file system is read-only",
     "remount it writable"),
    (errno.EIO, ("Input/output error",), "an I/O error (a failing disk or network file system)",
     "check the disk or network file system"),
)


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


def spellings(*names: str) -> list[str]:
    """``names`` for ``add_argument``, each followed by its other spelling (``--eval-k`` -> ``--eval-k``,
    ``--eval_k``): `pods train` takes a flag with hyphens or underscores (HfArgumentParser), so every `pods` command
    does. The first name gives the argument's ``dest``."""
    out: list[str] = []
    for name in names:
        stem = name[2:] if name.startswith("--") else None
        variants = [name] if stem is None else [name, "--" + stem.replace("-", "_"), "--" + stem.replace("_", "-")]
        for variant in variants:
            if variant not in out:
                out.append(variant)
    return out


def split_debug(argv: Sequence[str] | None) -> tuple[list[str], bool]:
    """``argv`` without ``--debug``, and whether it was there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return [a for a in argv if a != "--debug"], "--debug" in argv


def exception_chain(err: BaseException) -> list[BaseException]:
    """``err`` and every exception it was raised from or while handling (``__cause__``, ``__context__``)."""
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def storage_fault(err: BaseException) -> tuple[str, str] | None:
    """``(what, the way on)`` when a storage fault caused ``err`` anywhere in its chain, whatever the library raised
    it as (its errno, or its message): a full disk, an exceeded quota, a read-only or failing file system."""
    for item in exception_chain(err):
        code, text = getattr(item, "errno", None), str(item)
        for number, needles, what, way_on in _STORAGE_FAULTS:
            if code == number or any(needle in text for needle in needles):
                return what, way_on
    return None


def error_line(prog: str, err: BaseException) -> tuple[str, int]:
    """The one line (and exit code) that reports ``err``: a full disk as such (from any library); a user error
    (ValueError, FileNotFoundError, CommandFailed) by its message; anything else also by its type, with the --debug
    hint."""
    fault = None if isinstance(err, CommandFailed) else storage_fault(err)
    if fault is not None:
        where = getattr(next((e for e in exception_chain(err) if getattr(e, "filename", None)), None), "filename", None)
        return (f"{prog}: error: {fault[0]}{f' writing {where}' if where else ''}: {fault[1]} (or write elsewhere) "
                "and run the command again; what was written completely before is intact"), 1
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    if "Weights only load failed" in text or "weights_only" in first:
        # torch's refusal of a pickle advises loading it unsafely: the one thing not to do with a file of unknown
        # origin. Say what it is instead.
        first = ("a file holds pickled Python objects, not only tensors: refused unread, since loading it could run "
                 "code; use a file you made yourself or one from a source you trust")
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
        # One write with its newline: on an unbuffered stderr that a launcher shares between ranks, print's two
        # writes (text, then newline) let another process's log line land inside this one.
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        return code
