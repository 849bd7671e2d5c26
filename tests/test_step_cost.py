"""The step-cost estimator (pods_rl.step_cost) and `pods cost` under slow steps: a few slow generation calls in one
setting must not move its reported ratio, which a mean over the same steps does."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest

from pods_rl import step_cost
from pods_rl.commands import cost


def test_summary_is_robust_to_one_slow_step():
    steady = step_cost.summary([0.25, 0.26, 0.24, 0.25, 0.27])
    slow = step_cost.summary([0.25, 0.26, 0.24, 3.5, 0.27])  # one step 14x the others, as on the H200
    assert slow["median"] == pytest.approx(0.255) and steady["median"] == pytest.approx(0.25)
    assert slow["slow_steps"] == 1 and steady["slow_steps"] == 0  # 3.5 s > 2 x the median: an interruption
    assert slow["mean"] > 2.5 * slow["median"]  # what the mean made of it
    assert slow["steps"] == 5 and slow["max"] == 3.5
    with pytest.raises(ValueError, match="no measured steps"):
        step_cost.summary([])


def test_ratio_and_its_range_cross_the_quartiles():
    grpo, pods = step_cost.summary([1.0, 1.0, 1.2, 1.2]), step_cost.summary([2.0, 2.0, 2.4, 2.4])
    r = step_cost.ratio(pods, grpo)
    assert r["value"] == pytest.approx(2.0)
    assert (r["low"] == pytest.approx(pods["q25"] / grpo["q75"])
        and r["high"] == pytest.approx(pods["q75"] / grpo["q25"]))
    assert r["low"] < r["value"] < r["high"]


def test_a_paired_ratio_cancels_the_machines_drift():
    """Steps taken in the same turn share the machine's state: their ratio holds where the step times drift 3x."""
    load = [1.0, 1.5, 2.0, 3.0, 2.5, 1.2, 1.0, 2.8]  # what the other processes did, turn by turn
    grpo = {k: 0.1 * f for k, f in enumerate(load, 2)}
    pods = {k: 0.12 * f for k, f in enumerate(load, 2)}
    pods[5] += 5.0  # one interruption: set aside
    paired = step_cost.paired_ratio(pods, grpo)
    assert paired["value"] == pytest.approx(1.2) and paired["pairs"] == 7 and paired["slow_pairs"] == 1
    assert paired["low"] == pytest.approx(1.2) and paired["high"] == pytest.approx(1.2)
    unpaired = step_cost.ratio(step_cost.summary(list(pods.values())), step_cost.summary(list(grpo.values())))
    assert unpaired["high"] / unpaired["low"] > 1.5  # the same steps, unpaired: a wide range
    assert step_cost.paired_ratio({2: 1.0}, {2: 1.0}) is None  # too few pairs: the caller falls back


def test_spread_warning_names_the_noisy_setting():
    quiet, noisy = step_cost.summary([1.0, 1.01, 0.99, 1.0]), step_cost.summary([1.0, 2.0, 0.5, 1.5])
    assert step_cost.spread_warning("64 -> 16", quiet, quiet) is None
    line = step_cost.spread_warning("64 -> 16", noisy, quiet)
    assert line.startswith("warning: 64 -> 16") and "it " in line and "reference" not in line.split("limit")[0]
    assert "--steps" in line and "\n" not in line


def test_warmup_ends_when_the_step_time_settles():
    # Two slow first steps (compilation, allocation), then steady: the warm-up takes them, not a fixed count.
    seconds = [5.0, 2.0, 1.0, 1.05, 0.98, 1.02, 1.0]
    assert step_cost.steady_start(seconds, min_warmup=1) == 2
    assert step_cost.steady_start(seconds[:3], min_warmup=1) is None  # undecided: too few steps yet
    assert step_cost.steady_start(seconds, min_warmup=3) == 3  # never fewer than asked
    assert not step_cost.enough_steps(seconds[:5], steps=4) and step_cost.enough_steps(seconds[:6], steps=4)
    # A slow step later on (not a warm-up) does not extend the warm-up: the median of those after it decides.
    assert step_cost.steady_start([5.0, 1.0, 1.0, 4.0, 1.0, 1.0], min_warmup=1) == 1
    # Never steady (each step 1.4x the next): it gives up after MAX_EXTRA_WARMUP extra steps, and says so.
    falling = [10 * 0.7 ** i for i in range(20)]
    start = step_cost.steady_start(falling, min_warmup=1)
    assert start == 1 + step_cost.MAX_EXTRA_WARMUP and not step_cost.steady(falling, start)


def test_phase_split_adds_up_to_the_median_step():
    phases = {"generation": [1.0, 1.1, 0.9, 9.0], "update": [0.5, 0.5, 0.5, 0.5]}
    phases["step"] = [g + u for g, u in zip(phases["generation"], phases["update"])]
    split = step_cost.phase_split(phases)
    assert split["step"] == pytest.approx(1.5)  # median of 1.5, 1.6, 1.4 (9.5: a slow step, set aside)
    assert split["generation"] + split["update"] == pytest.approx(split["step"])
    assert split["generation"] / split["update"] == pytest.approx(2.1)  # the middle steps' shares (1.5, 1.6)
    assert step_cost.central_steps([3.0, 1.0, 2.0]) == [2] and step_cost.central_steps([1.0, 2.0]) == [0, 1]


