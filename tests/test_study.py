"""`pods study`: the plan (methods, runs, equal updates), its checks, resuming, slots, the study statistics, the
report against the committed evidence study, and the whole pipeline end to end (``--smoke``)."""

import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest

from pods_rl import stats
from pods_rl.commands.study import STAGES, build_parser, study_runs, sweep_runs
from pods_rl.commands.study_plan import default_methods, make_plan, parse_method
from pods_rl.commands.study_runner import Run, Runner, prepare, slot_envs

ROOT = Path(__file__).resolve().parents[1]
STRONG = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc" / "study_strong"


@pytest.fixture(scope="module")
def strong_runs(tmp_path_factory):
    """The committed strong-model study's run directories, unpacked from its runs.tar.xz (once per module)."""
    from pods_rl.runlog.packed import unpack_runs

    return unpack_runs(STRONG, tmp_path_factory.mktemp("study_strong")) / "study" / "runs"


def _plan(tmp_path, *argv):
    args, recipe = build_parser().parse_known_args(["--out", str(tmp_path / "st"), *argv])
    return make_plan(args, recipe)


# ------------------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------------------
def test_method_names_round_trip():
    assert parse_method("grpo-n16").is_grpo
    pods = parse_method("pods-mv-n64m16")
    assert (pods.n, pods.m, pods.rule, pods.is_grpo) == (64, 16, "max_variance", False)
    assert parse_method("pods-random-n64m16").rule == "random"
    shorter = parse_method("pods-mv-n32m16-shorter", {"shorter": ("--downsample_tiebreak", "shorter")})
    assert shorter.extra == ("--downsample_tiebreak", "shorter") and "+shorter" in shorter.label
    greso = parse_method("pods-mv-n16m16-greso", {"greso": ("--prompt_planner", "greso")})
    assert not greso.is_grpo and greso.label == "GRPO (n=16) +greso"  # GRPO with a planner: named as a variant
    assert [m.name for m in default_methods(8, [32], [32])] == ["grpo-n8", "pods-mv-n32m8", "pods-random-n32m8"]
    for bad, words in (("pods-mv-n8m16", "smaller than m"), ("ppo-n16", "unknown method"),
                       ("pods-mv-n32m16-x", "--variant x=")):
        with pytest.raises(ValueError, match=words):
            parse_method(bad)


def test_plan_gives_every_method_the_same_updates_and_kept_rows(tmp_path):
    plan = _plan(tmp_path, "--n", "32,64", "--m", "16", "--prompts-per-step", "8", "--seeds", "2", "--updates", "50",
                 "--eval-every", "10", "--learning_rate", "1e-4")
    assert [m.name for m in plan.methods] == ["grpo-n16", "pods-mv-n32m16", "pods-mv-n64m16", "pods-random-n64m16"]
    assert plan.cost_n == [16, 32, 64] and plan.lr == 1e-4 and plan.device == "cpu"
    runs = study_runs(plan, plan.lr)
    assert [r.run_dir.name for r in runs[:5]] == ["grpo-n16-s0", "pods-mv-n32m16-s0", "pods-mv-n64m16-s0",
                                                  "pods-random-n64m16-s0", "grpo-n16-s1"]  # seed-major
    for run in runs:
        flags = dict(zip(run.argv[::2], run.argv[1::2]))  # later flags win, as in the parser
        assert flags["--max_steps"] == "50" and flags["--per_device_train_batch_size"] == "128"
        assert flags["--eval_every_steps"] == "10" and flags["--downsample_to"] == "16"
        assert flags["--learning_rate"] == "0.0001" and flags["--output_dir"] == str(run.run_dir)
    assert {r.argv[r.argv.index("--num_generations") + 1] for r in runs} == {"16", "32", "64"}


def test_methods_run_without_the_recipes_planner_but_with_a_variants(tmp_path):
    """The embedded recipe plans with auto; a study's GRPO and fixed-n runs must not, its auto variant must."""
    from pods_rl.recipes import parse_args

    plan = _plan(tmp_path, "--methods", "grpo-n8,pods-mv-n32m8,pods-mv-n32m8-auto", "--variant",
                 "auto=--rollout_planner auto", "--updates", "4")
    planners = {run.method: parse_args(list(run.argv))[1].rollout_planner for run in study_runs(plan, plan.lr)}
    assert planners == {"grpo-n8": None, "pods-mv-n32m8": None, "pods-mv-n32m8-auto": "auto"}
    with pytest.raises(ValueError, match="^--rollout_planner is set by pods study for each run; use --variant"):
        _plan(tmp_path, "--rollout_planner", "auto")


