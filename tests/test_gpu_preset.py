"""The GPU preset (benchmarks/gpu/): its plan against one 15-minute lease (two study calls on a GPU kind whose step
costs are filed), the command of each device call, what a
call carries (preflight), what comes back and how it is kept, the model's hash and accuracy gate, a call's stages
against its deadline, its dry run from a tree without package metadata, and the wheels it carries. The steps run end
to end on CPU at toy sizes with `h100.py answer --cpu` and `h100.py study --cpu` (benchmarks/gpu/README.md)."""

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
H200 = ROOT / "benchmarks" / "results" / "gpu-nvidia-h200"  # the first lease's call 1 is filed there


@pytest.fixture
def gpu(monkeypatch):
    """The preset's modules (plan, outbox, carry, session, answer, study_call, h100, wheels), imported fresh."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(GPU))
    names = ("plan", "outbox", "carry", "session", "answer", "study_call", "h100", "wheels")
    for name in names:
        sys.modules.pop(name, None)
    import importlib

    return argparse.Namespace(**{name: importlib.import_module(name) for name in names})


def _args(tmp_path, **kw):
    base = dict(out=tmp_path / "out", work=tmp_path / "work", results=tmp_path / "results", cpu=True,
                model="built", dry_run=False, step="study")
    return argparse.Namespace(**{**base, **kw})


# ------------------------------------------------------------------------------------------------------------
# The plan and the commands
# ------------------------------------------------------------------------------------------------------------
def test_the_plan_fits_one_15_minute_lease(gpu, tmp_path):
    """On a GPU kind with nothing filed: machine start, every call at its hard limit and the per-call overhead fit
    the 15 minutes a lease has; every call ends inside 9 (the device stops a command at 10); call 1, the step costs,
    comes first, then one study call; call 1's stages' estimates fit inside its limit less the margin it keeps to
    pack, and the study call leaves time to runs."""
    P = gpu.plan
    unfiled = tmp_path / "gpu-nvidia-h100-80gb-hbm3"  # a kind with no results folder, or an empty one
    assert P.calls_for(None) is P.calls_for(unfiled) is P.CALLS and not P.step_costs_filed(unfiled)
    unfiled.mkdir()
    assert P.calls_for(unfiled) is P.CALLS and P.plan_text(unfiled) == P.plan_text()
    assert P.BUDGET_SECONDS == 15 * 60 and P.CALL_LIMIT_SECONDS == 9 * 60
    assert sum(seconds for _, seconds in P.timeline()) <= P.BUDGET_SECONDS
    assert all(c.estimate <= c.timeout <= P.CALL_LIMIT_SECONDS for c in P.CALLS)
    assert [c.step for c in P.CALLS] == ["answer", "study"]
    assert P.fitting_calls(P.BUDGET_SECONDS) == len(P.CALLS)
    assert P.START_SECONDS >= 120 and P.PER_CALL_SECONDS >= 30  # the device's start, carry and warm window
    assert sum(P.ANSWER_STAGES.values()) <= P.CALLS[0].timeout - gpu.plan.MARGIN_SECONDS
    assert P.study_run_seconds() >= sum(P.RUN_SECONDS.values())  # at least one paired seed per lease
    one_more = P.CALLS + (P.CALLS[-1],)
    assert sum(seconds for _, seconds in P.timeline(one_more)) > P.BUDGET_SECONDS  # the plan is full: no 3rd call
    text = P.plan_text()
    assert "of 15" in text and "of 30" not in text
    assert "total 14.8 min of 15" in text and "study call leaves about 3.7 min to runs" in text
    assert "skipped" not in text and "`h100.py plan --gpu NAME` gives the whole lease to the study" in text


def test_a_kind_with_filed_step_costs_gives_the_whole_lease_to_the_study(gpu):
    """The H200's call 1 is filed (benchmarks/results/gpu-nvidia-h200/answer.json, its cost stage done): its lease
    runs no call 1 but two study calls, the same command, inside the 15 minutes (every call under 9), and the plan
    says what it skips and where each of call 1's stages is filed; the study gets over twice the minutes of runs
    (one cost measurement a lease: the second call continues the first's study on the warm machine)."""
    P = gpu.plan
    assert P.step_costs_filed(H200) and P.calls_for(H200) is P.FILED_CALLS
    calls = P.calls_for(H200)
    assert [c.step for c in calls] == ["study", "study"]
    assert all(c.estimate <= c.timeout <= P.CALL_LIMIT_SECONDS for c in calls)
    assert sum(seconds for _, seconds in P.timeline(calls)) <= P.BUDGET_SECONDS
    assert P.fitting_calls(P.BUDGET_SECONDS, calls) == 2
    assert sum(seconds for _, seconds in P.timeline(calls + calls[-1:])) > P.BUDGET_SECONDS  # full: no 3rd call
    assert len({P.command(c) for c in calls}) == 1 and P.command(calls[0]) == P.command(P.CALLS[1])
    assert P.study_run_seconds(calls) > 2 * P.study_run_seconds(P.CALLS)
    assert P.study_run_seconds(calls) >= 3 * sum(P.RUN_SECONDS.values())  # three paired seeds a lease
    filed = P.filed_stages(H200)
    assert filed["cost"] == filed["machine"] == "answer.json"
    assert filed["cuda_tests"] == "answer.json (as selection_test)"
    assert filed["selection_bench"] == "selection/bench_downsample.json" and filed["cost_big_short"] is None
    text = P.plan_text(H200)
    lines = text.splitlines()
    assert [line.split()[:2] for line in lines[2:4]] == [["call", "1"], ["call", "2"]]
    assert not any(" answer: " in line for line in lines[2:4]) and "total 14.8 min of 15" in text
    assert "2 study calls leave about 8.0 min to runs" in text
    skipped = next(line for line in lines if line.startswith("skipped: "))
    assert skipped.startswith("skipped: call 1 (answer: the step costs, ~4.8 min), filed for this GPU kind in "
                              "benchmarks/results/gpu-nvidia-h200/ (call 1 of 2026-11-28): ")
    assert "machine, model, cost in answer.json" in skipped and "not measured by this lease either: cost_big_short" \
        in skipped


def test_step_costs_count_as_filed_only_from_a_gpu_call_1_whose_cost_stage_is_done(gpu, tmp_path):
    P = gpu.plan

    def record(**kw):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        stages = [{"name": "machine", "status": "done"}, {"name": "cost", "status": kw.pop("cost", "done")}]
        (folder / "answer.json").write_text(json.dumps({"step": "answer", "cpu_mode": False, "stages": stages,
                                                        "started": "2026-12-01 10:00:00", **kw}))
        return folder

    assert P.step_costs_filed(record())
    assert not P.step_costs_filed(record(cost="skipped")) and not P.step_costs_filed(record(cost="failed"))
    assert not P.step_costs_filed(record(cpu_mode=True))  # the CPU mode's toy costs say nothing of a GPU
    assert not P.step_costs_filed(record(step="study"))
    folder = record()
    (folder / "selection").mkdir()
    (folder / "selection" / "bench_downsample.json").write_text("{}")
    filed = P.filed_stages(folder)
    assert filed["selection_bench"] == "selection/bench_downsample.json" and filed["big_model"] is None
    assert "(call 1 of 2026-12-01)" in P.plan_text(folder)


def test_plan_and_commands_take_the_gpu_kind(gpu, capsys):
    """`h100.py plan --gpu NAME` finds the kind's results folder from the GPU's name, its folder's name or a part
    only one folder has; a kind with no folder gets the plan of nothing filed and one line on stderr."""
    h100 = gpu.h100
    assert {h100.kind_folder(name) for name in ("NVIDIA H200", "gpu-nvidia-h200", "H200",
                                                "one NVIDIA H200 GPU (about 139 GiB of GPU memory)")} == {H200}
    assert h100.kind_folder("NVIDIA H100 80GB HBM3").name == "gpu-nvidia-h100-80gb-hbm3"
    assert h100.kind_folder(None) is None
    assert h100.main(["plan", "--gpu", "NVIDIA H200"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == gpu.plan.plan_text(H200)
    assert h100.main(["commands", "--gpu", "H200"]) == 0
    assert capsys.readouterr().out.splitlines() == [gpu.plan.command(gpu.plan.CALLS[1])] * 2
    assert h100.main(["plan", "--gpu", "NVIDIA H100 80GB HBM3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n") == gpu.plan.plan_text()
    assert "no results folder" in captured.err and "gpu-nvidia-h200" in captured.err


def test_the_study_goes_on_phase_by_phase_paired_with_the_same_grpo_seeds(gpu, tmp_path):
    """PODS 64 -> 16 until its seeds are paired, then auto (PODS that picks its own n, up to the pairs' 64, keeping
    their 16), then adaptive PODS (pilot 16), then Knapsack-RL; each phase's `pods study` names GRPO and its method,
    so GRPO's finished seeds are reused and only missing ones run."""
    P = gpu.plan
    assert P.PHASES == ("pods", "auto", "adaptive", "knapsack")
    study = {**P.STUDY, "seeds": 2}
    pairs = lambda *methods: [f"{m}-s{s}" for s in range(2) for m in methods]  # noqa: E731
    assert P.study_phase([], study) == "pods"
    assert P.study_phase(pairs("grpo-n16", "pods-mv-n64m16")[:-1], study) == "pods"  # a seed short
    assert P.study_phase(pairs("grpo-n16", "pods-mv-n64m16"), study) == "auto"
    assert P.study_phase(pairs("grpo-n16", "pods-mv-n64m16", "pods-mv-n64m16-auto")[:-1], study) == "auto"
    auto = pairs("grpo-n16", "pods-mv-n64m16", "pods-mv-n64m16-auto")
    assert P.study_phase(auto, study) == "adaptive"
    adaptive = [*auto, *pairs("pods-mv-n64m16-pilot16")]
    assert P.study_phase(adaptive, study) == "knapsack"
    assert P.study_phase([*adaptive, *pairs("pods-mv-n64m16-knapsack32")], study) is None
    assert P.phase_method("auto", P.TINY_STUDY)[0] == "pods-mv-n8m4-auto"
    args = _args(tmp_path, cpu=False)
    auto_argv = gpu.study_call.study_argv(args, tmp_path, 1e-4, tmp_path / "st", "runs", phase="auto")
    assert "grpo-n16,pods-mv-n64m16-auto" in auto_argv and "auto=--rollout_planner auto" in auto_argv
    assert not any("adaptive_budget" in a or "--pilot" == a for a in auto_argv)  # auto refuses a fixed budget
    knapsack = gpu.study_call.study_argv(args, tmp_path, 1e-4, tmp_path / "st", "runs", phase="knapsack")
    assert "grpo-n16,pods-mv-n64m16-knapsack32" in knapsack
    assert "knapsack32=--rollout_planner knapsack --adaptive_budget 32" in knapsack
    adaptive = gpu.study_call.study_argv(args, tmp_path, 1e-4, tmp_path / "st", "runs", phase="adaptive")
    assert "grpo-n16,pods-mv-n64m16-pilot16" in adaptive and adaptive[adaptive.index("--pilot") + 1] == "16"
    assert "knapsack" in P.plan_text() and "adaptive" in P.CALLS[-1].measures
    assert P.CALLS[-1].measures.index("PODS 64 -> 16, then auto") < P.CALLS[-1].measures.index("adaptive")
    assert ", auto (pods-mv-n64m16-auto, ~80 s a seed), adaptive (" in P.plan_text()


def test_the_auto_phase_trains_the_auto_planner_at_the_pairs_n_and_m(gpu, tmp_path, capsys):
    """`pods study --dry-run` of the auto phase: its `pods train` commands parse to rollout_planner="auto" with
    num_generations 64 (the most a prompt gets) and downsample_to 16, no fixed budget, and the budget layer builds
    the auto planner from them (its refusals run before any model loads)."""
    import shlex

    from pods_rl.budget.rollout_budget import RolloutBudget
    from pods_rl.commands import study as study_cmd
    from pods_rl.recipes import parse_args

    model = gpu.study_call.committed_model("shipped")
    argv = gpu.study_call.study_argv(_args(tmp_path, cpu=False), Path(model["dir"]), model["lr"], tmp_path / "st",
                                     "runs", phase="auto")[4:]
    assert study_cmd.main([*argv, "--use_cpu", "true", "--bf16", "false", "--dry-run"]) == 0
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 16 and "/pods-mv-n64m16-auto-s0 " in commands[1]
    run, config, _ = parse_args(shlex.split(commands[1])[2:])
    assert (config.rollout_planner, config.num_generations, config.downsample_to) == ("auto", 64, 16)
    assert config.adaptive_budget is None and config.pilot_generations is None
    budget = RolloutBudget.from_config(config)
    assert type(budget.how_many).__name__ == "AutoN" and (budget.n, budget.m) == (64, 16)


def test_the_plan_subcommand_prints_it(gpu, capsys):
    assert gpu.h100.main(["plan"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == gpu.plan.plan_text()


def test_each_call_is_one_command_that_returns_what_it_has(gpu):
    """Each device call is one command of at most 2,000 characters: only the wheels the image lacks installed, after
    src/ on PYTHONPATH; the step under a `timeout` below the device's limit; its output kept in $OUT as it is
    written (tee), the pipeline's status that of the step. benchmarks/gpu/README.md writes each one out."""
    readme = (GPU / "README.md").read_text()
    for call in gpu.plan.CALLS:
        command = gpu.plan.command(call)
        assert len(command) <= 2000, len(command)
        assert command.startswith("set -o pipefail; ")
        assert f"timeout -k 10 {call.timeout} python3 benchmarks/gpu/h100.py {call.step} --out $OUT" in command
        assert command.endswith(f"2>&1 | tee $OUT/{call.step}.log")
        assert "PYTHONPATH=$PWD/src:/tmp/site " in command and "--no-index --no-deps" in command
        assert command in readme, f"README lacks call {call.step}'s command"


def test_the_readme_shows_the_plan_as_plan_py_computes_it(gpu):
    """Both plans: a kind with nothing filed, and the H200's (its step costs filed: two study calls)."""
    readme = (GPU / "README.md").read_text()
    assert "```\n" + gpu.plan.plan_text() + "\n```" in readme
    assert "```\n" + gpu.plan.plan_text(H200) + "\n```" in readme


def test_commands_subcommand_prints_the_plans_commands(gpu, capsys):
    assert gpu.h100.main(["commands"]) == 0
    assert capsys.readouterr().out.splitlines() == [gpu.plan.command(c) for c in gpu.plan.CALLS]


# ------------------------------------------------------------------------------------------------------------
# Preflight: what a call carries
# ------------------------------------------------------------------------------------------------------------
def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_preflight_sums_what_the_device_would_carry(gpu, tmp_path):
    """A synthetic tree: tracked (1 MiB), untracked but not ignored (2 MiB), ignored (50 MiB: stays, unless carried),
    a deleted tracked file (gone: not counted), shared/ (travels though ignored) and .whl (3 MiB, carried)."""
    MiB = 2**20
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("big/\n.whl/\nshared/\n")
    (repo / "src" / "a.bin").write_bytes(b"a" * MiB)
    (repo / "gone.bin").write_bytes(b"g" * 5 * MiB)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "tree")
    (repo / "gone.bin").unlink()
    (repo / "new.bin").write_bytes(b"n" * 2 * MiB)
    (repo / "big").mkdir()
    (repo / "big" / "weights.bin").write_bytes(b"w" * 50 * MiB)
    (repo / ".whl").mkdir()
    (repo / ".whl" / "x.whl").write_bytes(b"x" * 3 * MiB)
    (repo / "shared").mkdir()
    (repo / "shared" / "s.txt").write_bytes(b"s" * (MiB // 2))
    size = (repo / ".gitignore").stat().st_size
    ok, line = gpu.carry.preflight(repo, [".whl"], 10)
    assert ok, line
    expected = (1 + 2 + 0.5 + 3) * MiB + size
    assert f"a call carries {expected / MiB:.1f} MiB" in line and ".whl 3.0 MiB" in line and "within 10 MiB" in line
    ok, line = gpu.carry.preflight(repo, [".whl", "big"], 10)  # carrying the ignored folder counts it
    assert not ok and "\n" not in line and "over the 10 MiB limit" in line and "big 50.0 MiB" in line
    ok, line = gpu.carry.preflight(repo, [".whl"], 5)
    assert not ok and "largest: new.bin 2.0 MiB" in line, line


def test_preflight_subcommand_exits_1_over_the_limit(gpu, monkeypatch, capsys):
    monkeypatch.setattr(gpu.h100, "preflight", lambda repo, carry, limit: (False, f"preflight: {carry} over {limit}"))
    assert gpu.h100.main(["preflight", "--carry", ".whl,.gl"]) == 1
    assert capsys.readouterr().out.strip() == "preflight: ['.whl', '.gl'] over 60"


# ------------------------------------------------------------------------------------------------------------
# What comes back, and how it is kept
# ------------------------------------------------------------------------------------------------------------
def _run(study, name, finished=True, weights=True):
    run = study / "study" / "runs" / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(f'{{"step": 0, "name": "{name}"}}\n')
    (study / "study" / "runs" / f"{name}.log").write_text("log\n")
    if finished:
        (run / "summary.json").write_text("{}")
        (run / "study_run.json").write_text("{}")
    if weights:
        (run / "checkpoint-5").mkdir()
        (run / "checkpoint-5" / "trainer_state.json").write_text("{}")
        (run / "final").mkdir()
        (run / "final" / "model.safetensors").write_bytes(b"w")
    return run


def _names(archive):
    with tarfile.open(archive) as tar:
        return sorted(tar.getnames())


def test_study_archive_holds_finished_runs_and_no_weights(gpu, tmp_path):
    study = tmp_path / "study-abc"
    _run(study, "grpo-n16-s0")
    _run(study, "pods-mv-n64m16-s0", finished=False)  # in flight: restarts elsewhere
    (study / "report.txt").write_text("report")
    (study / "huge.log").write_bytes(b"x" * (gpu.outbox.SMALL_BYTES + 1))
    box = gpu.outbox.Outbox(tmp_path / "out")
    box.pack("study-abc.tgz", study, gpu.outbox.study_files(study))
    assert _names(tmp_path / "out" / "study-abc.tgz") == [
        "report.txt", "study/runs/grpo-n16-s0.log", "study/runs/grpo-n16-s0/metrics.jsonl",
        "study/runs/grpo-n16-s0/study_run.json", "study/runs/grpo-n16-s0/summary.json"]
    assert not list((tmp_path / "out").glob(".*"))  # no temporary file left: each file is replaced whole


def test_keep_merges_study_archives_and_moves_a_changed_json_aside(gpu, tmp_path):
    """An archive that came back is merged with the one kept before: the union of their finished runs (a call that
    started from an older archive loses nothing); a JSON that changed moves the old one to previous/; logs go to
    logs/ under the time they came back."""
    results = tmp_path / "results"
    old, new = tmp_path / "old", tmp_path / "new"
    _run(old, "grpo-n16-s0")
    _run(old, "pods-mv-n64m16-s0")
    _run(new, "grpo-n16-s0")
    _run(new, "grpo-n16-s1")
    (new / "report.txt").write_text("new report")
    back = tmp_path / "back"
    box = gpu.outbox.Outbox(back)
    box.write_json("study-call.json", {"results_dir": "gpu-test"})
    box.write_json("model.json", {"sha256": "b"})
    box.pack("study-k.tgz", new, gpu.outbox.study_files(new))
    (back / "study.log").write_text("output")
    dest = results / "gpu-test"
    dest.mkdir(parents=True)
    gpu.outbox.Outbox(dest).pack("study-k.tgz", old, gpu.outbox.study_files(old))
    (dest / "model.json").write_text('{"sha256": "a"}')
    lines = gpu.outbox.keep(back, results, stamp="T")
    assert any("3 finished runs (1 kept from the archive there)" in line for line in lines), lines
    names = _names(dest / "study-k.tgz")
    assert {n for n in names if n.endswith("study_run.json")} == {
        f"study/runs/{r}/study_run.json" for r in ("grpo-n16-s0", "grpo-n16-s1", "pods-mv-n64m16-s0")}
    assert "report.txt" in names and "study/runs/pods-mv-n64m16-s0.log" in names
    assert json.loads((dest / "model.json").read_text()) == {"sha256": "b"}
    assert json.loads((dest / "previous" / "T-model.json").read_text()) == {"sha256": "a"}
    assert (dest / "logs" / "T-study.log").read_text() == "output"
    with pytest.raises(ValueError, match="no call record"):
        gpu.outbox.keep(tmp_path / "old", results)


def test_unpack_missing_keeps_the_newer_files_of_a_warm_machine(gpu, tmp_path):
    study = tmp_path / "s"
    _run(study, "grpo-n16-s0", weights=False)
    gpu.outbox.Outbox(tmp_path).pack("a.tgz", study, gpu.outbox.study_files(study))
    (study / "study" / "runs" / "grpo-n16-s0" / "metrics.jsonl").write_text("newer\n")
    (study / "study" / "runs" / "grpo-n16-s0" / "summary.json").unlink()
    assert gpu.outbox.unpack_missing(tmp_path / "a.tgz", study) == 1
    assert (study / "study" / "runs" / "grpo-n16-s0" / "metrics.jsonl").read_text() == "newer\n"


# ------------------------------------------------------------------------------------------------------------
# The model: its hash, its accuracy, the study's folder
# ------------------------------------------------------------------------------------------------------------
def test_the_recorded_sha_of_the_shipped_model_is_the_shipped_weights(gpu):
    assert gpu.session.weights_sha256(gpu.session.SHIPPED) == gpu.plan.SHIPPED_SHA256
    assert gpu.plan.ACCURACY_RANGE[0] <= gpu.session.start_accuracy(gpu.session.SHIPPED) <= gpu.plan.ACCURACY_RANGE[1]


@pytest.mark.parametrize("accuracy, fits", [(0.1, False), (0.2, True), (0.5, True), (0.8, True), (0.85, False)])
def test_the_accuracy_gate_stops_in_one_line(gpu, accuracy, fits):
    if fits:
        gpu.session.gate(accuracy, gpu.plan.ACCURACY_RANGE)
        return
    with pytest.raises(gpu.session.Stop) as stop:
        gpu.session.gate(accuracy, gpu.plan.ACCURACY_RANGE)
    assert "\n" not in str(stop.value) and f"{accuracy:.3f}" in str(stop.value) and "--model shipped" in str(stop.value)


def _model(directory, weights=b"weights", accuracy=0.5):
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(weights)
    (directory / "build_info.json").write_text(json.dumps({"held_out_accuracy": {"sampled_t1": {"accuracy": accuracy}},
                                                           "versions": {"torch": "2.11.0+cu130"}}))


def _session(gpu, args, step="study", record="study-call.json"):
    call = gpu.session.Session(args, step, record)
    call.record["machine"] = {"info": {"gpu": "NVIDIA H100 80GB HBM3"}}
    return call


def test_a_built_model_other_than_the_recorded_one_stops_the_study(gpu, tmp_path):
    """A warm machine's model (or a rebuild) is hashed and compared with the sha256 kept in the results folder: the
    same continues, another stops in one line, after model.json went to $OUT (what was built comes back)."""
    args = _args(tmp_path)
    _model(args.work / "model")
    sha = gpu.session.weights_sha256(args.work / "model")
    call = _session(gpu, args)
    record = gpu.study_call.ensure_model(call)
    assert record["reused"] and record["key"] == sha[:12] and record["recorded_sha256"] is None
    assert json.loads((args.out / "model.json").read_text())["sha256"] == sha
    args.results.mkdir()
    (args.results / "model.json").write_text(json.dumps({"kind": "built", "sha256": sha}))
    assert gpu.study_call.ensure_model(call)["recorded_sha256"] == sha
    (args.results / "model.json").write_text(json.dumps({"kind": "built", "sha256": "f" * 64}))
    with pytest.raises(gpu.session.Stop) as stop:
        gpu.study_call.ensure_model(call)
    assert "\n" not in str(stop.value) and "ffffffffffff" in str(stop.value) and sha[:12] in str(stop.value)
    assert json.loads((args.out / "model.json").read_text())["recorded_sha256"] == "f" * 64


def test_the_shipped_model_names_its_own_study(gpu, tmp_path):
    record = gpu.study_call.ensure_model(_session(gpu, _args(tmp_path, model="shipped")))
    assert record["key"] == f"shipped-{gpu.plan.SHIPPED_SHA256[:12]}" and record["lr"] == gpu.plan.SHIPPED_LR


# ------------------------------------------------------------------------------------------------------------
# A call's stages against its deadline
# ------------------------------------------------------------------------------------------------------------
def test_a_stage_that_does_not_fit_is_skipped_and_every_stage_is_recorded_at_once(gpu, tmp_path):
    call = _session(gpu, _args(tmp_path), step="answer", record="answer.json")
    record = lambda: json.loads((tmp_path / "out" / "answer.json").read_text())  # noqa: E731
    assert call.stage("one", 1, lambda: {"x": 1}) == {"x": 1}
    assert record()["one"] == {"x": 1} and record()["stages"][0]["status"] == "done"
    assert call.stage("broken", 1, lambda: 1 / 0) is None and call.failed
    assert record()["stages"][1]["status"] == "failed" and "ZeroDivisionError" in record()["stages"][1]["why"]
    call.deadline = time.monotonic() + 10
    assert call.stage("long", 60, lambda: pytest.fail("ran past the deadline")) is None
    assert record()["stages"][2]["status"] == "skipped"

    def stop():
        raise gpu.session.Stop("no CUDA")

    with pytest.raises(gpu.session.Stop):
        call.stage("machine", 0, stop)
    assert record()["stages"][3] | {"seconds": 0} == {"name": "machine", "estimate": 0, "status": "stopped",
                                                      "why": "no CUDA", "seconds": 0}


def test_cost_summary_splits_the_step_and_names_the_headline(gpu):
    def row(n, pilot, step, ratio, gen, sel, upd):
        return {"n": n, "m": 16, "pilot_generations": pilot, "step_ratio": ratio, "update_peak_gb": 1.0,
                "sampled_per_step": 128, "seconds": {"generation": gen, "scoring": 0.0, "selection": sel,
                                                     "update": upd, "step": step}}

    summary = gpu.answer.cost_summary({"rows": [row(16, None, 1.0, 1.0, 0.3, 0.0, 0.7),
                                                row(64, None, 1.2, 1.2, 0.45, 0.05, 0.7),
                                                row(64, 16, 1.1, 1.1, 0.35, 0.05, 0.7)]})
    assert summary["rows"][1]["share"] == {"generation": 0.375, "scoring": 0.0, "selection": 0.042, "update": 0.583}
    assert summary["headline"] == ("a PODS 64 -> 16 step takes 1.20x a GRPO step (generation 38%, selection 4.2%, "
                                   "update 58% of it); adaptive 64 -> 16 k16: 1.10x")


def test_gpu_paths_cover_the_documented_paths(gpu):
    """docs/guides/gpu.md has a row for every GPU-only path of plan.GPU_PATHS, and the H200's gpu_paths.json (its
    first lease) says for each whether it ran."""
    doc = (ROOT / "docs" / "guides" / "gpu.md").read_text()
    for path in gpu.plan.GPU_PATHS:
        assert f"`{path}`" in doc, path
    recorded = json.loads((ROOT / "benchmarks" / "results" / "gpu-nvidia-h200" / "gpu_paths.json").read_text())
    assert set(recorded) == set(gpu.plan.GPU_PATHS) and recorded["bf16"]["ran"] and not recorded["vllm_cuda"]["ran"]


def test_auto_picks_the_model_with_fewer_finished_runs(gpu, tmp_path, monkeypatch):
    """`study --model auto` continues the study the repository holds fewer finished runs of (shipped on a tie), so
    leases on later days grow both models' studies; an explicit --model is kept."""
    args = _args(tmp_path, model="auto", cpu=False)
    info = {"gpu": "NVIDIA H200"}
    assert gpu.study_call.choose_model(args, info) == "shipped"
    folder = gpu.session.results_dir(args, info)
    folder.mkdir(parents=True, exist_ok=True)
    study = tmp_path / "shipped-study"
    for name in ("grpo-n16-s0", "pods-mv-n64m16-s0"):
        _run(study, name)
    key = gpu.study_call.committed_model("shipped")["key"]
    gpu.outbox.Outbox(folder).pack(f"study-{key}.tgz", study, gpu.outbox.study_files(study))
    assert gpu.outbox.archived_runs(folder / f"study-{key}.tgz") == ["grpo-n16-s0", "pods-mv-n64m16-s0"]
    assert gpu.study_call.choose_model(args, info) == "strong"
    assert gpu.study_call.choose_model(_args(tmp_path, model="shipped"), info) == "shipped"
    strong = gpu.study_call.committed_model("strong")
    assert strong["lr"] == gpu.plan.STRONG_LR and 0.2 <= strong["start_accuracy"] <= 0.8
    # A warm machine (the lease's second study call): the study its work folder holds goes on, even where `keep`
    # filed the first call's runs in between (the strong one now has fewer); a finished one does not hold it.
    here = args.work / f"study-{key}"
    _run(here, "grpo-n16-s0")
    _run(here, "pods-mv-n64m16-s0", finished=False)  # in flight at the first call's deadline: its checkpoint is here
    assert gpu.study_call.choose_model(args, info) == "shipped"
    every = [f"{m}-s{s}" for s in range(gpu.plan.STUDY["seeds"]) for m in ("grpo-n16", *(
        gpu.plan.phase_method(p)[0] for p in gpu.plan.PHASES))]
    monkeypatch.setattr(gpu.study_call, "finished_runs", lambda study_dir: every)
    assert gpu.study_call.choose_model(args, info) == "strong"


def test_a_study_call_records_the_lease_it_belongs_to(gpu, tmp_path):
    """study-call.json says whether this kind's step costs are filed (no call 1: two study calls) and where."""
    record = gpu.study_call.lease_record(_args(tmp_path, results=H200, cpu=False), {"gpu": "NVIDIA H200"})
    assert record["step_costs_filed"] and record["calls"] == ["study", "study"]
    assert record["results_dir"] == "gpu-nvidia-h200" and record["filed_stages"]["cost"] == "answer.json"
    record = gpu.study_call.lease_record(_args(tmp_path, cpu=False), {"gpu": "NVIDIA H100 80GB HBM3"})
    assert not record["step_costs_filed"] and record["calls"] == ["answer", "study"]


# ------------------------------------------------------------------------------------------------------------
# The dry run, from the tree a device call carries
# ------------------------------------------------------------------------------------------------------------
def python_without_pods_rl_metadata(tmp_path: Path) -> Path:
    """A virtual environment with every package of this one (linked) except pods-rl: no metadata, no editable
    finder, so ``importlib.metadata.version("pods-rl")`` fails there, as in a tree that was never installed."""
    site = Path(sysconfig.get_paths()["purelib"])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    target = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip())
    for entry in site.iterdir():
        if not re.match(r"(__editable__\.)?pods[_-]rl", entry.name, re.I) and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return python


def test_dry_run_from_a_git_archive_without_package_metadata(tmp_path):
    """`git archive HEAD` (no egg-info), pods_rl from its src/ on PYTHONPATH as on the machine, in an environment
    without pods-rl's metadata: `h100.py all --dry-run` imports what every stage imports, prints every command,
    plans the study with `pods study --dry-run` (GRPO and PODS, seed by seed), fits the budget on CPU,
    and writes nothing."""
    tree = tmp_path / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    assert not list((tree / "src").glob("*.egg-info")) and (tree / "benchmarks" / "gpu" / "h100.py").is_file()
    python = python_without_pods_rl_metadata(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tree / "src"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    probe = subprocess.run([python, "-c", "import importlib.metadata as m; m.version('pods-rl')"], env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0 and "PackageNotFoundError" in probe.stderr
    work = tmp_path / "work"
    done = subprocess.run([python, "benchmarks/gpu/h100.py", "all", "--dry-run", "--work", str(work)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"pods_rl from {tree / 'src' / 'pods_rl' / '__init__.py'} (version 0+unknown)" in out
    assert "dry run: ok" in out and "shipped model: sha256 f59f28d24887 as recorded" in out
    runs = re.findall(r"^pods train .*--output_dir \S+/study/runs/(\S+) ", out, re.M)
    methods = ["grpo-n16", "pods-mv-n64m16"]
    assert runs == [f"{m}-s{s}" for s in range(8) for m in methods], runs  # seed by seed, paired
    assert out.count("+ ") >= 12 and "build-tiny" in out and "--max_completion_length 128" in out
    assert "bench_downsample.py --device cuda" in out and "study on the strong model" in out
    assert "the study's phase: pods" in out and "--methods grpo-n16,pods-mv-n64m16-knapsack32" in out
    assert "--methods grpo-n16,pods-mv-n64m16-auto --variant 'auto=--rollout_planner auto'" in out
    assert not work.exists()  # a dry run writes nothing


# ------------------------------------------------------------------------------------------------------------
# The wheels: only what the image lacks
# ------------------------------------------------------------------------------------------------------------
def test_the_carried_wheels_are_what_the_image_lacks_and_nothing_it_has(gpu):
    """Carried: TRL, datasets, math-verify and what they need that the image lacks; never a package of the image
    (a carried copy would come first on PYTHONPATH and replace the image's torch or transformers)."""
    w = gpu.wheels
    lock = w.load()
    assert w.lock_problems(lock) == []
    assert set(lock["roots"]) == {w.canonical(re.match(r"[\w.-]+", d).group(0)) for d in w.base_dependencies()}
    carried = w.carried(lock)
    assert set(carried) == {"trl", "datasets", "math-verify", "dill", "multiprocess", "latex2sympy2-extended",
                            "antlr4-python3-runtime"}
    assert not set(carried) & w.IMAGE_PACKAGES
    for name in ("torch", "transformers", "accelerate", "peft", "pandas", "psutil", "xxhash", "jinja2", "pyarrow"):
        assert lock["packages"][name]["status"] == "image", name
    assert carried["trl"] == "1.16.0" and carried["datasets"] == "4.8.5"
    for name, version in w.IMAGE_VERSIONS.items():
        assert lock["packages"][name]["version"] == version, name
    assert "torch==2.11.0" in w.constraints(lock) and "trl==1.16.0" in w.constraints(lock)


def test_the_wheels_lock_is_the_packages_own_metadata(gpu):
    """Each lock entry installed here at the same version lists exactly the requirements its metadata declares (the
    lock is what pip resolved, not edited by hand)."""
    lock = gpu.wheels.load()
    compared = 0
    for name, package in lock["packages"].items():
        try:
            installed = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if installed.version == package["version"]:
            compared += 1
            assert gpu.wheels.requirement_names(installed.requires) == package["requires"], name
    assert compared >= 10, compared


def test_wheel_check_names_what_is_missing(gpu, tmp_path):
    """``wheels.py check`` on wheels built here from the lock: complete passes; a missing wheel, another version
    and a requirement outside the lock are each named."""
    w = gpu.wheels
    lock = w.load()

    def wheel(name, version, requires):
        path = tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        meta = "\n".join([f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)])
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
                       "Metadata-Version: 2.1\n" + meta + "\n\n")
        return path

    for name, version in w.carried(lock).items():
        wheel(name, version, lock["packages"][name]["requires"])
    assert w.wheel_problems(tmp_path, lock) == []
    next(tmp_path.glob("dill-*.whl")).unlink()
    wheel("trl", "1.16.0", ["accelerate", "no-such-dist>=1; python_version >= '3.8'"])
    wheel("datasets", "0.1", [])
    problems = w.wheel_problems(tmp_path, lock)
    assert any(p.endswith("requires no-such-dist, which is not in the lock") for p in problems), problems
    assert any("datasets 0.1, but the lock carries" in p for p in problems), problems
    assert f"dill=={lock['packages']['dill']['version']}: no wheel" in problems


def test_the_machine_check_names_a_carried_wheel_that_shadows_the_image(gpu, tmp_path):
    """On the machine, a carried distribution installed twice (in /tmp/site and in the image) is reported; the
    check itself runs here (the CPU mode's machine stage)."""
    class Dist:
        def __init__(self, name, version, path):
            self.metadata, self.version, self._path = {"Name": name}, version, path

    dists = [Dist("trl", "1.16.0", "/tmp/site"), Dist("TRL", "1.10.0", "/image"), Dist("torch", "2.11.0", "/image")]
    assert gpu.session.shadowing(dists, {"trl": "1.16.0", "dill": "0.4.1"}) == {
        "trl": ["1.16.0 at /tmp/site", "1.10.0 at /image"]}
    result = gpu.session.machine_stage(_session(gpu, _args(tmp_path), step="answer", record="answer.json"))
    assert result["shadowed"] == {} and result["info"]["device"] == "cpu" and result["import_errors"] == {}


def test_a_command_past_its_budget_is_asked_to_stop_first(gpu, tmp_path):
    """A stage's command past its budget gets SIGTERM (so `pods study` can stop its runs gracefully), exit 124."""
    call = _session(gpu, _args(tmp_path), step="answer", record="answer.json")
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('stopping gracefully', flush=True), sys.exit(0)))\n"
              "print('started', flush=True); time.sleep(60)\n")
    start = time.monotonic()
    assert call.run([sys.executable, "-c", script], tmp_path / "x.log", budget=10) == 124
    assert time.monotonic() - start < 40
    assert (tmp_path / "x.log").read_text().split() == ["started", "stopping", "gracefully"]
