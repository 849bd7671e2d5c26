"""TrainingClock's evaluation schedule: every N optimizer steps, besides the seconds-based one."""

from types import SimpleNamespace

from transformers import TrainerControl

from pods_rl.runlog import TrainingClock, read_metrics


def _run_steps(clock, num_steps, max_steps):
    for step in range(1, num_steps + 1):
        clock.on_step_begin(None, None, None)
        state = SimpleNamespace(global_step=step, max_steps=max_steps)
        clock.on_step_end(None, state, TrainerControl(), model=SimpleNamespace(training=True, train=lambda _: None,
                                                                               eval=lambda: None))


def test_eval_every_steps_evaluates_at_multiples_and_the_last_step(tmp_path):
    calls = []
    clock = TrainingClock(tmp_path, eval_fn=lambda model: calls.append(1) or {"accuracy": 0.5},
                          eval_every_steps=4)
    _run_steps(clock, 10, max_steps=10)
    steps = [row["step"] for row in read_metrics(tmp_path) if "eval/accuracy" in row]
    assert steps == [4, 8, 10]
    assert len(calls) == 3


def test_without_a_schedule_only_the_last_step_is_evaluated(tmp_path):
    clock = TrainingClock(tmp_path, eval_fn=lambda model: {"accuracy": 0.5})
    _run_steps(clock, 5, max_steps=5)
    assert [row["step"] for row in read_metrics(tmp_path)] == [5]
