"""The transformers ``TrainerCallback``s through which a training run writes its run directory.

    TrainingClock           training time (sum of optimizer-step durations), time-based checkpoints and stop,
                            periodic evaluation, one ``metrics.jsonl`` row per log; ``pods_clock.json`` last
    GracefulStop            SIGTERM / SIGINT: finish the step, save a complete checkpoint, stop
    ApplyOptimizerSettings  a resume with accepted config changes: put the new hyper-parameters in the optimizer

Kept apart from ``runlog.store`` because these need transformers (``TrainerCallback``, seconds to import) while
reading a run directory (``pods compare``, ``pods plot``, the benchmarks) should not.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from transformers import TrainerCallback

from pods_rl.runlog.store import CLOCK_FILE, METRICS_FILE, json_default, remove_incomplete, write_json_atomic

logger = logging.getLogger("pods_rl.runlog")


class TrainingClock(TrainerCallback):
    """Training-time clock, time-based checkpoints and stop, periodic evaluation, and ``metrics.jsonl``.

    Args:
        run_dir: the run directory (``metrics.jsonl`` and checkpoints live there).
        save_every_seconds: save a checkpoint every this many training seconds (None: off).
        max_train_seconds: stop and save once training time reaches this (None: off).
        eval_fn: ``eval_fn(model) -> dict`` of metrics (e.g. ``{"accuracy": 0.4}``); logged as ``eval/<key>``.
        eval_every_seconds: run ``eval_fn`` every this many training seconds; with ``eval_fn`` it also runs
            before the first step and after the last.
        eval_every_steps: run ``eval_fn`` every this many optimizer steps (as well as, or instead of, the
            seconds-based schedule): curves against policy updates then share their x values across runs.
        train_seconds: training time already spent (when resuming).
        is_main_process: only the main process writes files.
    """

    def __init__(self, run_dir, save_every_seconds=None, max_train_seconds=None,
                 eval_fn: Callable | None = None, eval_every_seconds=None, train_seconds=0.0,
                 is_main_process=True, progress=False, eval_every_steps=None):
        self.run_dir = Path(run_dir)
        self.save_every_seconds = save_every_seconds
        self.max_train_seconds = max_train_seconds
        self.eval_fn = eval_fn
        self.eval_every_seconds = eval_every_seconds
        self.eval_every_steps = eval_every_steps
        self.train_seconds = float(train_seconds)
        self.is_main_process = is_main_process
        self._step_start = None
        self._next_save = self._next_multiple(save_every_seconds)
        self._next_eval = self._next_multiple(eval_every_seconds)
        self.eval_seconds = 0.0  # wall time spent evaluating (not training time)
        # A time budget makes a step count meaningless for progress: show training seconds instead.
        self.progress = progress and max_train_seconds is not None and is_main_process
        self._bar = None

    def _next_multiple(self, every):
        if not every:
            return math.inf
        return (math.floor(self.train_seconds / every) + 1) * every

    def append_metrics(self, row: dict) -> None:
        """Append one row to ``metrics.jsonl`` (one write + flush per row: a kill can tear at most the last line)."""
        if not self.is_main_process:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(row, default=json_default) + "\n")
            f.flush()

    def evaluate(self, model, step: int) -> dict:
        """Run ``eval_fn`` now (outside the training clock) and log its metrics."""
        start = time.perf_counter()
        was_training = model.training
        model.eval()
        try:
            results = self.eval_fn(model)
        finally:
            model.train(was_training)
        self.eval_seconds += time.perf_counter() - start
        row = {"step": step, "train_seconds": round(self.train_seconds, 3)}
        row.update({f"eval/{k}": v for k, v in results.items() if isinstance(v, (int, float))})
        self.append_metrics(row)
        if self._bar is not None and "accuracy" in results:
            self._bar.write(f"step {step:>5}  training time {self.train_seconds:6.0f} s  "
                            f"held-out accuracy {100 * results['accuracy']:.1f}%")
        return results

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=round(self.max_train_seconds), initial=round(self.train_seconds),
                             unit="s", desc="training time", dynamic_ncols=True)
        if self.eval_fn is not None and state.global_step == 0:
            self.evaluate(model, 0)

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self._step_start is not None:
            self.train_seconds += time.perf_counter() - self._step_start
            self._step_start = None
        if self._bar is not None:
            self._bar.update(max(0, min(round(self.train_seconds), self._bar.total) - self._bar.n))
        if self.train_seconds >= self._next_save:
            control.should_save = True
            self._next_save = self._next_multiple(self.save_every_seconds)
        if self.max_train_seconds is not None and self.train_seconds >= self.max_train_seconds:
            control.should_training_stop = True
            control.should_save = True
        last_step = control.should_training_stop or (state.max_steps and state.global_step >= state.max_steps)
        step_due = bool(self.eval_every_steps) and state.global_step % self.eval_every_steps == 0
        if self.eval_fn is not None and (self.train_seconds >= self._next_eval or step_due or last_step):
            self._next_eval = self._next_multiple(self.eval_every_seconds)
            self.evaluate(model, state.global_step)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        row = {"step": state.global_step, "train_seconds": round(self.train_seconds, 3)}
        row.update(logs or {})
        self.append_metrics(row)
        if self._bar is not None and "reward" in row:
            self._bar.set_postfix(step=state.global_step, reward=f"{row['reward']:.3f}")

    def on_train_end(self, args, state, control, **kwargs):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_save(self, args, state, control, **kwargs):
        # Written last and atomically: its presence marks the checkpoint complete.
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.is_main_process and checkpoint.is_dir():
            write_json_atomic(checkpoint / CLOCK_FILE,
                              {"step": state.global_step, "train_seconds": self.train_seconds})
            remove_incomplete(self.run_dir, state.global_step)


class GracefulStop(TrainerCallback):
    """SIGTERM / SIGINT: finish the current optimizer step, save a complete checkpoint, stop training.

    ``handling_signals()`` installs the handlers (main thread only). While training runs, the first signal is
    noted and acted on at the end of the step (the checkpoint save that follows writes the training clock); a
    second one raises KeyboardInterrupt at once. Outside training (model loading, the final save and evaluation)
    there is no step to finish, so a signal aborts at once. A SIGTERM within ``DUPLICATE_SECONDS`` of the first
    is taken as the same request.

    With several processes, the ranks agree at each step end (one all-reduce of a flag): a launcher may deliver
    the signal to the ranks at different moments, and a rank that stopped a step before the others would leave
    them waiting in the next collective.
    """

    # A SIGTERM this soon after the first is the same request delivered twice (a scheduler signals every process
    # of the job, and the launcher passes its own copy on to the ranks), not a user insisting.
    DUPLICATE_SECONDS = 2.0

    def __init__(self):
        self.signal_name: str | None = None
        self.training = False
        self._first_at = 0.0

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if (name == "SIGTERM" and self.signal_name == "SIGTERM"
                and time.monotonic() - self._first_at < self.DUPLICATE_SECONDS):
            logger.warning("SIGTERM again within %.0f s: the same request, still finishing the step",
                           self.DUPLICATE_SECONDS)
            return
        if self.signal_name is not None or not self.training:
            raise KeyboardInterrupt(f"{name}: aborting")
        self.signal_name, self._first_at = name, time.monotonic()
        logger.warning("%s: finishing this step, then saving a checkpoint and stopping (send it again to abort "
                       "at once)", name)

    @contextmanager
    def handling_signals(self):
        """Route SIGTERM and SIGINT to this callback inside the block (no-op off the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def on_train_begin(self, args, state, control, **kwargs):
        self.training = True

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False

    def on_step_end(self, args, state, control, **kwargs):
        requested = self.signal_name is not None
        if _world_size() > 1:
            requested = _any_rank(requested)
            if requested and self.signal_name is None:
                self.signal_name = "SIGTERM"  # another rank got it; this one stops at the same step
        if requested:
            control.should_save = True
            control.should_training_stop = True
        return control


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (all ranks must call this at the same point)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class ApplyOptimizerSettings(TrainerCallback):
    """On a resume with accepted config changes: the checkpoint's optimizer and scheduler state carry the old
    learning rate, betas, epsilon and weight decay (``load_state_dict`` restores them); put the new ones in."""

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if optimizer is None:
            return
        groups = optimizer.param_groups
        for group in groups:
            group["initial_lr"] = args.learning_rate
            if "betas" in group:
                group["betas"] = (args.adam_beta1, args.adam_beta2)
            if "eps" in group:
                group["eps"] = args.adam_epsilon
        # transformers.Trainer builds [decayed weights, no-decay biases and norms]; the loaded state carries the old
        # decay in the first group (even 0.0), and the second one stays without.
        for i, group in enumerate(groups):
            if "weight_decay" in group and (i == 0 if len(groups) == 2 else group["weight_decay"]):
                group["weight_decay"] = args.weight_decay
        if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
            lr_scheduler.base_lrs = [args.learning_rate] * len(groups)
            lambdas = getattr(lr_scheduler, "lr_lambdas", None)
            for group, base, fn in zip(groups, lr_scheduler.base_lrs, lambdas or [None] * len(groups)):
                group["lr"] = base * fn(lr_scheduler.last_epoch) if fn else base
            lr_scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() (the log) reports
        else:
            for group in groups:
                group["lr"] = args.learning_rate
