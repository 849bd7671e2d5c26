"""The GPU preset: what one H100 can tell about PODS within a 45-minute GPU budget, with no hub and no internet.

Each step is one command that ends well inside 10 minutes and writes small result files under
``benchmarks/results/<machine>/`` (``--root``), so that steps can run as separate commands and, through
``pack``, come back from the machine to be committed; the study continues across commands and machines.

    python benchmarks/gpu/h100.py check       # versions, the GPU, every carried and image package imports (seconds)
    python benchmarks/gpu/h100.py selection   # max_variance vs a bare torch.sort on the GPU: B 64/512/4096, n <= 4096
    python benchmarks/gpu/h100.py model       # a ~75M model built as `pods build-tiny` builds the tiny one, SFT'd
                                              # a few minutes on arithmetic (skipped when --model-dir holds it)
    python benchmarks/gpu/h100.py cost        # step-time ratios n = 16/32/64/128 -> 16 (pods study's cost stage,
                                              # i.e. `pods cost`) and peak update memory: PODS 64 -> 16, GRPO 16,
                                              # GRPO with all 64 kept
    python benchmarks/gpu/h100.py study       # `pods study`: GRPO 16 against PODS 64 -> 16, interleaved seed by
                                              # seed, stopping gracefully after --minutes; run again to continue
    python benchmarks/gpu/h100.py pack DIR    # the small result files (no weights) as DIR/results.tgz
    python benchmarks/gpu/h100.py all --device cpu --tiny --root /tmp/dry    # every step at toy sizes on CPU
    python benchmarks/gpu/h100.py all --dry-run   # no GPU, nothing run: imports, the plan, the budget (seconds)

``--dry-run`` goes through what every step imports and plans (``pods study --dry-run`` on the study's exact flags)
and prints each step's command and the plan's time against the budget (``BUDGET_MINUTES``; estimates until a
GPU run replaces them), without a GPU, a model or package metadata (a ``git archive`` of the tree with
``PYTHONPATH=src``); it writes nothing and exits 1 when the plan does not fit.

The model lives outside the repository (``--model-dir``, default /tmp/pods-h100-model; 300 MB cannot come back
from the machine): a step that needs it builds it when it is missing (a fresh machine), with deterministic
kernels where torch has them. The study's folder is named after the weights' sha256 (``study-<12 hex>``), so a
rebuild that gives the same weights continues the same study on another machine, and one that does not starts
its own folder instead of mixing models. See benchmarks/gpu/README.md for the wheels to carry and the exact
command lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # for _machine (which puts src/ on sys.path)
sys.path.insert(0, str(HERE))  # for wheels (the lock of what the image lacks)
import wheels  # noqa: E402
from _machine import machine_info, machine_slug, results_dir  # noqa: E402

RECIPE = HERE / "h100.yaml"
# The ~75M model: hidden 768, 8 layers, 12 heads (head_dim 64), the embedded model's vocabulary and recipe.
MODEL = dict(hidden_size=768, num_layers=8, num_heads=12, steps=4000, batch_size=64, lr=6e-4, max_seconds=300)
TINY_MODEL = dict(hidden_size=64, num_layers=2, num_heads=2, steps=30, batch_size=16, lr=3e-3, max_seconds=60)
SELECTION = dict(batch_sizes="64,512,4096", group_sizes="16,64,256,1024,4096", reference_limit=70000)
TINY_SELECTION = dict(batch_sizes="8,64", group_sizes="16,64", reference_limit=2000)
COST_N = "16,32,64,128"
# GRPO n = m = 16 against PODS max_variance 64 -> 16 (no random control: it would cost a third of the runs), seed by
# seed (pods study runs seed 0 of both, then seed 1, ...), so that a study stopped early still holds whole pairs.
STUDY = dict(m=16, n=64, seeds=3, updates=150, eval_every=25, eval_problems=500, eval_k=4)
TINY_STUDY = dict(m=4, n=8, seeds=2, updates=2, eval_every=2, eval_problems=8, eval_k=2)
BUDGET_MINUTES = 45  # the GPU budget the plan has to fit, machine starts included
MARGIN = 0.8  # the plan's estimate must stay under this share of the budget
# Estimates, not measurements (no GPU has run the preset yet; preset_log.jsonl records the real seconds of every
# command): the ~75M model in bf16 with HF generation of <= 24 tokens on one H100. Seconds.
ESTIMATE = dict(
    machine_start=120,         # the device tool's start of a fresh machine
    call_overhead=30,          # per call: the working tree and wheels carried there, the wheels installed, pack
    run_startup=30,            # per `pods train` run: imports, CUDA, the model loaded
    update_per_rollout=0.0006,  # per update and generated rollout: generation, scoring, selection (GRPO: 128 rows)
    update_fixed=0.15,         # per update: the policy update on the 128 kept rows and TRL's bookkeeping
    evaluation=5,              # per evaluation of 500 problems x 4 samples (batch 2000)
    check_selection=120,       # step 1
    model=360,                 # step 2: the SFT stops after 300 s, then its held-out evaluation
    cost=180,                  # step 3: pods cost, 4 settings x 7 steps, and GRPO with all 64 kept
)
STUDY_CALL_MINUTES = 8.0  # --minutes of one study call (the device tool stops a command after 10 minutes)
SMALL_FILES = (".json", ".jsonl", ".txt", ".png", ".yaml", ".md", ".log")


def study_methods(size: dict) -> list[tuple[str, int]]:
    """The study's methods as (name, n): GRPO with n = m, then PODS max_variance n -> m (``pods study --control none``)."""
    return [(f"grpo-n{size['m']}", size["m"]), (f"pods-mv-n{size['n']}m{size['m']}", size["n"])]


