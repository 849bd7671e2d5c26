"""Calls 2, 3, ... of the GPU preset (``h100.py study``): the GPU model, its cost, and the study, resumable.

Each call is whole on its own: it builds the model where the machine lacks it (a fresh machine: ``plan.MODEL``'s
fixed step count, deterministic kernels, so the same weights every time), checks its sha256 against the one
recorded under ``benchmarks/results/<gpu>/model.json`` (kept from an earlier call; none the first time), measures
its cost once (`pods study`'s cost stage, skipped when the study already has ``cost.json``), checks that its
starting accuracy leaves room to learn, then runs the study's runs until the call's deadline and writes the report.
The study starts from its archive in the repository (``study-<sha 12>.tgz``: the finished runs of earlier calls,
carried here), and its archive in ``$OUT`` is re-packed whenever a run finishes.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import plan as P
from outbox import Repacker, archived_runs, finished_runs, study_files, unpack_missing
from session import (
    RECIPE,
    REPO,
    SHIPPED,
    Session,
    Stop,
    gate,
    machine_stage,
    python,
    recipe_flags,
    results_dir,
    sizes,
    start_accuracy,
    weights_sha256,
)

NONDETERMINISM = "does not have a deterministic implementation"


def model_argv(args, out: Path) -> list[str]:
    """`pods build-tiny` for the GPU model (``plan.MODEL``; CPU mode: ``plan.TINY_MODEL``): a fixed step count."""
    m = sizes(args)[2]
    return [*python(), "-m", "pods_rl.commands.cli", "build-tiny", "--out", str(out), "--device",
            "cpu" if args.cpu else "cuda", "--hidden-size", str(m["hidden_size"]), "--num-layers", str(m["num_layers"]),
            "--num-heads", str(m["num_heads"]), "--steps", str(m["steps"]), "--batch-size", str(m["batch_size"]),
            "--lr", str(m["lr"]), "--seed", "0", "--threads", "1"]


def study_argv(args, model_dir: Path, lr: float, study_dir: Path, stage: str, minutes: float | None = None,
               phase: str = "pods") -> list[str]:
    """`pods study` of the preset (``plan.STUDY``; CPU mode: ``plan.TINY_STUDY``) on ``model_dir``, one stage, with
    GRPO n = m and the method of ``phase`` (``plan.PHASES``)."""
    s = sizes(args)[1]
    method, declared = P.phase_method(phase, s)
    argv = [*python(), "-m", "pods_rl.commands.cli", "study", *recipe_flags(args, model_dir, lr), "--out",
            str(study_dir), "--m", str(s["m"]), "--methods", f"grpo-n{s['m']},{method}", *declared,
            "--seeds", str(s["seeds"]), "--updates", str(s["updates"]), "--eval-every", str(s["eval_every"]),
            "--eval-problems", str(s["eval_problems"]), "--eval-k", str(s["eval_k"]), "--prompts-per-step",
            str(s["prompts"]), "--cost-n", ",".join(map(str, s["cost_n"])), "--cost-steps", str(s["cost_steps"]),
            "--cost-warmup", str(s["cost_warmup"]), "--checkpoint-every", "60", "--drop-weights",
            "--progress-every", "60", "--stage", stage]
    if args.cpu:
        argv += ["--jobs", "1", "--threads", "1"]
    return argv + (["--max-minutes", f"{minutes:.2f}"] if minutes is not None else [])


def recorded_sha(args, info: dict) -> str | None:
    """The built model's sha256 recorded in the repository (``<results>/model.json``, kept from an earlier call)."""
    path = results_dir(args, info) / "model.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    return record.get("sha256") if record.get("kind") == "built" else None


def committed_model(kind: str, work: Path | None = None) -> dict:
    """A model the repository holds (``shipped`` or ``strong``): no build; the shipped one's sha256 is checked.
    With ``work``, the study reads a copy under ``work/models/<kind>``: a path the same on every machine, where the
    checkout's may differ (`pods study` refuses a study whose recorded model path changed)."""
    model_dir = SHIPPED if kind == "shipped" else REPO / P.STRONG_RELATIVE
    if not list(model_dir.glob("*.safetensors")):
        raise Stop(f"no weights in {model_dir}: the {kind} model's study needs the repository's copy of them")
    sha = weights_sha256(model_dir)
    if kind == "shipped" and sha != P.SHIPPED_SHA256:
        raise Stop(f"the shipped model's weights have sha256 {sha[:12]}, not {P.SHIPPED_SHA256[:12]}")
    if work is not None:
        copy = Path(work) / "models" / kind
        if not copy.is_dir():
            shutil.copytree(model_dir, copy)
        model_dir = copy
    return {"kind": kind, "dir": str(model_dir), "key": f"{kind}-{sha[:12]}", "sha256": sha,
            "lr": P.SHIPPED_LR if kind == "shipped" else P.STRONG_LR, "start_accuracy": start_accuracy(model_dir)}