def test_first_seed_runs_fresh_seeds_seed_major(tmp_path):
    """A new study beside an old one runs fresh seeds: --first-seed 32 --seeds 2 gives seeds 32 and 33, passed to
    `pods train` and named in the run folders, every method's seed before the next seed."""
    plan = _plan(tmp_path, "--methods", "grpo-n8,pods-mv-n32m8", "--first-seed", "32", "--seeds", "2")
    runs = study_runs(plan, plan.lr)
    assert [r.run_dir.name for r in runs] == ["grpo-n8-s32", "pods-mv-n32m8-s32", "grpo-n8-s33", "pods-mv-n32m8-s33"]
    assert [r.argv[r.argv.index("--seed") + 1] for r in runs] == ["32", "32", "33", "33"]


def test_pilot_adds_adaptive_methods_their_control_and_cost_rows(tmp_path):
    plan = _plan(tmp_path, "--n", "32", "--m", "8", "--pilot", "8", "--learning_rate", "1e-4")
    assert [m.name for m in plan.methods] == ["grpo-n8", "pods-mv-n32m8", "pods-random-n32m8",
                                              "pods-mv-n32m8-pilot8", "pods-random-n32m8-pilot8"]
    adaptive = plan.methods[3]
    assert adaptive.extra == ("--pilot_generations", "8") and adaptive.label == "PODS max_variance (n=32→m=8) +pilot8"
    assert plan.methods[4].rule == "random" and plan.cost_pilot == 8
    run = next(r for r in study_runs(plan, plan.lr) if r.run_dir.name == "pods-random-n32m8-pilot8-s0")
    flags = dict(zip(run.argv[::2], run.argv[1::2]))
    assert flags["--pilot_generations"] == "8" and flags["--downsample_rule"] == "random"
    with pytest.raises(ValueError, match="--pilot 64 is larger than n = 32"):
        _plan(tmp_path, "--n", "32", "--m", "8", "--pilot", "64")


def test_plan_refuses_bad_input_in_one_line(tmp_path):
    cases = {("--num_generations", "32"): "set by pods study for each run; use --n",
             ("--n", "8", "--m", "8"): "must exceed m=8",
             ("--lrs", "1e-4,2e-4", "--learning_rate", "1e-4"): "not both",
             ("--baseline", "grpo-n99"): "not among the methods",
             ("--updates", "10", "--eval-every", "20"): "--eval-every must be between 1 and --updates",
             ("--methods", "grpo-n16,pods-mv-n64m8"): "same m",
             ("--variant", "bad name=--x 1"): "--variant takes NAME=",
             ("--n", "3x"): "comma-separated integers",
             ("--first-seed", "-1"): "--first-seed must be >= 0"}
    for argv, words in cases.items():
        with pytest.raises(ValueError, match=words):
            _plan(tmp_path, *argv)


def test_sweep_runs_take_grpo_at_each_rate(tmp_path):
    plan = _plan(tmp_path, "--lrs", "1e-4,2e-4", "--sweep-seeds", "2", "--sweep-updates", "30")
    assert plan.lr is None  # the sweep decides
    runs = sweep_runs(plan)
    assert [r.run_dir.name for r in runs] == ["grpo-n8-lr0.0001-s0", "grpo-n8-lr0.0002-s0", "grpo-n8-lr0.0001-s1",
                                              "grpo-n8-lr0.0002-s1"]
    assert all(r.updates == 30 and "--num_generations" in r.argv for r in runs)


def test_a_study_folder_refuses_other_settings(tmp_path):
    from pods_rl.commands.study import check_plan_file

    plan = _plan(tmp_path, "--updates", "40")
    plan.out.mkdir(parents=True)
    check_plan_file(plan)
    check_plan_file(_plan(tmp_path, "--updates", "40", "--seeds", "6"))  # more seeds: the same study
    with pytest.raises(ValueError, match="updates 40 -> 60"):
        check_plan_file(_plan(tmp_path, "--updates", "60"))