def run_seconds(n: int, size: dict, prompts: int = 8) -> float:
    """Estimated seconds of one study run that samples ``n`` rollouts for each of ``prompts`` prompts per update."""
    evaluations = size["updates"] // size["eval_every"] + 1  # before training, then every eval_every updates
    per_update = ESTIMATE["update_fixed"] + prompts * n * ESTIMATE["update_per_rollout"]
    return ESTIMATE["run_startup"] + size["updates"] * per_update + evaluations * ESTIMATE["evaluation"]


def plan_seconds(size: dict | None = None, methods: list[tuple[str, int]] | None = None) -> list[tuple[str, float]]:
    """The plan's device calls and their estimated seconds, machine start and per-call overhead included: step 1
    (check, selection), step 2 (model), step 3 (cost), then as many study calls of ``STUDY_CALL_MINUTES`` as the
    study's runs (every method x seed) take."""
    size = size or STUDY
    methods = methods or study_methods(size)
    study = size["seeds"] * sum(run_seconds(n, size) for _, n in methods)
    calls = max(1, math.ceil(study / (STUDY_CALL_MINUTES * 60)))
    return [("machine start", ESTIMATE["machine_start"]),
            ("call 1: check, selection", ESTIMATE["check_selection"] + ESTIMATE["call_overhead"]),
            ("call 2: model", ESTIMATE["model"] + ESTIMATE["call_overhead"]),
            ("call 3: cost", ESTIMATE["cost"] + ESTIMATE["call_overhead"]),
            *((f"call {4 + i}: study ({study / 60:.1f} min of runs in all)",
               STUDY_CALL_MINUTES * 60 + ESTIMATE["call_overhead"]) for i in range(calls))]


def print_budget(size: dict | None = None) -> bool:
    """Print the plan's estimate against ``BUDGET_MINUTES``; True when it fits under ``MARGIN`` of it."""
    size = size or STUDY
    plan = plan_seconds(size)
    total = sum(seconds for _, seconds in plan) / 60
    methods = study_methods(size)
    print(f"plan (estimates, not measurements): {' vs '.join(name for name, _ in methods)}, {size['seeds']} seeds "
          f"interleaved, {size['updates']} updates, evaluation every {size['eval_every']} on "
          f"{size['eval_problems']} x {size['eval_k']}")
    for name, n in methods:
        print(f"  one {name} run: {run_seconds(n, size) / 60:.1f} min")
    for name, seconds in plan:
        print(f"  {name:<45} {seconds / 60:5.1f} min")
    fits = total <= MARGIN * BUDGET_MINUTES
    print(f"  {'total':<45} {total:5.1f} min of {BUDGET_MINUTES} ({'fits' if fits else 'DOES NOT FIT'} under "
          f"{MARGIN:.0%}: {MARGIN * BUDGET_MINUTES:.0f} min)")
    return fits


