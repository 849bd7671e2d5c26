"""What every call of the GPU preset shares: its clock and record (``Session``), a stop in one line (``Stop``), the
machine's versions and imports, the model's hash and accuracy gate, and the flags every command starts from."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # _machine (which puts src/ on sys.path)
sys.path.insert(0, str(HERE))  # plan, outbox, wheels
import plan as P  # noqa: E402
import wheels  # noqa: E402
from _machine import RESULTS_ROOT, machine_info, machine_slug  # noqa: E402
from outbox import Outbox  # noqa: E402

RECIPE = HERE / "h100.yaml"
SHIPPED = REPO / "src" / "pods_rl" / "assets" / "tiny"
VERSIONED = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "math-verify", "huggingface-hub",
             "tokenizers", "safetensors", "numpy", "pyarrow", "pandas", "fsspec", "triton")


class Stop(Exception):
    """A stage found that the call cannot go on (one line: what and what to do)."""


class Skip(Exception):
    """A stage that does not apply here (e.g. NCCL in the CPU mode): recorded as skipped, with why."""


def python() -> list[str]:
    """The interpreter prefix of every command (the machine's python3 holds the image's torch)."""
    return [sys.executable]


def weights_sha256(model_dir: Path) -> str:
    """sha256 of the model's weights (its *.safetensors files, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def start_accuracy(model_dir: Path) -> float:
    """The model's held-out accuracy (sampled at T = 1) from its build_info.json."""
    return json.loads((Path(model_dir) / "build_info.json").read_text())["held_out_accuracy"]["sampled_t1"]["accuracy"]


def gate(accuracy: float, bounds: tuple[float, float]) -> None:
    """Stop unless the starting accuracy leaves room to learn (inside ``bounds``)."""
    if not bounds[0] <= accuracy <= bounds[1]:
        raise Stop(f"the model's starting accuracy {accuracy:.3f} is outside {bounds[0]}-{bounds[1]}: RL has "
                   f"{'little to learn from' if accuracy < bounds[0] else 'no room to improve'}; run the study "
                   "on the shipped model instead: h100.py study --model shipped")


# ------------------------------------------------------------------------------------------------------------
# A call: its clock, its record, its stages
# ------------------------------------------------------------------------------------------------------------
class Session:
    """One device call: the deadline, the record (``OUT/<record>``, rewritten after every stage) and the work folder."""

    def __init__(self, args, step: str, record: str):
        self.args, self.step, self.name = args, step, record
        self.started = time.monotonic()
        timeout = next(c.timeout for c in P.CALLS if c.step == step)
        self.deadline = self.started + (3600 if args.cpu else timeout - P.MARGIN_SECONDS)
        self.outbox = Outbox(args.out)
        self.work = Path(args.work).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.record = {"step": step, "cpu_mode": args.cpu, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "timeout": timeout, "stages": []}
        self.failed = False

    def left(self) -> float:
        """Seconds left before the call's deadline."""
        return self.deadline - time.monotonic()

    def save(self) -> None:
        """Write the record to ``$OUT`` (whole)."""
        self.record["seconds"] = round(time.monotonic() - self.started, 1)
        self.outbox.write_json(self.name, self.record)

    def stage(self, name: str, estimate: float, fn):
        """Run ``fn()`` if ``estimate`` seconds fit before the deadline, else record it as skipped; its result
        (a dict) goes into the record under ``name``. ``Stop`` ends the call; another error fails the stage only."""
        entry = {"name": name, "estimate": estimate}
        self.record["stages"].append(entry)
        if self.left() < estimate:
            entry.update(status="skipped", why=f"{self.left():.0f} s left, {estimate:.0f} s needed")
            print(f"=== {name}: skipped ({entry['why']})", flush=True)
            self.save()
            return None
        print(f"=== {name} ({self.left():.0f} s left)", flush=True)
        start = time.monotonic()
        try:
            result = fn()
            entry["status"] = "done"
        except Stop as stop:
            entry.update(status="stopped", why=str(stop))
            self.save()
            raise
        except Skip as skip:
            entry.update(status="skipped", why=str(skip))
            result = None
        except Exception as err:  # a failed stage is recorded; the next one may still answer
            entry.update(status="failed", why=f"{type(err).__name__}: {err}")
            self.failed, result = True, None
            print(f"=== {name} failed: {entry['why']}", flush=True)
        entry["seconds"] = round(time.monotonic() - start, 1)
        if result is not None:
            self.record[name] = result
        self.save()
        return result

    def run(self, argv: list[str], log: Path, budget: float, env: dict | None = None) -> int:
        """``argv`` in the repository root, its output to ``log``, stopped after ``budget`` seconds or at the
        deadline (SIGTERM, then a kill 20 s later; exit 124); on failure its last lines are printed."""
        log.parent.mkdir(parents=True, exist_ok=True)
        print("+ " + shlex.join(argv), flush=True)
        limit = max(1.0, min(budget, self.left()))
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})})
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                # SIGTERM first: `pods study` then stops its runs (their own sessions, which a kill would orphan)
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                code = 124
        if code:
            tail = log.read_text(errors="replace").strip().splitlines()[-6:]
            print(f"  exit {code} (log {log}):\n    " + "\n    ".join(tail), flush=True)
        return code


