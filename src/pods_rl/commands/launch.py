"""``pods accelerate-config NAME``: the path of a shipped accelerate launch config (``ddp``, ``zero2``, ``zero3``,
``fsdp``), for ``accelerate launch --config_file $(pods accelerate-config zero2) -m pods_rl.commands.cli train ...``."""

from __future__ import annotations

from pathlib import Path

from pods_rl.errors import run_guarded

ACCELERATE_DIR = Path(__file__).parent.parent / "recipes" / "accelerate"


def accelerate_configs() -> list[str]:
    """The names of the shipped accelerate launch configs."""
    return sorted(p.stem for p in ACCELERATE_DIR.glob("*.yaml"))


def accelerate_config(name: str) -> Path:
    """The path of the shipped accelerate launch config ``name`` (``ddp``, ``zero2``, ``zero3``, ``fsdp``)."""
    path = ACCELERATE_DIR / f"{Path(name).stem}.yaml"
    if not path.is_file():
        raise ValueError(f"no accelerate config {name!r}; shipped: {', '.join(accelerate_configs())}")
    return path


def main(argv: list[str] | None = None) -> int:
    """`pods accelerate-config NAME`: print the installed path of a shipped accelerate config; returns the exit code."""
    return run_guarded("pods accelerate-config", _main, argv)


def _main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        if argv and argv[0] in ("-h", "--help"):
            print(__doc__)
            return 0
        raise ValueError(f"give one config name: {', '.join(accelerate_configs())} "
                         "(e.g. accelerate launch --config_file $(pods accelerate-config zero2) "
                         "-m pods_rl.commands.cli train --config gsm8k/pods)")
    print(accelerate_config(argv[0]))
    return 0