def choose_model(args, info: dict) -> str:
    """``--model auto``: of ``plan.STUDY_MODELS``, the one whose study in the repository (``study-<key>.tgz`` under
    the machine's results folder) holds the fewest finished runs; the first on a tie. On a warm machine whose work
    folder holds a study with runs still to do (the lease's earlier study call: ``plan.FILED_CALLS``), that study
    goes on, whatever ``keep`` filed in between: its run in flight resumes from its checkpoint, its cost is not
    measured again."""
    if args.model != "auto":
        return args.model
    held, here = {}, []
    for kind in P.STUDY_MODELS:
        key = committed_model(kind)["key"]
        archive = results_dir(args, info) / f"study-{key}.tgz"
        held[kind] = len(archived_runs(archive)) if archive.is_file() else 0
        study_dir = Path(args.work) / f"study-{key}"
        if study_dir.is_dir() and P.study_phase(finished_runs(study_dir), sizes(args)[1]) is not None:
            here.append(kind)
    return min(here or P.STUDY_MODELS, key=lambda kind: held[kind])


def ensure_model(call: Session) -> dict:
    """The study's model: a committed one (``shipped``, ``strong``; ``auto`` picks: ``choose_model``), or a GPU model
    built unless this (warm) machine has it (``built``); a built model's record goes to ``$OUT/model.json`` before
    the check against the recorded sha256."""
    args = call.args
    kind = choose_model(args, call.record["machine"]["info"])
    if kind in P.STUDY_MODELS:
        return committed_model(kind, call.work)
    model_dir = call.work / "model"
    reused = (model_dir / "build_info.json").is_file()
    record = {"kind": "built", "dir": str(model_dir), "reused": reused, "size": sizes(args)[2]}
    if not reused:
        building = call.work / "model.building"
        shutil.rmtree(building, ignore_errors=True)  # a build cut short (the same weights come from a new one)
        log = call.work / "model-build.log"
        code = call.run(model_argv(args, building), log, budget=3 * sizes(args)[2]["build_seconds"])
        if code:
            raise RuntimeError(f"pods build-tiny failed (exit {code}); its log: {log}")
        building.rename(model_dir)
        text = log.read_text(errors="replace")
        record["nondeterministic_ops"] = sorted({line.strip()[:200] for line in text.splitlines()
                                                 if NONDETERMINISM in line})
    sha = weights_sha256(model_dir)
    info = call.record["machine"]["info"]
    recorded = recorded_sha(args, info)
    build_info = json.loads((model_dir / "build_info.json").read_text())
    record.update(key=sha[:12], sha256=sha, recorded_sha256=recorded, lr=_recipe_lr(),
                  start_accuracy=start_accuracy(model_dir), build_info=build_info,
                  results_dir=results_dir(args, info).name)
    call.outbox.write_json("model.json", record)
    if recorded and recorded != sha:
        raise Stop(f"the model built here has sha256 {sha[:12]}, the recorded one {recorded[:12]} (torch "
                   f"{build_info['versions']['torch']}): the build is not reproducible here, and a study on other "
                   "weights would not compare; run the study on the shipped model (h100.py study --model shipped), "
                   "or remove model.json from the results folder to start a study on these weights")
    return record


def _recipe_lr() -> float:
    """The recipe's learning rate (the GPU model's)."""
    import yaml

    return float(yaml.safe_load(RECIPE.read_text())["learning_rate"])


def study(args) -> int:
    """Calls 2, 3, ...: model, cost, gate, runs until the deadline, report (see the module docstring)."""
    call = Session(args, "study", "study-call.json")
    s = sizes(args)[1]
    try:
        call.stage("machine", P.ANSWER_STAGES["machine"], lambda: machine_stage(call))
        if "machine" in call.record:
            call.record["lease"] = lease_record(args, call.record["machine"]["info"])
            print(f"h100.py study: this lease's calls on this GPU kind: {', '.join(call.record['lease']['calls'])}"
                  + (" (its step costs are filed: no call 1)" if call.record["lease"]["step_costs_filed"] else ""),
                  flush=True)
        build = 5 if args.model != "built" or (call.work / "model" / "build_info.json").is_file() else \
            sizes(args)[2]["build_seconds"]
        model = call.stage("model", build, lambda: ensure_model(call))
        if model is None:
            return 1
        study_dir = call.work / f"study-{model['key']}"
        archive = f"study-{model['key']}.tgz"
        carried = results_dir(args, call.record["machine"]["info"]) / archive
        seeded = unpack_missing(carried, study_dir) if carried.is_file() else 0
        call.record["study"] = {"dir": study_dir.name, "archive": archive, "seeded_files": seeded,
                                "finished_before": finished_runs(study_dir)}
        pack = lambda: call.outbox.pack(archive, study_dir, study_files(study_dir))  # noqa: E731
        flags = (args, Path(model["dir"]), model["lr"], study_dir)
        call.stage("cost", s["cost_seconds"], lambda: pods_study(call, *flags, "cost", 4 * s["cost_seconds"]))
        pack()
        call.stage("gate", 0, lambda: gate(model["start_accuracy"], P.TINY_ACCURACY_RANGE if args.cpu
                                           else P.ACCURACY_RANGE) or {"start_accuracy": model["start_accuracy"]})
        with Repacker(pack, lambda: finished_runs(study_dir)):
            phase = run_phases(call, flags, study_dir)
        call.stage("report", s["report_seconds"], lambda: pods_study(call, *flags, "report", s["report_seconds"] * 2,
                                                                     phase=phase or P.PHASES[-1]))
        call.record["study"]["finished_after"] = finished_runs(study_dir)
        pack()
    except Stop as stop:
        print(f"h100.py study: stopped: {stop}", flush=True)
        return 3
    finally:
        call.save()
    done, total = len(call.record["study"]["finished_after"]), s["seeds"] * (1 + len(P.PHASES))
    print(f"h100.py study: {done} of {total} runs finished; the same command continues (after `h100.py keep`)",
          flush=True)
    return 1 if call.failed else 0


