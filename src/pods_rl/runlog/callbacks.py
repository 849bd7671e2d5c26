"""The transformers ``TrainerCallback``s through which a training run writes its run directory: TrainingClock
(training time, time-based saves and stop, evaluations, metrics rows), GracefulStop (SIGTERM / SIGINT) and
ApplyOptimizerSettings. Apart from ``runlog.store`` because they import transformers, which reading a run should not."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from transformers import TrainerCallback

from pods_rl import activity, ranks
from pods_rl.runlog.store import CLOCK_FILE, METRICS_FILE, json_default, remove_incomplete, write_json_atomic

logger = logging.getLogger("pods_rl.runlog")


class TrainingClock(TrainerCallback):
    """Training-time clock, time-based checkpoints and stop, periodic evaluation, and ``metrics.jsonl``.

    ``eval_fn(model)`` returns metrics logged as ``eval/<key>``, run before the first step, after the last and on the
    ``eval_every_*`` schedules. ``train_seconds``: already spent (resume). Only the main process writes."""

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
        self.last_eval_step: int | None = None  # the step of the last evaluation (every rank knows it)
        # A time budget makes a step count meaningless for progress: show training seconds instead (on the main
        # process only: ``is_main_process`` may be set after construction, once the trainer knows it).
        self.progress = progress and max_train_seconds is not None
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
            with activity.doing("an evaluation"):
                results = self.eval_fn(model)
        finally:
            model.train(was_training)
        self.eval_seconds += time.perf_counter() - start
        self.last_eval_step = step
        row = {"step": step, "train_seconds": round(self.train_seconds, 3)}
        row.update({f"eval/{k}": v for k, v in results.items() if isinstance(v, (int, float))})
        self.append_metrics(row)
        if self._bar is not None and "accuracy" in results:
            self._bar.write(f"step {step:>5}  training time {self.train_seconds:6.0f} s  "
                            f"held-out accuracy {100 * results['accuracy']:.1f}%")
        return results

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        """Open the progress bar and evaluate the starting model (step 0 of a fresh run)."""
        if self.progress and self.is_main_process:
            from tqdm.auto import tqdm

            # Counts seconds of training time (not steps; no "s/s" rate), against wall time elapsed and left.
            self._bar = tqdm(total=round(self.max_train_seconds), initial=round(self.train_seconds),
                             desc="training time", dynamic_ncols=True,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s "
                                        "[wall {elapsed}, ~{remaining} left{postfix}]")
        if self.eval_fn is not None and state.global_step == 0:
            self.evaluate(model, 0)

    def on_step_begin(self, args, state, control, **kwargs):
        """Start this step's clock once every rank is there: waiting for rank 0's writes is not training."""
        ranks.start_step_together(state)
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        """Add the step's seconds to the clock; ask for a save, the stop or an evaluation when due.

        With several processes the ranks first agree on one clock (the slowest rank's, one all-reduce), so every
        decision is taken by all ranks at the same step: a rank acting alone would leave the others in a collective."""
        if self._step_start is not None:
            self.train_seconds += time.perf_counter() - self._step_start
            self._step_start = None
        self.train_seconds = ranks.agree_max([self.train_seconds])[0]
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
        """Append the logged row, with the step and the training seconds, to ``metrics.jsonl``."""
        row = {"step": state.global_step, "train_seconds": round(self.train_seconds, 3)}
        row.update(logs or {})
        self.append_metrics(row)
        if self._bar is not None and "reward" in row:
            # The mean of the weighted sum of the reward functions: 0 to the sum of the weights for rewards in [0, 1]
            # (a pods-rl task's: correctness 1 + format 0.1 + tag count 0.1 = 1.2).
            weights = getattr(args, "reward_weights", None) or []
            top = sum(float(w) for w in weights if float(w) > 0)
            scale = f" (weighted, 0-{top:g})" if top else ""
            self._bar.set_postfix_str(f"step {state.global_step}, reward {row['reward']:.3f}{scale}")

    def on_train_end(self, args, state, control, **kwargs):
        """Close the progress bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_save(self, args, state, control, **kwargs):
        """Write the checkpoint's ``pods_clock.json`` (step, training seconds), which marks it complete."""
        # Written last and atomically: its presence marks the checkpoint complete.
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.is_main_process and checkpoint.is_dir():
            write_json_atomic(checkpoint / CLOCK_FILE,
                              {"step": state.global_step, "train_seconds": self.train_seconds})
            remove_incomplete(self.run_dir, state.global_step)


class StopNow(BaseException):
    """The stop's grace ran out mid-step: abandon it at the last complete step (``where``: what was running)."""

    def __init__(self, where: str, waited: float):
        super().__init__(f"the step did not end within {waited:.0f} s of the stop request (it was in {where})")
        self.where, self.waited = where, waited


class GracefulStop(TrainerCallback):
    """SIGTERM / SIGINT: finish the step, save a complete checkpoint and stop within ``grace_seconds``.

    During training the first signal acts at the step's end and a second raises KeyboardInterrupt; outside training a
    signal aborts at once. A watchdog thread raises ``StopNow`` in a step that outlives its share of the grace, and
    ends the process ``HARD_EXIT_MARGIN`` s before the grace if the main thread never returns. Ranks agree at each step
    end. docs/guides/stopping.md has the details."""

    # A SIGTERM this soon after the first is the same request delivered twice (a scheduler signals every process
    # of the job, and the launcher passes its own copy on to the ranks), not a user insisting.
    DUPLICATE_SECONDS = 2.0
    SAVE_GUESS_SECONDS = 5.0  # the save estimate before this run has saved anything
    EXIT_MARGIN = 5.0  # kept for writing the summary and leaving
    HARD_EXIT_MARGIN = 2.0

    def __init__(self, grace_seconds: float = 30.0, run_dir=None):
        self.grace_seconds = grace_seconds
        self.run_dir = run_dir
        self.signal_name: str | None = None
        self.training = False
        self.abandoned: StopNow | None = None
        self.last_save_seconds: float | None = None
        self._first_at = 0.0
        self._state = None
        self._stepping_from = None  # global_step while the optimizer changes the weights
        self._save_started: float | None = None
        self._interrupt_due = False
        self._done = threading.Event()
        self._main_thread_id = threading.main_thread().ident

    # --- the budget ----------------------------------------------------------------------------------------
    def wait_budget(self) -> float:
        """Seconds the step in progress may take after the stop request before it is abandoned."""
        save = self.last_save_seconds if self.last_save_seconds is not None else self.SAVE_GUESS_SECONDS
        budget = self.grace_seconds - save - self.EXIT_MARGIN
        return max(budget, min(5.0, self.grace_seconds / 3))

    def safe_to_abandon(self) -> bool:
        """Whether the weights are those of a complete step and no checkpoint is being written."""
        stepping = self._stepping_from is not None and self._state is not None and (
            self._state.global_step == self._stepping_from)
        return not stepping and self._save_started is None

    @contextmanager
    def saving(self):
        """Mark a checkpoint save in progress (never interrupted; the watchdog does not end the process)."""
        started = self._save_started = time.monotonic()
        try:
            yield
        finally:
            self.last_save_seconds = time.monotonic() - started
            self._save_started = None

    def finish(self) -> None:
        """The stop is handled (saved, or nothing to save): the watchdog has nothing left to do."""
        self._done.set()

    # --- signals -------------------------------------------------------------------------------------------
    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self._interrupt_due:  # the watchdog's own signal: the step ran out of time
            self._interrupt_due = False
            if self.abandoned is None and self.training and self.safe_to_abandon():
                self.abandoned = StopNow(activity.current(), time.monotonic() - self._first_at)
                raise self.abandoned
            return
        if name == "SIGTERM" and self.run_dir is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # With several ranks, a launcher's SIGTERM while a peer is gone is the launcher ending the job after
            # that rank died, not a request to stop: no step end will come (its collectives would fail or wait).
            lost = ranks.peer_states(self.run_dir, int(os.environ.get("RANK", "0")))
            if lost:
                raise ranks.PeerLost("; ".join(description for _, description in lost))
        if (name == "SIGTERM" and self.signal_name == "SIGTERM"
                and time.monotonic() - self._first_at < self.DUPLICATE_SECONDS):
            logger.warning("SIGTERM again within %.0f s: the same request, still finishing the step",
                           self.DUPLICATE_SECONDS)
            return
        if self.signal_name is not None or not self.training:
            raise KeyboardInterrupt(f"{name}: aborting")
        self.signal_name, self._first_at = name, time.monotonic()
        budget = self.wait_budget()
        logger.warning("%s: finishing this step (for up to %.0f s), then saving a checkpoint and stopping (send it "
                       "again to abort at once)", name, budget)
        threading.Thread(target=self._watch, args=(signum, budget), name="pods-stop-watchdog", daemon=True).start()

    def _watch(self, signum: int, budget: float) -> None:
        """The watchdog: interrupt a step that outlives ``budget``; end a process that outlives the grace."""
        if self._done.wait(budget):
            return
        hard_exit_at = self._first_at + self.grace_seconds - self.HARD_EXIT_MARGIN
        while not self._done.wait(0.25):
            if self.abandoned is None and self.training:
                self._interrupt_due = True
                try:
                    signal.pthread_kill(self._main_thread_id, signum)
                except (AttributeError, ProcessLookupError, OSError):  # no pthread_kill (Windows)
                    import _thread

                    _thread.interrupt_main(signum)
            if time.monotonic() >= hard_exit_at and self._save_started is None:
                self._hard_exit(signum)

    def _hard_exit(self, signum: int) -> None:
        import sys

        from pods_rl.runlog.store import list_checkpoints

        complete = list_checkpoints(self.run_dir) if self.run_dir is not None else []
        last = complete[-1] if complete else None
        kept = f"the last complete checkpoint is {last}" if last else "no checkpoint was complete"
        resume = (f"; resume with the same command plus --output_dir {self.run_dir} --resume_from_checkpoint true"
                  if self.run_dir is not None else "")
        print(f"pods train: stopped by {self.signal_name}: the step did not end within the grace period "
              f"({self.grace_seconds:.0f} s) and could not be interrupted; exiting without saving: {kept}{resume}",
              file=sys.stderr, flush=True)
        os._exit(128 + signum)

    @contextmanager
    def handling_signals(self):
        """Route SIGTERM and SIGINT to this callback inside the block (no-op off the main thread); after it, the
        handlers before it, except that a rank of several leaving the block by an error ignores SIGTERM."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._main_thread_id = threading.get_ident()
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        failed = True
        try:
            yield
            failed = False
        finally:
            self.finish()  # the watchdog must never signal a process whose handlers are no longer ours
            if failed and int(os.environ.get("WORLD_SIZE", "1")) > 1:
                # A rank leaving with an error (most often a collective failing because a peer died) is about to
                # get the launcher's SIGTERM: ignore it, or it kills the rank before the rank's line is printed.
                previous[signal.SIGTERM] = signal.SIG_IGN
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # --- the training loop ---------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        """Training has begun: a signal from now on stops at the end of the step (before, it aborts at once)."""
        self.training, self._state = True, state
        if self.run_dir is None and args is not None:
            self.run_dir = Path(args.output_dir)

    def on_train_end(self, args, state, control, **kwargs):
        """Training is over: stop the watchdog."""
        self.training = False
        self.finish()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """Mark the weights as half-way through a step until the step ends."""
        self._stepping_from = state.global_step  # until global_step moves on, the weights are half-way

    def _note_save(self, control) -> None:
        if control.should_save and self._save_started is None:
            self._save_started = time.monotonic()  # the Trainer saves right after this callback

    def on_step_end(self, args, state, control, **kwargs):
        """The step is complete: if a stop was asked for (on any rank), save and stop here."""
        self._stepping_from = None
        requested = self.signal_name is not None
        if ranks.world_size() > 1:
            requested = ranks.any_rank(requested)
            if requested and self.signal_name is None:
                self.signal_name = "SIGTERM"  # another rank got it; this one stops at the same step
        if requested:
            control.should_save = True
            control.should_training_stop = True
        self._note_save(control)
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        """Note a save the Trainer is about to make."""
        self._note_save(control)

    def on_save(self, args, state, control, **kwargs):
        """Record how long the save took (the stop's estimate of the next one)."""
        if self._save_started is not None:
            self.last_save_seconds = time.monotonic() - self._save_started
            self._save_started = None


class ApplyOptimizerSettings(TrainerCallback):
    """On a resume with accepted config changes: the new hyper-parameters into the restored optimizer."""

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        """Put the accepted learning rate, betas, epsilon and weight decay into the restored optimizer and scheduler."""
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