def test_settings_fit_together_within_the_headroom():
    assert step_cost.fits_together([10, 10, 10], free_bytes=100)
    assert not step_cost.fits_together([30, 30, 30], free_bytes=100)


def _slow_generation(trainer, steps: set[int], delay: float, delayed: list[int]):
    """Make ``trainer``'s generation phase ``delay`` seconds slower in the (1-based) optimizer ``steps``."""
    phase = trainer.phase_clock.phase

    @contextmanager
    def slow(name):
        with phase(name):
            yield
            step = trainer.state.global_step + 1
            if name == "generation" and step in steps and step not in delayed:
                delayed.append(step)
                time.sleep(delay)

    trainer.phase_clock.phase = slow


def test_slow_steps_in_one_setting_leave_its_ratio(tmp_path, tiny_model_dir, monkeypatch):
    """Two generation calls of PODS 8 -> 4 are made 2 s slower (ten times a step on this model): the ratio `pods cost`
    reports is the one of the same turns undisturbed, and within a few percent of the one with the delay taken out of
    those steps, while the mean over the same steps (the old estimator) moves by 20% and more. One run, so that the
    machine's drift between two runs cannot decide the test; every step's phase times come from ``per_step``."""
    delay, delayed, build = 2.0, [], cost.build_trainer

    def build_slow(recipe_argv, n, m, max_steps, output_dir, oversample=1.0, pilot=None):
        trainer, run_dir = build(recipe_argv, n, m, max_steps, output_dir, oversample, pilot)
        if n == 8:
            _slow_generation(trainer, {5, 9}, delay, delayed)
        return trainer, run_dir

    monkeypatch.setattr(cost, "build_trainer", build_slow)
    result = cost.measure(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir),
                           "--torch_threads", "1"], ns=[4, 8], m=4, steps=20, warmup=1, schedule="interleaved")
    grpo, pods = result["rows"]
    assert delayed == [5, 9] and result["settings"]["schedule"] == "interleaved"
    assert grpo["step_ratio"] == 1.0 and pods["steps"] == 20 and len(pods["per_step"]) == 20 + pods["warmup_steps"]

    def steps(row, clean=False):  # measured step seconds (S,); clean: the injected delay taken out
        return [s["seconds"]["step"] - (delay if clean and s["optimizer_step"] in delayed else 0.0)
                for s in row["per_step"] if not s["warmup"]]

    def by_step(row, clean=False):  # optimizer step -> measured seconds
        measured = [s for s in row["per_step"] if not s["warmup"]]
        return dict(zip((s["optimizer_step"] for s in measured), steps(row, clean)))

    reported = step_cost.paired_ratio(by_step(pods), by_step(grpo))  # interleaved: turn by turn
    assert pods["step_ratio"] == pytest.approx(reported["value"]) and pods["step_ratio_paired"]
    assert reported["slow_pairs"] >= 2  # the two delayed steps, set aside
    # The slow steps had no say: made ten times slower still, they leave the ratio exactly as it is (they are set
    # aside, and the cut, a multiple of the median, does not move) ...
    slower = {k: v * 10 if k in delayed else v for k, v in by_step(pods).items()}
    again = step_cost.paired_ratio(slower, by_step(grpo))
    assert again["value"] == pytest.approx(pods["step_ratio"], rel=1e-12)
    assert (again["pairs"], again["slow_pairs"]) == (reported["pairs"], reported["slow_pairs"])
    # ... and close to the one with the delayed turns undisturbed too: they are 2 of 20 turns, and on this shared
    # 2-core CPU a turn's ratio varies by 20% or more (the rest of 5% is that noise, not the delay).
    undisturbed = step_cost.paired_ratio(by_step(pods, clean=True), by_step(grpo))["value"]
    assert pods["step_ratio"] == pytest.approx(undisturbed, rel=0.08), (pods["step_ratio"], undisturbed)
    reference = step_cost.summary(steps(grpo))
    hit = [s for s in pods["per_step"] if s["optimizer_step"] in delayed and not s["warmup"]]
    mean_ratio, clean_mean = (sum(steps(pods, c)) / len(steps(pods)) / reference["mean"] for c in (False, True))
    # The injected delay reached the measured steps, and a mean over them is moved by well over 5%.
    assert hit and all(s["seconds"]["generation"] > delay for s in hit)
    assert mean_ratio > 1.2 * clean_mean, (mean_ratio, clean_mean)


def test_sequential_settings_are_measured_in_alternating_rounds(tiny_model_dir):
    """One setting after the other (as on a GPU they do not fit together, or with vLLM), in 2 rounds that split the
    steps: each round warms its new trainer up again, and every round's steps are kept and pooled."""
    result = cost.measure(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir),
                           "--torch_threads", "1"], ns=[4, 8], m=4, steps=4, warmup=1, schedule="sequential")
    assert result["settings"]["schedule"] == "sequential" and result["settings"]["rounds"] == 2
    for row in result["rows"]:
        assert row["steps"] == 4  # 2 + 2
        flags = [s["warmup"] for s in row["per_step"]]
        starts = [i for i in range(1, len(flags)) if flags[i] and not flags[i - 1]]
        assert flags[0] and len(starts) == 1, flags  # a second warm-up: the second round's new trainer
        assert [s["optimizer_step"] for s in row["per_step"]][starts[0]] == 1
