"""The asymmetry PODS starts from: generation cost grows with n (rollouts sampled), update cost with m (kept).

For one model (default: the shipped tiny model) and P prompts of the task's test split, measured separately:

  * generation: ``PODSTrainer._generate`` of n completions per prompt (P * n rollouts, sampled at the recipe's
    temperature up to its ``max_completion_length``), for n in {16, 32, 64, 128};
  * update: one optimizer step on P * m kept rollouts: ``PODSTrainer.compute_loss`` (forward of the GRPO loss)
    + backward + ``optimizer.step()``, for m in {4, 8, 16, 32, 64}. The batches are real: built by
    ``PODSTrainer._generate_and_score_completions`` (generate n_source = max(m list) per prompt, score, keep m by
    max_variance, advantages on the kept subset), all before the first timed step, with the initial weights.
    A control row times m = 16 kept from n = 16 (plain GRPO) to show that the update does not depend on n.

Both phases use the trainer exactly as ``pods train`` builds it from the recipe (default: the ``tiny`` recipe).
Each measurement: one warm-up call, then the median over ``--repeats`` calls. Peak memory per call is
``torch.cuda.max_memory_allocated`` on CUDA; on CPU it is the peak resident set size during the call (VmHWM
after resetting it through /proc/self/clear_refs) minus the RSS at the call's start. Where the reset is not
possible the process's lifetime peak RSS is reported instead (flagged in the JSON).
What the update row does NOT include: the log-prob pass over kept rows that TRL runs before the step when it
needs old/reference log-probs (not needed by the tiny recipe: beta=0, one iteration per generation).

    python benchmarks/bench_phases.py                      # shipped tiny model, CPU, full grid
    python benchmarks/bench_phases.py --quick              # small grid, one repeat (smoke test)
    python benchmarks/bench_phases.py --model PATH --device cuda --threads 1
Writes a table to stdout and benchmarks/results/<machine>/bench_phases.{json,png} (or --out DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install

from _machine import add_threads_argument, device_or_none, machine_info, machine_slug, results_dir  # noqa: E402

FULL_N = [16, 32, 64, 128]
FULL_M = [4, 8, 16, 32, 64]
QUICK_N = [2, 64]
QUICK_M = [2, 8]
CONTROL_M = 16  # the "update does not depend on n" control: m = 16 from n = 16 vs from n_source


# ------------------------------------------------------------------------------------------------------------
# Memory
# ------------------------------------------------------------------------------------------------------------
def _proc_status_kib(field: str) -> int | None:
    """A ``VmXXX`` field of /proc/self/status in KiB, or None off Linux."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _reset_cpu_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Context manager: peak memory of the block in MiB, ``.peak_mib`` (above the start) and ``.total_mib``.

    CUDA: max_memory_allocated during the block. CPU: peak RSS during the block (see module docstring);
    ``.scope`` says "call" when the peak was reset for this block, "process" when it is the lifetime peak.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mib = self.total_mib = float("nan")
        self.scope = "call"

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self.scope = "call" if _reset_cpu_peak() else "process"
            self._start = (_proc_status_kib("VmRSS") or 0) * 1024
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            hwm = _proc_status_kib("VmHWM")
            if hwm is None:  # not Linux: ru_maxrss is the lifetime peak (KiB on Linux, bytes on macOS)
                import resource

                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                hwm = rss // 1024 if sys.platform == "darwin" else rss
                self.scope = "process"
            peak = hwm * 1024
        self.total_mib = peak / 2**20
        self.peak_mib = max(0.0, (peak - self._start) / 2**20)
        return False


