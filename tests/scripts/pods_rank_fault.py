"""`pods` with a task whose judge fails on one rank, for tests/test_rank_failure.py under `accelerate launch`:
``PODS_FAULT_RANK`` (the rank), ``PODS_FAULT_STEP`` (from this step on) and ``PODS_FAULT``: ``raise`` (an error
of its own), ``sleep`` (rank ``PODS_SLEEP_RANK`` sleeps in a step from then on, after writing ``PODS_FAULT_MARK``)
``slow_logs`` (rank 0 takes ``PODS_LOG_SECONDS`` more to write each metrics row, outside its step: what a slow
disk or a large checkpoint does; the other rank waits for it inside its next step, so their own clocks drift apart)
``slow_saves`` (rank 0 takes ``PODS_SAVE_SECONDS`` more to write each checkpoint, in its last file, pods_clock.json,
after the trainer's own save and its barrier: a slow shared file system; training time must not count it)
``mismatch`` (from its ``PODS_FAULT_STEP``-th clock agreement on, rank ``PODS_FAULT_RANK`` reduces 64 values where
its peer reduces 1: a collective mismatch, which gloo answers with an abort) or ``none`` (no fault: a plain run,
for the SIGKILL / SIGSTOP cases). With any of them, ``PODS_EXIT_SECONDS``: rank 0 takes that much longer to
record its own failure (a slow shared file system), after its signal handlers are gone and before its line is
printed: the launcher's SIGTERM for a dead peer arrives in between."""

import os
import sys
import time
from dataclasses import dataclass

from pods_rl.commands.cli import main
from pods_rl.tasks import register_task
from pods_rl.tasks.arithmetic import ArithmeticTask


def judge(prompts, completions, trainer_state=None, **kwargs):
    step = trainer_state.global_step if trainer_state is not None else 0
    if (os.environ.get("PODS_FAULT") == "raise" and os.environ.get("RANK") == os.environ.get("PODS_FAULT_RANK")
            and step >= int(os.environ.get("PODS_FAULT_STEP", "0"))):
        raise ZeroDivisionError(f"the judge failed at step {step}")
    if (os.environ.get("PODS_FAULT") == "sleep" and os.environ.get("RANK") == os.environ.get("PODS_SLEEP_RANK", "0")
            and step >= int(os.environ.get("PODS_FAULT_STEP", "0"))):
        open(os.environ["PODS_FAULT_MARK"], "w").write("sleeping")
        time.sleep(600)  # a long step (a slow judge, a long generation): no collective for minutes
    return [0.0] * len(completions)


@dataclass
class RankFault(ArithmeticTask):
    name: str = "rankfault"
    reward_weights: tuple = (1.0, 0.1, 0.1, 1.0)

    def reward_funcs(self):
        return [*ArithmeticTask.reward_funcs(self), judge]


register_task("rankfault", RankFault)
if os.environ.get("PODS_FAULT") == "slow_logs" and os.environ.get("RANK") == "0":
    from pods_rl.runlog.callbacks import TrainingClock

    write_row = TrainingClock.append_metrics

    def slow_append_metrics(self, row):
        time.sleep(float(os.environ.get("PODS_LOG_SECONDS", "0.3")))
        write_row(self, row)

    TrainingClock.append_metrics = slow_append_metrics
if os.environ.get("PODS_FAULT") == "slow_saves" and os.environ.get("RANK") == "0":
    from pods_rl.runlog.callbacks import TrainingClock

    write_clock = TrainingClock.on_save

    def slow_on_save(self, args, state, control, **kwargs):
        time.sleep(float(os.environ.get("PODS_SAVE_SECONDS", "1.5")))
        return write_clock(self, args, state, control, **kwargs)

    TrainingClock.on_save = slow_on_save
if os.environ.get("PODS_FAULT") == "mismatch" and os.environ.get("RANK") == os.environ.get("PODS_FAULT_RANK"):
    from pods_rl import ranks

    agree, calls = ranks.agree_max, []

    def mismatched_agree_max(values):
        calls.append(1)
        if len(calls) >= int(os.environ.get("PODS_FAULT_STEP", "0")):
            values = [*values, *[0.0] * 63]
        return agree(values)[:1]

    ranks.agree_max = mismatched_agree_max
if os.environ.get("PODS_EXIT_SECONDS") and os.environ.get("RANK") == "0":
    from pods_rl import ranks

    record_exit = ranks.record_exit

    def slow_record_exit(*args, **kwargs):
        time.sleep(float(os.environ["PODS_EXIT_SECONDS"]))
        record_exit(*args, **kwargs)

    ranks.record_exit = slow_record_exit
sys.exit(main(sys.argv[1:]))
