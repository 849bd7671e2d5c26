"""What ``rollout_planner="auto"`` costs where it chooses m everywhere: its step against GRPO's, in interleaved pairs.

Issue #74 asks auto to be free where PODS does not pay: at m everywhere its step within 1% of a GRPO step. Two real
``pods train`` trainers (``pods cost``'s ``build_trainer``) take optimizer steps in turn (``train_interleaved``), so
a load that drifts slows both alike: GRPO (n = m) and auto (n = 4m) with a sampling cost so dear (``sample_ms``) that
every prompt gets m. Reported: the step-cost ratio turn by turn (``step_cost.paired_ratio``, as ``pods cost``), each
phase's median, and the seconds each trainer spends fetching its next batch, outside ``time/step``. Both orders of the
pair run, ``--rounds`` times each. Prints a table; JSON to benchmarks/results/<machine>/bench_auto_at_m.json.

At m everywhere auto's trajectory is GRPO's, step for step (the same rewards, lengths and losses), so the two do the
same work but auto's own: the plan, the ledger, and where a step is not GRPO's own, selection. That work is also
accounted directly, in CPU seconds of the training thread (``time.thread_time``): per step, and as a share of GRPO's
step CPU. A trainer's wall-clock speed varies by a few percent from one build to the next, more than the effect; the
accounting does not.

    python benchmarks/bench_auto_at_m.py                     # the strong tiny model of the auto studies, m = 16
    python benchmarks/bench_auto_at_m.py --steps 20 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install

from _machine import add_threads_argument, machine_info, results_dir  # noqa: E402

from pods_rl import step_cost  # noqa: E402
from pods_rl.bootstrap import bootstrap_ci  # noqa: E402
from pods_rl.commands.cost import PHASES, build_trainer, step_rows, train_interleaved  # noqa: E402

STRONG = Path(__file__).resolve().parent / "results" / "cpu-2core-amd-epyc" / "evidence" / "strong" / "model"
AT_M = '{"sample_ms": 1000000, "train_ms": 1}'  # a rollout dearer than any gain: auto gives every prompt m


def recipe(model: str, m: int) -> list[str]:
    """The auto studies' recipe (8 prompts x m kept rollouts per update), as ``pods train`` flags."""
    return ["--config", "tiny", "--model_name_or_path", model, "--learning_rate", "1e-4", "--train_limit", "512",
            "--per_device_train_batch_size", str(8 * m), "--downsample_rule", "max_variance", "--seed", "80"]


