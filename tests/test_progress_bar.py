"""`pods train`'s progress bar (#63): it counts seconds of training time (no "s/s" rate) and says the reward's scale."""

from __future__ import annotations

import io
from types import SimpleNamespace

from pods_rl.runlog.callbacks import TrainingClock


def test_the_bar_counts_training_seconds_and_says_the_reward_scale(tmp_path, monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    clock = TrainingClock(tmp_path, max_train_seconds=300, progress=True)
    state, control = SimpleNamespace(global_step=0), SimpleNamespace()
    args = SimpleNamespace(reward_weights=[1.0, 0.1, 0.1])
    clock.on_train_begin(args, state, control)
    clock._bar.update(120)
    state.global_step = 7
    clock.on_log(args, state, control, logs={"reward": 0.8531})
    clock._bar.refresh()
    shown = err.getvalue().split("\r")[-1]
    clock.on_train_end(args, state, control)
    assert "training time" in shown and "120/300 s" in shown and "s/s" not in shown, shown
    assert "step 7, reward 0.853 (weighted, 0-1.2)" in shown, shown