def run(cmd: list[str], root: Path, step: str) -> int:
    """Run one command (output streamed), and log it with its exit code and seconds in ROOT/preset_log.jsonl."""
    print("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    code = subprocess.run(cmd, cwd=REPO).returncode
    with open(root / "preset_log.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "command": shlex.join(cmd), "exit_code": code,
                            "seconds": round(time.time() - start, 1), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
                + "\n")
    return code


def weights_sha256(model_dir: Path) -> str:
    """sha256 of the model's weights (its *.safetensors files, in name order): names the study's folder."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def import_report() -> dict[str, str]:
    """{distribution: its version, or ``MISSING: why``} for every package of the wheels' lock that the preset needs
    on the machine (carried or the image's): each one's installed metadata read and its top-level modules imported."""
    import importlib
    from importlib import metadata

    modules: dict[str, list[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            modules.setdefault(wheels.canonical(dist), []).append(module)
    report = {}
    for name, package in wheels.load()["packages"].items():
        if package["status"] not in ("carried", "image"):
            continue
        try:
            report[name] = metadata.version(name)
            for module in sorted(m for m in modules.get(name, []) if m.isidentifier() and not m.startswith("_")):
                importlib.import_module(module)
        except Exception as err:  # report every missing piece at once
            report[name] = f"MISSING: {type(err).__name__}: {err}"
    return report


def step_check(args) -> int:
    """Versions, the device, and whether everything the preset imports imports (check.json; exit 1 if not)."""
    import torch

    dry = getattr(args, "dry_run", False)
    info = {**machine_info(), "cuda": torch.version.cuda, "device_asked": args.device, "packages": import_report()}
    import pods_rl.trainer  # noqa: F401  (TRL's GRPOTrainer and the supported-range check)
    from pods_rl.tasks import get_task

    get_task("arithmetic").load("train", limit=8)  # datasets works
    missing = {k: v for k, v in info["packages"].items() if v.startswith("MISSING")}
    if args.device == "cuda" and not torch.cuda.is_available() and not dry:
        print("check: torch sees no CUDA device", file=sys.stderr)
        return 1
    if not dry:
        (args.root / "check.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info if not dry else {"packages_imported": len(info["packages"]) - len(missing),
                                                     "missing": missing}, indent=1))
    return 1 if missing else 0


def step_selection(args) -> int:
    """bench_downsample.py on ``--device``: max_variance against a bare torch.sort (exit 0 also when a criterion
    derived from CPU timings fails: the numbers are the result)."""
    sizes = TINY_SELECTION if args.tiny else SELECTION
    cmd = [sys.executable, "benchmarks/bench_downsample.py", "--device", args.device, "--out", str(args.root),
           "--batch-sizes", sizes["batch_sizes"], "--group-sizes", sizes["group_sizes"],
           "--reference-limit", str(sizes["reference_limit"]), "--stem", f"bench_downsample_{args.device}"]
    if args.tiny:
        cmd += ["--quick", "--threads", "1"]
    code = run(cmd, args.root, "selection")
    return 0 if code in (0, 1) else code  # 1: a CPU-derived criterion failed; the numbers are the result


def step_model(args) -> int:
    """Build the model unless ``--model-dir`` holds it; its build_info.json and sha256 go to ROOT/model/."""
    if (args.model_dir / "config.json").is_file():
        print(f"model: {args.model_dir} exists (sha256 {weights_sha256(args.model_dir)[:12]}), not rebuilt")
        return 0
    size = TINY_MODEL if args.tiny else MODEL
    cmd = [sys.executable, "-m", "pods_rl.commands.cli", "build-tiny", "--out", str(args.model_dir), "--device", args.device,
           "--hidden-size", str(size["hidden_size"]), "--num-layers", str(size["num_layers"]),
           "--num-heads", str(size["num_heads"]), "--steps", str(size["steps"]), "--batch-size", str(size["batch_size"]),
           "--lr", str(size["lr"]), "--max-seconds", str(size["max_seconds"])]
    code = run(cmd, args.root, "model")
    if code == 0:
        (args.root / "model").mkdir(exist_ok=True)
        info = json.loads((args.model_dir / "build_info.json").read_text())
        info["weights_sha256"] = weights_sha256(args.model_dir)
        (args.root / "model" / f"build_info-{info['weights_sha256'][:12]}.json").write_text(json.dumps(info, indent=1))
    return code


def study_dir(args) -> Path:
    """ROOT/study-<sha256 of the model's weights, 12 hex> unless --study-name names another folder."""
    if args.study_name:
        return args.root / args.study_name
    if not any(args.model_dir.glob("*.safetensors")):  # a dry run: no model yet
        return args.root / "study-MODEL_SHA256"
    return args.root / f"study-{weights_sha256(args.model_dir)[:12]}"


def study_argv(args, *extra: str) -> list[str]:
    """The `pods study` command of the preset (``STUDY``, or ``TINY_STUDY`` with --tiny), ``extra`` appended."""
    size = TINY_STUDY if args.tiny else STUDY
    argv = ["--config", str(RECIPE), "--model_name_or_path", str(args.model_dir), "--out", str(study_dir(args)), "--m", str(size["m"]), "--n", str(size["n"]),
            "--seeds", str(size["seeds"]), "--updates", str(size["updates"]), "--eval-every", str(size["eval_every"]),
            "--eval-problems", str(size["eval_problems"]), "--eval-k", str(size["eval_k"]),
            "--cost-n", f"{size['m']},{2 * size['m']},{size['n']}" if args.tiny else COST_N,
            "--control", "none", "--cost-warmup", "2", "--checkpoint-every", "60", "--drop-weights",
            "--progress-every", "60", *extra]
    if args.device == "cpu":
        argv += ["--use_cpu", "true", "--bf16", "false", "--prompts-per-step", "2", "--max_completion_length", "12",
                 "--eval_batch_size", "64", "--cost-steps", "1", "--jobs", "1", "--threads", "1"]
    return [sys.executable, "-m", "pods_rl.commands.cli", "study", *argv]


def step_cost(args) -> int:
    """`pods cost` through pods study's cost stage (into the study folder, whose report shows it), then GRPO with
    all n = 64 kept (its peak update memory)."""
    code = ensure_model(args) or run(study_argv(args, "--stage", "cost"), args.root, "cost")
    if code:
        return code
    size = TINY_STUDY if args.tiny else STUDY
    out = args.root / "cost_grpo_all_kept.json"
    if out.is_file():
        return 0
    prompts = 2 if args.device == "cpu" else 8
    cmd = [sys.executable, "-m", "pods_rl.commands.cli", "cost", "--config", str(RECIPE), "--model_name_or_path",
           str(args.model_dir), "--n", str(size["n"]), "--m", str(size["n"]), "--per_device_train_batch_size",
           str(prompts * size["n"]), "--steps", "1" if args.tiny else "5", "--warmup", "2", "--out", str(out)]
    if args.device == "cpu":
        cmd += ["--use_cpu", "true", "--bf16", "false", "--max_completion_length", "12", "--torch_threads", "1"]
    return run(cmd, args.root, "cost-grpo-all-kept")


def ensure_model(args) -> int:
    """Build the model first on a machine that lacks it (the time it takes comes off --minutes)."""
    start = time.time()
    code = step_model(args)
    args.minutes -= (time.time() - start) / 60
    if code == 0:
        study = study_dir(args)
        study.mkdir(parents=True, exist_ok=True)
        (study / "model_sha256.txt").write_text(weights_sha256(args.model_dir) + "\n")
    return code


def step_study(args) -> int:
    """The study's runs and report for at most --minutes (the model built first where missing); run again to go on."""
    code = ensure_model(args)
    if code:
        return code
    return run(study_argv(args, "--stage", "runs,report", "--max-minutes", f"{max(args.minutes, 1):.1f}"),
               args.root, "study")


def step_pack(args) -> int:
    """ROOT's small files (no weights, checkpoints or run logs of in-flight runs) as DEST/results.tgz."""
    dest = Path(args.dest) if args.dest else args.root.parent
    dest.mkdir(parents=True, exist_ok=True)
    tgz = dest / "results.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for path in sorted(args.root.rglob("*")):
            parts = path.relative_to(args.root).parts
            if path.is_file() and path.suffix in SMALL_FILES and not any(
                    p.startswith(("checkpoint-", "final", "_incomplete")) for p in parts):
                tar.add(path, arcname=str(path.relative_to(REPO) if path.is_relative_to(REPO) else path))
    print(f"pack: {tgz} ({tgz.stat().st_size / 2**20:.2f} MiB); here: tar xzf results.tgz")
    return 0


STEPS = {"check": step_check, "selection": step_selection, "model": step_model, "cost": step_cost,
         "study": step_study, "pack": step_pack}


def dry_run(args, steps: list[str]) -> int:
    """``--dry-run``: what each step of ``steps`` imports, its command, the study's plan (``pods study --dry-run`` on
    its exact flags) and the time against the budget; nothing is run or written, no GPU or model needed."""
    import importlib

    import torch

    codes = []
    print(f"dry run: pods_rl from {importlib.import_module('pods_rl').__file__} (version "
          f"{importlib.import_module('pods_rl').__version__}), torch {torch.__version__}, CUDA "
          f"{'available' if torch.cuda.is_available() else 'not available here'}", flush=True)
    for name in steps:
        print(f"=== {name} (dry run)", flush=True)
        if name == "check":
            codes.append(step_check(args))
        elif name == "selection":
            importlib.import_module("bench_downsample")
            print("+ python benchmarks/bench_downsample.py (its sizes: " + json.dumps(
                TINY_SELECTION if args.tiny else SELECTION) + ")")
        elif name == "model":
            importlib.import_module("pods_rl.commands.build_tiny")
            print(f"+ pods build-tiny --out {args.model_dir} " + json.dumps(TINY_MODEL if args.tiny else MODEL))
        elif name == "cost":
            importlib.import_module("pods_rl.commands.cost")
            print("+ " + shlex.join(["pods", "study", *study_argv(args, "--stage", "cost")[4:]]))
            print(f"+ pods cost ... --n {(TINY_STUDY if args.tiny else STUDY)['n']} --m (the same: GRPO, all kept)")
        elif name == "study":
            from pods_rl.commands import study, study_report, train  # noqa: F401  (the runs' and report's imports)

            argv = study_argv(args, "--stage", "runs,report", "--max-minutes", f"{args.minutes:.1f}")[4:]
            if args.device == "cuda" and not torch.cuda.is_available():  # planned as on the GPU, parsed on CPU
                print("(no CUDA here: the plan is parsed with --use_cpu true --bf16 false appended; on the GPU "
                      "they are absent)")
                argv += ["--use_cpu", "true", "--bf16", "false"]
            print("+ " + shlex.join(["pods", "study", *argv]), flush=True)
            codes.append(study.main([*argv, "--dry-run"]))
        elif name == "pack":
            print(f"+ pack {args.root} -> {args.dest or args.root.parent}/results.tgz")
    if not args.tiny:
        codes.append(0 if print_budget() else 1)
    failed = [code for code in codes if code]
    print(f"dry run: {'failed' if failed else 'ok'}", flush=True)
    return failed[0] if failed else 0


def main(argv: list[str] | None = None) -> int:
    """The preset's command line (see the module docstring): 0, or the first failing step's exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=[*STEPS, "all"])
    parser.add_argument("dest", nargs="?", default=None, help="pack: the folder for results.tgz (e.g. $OUT)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (the CPU dry run)")
    parser.add_argument("--root", type=Path, default=None, help="results folder (default benchmarks/results/<machine>)")
    parser.add_argument("--model-dir", type=Path, default=None, help="default /tmp/pods-h100-model (tiny: ROOT/../model)")
    parser.add_argument("--study-name", default=None, help="the study's folder under ROOT (default study-<the "
                        "model's sha256, 12 hex>)")
    parser.add_argument("--minutes", type=float, default=STUDY_CALL_MINUTES,
                        help=f"study: stop gracefully after this long (default {STUDY_CALL_MINUTES:g})")
    parser.add_argument("--dry-run", action="store_true", help="no GPU, nothing run or written: the imports, each "
                        "step's command, the study's plan and the time against the budget")
    args = parser.parse_args(argv)
    info = machine_info()
    if args.device == "cpu":
        info = {**info, "gpu": None}
    if args.dry_run and args.root is None:
        from _machine import RESULTS_ROOT

        args.root = RESULTS_ROOT / machine_slug(info)  # not created
    args.root = (args.root or results_dir(machine_slug(info))).resolve()
    if not args.dry_run:
        args.root.mkdir(parents=True, exist_ok=True)
    default_model = args.root.parent / "pods-preset-model" if args.tiny else Path("/tmp/pods-h100-model")
    args.model_dir = (args.model_dir or default_model).resolve()
    steps = list(STEPS) if args.step == "all" else [args.step]
    if args.dry_run:
        return dry_run(args, steps)
    for name in steps:
        print(f"=== {name}", flush=True)
        code = STEPS[name](args)
        if code:
            print(f"=== {name} failed (exit {code})", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