# ------------------------------------------------------------------------------------------------------------
# The trainer, built like `pods train` builds it
# ------------------------------------------------------------------------------------------------------------
def build_trainer(model_path: str, recipe: str, device: torch.device, num_generations: int, downsample_to: int,
                  per_device_train_batch_size: int, output_dir: str, train_rows):
    """A ``PODSTrainer`` for ``recipe`` (+ the given n, m and batch size) on ``model_path``; returns (trainer, run).

    ``train_rows`` (a datasets.Dataset) is only there because the trainer needs a train set; nothing iterates it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pods_rl.engines.trl.trainer import PODSTrainer
    from pods_rl.recipes import parse_args, parse_task_args
    from pods_rl.tasks import get_task

    argv = ["--config", recipe, "--model_name_or_path", model_path, "--output_dir", output_dir,
            "--rollout_planner", "none", "--num_generations", str(num_generations),
            "--downsample_to", str(downsample_to),
            "--per_device_train_batch_size", str(per_device_train_batch_size), "--gradient_accumulation_steps", "1",
            "--report_to", "none", "--use_cpu", "true" if device.type == "cpu" else "false"]
    run, config, _ = parse_args(argv)
    task = get_task(run.task, **parse_task_args(run.task_args))
    if config.reward_weights is None:
        config.reward_weights = list(task.reward_weights)
    trust = bool(config.trust_remote_code)  # never None: transformers would ask on a terminal
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, trust_remote_code=trust)
    trainer = PODSTrainer(model=model, reward_funcs=task.reward_funcs(), args=config, train_dataset=train_rows,
                          processing_class=tokenizer)
    trainer.model.train()  # the PODS path (and TRL's sampling) run in training mode, as inside trainer.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop; compute_loss reads it
    return trainer, config


def load_prompts(recipe: str, num_prompts: int):
    """The first ``num_prompts`` rows of the recipe task's test split (a datasets.Dataset)."""
    from pods_rl.recipes import parse_args, parse_task_args
    from pods_rl.tasks import get_task

    run, _, _ = parse_args(["--config", recipe, "--output_dir", tempfile.gettempdir()])
    task = get_task(run.task, **parse_task_args(run.task_args))
    rows = task.load(run.eval_split, limit=num_prompts)
    if len(rows) < num_prompts:
        raise ValueError(f"task {run.task!r} has only {len(rows)} {run.eval_split} problems; lower --prompts")
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, device: torch.device, repeats: int) -> dict:
    """One warm-up call of ``fn``, then ``repeats`` timed calls, each under ``PeakMemory``.

    Returns {"seconds": median, "seconds_all": [...], "peak_mib": max over calls of the peak above the start,
    "total_peak_mib": max absolute peak, "memory_scope", "result": fn's last return value}.
    """
    fn()  # warm-up: allocator, lazy init, optimizer state
    seconds, peaks, totals, result, scope = [], [], [], None, "call"
    for _ in range(repeats):
        with PeakMemory(device) as mem:
            _sync(device)
            start = time.perf_counter()
            result = fn()
            _sync(device)
            seconds.append(time.perf_counter() - start)
        peaks.append(mem.peak_mib)
        totals.append(mem.total_mib)
        scope = mem.scope
    return {"seconds": statistics.median(seconds), "seconds_all": seconds, "peak_mib": max(peaks),
            "total_peak_mib": max(totals), "memory_scope": scope, "result": result}


# ------------------------------------------------------------------------------------------------------------
# The two phases
# ------------------------------------------------------------------------------------------------------------
def bench_generation(model_path, recipe, device, rows, n_list, repeats, workdir) -> list[dict]:
    """Generation of n rollouts per prompt for each n: one trainer, ``trainer._generate`` on P * n prompts."""
    num_prompts = len(rows)
    trainer, config = build_trainer(model_path, recipe, device, num_generations=max(n_list), downsample_to=2,
                                    per_device_train_batch_size=2 * num_prompts, output_dir=workdir,
                                    train_rows=rows)
    results = []
    for n in n_list:
        prompts = [row["prompt"] for row in rows for _ in range(n)]  # (P*n,) each prompt repeated n times
        torch.manual_seed(n)
        r = measure(lambda prompts=prompts: trainer._generate(prompts), device, repeats)
        completion_ids = r.pop("result")[1]  # (P*n,) lists of token ids
        lengths = [len(ids) for ids in completion_ids]
        r.update(phase="generation", n=n, rollouts=num_prompts * n, prompts=num_prompts,
                 max_new_tokens=config.max_completion_length,
                 mean_completion_tokens=sum(lengths) / len(lengths), max_completion_tokens=max(lengths))
        results.append(r)
        _print_row(r)
    return results