def lease_record(args, info: dict) -> dict:
    """The lease's calls on this GPU kind (``plan.calls_for``): where its step costs are filed, call 1 is skipped and
    the study gets two calls; the record says which and where each of call 1's stages is filed."""
    folder = results_dir(args, info)
    filed = P.step_costs_filed(folder)
    return {"results_dir": folder.name, "step_costs_filed": filed, "calls": [c.step for c in P.calls_for(folder)],
            "filed_stages": P.filed_stages(folder) if filed else None}


def run_phases(call: Session, flags: tuple, study_dir: Path) -> str | None:
    """The runs of each phase in turn (``plan.study_phase``: the first with seeds missing), a stage ``runs <phase>``
    each, while a minute of runs and the report's time fit; returns the phase the study is in (None: all done)."""
    s, ran = sizes(call.args)[1], []
    while True:
        phase = P.study_phase(finished_runs(study_dir), s)
        if phase is None or phase in ran:  # all done, or the phase stopped before its seeds (its deadline)
            return phase
        ran.append(phase)
        # At least a minute of runs, and the report's time kept after them (--max-minutes stops them gracefully).
        result = call.stage(f"runs {phase}", s["report_seconds"] + 80, lambda: pods_study(
            call, *flags, "runs", call.left() - s["report_seconds"],
            minutes=(call.left() - s["report_seconds"] - 20) / 60, phase=phase))  # noqa: B023  (called at once)
        if result is None:  # skipped (no time left) or failed
            return phase


def pods_study(call: Session, args, model_dir: Path, lr: float, study_dir: Path, stage: str, budget: float,
               minutes: float | None = None, phase: str = "pods") -> dict:
    """One stage of `pods study` (its output to ``<study>/<stage>-call.log``); fails the stage on a non-zero exit."""
    study_dir.mkdir(parents=True, exist_ok=True)
    before = len(finished_runs(study_dir))
    log = study_dir / (f"{stage}-call.log" if stage != "runs" else f"runs-{phase}-call.log")
    code = call.run(study_argv(args, model_dir, lr, study_dir, stage, minutes, phase), log, budget)
    result = {"exit_code": code, "finished_runs": len(finished_runs(study_dir)),
              "new_runs": len(finished_runs(study_dir)) - before}
    if stage == "cost" and (study_dir / "cost.json").is_file():
        from answer import cost_summary

        result["cost"] = cost_summary(json.loads((study_dir / "cost.json").read_text()))
        print(f"  {result['cost']['headline']}", flush=True)
    if code:
        raise RuntimeError(f"pods study --stage {stage} exited {code}")
    return result


def dry_run_study(args) -> int:
    """The study's commands on each committed model, and `pods study --dry-run` on the shipped one's exact flags
    (with --use_cpu where CUDA is absent): the `pods train` commands it would run, seed by seed."""
    import torch

    from pods_rl.commands import study as study_cmd

    for kind in P.STUDY_MODELS:
        model = committed_model(kind)  # (the study reads a copy under --work: see committed_model)
        study_dir = args.work / f"study-{model['key']}"
        print(f"study on the {kind} model (sha256 {model['sha256'][:12]}, starting accuracy "
              f"{model['start_accuracy']}): archive study-{model['key']}.tgz")
        for stage, phase in (("cost", "pods"), *(("runs", phase) for phase in P.PHASES), ("report", "pods")):
            print("+ " + shlex.join(study_argv(args, Path(model["dir"]), model["lr"], study_dir, stage,
                                               4.0 if stage == "runs" else None, phase)))
    model = committed_model("shipped")
    phase = P.study_phase(finished_runs(args.work / "study-DRY"), sizes(args)[1])  # a fresh study: the first
    print(f"the study's phase: {phase} (of {', '.join(P.PHASES)}; each starts once the one before has all its seeds)")
    argv = study_argv(args, Path(model["dir"]), model["lr"], args.work / "study-DRY", "runs", phase=phase)[4:]
    if not args.cpu and not torch.cuda.is_available():
        print("(no CUDA here: the plan is parsed with --use_cpu true --bf16 false "
              "appended; on the GPU they are absent)")
        argv += ["--use_cpu", "true", "--bf16", "false"]
    sys.stdout.flush()
    return study_cmd.main([*argv, "--dry-run"])
