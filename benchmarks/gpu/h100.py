"""The GPU preset: what one H100 can tell about PODS in 30 minutes of machine time, with no hub and no internet.

Each step is one command that ends well inside 10 minutes and writes small result files under
``benchmarks/results/<machine>/`` (``--root``), so that steps can run as separate commands and, through
``pack``, come back from the machine to be committed; the study continues across commands and machines.

    python benchmarks/gpu/h100.py check       # versions, the GPU, the carried wheels import (seconds)
    python benchmarks/gpu/h100.py selection   # max_variance vs a bare torch.sort on the GPU: B 64/512/4096, n <= 4096
    python benchmarks/gpu/h100.py model       # a ~75M model built as `pods build-tiny` builds the tiny one, SFT'd
                                              # a few minutes on arithmetic (skipped when --model-dir holds it)
    python benchmarks/gpu/h100.py cost        # step-time ratios n = 16/32/64/128 -> 16 (pods study's cost stage,
                                              # i.e. `pods cost`) and peak update memory: PODS 64 -> 16, GRPO 16,
                                              # GRPO with all 64 kept
    python benchmarks/gpu/h100.py study       # `pods study`: GRPO 16, PODS 64 -> 16, its random control, seed by
                                              # seed, stopping gracefully after --minutes; run again to continue
    python benchmarks/gpu/h100.py pack DIR    # the small result files (no weights) as DIR/results.tgz
    python benchmarks/gpu/h100.py all --device cpu --tiny --root /tmp/dry    # every step at toy sizes on CPU

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
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # for _machine (which puts src/ on sys.path)
from _machine import machine_info, machine_slug, results_dir  # noqa: E402

RECIPE = HERE / "h100.yaml"
# The ~75M model: hidden 768, 8 layers, 12 heads (head_dim 64), the embedded model's vocabulary and recipe.
MODEL = dict(hidden_size=768, num_layers=8, num_heads=12, steps=4000, batch_size=64, lr=6e-4, max_seconds=300)
TINY_MODEL = dict(hidden_size=64, num_layers=2, num_heads=2, steps=30, batch_size=16, lr=3e-3, max_seconds=60)
SELECTION = dict(batch_sizes="64,512,4096", group_sizes="16,64,256,1024,4096", reference_limit=70000)
TINY_SELECTION = dict(batch_sizes="8,64", group_sizes="16,64", reference_limit=2000)
COST_N = "16,32,64,128"
STUDY = dict(m=16, n=64, seeds=4, updates=200, eval_every=25, eval_problems=500, eval_k=4)
TINY_STUDY = dict(m=4, n=8, seeds=2, updates=2, eval_every=2, eval_problems=8, eval_k=2)
SMALL_FILES = (".json", ".jsonl", ".txt", ".png", ".yaml", ".md", ".log")


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
    digest = hashlib.sha256()
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def step_check(args) -> int:
    """Versions, the device, and whether everything the preset imports imports."""
    import torch

    info = {**machine_info(), "cuda": torch.version.cuda, "device_asked": args.device}
    for name in ("trl", "datasets", "accelerate", "peft", "pyarrow", "fsspec", "huggingface_hub", "numpy", "dill",
                 "multiprocess", "matplotlib"):
        try:
            info[name] = __import__(name).__version__
        except Exception as err:  # report every missing piece at once
            info[name] = f"MISSING: {type(err).__name__}: {err}"
    import pods_rl.trainer  # noqa: F401  (TRL's GRPOTrainer and the supported-range check)
    from pods_rl.tasks import get_task

    get_task("arithmetic").load("train", limit=8)  # datasets works
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check: torch sees no CUDA device", file=sys.stderr)
        return 1
    (args.root / "check.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info, indent=1))
    return 1 if any(str(v).startswith("MISSING") for v in info.values()) else 0


def step_selection(args) -> int:
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
    name = args.study_name or f"study-{weights_sha256(args.model_dir)[:12]}"
    return args.root / name


def study_argv(args, *extra: str) -> list[str]:
    size = TINY_STUDY if args.tiny else STUDY
    argv = ["--config", str(RECIPE), "--model_name_or_path", str(args.model_dir), "--out", str(study_dir(args)), "--m", str(size["m"]), "--n", str(size["n"]),
            "--seeds", str(size["seeds"]), "--updates", str(size["updates"]), "--eval-every", str(size["eval_every"]),
            "--eval-problems", str(size["eval_problems"]), "--eval-k", str(size["eval_k"]),
            "--cost-n", f"{size['m']},{2 * size['m']},{size['n']}" if args.tiny else COST_N,
            "--cost-warmup", "2", "--checkpoint-every", "60", "--drop-weights", "--progress-every", "60", *extra]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=[*STEPS, "all"])
    parser.add_argument("dest", nargs="?", default=None, help="pack: the folder for results.tgz (e.g. $OUT)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (the CPU dry run)")
    parser.add_argument("--root", type=Path, default=None, help="results folder (default benchmarks/results/<machine>)")
    parser.add_argument("--model-dir", type=Path, default=None, help="default /tmp/pods-h100-model (tiny: ROOT/../model)")
    parser.add_argument("--study-name", default=None, help="the study's folder under ROOT (default study-<the "
                        "model's sha256, 12 hex>)")
    parser.add_argument("--minutes", type=float, default=8.0, help="study: stop gracefully after this long (default 8)")
    args = parser.parse_args(argv)
    info = machine_info()
    if args.device == "cpu":
        info = {**info, "gpu": None}
    args.root = (args.root or results_dir(machine_slug(info))).resolve()
    args.root.mkdir(parents=True, exist_ok=True)
    default_model = args.root.parent / "pods-preset-model" if args.tiny else Path("/tmp/pods-h100-model")
    args.model_dir = (args.model_dir or default_model).resolve()
    for name in (list(STEPS) if args.step == "all" else [args.step]):
        print(f"=== {name}", flush=True)
        code = STEPS[name](args)
        if code:
            print(f"=== {name} failed (exit {code})", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