def bench_update(model_path, recipe, device, rows, m_list, repeats, workdir) -> list[dict]:
    """One optimizer step on P * m kept rollouts for each m (real batches: n_source generated, m kept)."""
    num_prompts = len(rows)
    n_source = max(m_list)
    cases = [(n_source, m) for m in m_list]
    if CONTROL_M in m_list and CONTROL_M < n_source:
        cases.append((CONTROL_M, CONTROL_M))  # control: same m, GRPO (no down-sampling)
    # Build every trainer and batch first, with the initial weights, so later steps cannot change the
    # completions (and so their lengths) that the other cases train on.
    prepared = []
    for n, m in cases:
        trainer, config = build_trainer(model_path, recipe, device, num_generations=n, downsample_to=m,
                                        per_device_train_batch_size=num_prompts * m, output_dir=workdir,
                                        train_rows=rows)
        inputs = [dict(row) for row in rows for _ in range(n)]  # (P*n,) rows, each prompt n times
        torch.manual_seed(1000 + m)
        batch = trainer._generate_and_score_completions(inputs)  # P*m kept rows, advantages on the kept subset
        trainer.create_optimizer()
        prepared.append((n, m, trainer, config, batch))
    results = []
    for n, m, trainer, config, batch in prepared:
        def step(trainer=trainer, batch=batch):
            loss = trainer.compute_loss(trainer.model, batch)
            trainer.accelerator.backward(loss)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        r = measure(step, device, repeats)
        r.pop("result")
        mask = batch["completion_mask"]  # (P*m, T)
        r.update(phase="update", m=m, n_source=n, rule=config.downsample_rule if m < n else "none (GRPO)",
                 rollouts=int(mask.shape[0]), prompts=num_prompts, padded_completion_tokens=int(mask.shape[1]),
                 mean_completion_tokens=float(mask.sum(1).float().mean()), control=(n, m) == (CONTROL_M, CONTROL_M)
                 and n < n_source)
        results.append(r)
        _print_row(r)
        del trainer.optimizer
    return results


# ------------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------------
HEADER = (f"{'phase':<10} {'size':>14} {'rollouts':>8} | {'seconds':>8} {'ms/rollout':>10} | "
          f"{'peak MiB':>9} | {'tokens':>6}")


def _size(r: dict) -> str:
    return f"n={r['n']}" if r["phase"] == "generation" else f"m={r['m']} (of n={r['n_source']})"


def _print_row(r: dict) -> None:
    print(f"{r['phase']:<10} {_size(r):>14} {r['rollouts']:>8} | {r['seconds']:>8.3f} "
          f"{1000 * r['seconds'] / r['rollouts']:>10.2f} | {r['peak_mib']:>9.1f} | "
          f"{r['mean_completion_tokens']:>6.1f}", flush=True)


def asymmetry(generation: list[dict], update: list[dict]) -> dict:
    """Ratios that state the asymmetry: generation at largest/smallest n, update at largest/smallest m, and the
    update at the control m from n_source vs from n = m (should be ~1: the update does not see n)."""
    gen = sorted(generation, key=lambda r: r["n"])
    upd = sorted((r for r in update if not r["control"]), key=lambda r: r["m"])
    out = {
        "generation_ratio_largest_to_smallest_n": gen[-1]["seconds"] / gen[0]["seconds"],
        "n_ratio": gen[-1]["n"] / gen[0]["n"],
        "update_ratio_largest_to_smallest_m": upd[-1]["seconds"] / upd[0]["seconds"],
        "m_ratio": upd[-1]["m"] / upd[0]["m"],
        "generation_grows_with_n": gen[-1]["seconds"] > gen[0]["seconds"],
        "update_grows_with_m": upd[-1]["seconds"] > upd[0]["seconds"],
    }
    control = [r for r in update if r["control"]]
    same_m = [r for r in upd if control and r["m"] == control[0]["m"]]
    if control and same_m:
        out["update_same_m_pods_over_grpo"] = same_m[0]["seconds"] / control[0]["seconds"]
        out["control"] = f"m={control[0]['m']}: kept from n={same_m[0]['n_source']} vs from n={control[0]['n_source']}"
    return out


