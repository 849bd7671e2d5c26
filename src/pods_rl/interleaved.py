"""Trainers that take optimizer steps in turn, each in a thread of one process (``pods cost``'s interleaved schedule).

Turns make a load that drifts slow every setting alike, so step times compare turn by turn. The order rotates
(A B C, B C A, C A B, ...; with two, A B, B A), not a round (A B C, A B C, ...): whichever runs first on a step's batch
may find the machine in another state than the last does, so each trainer takes each place equally often; and with
three or more none takes two turns in a row (a serpentine, A B C, C B A, gives the ends two in a row, warm, and the
middle never).

The threads share one process's random number generators (Python's, NumPy's, torch's CPU and CUDA): without care each
trainer would draw from where the previous turn left the stream, and two runs of the same recipe would sample
different completions, of different lengths, at every step: a difference in work, not in speed. So each trainer draws
from its own streams: seeded from its ``args.seed`` at its first turn, saved when it hands the turn on and restored
when the turn comes back. Two trainers of the same recipe and seed then sample the same completions step for step,
whatever runs between their turns.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import torch

__all__ = ["Turns", "rng_state", "set_rng_state", "take_turns", "train_interleaved"]


class Turns:
    """A baton passed in rotating order: trainer ``i`` runs only while ``turn == i``; sweep k runs k, k+1, ..., N-1,
    0, ..., k-1 (mod N), so that over N sweeps each trainer takes each place once, and with N >= 3 no trainer takes two
    turns in a row; finished trainers are skipped."""

    def __init__(self, count: int):
        self.cond = threading.Condition()
        self.turn = 0
        self.position = 0  # turns handed out so far: with the count, where in the rotation the baton is
        self.done = [False] * count

    def wait(self, i: int) -> None:
        """Block until it is trainer ``i``'s turn."""
        with self.cond:
            self.cond.wait_for(lambda: self.turn == i)

    def pass_on(self, i: int) -> None:
        """Trainer ``i`` hands the turn to the next trainer in the rotation that has not finished."""
        with self.cond:
            count = len(self.done)
            for _ in range(2 * count):  # two sweeps at most to find one that has not finished
                self.position += 1
                sweep, offset = divmod(self.position, count)
                following = (sweep + offset) % count
                if not self.done[following]:
                    self.turn = following
                    break
            self.cond.notify_all()

    def finish(self, i: int) -> None:
        """Trainer ``i`` is done: it is skipped from now on (and hands the turn on if it held it)."""
        with self.cond:
            self.done[i] = True
            if self.turn == i:
                self.pass_on(i)  # re-entrant: Condition wraps an RLock


def rng_state() -> dict:
    """This process's random number generators' states: Python's, NumPy's, torch's CPU and (if any) CUDA's."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore ``rng_state()``'s ``state``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def take_turns(turns: Turns, i: int):
    """A ``TrainerCallback`` for trainer ``i``: it waits for its turn before each step (before its clocks start) and
    draws from its own random streams (module docstring)."""
    from transformers import TrainerCallback, set_seed

    class TakeTurns(TrainerCallback):
        own_state = None

        def on_train_begin(self, args, state, control, **kwargs):
            turns.wait(i)
            set_seed(args.seed)  # the threads raced to here: start the trainer's streams from its own seed

        def on_step_begin(self, args, state, control, **kwargs):
            self.own_state = rng_state()
            turns.pass_on(i)  # everything since our last step (logging, the next batch) ran in our turn
            turns.wait(i)
            set_rng_state(self.own_state)

        def on_train_end(self, args, state, control, **kwargs):
            turns.finish(i)

    return TakeTurns()


def train_interleaved(trainers: list) -> None:
    """``trainer.train()`` for every trainer, each in a thread, taking optimizer steps in turn (``Turns``)."""
    turns = Turns(len(trainers))
    errors: list[BaseException] = []
    for i, trainer in enumerate(trainers):
        # First in line: the wait must come before PODSTrainer's phase clock starts timing the step.
        trainer.callback_handler.callbacks.insert(0, take_turns(turns, i))

    def work(i: int, trainer) -> None:
        try:
            trainer.train()
        except BaseException as err:  # re-raised after all threads end; never leave the others waiting
            errors.append(err)
        finally:
            turns.finish(i)

    threads = [threading.Thread(target=work, args=(i, t), daemon=True) for i, t in enumerate(trainers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
