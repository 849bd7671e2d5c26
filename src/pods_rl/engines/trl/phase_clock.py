"""The wall-clock seconds of a training step's phases, logged as ``time/<phase>`` (a ``TrainerCallback``; no TRL)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from transformers import TrainerCallback

from pods_rl import activity, ranks

PHASES = ("generation", "scoring", "selection", "update")


class PhaseClock(TrainerCallback):
    """Seconds of each phase of one optimizer step; ``update`` is what the others leave of the step. On CUDA each
    boundary synchronizes, so kernels are charged to the phase that launched them."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.step_start = None
        self.listeners = []  # called with each step's {phase: seconds} (the auto planner's cost model)

    def _sync(self):
        if torch.cuda.is_available() and self.trainer.accelerator.device.type == "cuda":
            torch.cuda.synchronize()

    def _reset_peak_memory(self):
        if self.trainer.accelerator.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()

    @contextmanager
    def phase(self, name: str):
        """Charge the time spent inside the block to phase ``name``."""
        self._sync()
        start = time.perf_counter()
        try:
            with activity.doing(name):  # what a stop that outlives its grace says it interrupted
                yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start
            if name in ("scoring", "selection"):  # what follows is the update: measure its peak memory alone
                self._reset_peak_memory()

    def on_step_begin(self, args, state, control, **kwargs):
        """Start the step's clock once every rank is there (not counting the wait for rank 0's logs, checkpoints)."""
        ranks.start_step_together(state)
        self._sync()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._reset_peak_memory()
        self.step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        """Log ``time/<phase>`` and ``time/step`` (the update: what the other phases leave of the step)."""
        if self.step_start is None:
            return
        self._sync()
        step_seconds = time.perf_counter() - self.step_start
        self.step_start = None
        self.seconds["update"] = max(
            0.0, step_seconds - sum(self.seconds[p] for p in ("generation", "scoring", "selection"))
        )
        metrics = self.trainer._metrics["train"]
        for name, seconds in self.seconds.items():
            metrics[f"time/{name}"].append(seconds)
        metrics["time/step"].append(step_seconds)
        self.last_step_seconds = step_seconds
        for listener in self.listeners:
            listener(dict(self.seconds))
        if self.trainer.accelerator.device.type == "cuda":
            metrics["memory/update_peak_gb"].append(torch.cuda.max_memory_allocated() / 2**30)