def plot(generation: list[dict], update: list[dict], path: Path, title: str) -> None:
    """Two log-log panels: generation seconds vs n, update seconds vs m (with a dashed ∝ size guide)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    panels = [(axes[0], sorted(generation, key=lambda r: r["n"]), "n", "rollouts sampled per prompt n",
               "generation", "C0"),
              (axes[1], sorted((r for r in update if not r["control"]), key=lambda r: r["m"]), "m",
               "rollouts kept per prompt m", "update (one optimizer step)", "C3")]
    for ax, rows, key, xlabel, name, color in panels:
        xs = [r[key] for r in rows]
        ys = [r["seconds"] for r in rows]
        lows = [min(r["seconds_all"]) for r in rows]
        highs = [max(r["seconds_all"]) for r in rows]
        ax.plot(xs, ys, "o-", color=color, label=f"{name}: median")
        ax.fill_between(xs, lows, highs, color=color, alpha=0.2, linewidth=0, label="min–max of repeats")
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], "--", color="gray", linewidth=0.8, label=f"∝ {key}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(f"{xlabel} ({rows[0]['prompts']} prompts)")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
    control = [r for r in update if r["control"]]
    if control:
        r = control[0]
        axes[1].plot([r["m"]], [r["seconds"]], "s", color="black", fillstyle="none",
                     label=f"m={r['m']} kept from n={r['n_source']} (GRPO)")
    axes[0].set_ylabel("seconds per call")
    for ax in axes:
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _parse_int_list(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF model directory (default: the shipped tiny model)")
    parser.add_argument("--recipe", default="tiny", help="recipe the trainer is built from (default: tiny)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--prompts", type=int, default=4, help="P: prompts of the test split (default 4)")
    parser.add_argument("--n-list", type=_parse_int_list, default=None, help=f"default {FULL_N}")
    parser.add_argument("--m-list", type=_parse_int_list, default=None,
                        help=f"default {FULL_M}; each m >= 2, batches are kept from n = max(m list)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls after a warm-up (default 5; quick 1)")
    add_threads_argument(parser)
    parser.add_argument("--quick", action="store_true", help=f"n {QUICK_N}, m {QUICK_M}, 1 repeat (smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: results/<machine>/)")
    args = parser.parse_args(argv)

    device = device_or_none(args.device)
    if device is None:
        return 2
    n_list = args.n_list or (QUICK_N if args.quick else FULL_N)
    m_list = args.m_list or (QUICK_M if args.quick else FULL_M)
    repeats = args.repeats or (1 if args.quick else 5)
    if min(m_list) < 2:
        parser.error("every m must be >= 2 (group-normalized advantages of one rollout are 0)")
    if args.prompts < 1 or repeats < 1:
        parser.error("--prompts and --repeats must be >= 1")
    if args.model is None:
        from pods_rl.tiny import model_path

        try:
            model = str(model_path())
        except FileNotFoundError as err:
            print(f"error: {err}; or pass --model PATH", file=sys.stderr)
            return 2
    else:
        model = args.model
        if not (Path(model) / "config.json").is_file():
            print(f"error: --model {model} is not a model directory (no config.json)", file=sys.stderr)
            return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    info = machine_info()
    if device.type == "cpu":
        info = {**info, "gpu": None}  # a CPU run on a GPU host belongs with CPU results
    out_dir = args.out or results_dir(machine_slug(info))
    out_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"model={model} device={device} threads={torch.get_num_threads()} cpu={info['cpu_model']} "
          f"gpu={info['gpu']} load average at start={load}")
    print(HEADER)
    print("-" * len(HEADER))

    rows = load_prompts(args.recipe, args.prompts)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        generation = bench_generation(model, args.recipe, device, rows, n_list, repeats, workdir)
        update = bench_update(model, args.recipe, device, rows, m_list, repeats, workdir)
    wall = time.perf_counter() - started
    ratios = asymmetry(generation, update)
    print(f"\ngeneration: n x{ratios['n_ratio']:g} -> time x{ratios['generation_ratio_largest_to_smallest_n']:.2f}"
          f";  update: m x{ratios['m_ratio']:g} -> time x{ratios['update_ratio_largest_to_smallest_m']:.2f}")
    if "update_same_m_pods_over_grpo" in ratios:
        print(f"update at {ratios['control']}: time ratio {ratios['update_same_m_pods_over_grpo']:.2f} "
              f"(~1: the update cost does not depend on n)")
    print(f"total wall time {wall:.0f} s")

    stem = "bench_phases_quick" if args.quick else "bench_phases"
    payload = {
        "benchmark": "seconds and peak memory of the generation phase (vs n) and the update phase (vs m)",
        "command": shlex.join(["python", "benchmarks/bench_phases.py", *(sys.argv[1:] if argv is None else argv)]),
        "model": model,
        "recipe": args.recipe,
        "device": str(device),
        "prompts": args.prompts,
        "questions": list(rows["question"]) if "question" in rows.column_names else None,
        "repeats": repeats,
        "timing": f"one warm-up call, then the median of {repeats} calls",
        "memory": ("torch.cuda.max_memory_allocated above the start of the call" if device.type == "cuda" else
                   "peak RSS during the call (VmHWM reset via /proc/self/clear_refs) above the RSS at its start; "
                   "memory_scope 'process' marks the process's lifetime peak where no reset was possible"),
        "load_average_at_start": load,
        "wall_seconds": wall,
        "machine": info,
        "asymmetry": ratios,
        "generation": generation,
        "update": update,
    }
    from pods_rl.commands.study_paths import portable

    repo = Path(__file__).resolve().parents[1]  # the model's path (the shipped one: in src/) relative to the checkout
    (out_dir / f"{stem}.json").write_text(json.dumps(portable(payload, repo), indent=2) + "\n")
    plot(generation, update, out_dir / f"{stem}.png",
         f"{Path(model).name}: {args.prompts} prompts, {device} ({info['gpu'] or info['cpu_model']}, "
         f"{torch.get_num_threads()} threads)")
    print(f"wrote {out_dir / (stem + '.json')} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
