"""`pods train` under `accelerate launch` with 2 CPU ranks (gloo) and the recipes' time-based clock, as GPU users
launch it: every time-based decision (evaluate, save, stop at the time budget, the last evaluation) is taken by
both ranks at the same step, so the job ends by itself, once, with everything saved; SIGTERM stops it with a
complete checkpoint and the resume runs it to the end of its time budget.

The ranks' own clocks drift apart for real: rank 0 writes the logs and checkpoints while rank 1 already waits in
the next step's first collective. ``PODS_FAULT=slow_logs`` makes that drift large (rank 0 takes 0.3 s more per
metrics row), so that a rank deciding on its own clock evaluates, saves or stops at another step than its peer:
gloo then aborts on mismatched collectives, or a rank waits in one its peer never joins."""

import pytest

from tests import multiproc


@pytest.mark.slow
def test_the_time_clock_is_one_clock_for_all_ranks(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    proc = multiproc.start(multiproc.pods_train_command(run_dir, tiny_model_dir, "--max_train_seconds", "10"),
                           multiproc.launch_env("slow_logs"))
    out, err = multiproc.end(proc, timeout=300)
    assert proc.returncode == 0, err[-4000:]
    multiproc.check_finished(run_dir, 10)
    assert out.count("run directory:") == 1  # the end is reported once (rank 0), not once per rank


@pytest.mark.slow
def test_sigterm_stops_every_rank_with_a_checkpoint_and_the_resume_runs_to_the_budget(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    command = multiproc.pods_train_command(run_dir, tiny_model_dir, "--max_train_seconds", "14")
    multiproc.stop_and_resume(command, run_dir, 14, multiproc.launch_env("slow_logs"))


@pytest.mark.slow
def test_adaptive_rounds_of_uneven_size_and_prompt_oversampling_under_the_clock(tmp_path, tiny_model_dir):
    """The rounds' own collectives (each round's size is agreed) beside the clock's: budgeted rounds of 3 from a
    pilot of 2 up to n = 8 (so rounds differ in size between ranks), 1.5x prompt over-sampling."""
    run_dir = tmp_path / "run"
    command = multiproc.pods_train_command(
        run_dir, tiny_model_dir, "--max_train_seconds", "10", "--num_generations", "8", "--downsample_to", "4",
        "--pilot_generations", "2", "--adaptive_round_size", "3", "--adaptive_rule", "budgeted",
        "--adaptive_budget", "4", "--oversample_prompts", "1.5")
    proc = multiproc.start(command, multiproc.launch_env("slow_logs"))
    _, err = multiproc.end(proc, timeout=300)
    assert proc.returncode == 0, err[-4000:]
    multiproc.check_finished(run_dir, 10)
    rounds = [r["pods/rounds"] for r in multiproc.metrics_rows(run_dir) if "pods/rounds" in r]
    assert rounds and max(rounds) > 1, rounds