def test_runs_resume_from_a_checkpoint_and_restart_without_one(tmp_path):
    from pods_rl.runlog import CLOCK_FILE

    run = Run("grpo-n8", 0, 1e-4, tmp_path / "runs" / "grpo-n8-s0", 10, ("--output_dir", "x"))
    argv, resume = prepare(run)
    assert argv == ["--output_dir", "x"] and not resume  # a new run
    (run.run_dir / "checkpoint-4").mkdir(parents=True)
    argv, resume = prepare(run)  # an incomplete checkpoint only: started over, the old directory kept aside
    assert not resume and not run.run_dir.exists()
    assert len(list((tmp_path / "runs" / "_incomplete").iterdir())) == 1
    (run.run_dir / "checkpoint-4").mkdir(parents=True)
    (run.run_dir / "checkpoint-4" / CLOCK_FILE).write_text(json.dumps({"step": 4, "train_seconds": 2.0}))
    argv, resume = prepare(run)
    assert resume and argv[-2:] == ["--resume_from_checkpoint", "true"] and run.run_dir.is_dir()


def test_a_run_stopped_while_it_starts_is_stopped_not_failed(tmp_path):
    # A deadline or Ctrl-C can reach a run in its first seconds, before `pods train` handles SIGTERM: it dies
    # without a checkpoint. That is a stop (the same command starts it again), not a failure to report.
    runner = Runner("cpu", 1, 1)
    runner.stop.set()  # halted: _run_one sends SIGTERM right after starting the process
    run_dir = tmp_path / "runs" / "grpo-n8-s0"
    run = Run("grpo-n8", 0, 1e-4, run_dir, 10, ("--output_dir", str(run_dir), "--max_steps", "10"))
    record = runner._run_one(run, 0)
    assert record["returncode"] == -signal.SIGTERM
    assert record["status"] == "stopped"


