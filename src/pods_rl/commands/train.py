"""`pods train`: a recipe -> task, model, PODSTrainer -> a run directory (build, fit, summary).

    pods train                                   # the embedded default: tiny model, arithmetic task, CPU
    pods train --config gsm8k/pods               # a packaged recipe by name (src/pods_rl/recipes/...)
    pods train --config my.yaml --output_dir runs/x --resume_from_checkpoint true

Flags are the fields of ``RunArguments``, ``pods_rl.PODSConfig`` and ``trl.ModelConfig`` (``pods_rl.recipes``).
The run itself is ``pods_rl.training_run``; this module parses, handles signals and exit codes, and prints."""

from __future__ import annotations

import sys

from pods_rl import ranks, runlog
from pods_rl.errors import run_guarded
from pods_rl.recipes import parse_args
from pods_rl.runlog import RunFinished
from pods_rl.training_run import (  # noqa: F401  (re-exported: these lived here before pods_rl.training_run)
    EVAL_KEYS,
    RunFailed,
    build,
    default_run_dir,
    fit,
    train,
)


def main(argv: list[str] | None = None) -> int:
    """Run ``pods train``; returns the exit code (0 done or already finished, 2 bad input, 1 failed,
    128 + signal number when stopped by a signal, 130 when aborted). ``--debug``: a traceback, not one line."""
    return run_guarded("pods train", _main, argv)


def _main(argv: list[str]) -> int:
    config, stop = None, runlog.GracefulStop()
    try:
        run, config, model_args = parse_args(argv)
        # From here a signal aborts at once (and a run directory made by this start is removed) until training
        # begins; then it finishes the step and saves.
        with stop.handling_signals():
            trainer, clock, eval_fn = build(run, config, model_args, stop=stop)
            summary = fit(trainer, clock, eval_fn)
    except RunFinished as done:  # not an error: nothing to do
        print(f"pods train: {done}")
        return 0
    except KeyboardInterrupt as err:  # a second SIGINT / SIGTERM, or Ctrl-C before training started
        run_dir = config.output_dir if config is not None and config.output_dir else "RUN_DIR"
        raise RunFailed(f"aborted; {run_dir} keeps its complete checkpoints (resume with --output_dir {run_dir} "
                        "--resume_from_checkpoint true)", exit_code=130) from err
    except (Exception, SystemExit) as err:  # this rank's own end, for the ranks left to name it in theirs
        ranks.record_exit(config.output_dir if config is not None else None, err)
        raise
    ranks.record_exit(config.output_dir, None)  # a clean end is not a death to the ranks still finishing
    return summary.get("exit_code", 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
