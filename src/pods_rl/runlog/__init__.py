"""The run directory: everything one run produced, read and written through this package alone.

    store.py (layout, config, metrics, checkpoints, resume)   lock.py (one owner)   ours.py (is it a run)
    integrity.py (checkpoint files)   data.py (training rows)   evals.py (eval.json)   divergence.py (NaN guard)
    callbacks.py (what writes it while training; needs transformers, loaded on first use)"""

from __future__ import annotations

from pods_rl.runlog.data import (  # noqa: F401
    DATA_FIELDS,
    DATA_FILE,
    check_data_change,
    data_fingerprint,
    read_data_record,
    record_data,
)
from pods_rl.runlog.evals import (  # noqa: F401  (the package's API)
    already_done,
    checkpoint_clock,
    default_out_for_model,
    find_checkpoints,
    is_adapter_dir,
    is_model_dir,
    is_run_dir,
    is_skip,
    load_entries,
    load_results,
    load_skips,
    record_entries,
    result_key,
    save_results,
    upsert_result,
)
from pods_rl.runlog.integrity import (  # noqa: F401
    CheckpointUnreadable,
    check_resume_checkpoint,
    checkpoint_problems,
    intact_before,
    load_problems,
    loader_error,
    reading_checkpoint,
)
from pods_rl.runlog.lock import LOCK_FILE, RunDirInUse, hold_run_dir  # noqa: F401
from pods_rl.runlog.ours import check_not_foreign, foreign_entries, is_pods_run  # noqa: F401
from pods_rl.runlog.store import (  # noqa: F401  (the package's API)
    CLOCK_FILE,
    CONFIG_FILE,
    DEFAULT_EVAL_FILE,
    KEY_FIELDS,
    METRICS_FILE,
    NOT_TRAINING_FIELDS,
    REUSE_FIELDS,
    RUN_MARKER,
    SET_ASIDE_DIR,
    SUMMARY_FILE,
    RunFinished,
    check_output_dir,
    clock_problem,
    config_changes,
    disk_full_message,
    free_name,
    holds_a_run,
    is_checkpoint_name,
    list_checkpoints,
    load_run_config,
    mark_as_run,
    move_aside,
    plan_resume,
    prepare_resume,
    read_clock,
    read_metrics,
    read_summary,
    remove_incomplete,
    run_finished,
    run_stopped,
    save_config,
    set_aside,
    write_clock,
    write_json_atomic,
    write_summary,
)

_CALLBACKS = ("TrainingClock", "GracefulStop", "StopNow", "ApplyOptimizerSettings")


def __getattr__(name):
    if name in _CALLBACKS:
        # Lazy: the callbacks import transformers (seconds); reading a run directory does not need them.
        from pods_rl.runlog import callbacks

        return getattr(callbacks, name)
    raise AttributeError(f"module 'pods_rl.runlog' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_CALLBACKS])