def results_dir(args, info: dict) -> Path:
    """Where this machine's results live in the repository (the recorded model, the study archives)."""
    return Path(args.results) if args.results else RESULTS_ROOT / machine_slug(info)


def shadowing(distributions, carried) -> dict[str, list[str]]:
    """{carried distribution: its installations} for each one of ``carried`` installed more than once (a carried
    wheel that would replace the image's own: none should)."""
    seen: dict[str, list[str]] = {}
    for dist in distributions:
        name = wheels.canonical(dist.metadata["Name"] or "")
        seen.setdefault(name, []).append(f"{dist.version} at {getattr(dist, '_path', '?')}")
    return {name: seen[name] for name in carried if len(seen.get(name, [])) > 1}


def machine_stage(call: Session) -> dict:
    """Versions, the GPU (nvidia-smi), the carried wheels (none may shadow an image package) and the imports the
    preset needs; stops when torch sees no CUDA (GPU mode) or an import fails."""
    import importlib
    from importlib import metadata

    import torch

    info = {**machine_info(), "device": "cpu" if call.args.cpu else "cuda"}
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    shadowed = shadowing(metadata.distributions(), wheels.carried())
    cuda = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None}
    if cuda["available"]:
        props = torch.cuda.get_device_properties(0)
        cuda.update(name=props.name, capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory
                    / 2**30, 1), multiprocessors=props.multi_processor_count, bf16=torch.cuda.is_bf16_supported())
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    (call.work / "nvidia-smi.txt").write_text(smi.stdout if smi else "nvidia-smi: not found\n")
    errors = {}
    for module in ("trl", "datasets", "math_verify", "pods_rl.trainer", "pods_rl.commands.train"):
        try:
            importlib.import_module(module)  # pods_rl.trainer checks the TRL range
        except Exception as err:
            errors[module] = f"{type(err).__name__}: {err}"
    call.record["results_dir"] = results_dir(call.args, info).name
    result = {"info": info, "versions": versions, "cuda": cuda, "nvidia_smi": smi.stdout.splitlines()[:12] if smi
              else None, "shadowed": shadowed, "import_errors": errors}
    print(json.dumps({"gpu": cuda.get("name"), "versions": versions}, indent=None), flush=True)
    if not call.args.cpu and not cuda["available"]:
        call.record["machine"] = result
        raise Stop("torch sees no CUDA device: is this the GPU machine? (on a CPU: --cpu)")
    if errors:
        call.record["machine"] = result
        raise Stop(f"cannot import {', '.join(errors)}: {next(iter(errors.values()))} (were the wheels carried: "
                   "carry .whl, see benchmarks/gpu/README.md)")
    return result


def sizes(args) -> tuple[dict, dict, dict]:
    """(answer, study, model) sizes: the GPU's, or the CPU mode's toy ones."""
    return (P.TINY_ANSWER, P.TINY_STUDY, P.TINY_MODEL) if args.cpu else (P.ANSWER, P.STUDY, P.MODEL)


def recipe_flags(args, model_dir: Path, lr: float) -> list[str]:
    """The recipe and model every command of the preset starts from (CPU mode: the toy flags appended)."""
    flags = ["--config", str(RECIPE), "--model_name_or_path", str(model_dir), "--learning_rate", f"{lr:g}"]
    return flags + (list(P.CPU_FLAGS) if args.cpu else [])


def run_summary(run_dir: Path, warmup_rows: int = 2) -> dict:
    """A `pods train` run's numbers: updates, accuracy before/after, mean seconds per phase (the first
    ``warmup_rows`` logged rows left out), whether it finished, and its precision and device."""
    import yaml

    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (run_dir / "metrics.jsonl").is_file() else []
    timed = [r for r in rows if "time/step" in r]
    timed = timed[min(warmup_rows, max(0, len(timed) - 1)):]
    phases = {p: round(sum(r.get(f"time/{p}", 0.0) for r in timed) / len(timed), 4) for p in
              ("generation", "scoring", "selection", "update", "step")} if timed else {}
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    flat = {**config, **config.get("args", {})} if isinstance(config, dict) else {}
    return {"finished": bool(summary), "updates": summary.get("steps"), "accuracy_before":
            summary.get("accuracy_before"), "accuracy_after": summary.get("accuracy_after"),
            "train_seconds": summary.get("train_seconds"), "seconds_per_update": phases,
            "bf16": bool(flat.get("bf16")), "device": "cpu" if flat.get("use_cpu") else "cuda"}