def timed_batches(trainer) -> list[float]:
    """Seconds of each ``get_batch_samples`` call of ``trainer`` (the next batch, fetched outside ``time/step``)."""
    seconds, fetch = [], trainer.get_batch_samples

    def get_batch_samples(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fetch(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    trainer.get_batch_samples = get_batch_samples
    return seconds


OWN_WORK = ("_plan_rollouts", "_plain_at_m", "_select_kept")  # auto's own per-step work on the trainer; the ledger


def cpu_clock(trainer) -> dict[str, list[float]]:
    """CPU seconds (``time.thread_time``) of each ``training_step`` of ``trainer`` and of auto's own work in it
    (``OWN_WORK`` and the ledger's ``record``): {name: [seconds per call]}, filled as the trainer runs."""
    seconds: dict[str, list[float]] = {}

    def timed(owner, name: str, key: str) -> None:
        method = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                seconds.setdefault(key, []).append(time.thread_time() - start)

        setattr(owner, name, wrapper)

    timed(trainer, "training_step", "step")
    for name in OWN_WORK:
        if hasattr(trainer, name):
            timed(trainer, name, name.lstrip("_"))
    if getattr(trainer, "_budget", None) is not None:
        timed(trainer._budget, "record", "ledger")
    return seconds


def own_work_per_step(seconds: dict[str, list[float]], steps: int, start: int) -> dict[str, float]:
    """{part: CPU seconds per measured step} of auto's own work, the first ``start`` steps left out (one call a step,
    ``_select_kept`` only where a step is not GRPO's own)."""
    total = max(len(seconds.get("step", [])) - start, 1)
    return {key: sum(values[start:]) / total for key, values in seconds.items() if key != "step"}


def one_round(model: str, m: int, steps: int, auto_first: bool, tmp: Path) -> dict:
    """GRPO and auto-at-m trained in turn for ``steps`` measured steps: their per-step rows and batch seconds."""
    base = recipe(model, m)
    auto = ["--rollout_planner", "auto", "--adaptive_reward", "correctness_reward", "--rollout_planner_args", AT_M]
    settings = {"grpo": (base, m), "auto": (base + auto, 4 * m)}
    order = ["auto", "grpo"] if auto_first else ["grpo", "auto"]
    built = {name: build_trainer(settings[name][0], settings[name][1], m, steps + 4, tmp / name)
             for name in order}
    batches = {name: timed_batches(trainer) for name, (trainer, _) in built.items()}
    cpu = {name: cpu_clock(trainer) for name, (trainer, _) in built.items()}
    train_interleaved([built[name][0] for name in order])
    out = {}
    for name, (_, run_dir) in built.items():
        rows, start = step_rows(run_dir, warmup=2)
        if len(cpu[name]["step"]) != len(rows):  # one training_step per logged optimizer step (no accumulation)
            raise RuntimeError(f"{name}: {len(cpu[name]['step'])} training steps timed for {len(rows)} logged steps")
        n_means = [r["pods/auto_n_mean"] for r in rows if "pods/auto_n_mean" in r]
        out[name] = {"steps": {int(r["step"]): float(r["time/step"]) for r in rows[start:]},
                     "phases": {p: [float(r[f"time/{p}"]) for r in rows[start:]] for p in PHASES},
                     "batch_seconds": batches[name][start:], "n_mean": statistics.mean(n_means) if n_means else m,
                     "cpu_steps": {int(r["step"]): s for r, s in zip(rows[start:], cpu[name]["step"][start:])},
                     "own_work": own_work_per_step(cpu[name], steps, start)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(STRONG), help="a local model folder (default: the strong tiny model)")
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="measured steps per trainer and round")
    parser.add_argument("--rounds", type=int, default=6, help="pairs of rounds (one in each order): each round "
                        "builds both trainers anew, and a trainer's own speed varies by a few % between builds")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    ratios, phases, batches, n_means = [], {"grpo": {}, "auto": {}}, {"grpo": [], "auto": []}, []
    cpu_ratios, own, grpo_cpu = [], [], []
    with tempfile.TemporaryDirectory(prefix="pods-auto-at-m-") as tmp:
        for k in range(2 * args.rounds):
            result = one_round(args.model, args.m, args.steps, auto_first=k % 2 == 1, tmp=Path(tmp) / f"round{k}")
            ratio = step_cost.paired_ratio(result["auto"]["steps"], result["grpo"]["steps"])
            ratios.append(ratio)
            cpu_ratios.append(step_cost.paired_ratio(result["auto"]["cpu_steps"], result["grpo"]["cpu_steps"]))
            own.append(result["auto"]["own_work"])
            grpo_cpu.extend(result["grpo"]["cpu_steps"].values())
            n_means.append(result["auto"]["n_mean"])
            for name in phases:
                for p, values in result[name]["phases"].items():
                    phases[name].setdefault(p, []).extend(values)
                batches[name].extend(result[name]["batch_seconds"])
            print(f"round {k + 1}: auto/GRPO step {ratio['value']:.4f} [{ratio['low']:.4f}, {ratio['high']:.4f}] "
                  f"over {ratio['pairs']} pairs, CPU {cpu_ratios[-1]['value']:.4f} (auto first: {k % 2 == 1}; "
                  f"auto's mean n {n_means[-1]:.2f}; its own work {1e3 * sum(own[-1].values()):.2f} ms a step)",
                  flush=True)
    value = statistics.mean(r["value"] for r in ratios)
    interval = bootstrap_ci([r["value"] for r in ratios])  # over rounds: the builds' spread dominates
    cpu_value = statistics.mean(r["value"] for r in cpu_ratios)
    cpu_interval = bootstrap_ci([r["value"] for r in cpu_ratios])
    parts = sorted({part for o in own for part in o})
    own_ms = {part: 1e3 * statistics.mean(o.get(part, 0.0) for o in own) for part in parts}
    own_ci = bootstrap_ci([1e3 * sum(o.values()) for o in own])
    grpo_cpu_ms = 1e3 * statistics.median(grpo_cpu)
    ms = {name: {p: 1e3 * statistics.median(v) for p, v in phases[name].items()} for name in phases}
    batch_ms = {name: 1e3 * statistics.median(v) for name, v in batches.items()}
    each = ", ".join(f"{r['value']:.4f}" for r in ratios)
    print(f"\nauto at m against GRPO (m = {args.m}; interleaved pairs, {len(ratios)} rounds): step-cost ratio "
          f"{value:.4f} [{interval[0]:.4f}, {interval[1]:.4f}] (95% CI, bootstrap over rounds; rounds: {each})")
    print(f"{'phase (median ms)':<20}{'GRPO':>10}{'auto':>10}{'auto - GRPO':>14}")
    for p in PHASES:
        print(f"{p:<20}{ms['grpo'][p]:>10.1f}{ms['auto'][p]:>10.1f}{ms['auto'][p] - ms['grpo'][p]:>+14.1f}")
    print(f"{'next batch':<20}{batch_ms['grpo']:>10.1f}{batch_ms['auto']:>10.1f}"
          f"{batch_ms['auto'] - batch_ms['grpo']:>+14.1f}   (outside time/step)")
    print(f"CPU seconds of the training thread: auto/GRPO step {cpu_value:.4f} [{cpu_interval[0]:.4f}, "
          f"{cpu_interval[1]:.4f}]; auto's own work {sum(own_ms.values()):.2f} ms a step [{own_ci[0]:.2f}, "
          f"{own_ci[1]:.2f}] ({', '.join(f'{k} {v:.2f}' for k, v in own_ms.items())}), "
          f"{100 * sum(own_ms.values()) / grpo_cpu_ms:.2f}% of GRPO's step ({grpo_cpu_ms:.1f} ms CPU, median)")
    out = results_dir() / "bench_auto_at_m.json"
    out.write_text(json.dumps({"machine": machine_info(), "command": "python benchmarks/bench_auto_at_m.py " +
                               " ".join(argv if argv is not None else sys.argv[1:]),
                               "m": args.m, "steps": args.steps, "step_ratio": value, "step_ratio_ci": list(interval),
                               "rounds": ratios,
                               "auto_n_mean": n_means, "phase_ms": ms, "next_batch_ms": batch_ms,
                               "cpu_step_ratio": cpu_value, "cpu_step_ratio_ci": list(cpu_interval),
                               "cpu_rounds": cpu_ratios, "own_work_ms": own_ms, "own_work_ms_ci": list(own_ci),
                               "grpo_step_cpu_ms": grpo_cpu_ms,
                               "own_work_share": sum(own_ms.values()) / grpo_cpu_ms}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