def test_slots_pin_one_gpu_per_run_and_share_cpu_threads(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [e["CUDA_VISIBLE_DEVICES"] for e in slot_envs("cuda", 3, None)] == ["2", "3", "2"]
    cpu = slot_envs("cpu", 2, 1)
    assert len(cpu) == 2 and all(e["OMP_NUM_THREADS"] == "1" and "CUDA_VISIBLE_DEVICES" not in e for e in cpu)


# ------------------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------------------
def test_step_time_ratio_and_its_interval():
    ratio, ci = stats.ratio_of_means([2.0, 2.2, 1.8], [1.0, 1.1, 0.9])
    assert ratio == pytest.approx(2.0) and ci[0] < 2.0 < ci[1]
    assert stats.ratio_of_means([2.0], [1.0]) == (2.0, None)


def test_break_even_verdicts():
    assert stats.break_even(1.5, (1.3, 1.8), 1.1, (1.0, 1.2))["verdict"] == "pays"
    assert stats.break_even(1.1, (1.0, 1.2), 1.8, (1.7, 1.9))["verdict"] == "does not pay"
    undecided = stats.break_even(1.4, (1.2, 1.8), 1.5, (1.4, 1.6))
    assert undecided["verdict"] == "undecided" and undecided["margin"] == pytest.approx(1.4 / 1.5)
    assert stats.break_even(1.4, (1.3, None), 1.2, None)["verdict"] == "pays"  # None bound = infinite
    assert stats.break_even(None, None, 1.2, None)["verdict"] == "unknown"


def test_eval_noise_separates_evaluation_from_seed_spread(tmp_path):
    def run(values, se):
        return stats.RunData(run_dir=tmp_path, label="a", steps=np.array([0, 10, 20]), values=np.array(values),
                             stderrs=np.full(3, se), times=np.array([0.0, 1.0, 2.0]))

    noise = stats.eval_noise([run([0.2, 0.30, 0.40], 0.01), run([0.2, 0.34, 0.44], 0.01)])
    spread = np.std([0.30, 0.34], ddof=1)  # the same at steps 10 and 20
    assert noise["seed_std_mean_over_steps"] == pytest.approx(spread)
    assert noise["seed_std_without_eval_noise"] == pytest.approx(math.sqrt(spread**2 - 0.01**2))
    assert noise["eval_share_of_seed_variance"] == pytest.approx(0.01**2 / spread**2)
    assert noise["seed_std_at_step_0"] == 0.0


def test_the_figures_say_how_many_seeds_each_method_has():
    from pods_rl.commands.study_report import seeds_per_method

    assert seeds_per_method([32, 32, 32, 32]) == "32 seeds per method"
    assert seeds_per_method([8, 6, 8]) == "6-8 seeds per method"


def test_report_reproduces_the_committed_evidence_study(strong_runs):
    """The package's report, on the committed runs of the strong-model study, gives the numbers the docs
    quote (docs/results/history/strong-model.md) (computed then by benchmarks/study_report.py):
    the statistics moved without changing."""
    from pods_rl.commands.study_report import headline, study_report

    committed = json.loads((STRONG / "study.json").read_text())["study"]["methods"]
    report = study_report(strong_runs, None, "grpo-n16", n_boot=0, figures=False)
    for name in ("pods-mv-n64m16", "pods-random-n64m16"):
        for key in ("steps/peak", "steps/gain80", "time/peak", "time/gain80"):
            assert report["methods"][name][key]["ratio"] == pytest.approx(committed[name][key]["ratio"]), (name, key)
        assert report["methods"][name]["step_ratio"] == pytest.approx(committed[name]["step_ratio"])
    numbers = headline(report)["pods-mv-n64m16"]
    assert numbers["learning_per_update"]["value"] == pytest.approx(1.375)
    assert numbers["break_even"]["margin"] == pytest.approx(1.375 / committed["pods-mv-n64m16"]["step_ratio"])


def test_report_reads_the_committed_study_between_evaluations(strong_runs):
    """Interpolated between evaluations, learning per update leaves the evaluation grid (evaluations every 25
    updates: GRPO reaches its peak at 275, so a grid reading is 275 / 200 = 1.375 or 275 / 175 = 1.571); the
    accuracy at equal budgets and the area under the curve come with intervals holding their estimates, and the
    printed report says how the numbers were read and the verdict rule."""
    from pods_rl import curves
    from pods_rl.commands.study_report import format_report, headline, study_report

    report = study_report(strong_runs, None, "grpo-n16", n_boot=200, figures=False)
    pods = report["methods"]["pods-mv-n64m16"]
    grid, inter = pods["steps/peak"], pods["interpolated"]["steps/peak"]
    assert grid["ratio"] == pytest.approx(275 / 200) and report["methods"]["grpo-n16"]["interpolated"][
        "steps/peak"]["to_target"] == 275.0  # the baseline's peak is an evaluation: the same in both readings
    assert 175 < inter["to_target"] < 200 and 275 / 200 < inter["ratio"] < 275 / 175
    assert inter["ci95"][0] <= inter["ratio"] <= inter["ci95"][1]
    assert inter["verdict"] == curves.interval_verdict(inter["ci95"])
    assert report["comparisons_interpolated"]["steps/peak"]["crossing"] == "interpolated between evaluations"
    time_span = report["curves"]["time"]["span"]
    assert time_span[0] == 0.0 and time_span[1] == min(
        r["last_time"] for label in report["comparisons"]["time/peak"]["labels"].values() for r in label["seeds"])
    for key in ("accuracy_at_equal_updates", "accuracy_at_equal_time"):
        rows = pods[key]
        assert [row["fraction"] for row in rows] == [0.25, 0.5, 0.75, 1.0]
        for row in rows:
            assert row["difference_ci95"][0] <= row["difference"] <= row["difference_ci95"][1], (key, row)
            assert row["difference"] == pytest.approx(np.mean(row["per_seed"]) - row["baseline_mean"])
    assert pods["accuracy_at_equal_updates"][-1]["x"] == 300.0
    area = pods["area_vs_time"]
    assert area["ratio_ci95"][0] <= area["ratio"] <= area["ratio_ci95"][1] and 0 < area["mean"] < 1
    numbers = headline(report)["pods-mv-n64m16"]
    assert numbers["learning_per_update_interpolated"]["value"] == inter["ratio"]
    assert numbers["learning_per_update"]["value"] == pytest.approx(1.375)  # the grid reading keeps its key
    assert {"wall_clock_speedup_interpolated", "break_even_interpolated", "accuracy_at_equal_time",
            "area_vs_time"} <= set(numbers)
    levels = pods["to_levels"]["time"]  # time to every level from 20% to 90% of GRPO's gain, seeds paired
    assert levels["seeds"] == sorted(r.seed for r in stats.load_runs(sorted(strong_runs.glob(
        "pods-mv-n64m16-s[0-9]*"))))
    assert levels["ci95"][0] <= levels["ratio"] <= levels["ci95"][1] and len(levels["levels"]) == 15
    assert numbers["wall_clock_speedup_levels"]["ratio"] == levels["ratio"]
    assert numbers["learning_per_update_levels"]["ratio"] == pods["to_levels"]["steps"]["ratio"] > 1
    text = format_report({"study": report})
    assert "to every accuracy level from 20% to 90%" in text and f"(3) {levels['ratio']:.2f}x" in text
    assert "interpolated between evaluations" in text and curves.VERDICT_RULE in text
    assert f"{inter['ratio']:.2f}x" in text and "at evaluation resolution" in text and "area under accuracy" in text
    # the noise and projection sections (lost once in a refactor: the JSON had them, the text did not)
    assert "evaluation noise against seed spread" in text and "PROJECTION (not a measurement)" in text
    paper = next(row for row in report["projection"]["rows"] if row["source"].startswith("paper") and "64 -> 16"
                 in row["source"])
    assert f"pods-mv-n64m16: {paper['pods-mv-n64m16']['speedup']:.2f}x" in text


def test_report_pairs_a_seeds_methods_only_on_one_machine(strong_runs, tmp_path):
    """Runs of two machines: the report names the machine of each seed; seed 1, all on machine B, stays paired;
    PODS's seed 0 ran on B while GRPO's seed 0 ran on A, so it is left out of the pairing and said so."""
    import shutil

    from pods_rl.commands.study_report import format_report, study_report

    runs = tmp_path / "runs"
    for name in ("grpo-n16", "pods-mv-n64m16"):
        for seed in (0, 1, 2):
            run = shutil.copytree(strong_runs / f"{name}-s{seed}", runs / f"{name}-s{seed}")
            machine = "GPU A x1" if seed == 2 or (seed == 0 and name == "grpo-n16") else "GPU B x1"
            record = json.loads((run / "study_run.json").read_text()) if (run / "study_run.json").is_file() else {}
            (run / "study_run.json").write_text(json.dumps({**record, "machine": {"label": machine}}))
    report = study_report(runs, None, "grpo-n16", n_boot=0, figures=False)
    assert report["machines"]["left_out"] == ["pods-mv-n64m16-s0"]
    assert report["methods"]["pods-mv-n64m16"]["seeds"] == 2 and report["methods"]["grpo-n16"]["seeds"] == 3
    assert report["machines"]["seeds"][1] == {"grpo-n16": "GPU B x1", "pods-mv-n64m16": "GPU B x1"}
    text = format_report({"study": report})
    assert "seed 0: grpo-n16 GPU A x1; pods-mv-n64m16 GPU B x1" in text and "seed 1: GPU B x1 (all methods)" in text
    assert "seed 2: GPU A x1 (all methods)" in text and "left out of the pairing" in text


def test_runs_record_their_machine():
    from pods_rl.commands.study_runner import run_machine

    machine = run_machine("cpu")
    assert "cores" in machine["label"] and machine["info"]["usable_cores"] >= 1


# ------------------------------------------------------------------------------------------------------------
# End to end
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_smoke_runs_the_whole_study_and_resumes(tmp_path, capsys):
    """`pods study --smoke`: cost, 3 methods x 2 seeds of real `pods train` runs, the report with the three
    numbers and their intervals, figures; a second call finds everything done."""
    from pods_rl.commands.study import main

    out = tmp_path / "smoke"
    assert main(["--smoke", "--out", str(out)]) == 0
    report = json.loads((out / "study.json").read_text())
    for name in ("cost.json", "plan.json", "commands.jsonl", "report.txt", *report["study"]["figures"]):
        assert (out / name).stat().st_size > 0, name
    assert [r["n"] for r in report["cost"]["rows"]] == [4, 8] and report["cost"]["rows"][0]["step_ratio"] == 1.0
    numbers = report["headline"]["pods-mv-n8m4"]
    for key in ("learning_per_update", "step_time_ratio", "wall_clock_speedup"):
        assert len(numbers[key]["ci95"]) == 2, key  # an interval over the 2 seeds
    step = numbers["step_time_ratio"]
    assert step["value"] > 0 and step["ci95"][0] <= step["value"] <= step["ci95"][1]
    assert numbers["break_even"]["verdict"] in ("pays", "does not pay", "undecided", "unknown")
    assert set(report["study"]["methods"]) == {"grpo-n4", "pods-mv-n8m4", "pods-random-n8m4"}
    assert all(m["seeds"] == 2 for m in report["study"]["methods"].values())
    text = (out / "report.txt").read_text()
    assert "(1) learning per update" in text and "interpolated between evaluations" in text
    assert len(numbers["accuracy_at_equal_time"]) == 4 and numbers["area_vs_time"]["mean"] is not None
    logged = json.loads((out / "commands.jsonl").read_text().splitlines()[0])
    assert logged["command"] == f"pods study --smoke --out {out}" and len(logged["runs"]) == 6
    capsys.readouterr()
    assert main(["--smoke", "--out", str(out), "--stage", "runs"]) == 0
    assert "6 runs, 6 done before, 0 to go" in capsys.readouterr().out


def test_stage_names():
    assert STAGES == ("cost", "sweep", "runs", "report")
