"""`pods cost`: what a GRPO step (n = m) and each PODS step (n -> m) cost on YOUR recipe, before you train.

    pods cost                                            # the embedded default: tiny model, m=8, n = 8, 16, 32
    pods cost --config gsm8k/pods --n 16,64 --steps 3    # a paper recipe (needs its GPU); any pods train flag
    pods cost --n 16 --oversample_prompts 2              # what sampling 2x the prompts adds to a step
    pods cost --n 32 --pilot_generations 8               # adaptive rollouts: pilot of 8, up to 32, keep m

For each n (and n = m, the GRPO reference) it trains the real ``pods train`` trainer (``num_generations=n``,
``downsample_to=m``, no evaluation or checkpoints, a temporary run directory) and reads back the per-step ``time/*``,
``memory/*`` and reward statistics ``PODSTrainer`` logs to metrics.jsonl: no second timing code path. Schedule:
``interleaved`` (all trainers in one process, stepping in turn, each from its own random streams: a noisy machine
slows all alike; ``pods_rl.interleaved``), ``sequential`` (one setting after another, in alternating ``rounds``) or
``auto``. A setting warms up until its step times are steady; its cost is the median step (``pods_rl.step_cost``),
with quartile ranges; ``ratio`` = step seconds / those of n = m (PODS pays off when its progress per step exceeds
it). ``--oversample_prompts`` and ``--pilot_generations`` add rows measured with them. Then what
``rollout_planner="auto"`` would choose on the measured costs and the starting model's pass rates on
``--auto_prompts`` training prompts (``auto_projection``): its n per prompt and predicted signal per second against
GRPO. docs/guides/cost.md explains the table and estimator."""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pods_rl import step_cost, training_run
from pods_rl.auto_projection import DEFAULT_AUTO_PROMPTS, DEFAULT_AUTO_SAMPLES, auto_projection
from pods_rl.errors import one_line_parser_errors, run_guarded, spellings
from pods_rl.interleaved import train_interleaved
from pods_rl.machine import machine_info
from pods_rl.recipes import parse_args
from pods_rl.runlog import read_metrics

PHASES = ("generation", "scoring", "selection", "update", "step")
DEFAULT_STEPS = 5
DEFAULT_WARMUP = 1
ESTIMATOR = ("median step time (split into phases by the middle steps' shares); warm-up until steady; "
             "interleaved: ratio turn by turn (interquartile mean), else ratio of medians; range from the quartiles")


# ------------------------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------------------------
def build_trainer(recipe_argv: list[str], n: int, m: int, max_steps: int, output_dir: Path, oversample: float = 1.0,
                  pilot: int | None = None):
    """The real `pods train` trainer for one setting (n -> m), without evaluation, checkpoints or a time limit:
    ``(trainer, run_dir)``; its per-step phase times land in ``run_dir/metrics.jsonl`` (see ``step_rows``). Also used
    by benchmarks/bench_generation.py."""
    from transformers.trainer_callback import (
        PrinterCallback,  # seconds to import; `pods cost --help` needs none
    )

    # no rollout planner (a fixed n) unless the recipe's flags name one, then the user's recipe, then this
    # setting's `pods train` flags (later flags win; any flag wins over the recipe's YAML)
    run, config, model_args = parse_args([
        "--rollout_planner", "none", *recipe_argv, "--num_generations", str(n), "--downsample_to", str(m),
        "--max_steps", str(max_steps),
        "--oversample_prompts", repr(float(oversample)), "--pilot_generations", str(pilot or 0),
        "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
        "--eval_before_after", "false", "--output_dir", str(output_dir)])
    run.eval_every_seconds = run.eval_every_steps = None
    config.max_train_seconds = config.save_every_seconds = None  # stop by steps, never save
    trainer, clock, _ = training_run.build(run, config, model_args)
    if getattr(clock, "run_lock", None) is not None:
        clock.run_lock.release()  # a private temporary directory: no `fit` here to release it at the end
    trainer.remove_callback(PrinterCallback)  # the per-step log dicts go to metrics.jsonl only
    return trainer, clock.run_dir


def step_rows(run_dir: Path, warmup: int, steps: int | None = None) -> tuple[list[dict], int]:
    """The per-step rows of a cost run's metrics.jsonl (rows with ``time/step``, in order) and how many of them
    are warm-up: at least ``warmup``, then until the step time is steady (``step_cost.steady_start``)."""
    rows = sorted((r for r in read_metrics(run_dir) if "time/step" in r), key=lambda r: r["step"])
    seconds = [float(r["time/step"]) for r in rows]
    start = step_cost.steady_start(seconds, warmup, step_cost.window_for(steps or step_cost.STEADY_WINDOW + 1))
    if start is None:  # fewer steps than the window: the run stopped early; keep what there is past the minimum
        start = min(warmup, len(rows))
    return rows, start


def summarize(rows: list[dict], n: int, m: int, kept_per_step: int, oversample: float = 1.0,
              sampled_per_step: int | None = None, pilot: int | None = None, steady: bool = True) -> dict:
    """One table row from a setting's per-step rows (``"warmup": True`` flags warm-up): median cost per phase, spread,
    seconds per sampled / kept rollout, peak update memory, selection statistics; ``per_step`` keeps every step.
    ``steady``: the warm-up ended in steady steps. ``sampled_per_step``: default kept_per_step x n / m x oversample;
    adaptive rows (``pilot``) use the measured mean."""
    import numpy as np

    all_rows, rows = rows, [r for r in rows if not r.get("warmup")]
    if not rows:
        raise ValueError(f"no measured steps for n={n} (the run logged no time/step rows after the warm-up)")

    def column(key):
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        return np.array(values) if values else None

    phases = {phase: column(f"time/{phase}") for phase in PHASES}
    seconds = step_cost.phase_split(phases)
    robust = {phase: step_cost.summary(values) for phase, values in phases.items()}
    std = {p: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for p, v in phases.items()}
    if sampled_per_step is None:
        sampled_per_step = round(kept_per_step * n / m * oversample)
    measured_sampled, rounds = column("pods/rollouts_sampled"), column("pods/rounds")
    if pilot and measured_sampled is not None:
        sampled_per_step = float(measured_sampled.mean())  # what the rounds needed, not n per prompt

    def mean_of(*keys):  # the PODS metric when the trainer selected, else TRL's (n = m: all kept)
        return next((float(values.mean()) for values in map(column, keys) if values is not None), None)

    memory = column("memory/update_peak_gb")
    return {
        "n": n, "m": m, "oversample_prompts": oversample, "pilot_generations": pilot, "steps": len(rows),
        "warmup_steps": len(all_rows) - len(rows), "steady": steady,
        "rounds": float(rounds.mean()) if rounds is not None else 1.0,
        "seconds": seconds, "step_summary": robust["step"], "spread": robust["step"]["spread"],
        "seconds_mean": {p: r["mean"] for p, r in robust.items()}, "seconds_std": std,
        "seconds_min": {p: r["min"] for p, r in robust.items()},
        "seconds_max": {p: r["max"] for p, r in robust.items()},
        "step_ratio": None, "step_ratio_range": None,  # filled in against n = m by add_ratios
        "oversample_step_ratio": None,  # over-sampled rows: against the same n without over-sampling
        "sampled_per_step": sampled_per_step, "kept_per_step": kept_per_step,
        "generation_ms_per_sampled_rollout": 1e3 * seconds["generation"] / sampled_per_step,
        "update_ms_per_kept_rollout": 1e3 * seconds["update"] / kept_per_step,
        "update_peak_gb": float(memory.max()) if memory is not None else None,
        "frac_zero_std_all": mean_of("pods/frac_zero_std_all", "frac_reward_zero_std"),
        "frac_zero_std_kept": mean_of("pods/frac_zero_std_kept", "frac_reward_zero_std"),
        "kept_reward_std": mean_of("pods/reward_kept_std", "reward_std"),
        "per_step": [{"optimizer_step": r["step"], "warmup": bool(r.get("warmup")),
                      "seconds": {p: r.get(f"time/{p}") for p in PHASES}} for r in all_rows],
    }


def add_ratios(rows: list[dict], paired: bool = False) -> list[dict]:
    """Set each row's ``step_ratio`` (and ``step_ratio_range``) against the n = m row without over-sampling:
    paired by turn when ``paired`` (interleaved), else the ratio of medians; ``warning`` when the spread is too wide;
    ``oversample_step_ratio`` for over-sampled rows (vs the same n without)."""
    plain = {r["n"]: r for r in rows if r.get("oversample_prompts", 1.0) == 1.0 and not r.get("pilot_generations")}
    reference = plain[next(r["m"] for r in rows)]
    for row in rows:
        r = (step_cost.paired_ratio(step_cost.by_step(row), step_cost.by_step(reference)) if paired else None) or \
            step_cost.ratio(row["step_summary"], reference["step_summary"])
        row["step_ratio"], row["step_ratio_range"] = (1.0, [1.0, 1.0]) if row is reference else \
            (r["value"], [r["low"], r["high"]])
        row["step_ratio_paired"] = r.get("pairs") is not None and row is not reference
        row["warning"] = step_cost.spread_warning(_name(row), row["step_summary"], reference["step_summary"])
        if row.get("oversample_prompts", 1.0) != 1.0 and not row.get("pilot_generations") and row["n"] in plain:
            row["oversample_step_ratio"] = row["seconds"]["step"] / plain[row["n"]]["seconds"]["step"]
    return rows


def measure(recipe_argv: Sequence[str], ns: Sequence[int], m: int, steps: int = DEFAULT_STEPS,
            warmup: int = DEFAULT_WARMUP, schedule: str = "auto", oversample: float = 1.0,
            pilot: int | None = None, rounds: int | None = None) -> dict:
    """Train the recipe at each n (keeping m) through its warm-up and ``steps`` measured steps; summarize the cost.
    ``ns`` must include m (the GRPO reference). ``schedule``: "interleaved", "sequential" or "auto". ``oversample`` > 1
    and ``pilot`` add settings measured with them. ``rounds`` (sequential): alternating passes over the settings.
    Returns ``{"machine", "settings", "rows": [one dict per setting, see summarize()]}``."""
    if m not in ns:
        raise ValueError(f"the n list {list(ns)} must include n = m = {m}, the GRPO reference")
    cases = [(n, o, None) for n in ns for o in ([1.0, float(oversample)] if oversample > 1 else [1.0])]
    cases += [(n, 1.0, pilot) for n in ns if pilot and n > m and n >= pilot]  # (n, oversample, pilot)
    seen = {c: {"rows": [], "steady": True} for c in cases}  # case -> its rows (each flagged "warmup"), steadiness
    with tempfile.TemporaryDirectory(prefix="pods-cost-") as tmp:
        passes, round_index = 1, 0
        while round_index < passes:  # sequential: `passes` rounds in alternation; interleaved: one
            per_pass = steps // passes + (round_index < steps % passes)  # this round's share of the steps
            waiting = []
            for case in cases:
                n, o, k = case
                trainer, run_dir = build_trainer(list(recipe_argv), n, m, warmup + step_cost.MAX_EXTRA_WARMUP +
                                                 per_pass + step_cost.STEADY_WINDOW,
                                                 Path(tmp) / f"r{round_index}-n{n}-o{o:g}-k{k or 0}", o, k)
                if schedule == "auto":
                    on_cuda = trainer.accelerator.device.type == "cuda"
                    alone = trainer.args.use_vllm or (on_cuda and not step_cost.cuda_fits_together(trainer, len(cases)))
                    schedule = "sequential" if alone else "interleaved"
                if schedule == "sequential" and round_index == 0 and case == cases[0]:
                    passes = max(1, min(rounds or 2, steps // 2))  # >= 2 steps a round: no extra step
                    per_pass = steps // passes + (steps % passes > 0)
                trainer.add_callback(step_cost.stop_when_measured(per_pass, warmup))
                if schedule == "sequential":  # train now and free it: the next setting gets the device alone
                    trainer.train()
                    _collect(seen[case], trainer, run_dir, warmup, per_pass)
                    trainer.release_vllm_engine()  # deleting the trainer alone leaves its engine in memory
                    del trainer
                    _free_memory()
                else:
                    waiting.append((case, trainer, run_dir))
            if waiting:
                train_interleaved([trainer for _, trainer, _ in waiting])
                for case, trainer, run_dir in waiting:
                    _collect(seen[case], trainer, run_dir, warmup, per_pass)
                del waiting, trainer
                _free_memory()
            round_index += 1
        rows = [summarize(seen[c]["rows"], c[0], m, seen[c]["kept_per_step"], oversample=c[1],
                          sampled_per_step=seen[c]["sampled_per_step"], pilot=c[2], steady=seen[c]["steady"])
                for c in cases]
    machine = {**machine_info(), "device": seen[cases[0]]["device"]}
    settings = {"m": m, "n": list(ns), "oversample_prompts": float(oversample), "pilot_generations": pilot,
                "steps": steps, "warmup": warmup, "estimator": ESTIMATOR, "schedule": schedule,
                "rounds": passes, "recipe_argv": list(recipe_argv)}
    return {"machine": machine, "settings": settings, "rows": add_ratios(rows, paired=schedule == "interleaved")}


def _collect(seen: dict, trainer, run_dir: Path, warmup: int, steps: int) -> None:
    """Add one trained setting's per-step rows (warm-up flagged), steadiness and ``describe_trainer`` to ``seen``."""
    rows, start = step_rows(run_dir, warmup, steps)
    seconds = [float(r["time/step"]) for r in rows]
    seen["steady"] = seen["steady"] and step_cost.steady(seconds, start, step_cost.window_for(steps))
    seen["rows"] += [{**r, "warmup": i < start} for i, r in enumerate(rows)]  # (round r's rows after r-1's)
    seen.update(describe_trainer(trainer))


def describe_trainer(trainer) -> dict:
    """What the summary needs from a trainer (so that the trainer itself can be freed)."""
    import torch

    args, device = trainer.args, trainer.accelerator.device
    name = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
    processes = trainer.accelerator.num_processes
    kept_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * processes
    # Sampled = kept x n / m, times the prompts sampled per kept group (oversample_prompts, rounded up per process).
    kept_groups = args.per_device_train_batch_size * args.steps_per_generation // args.downsample_to
    sampled_per_step = round(kept_per_step * args.num_generations / args.downsample_to
                             * args.sampled_prompts_per_process() / kept_groups)
    return {"kept_per_step": kept_per_step, "sampled_per_step": sampled_per_step, "device": name}


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------------------
# What the auto planner would choose here
# ------------------------------------------------------------------------------------------------------------
def format_auto(auto: dict) -> list[str]:
    """The auto projection's lines under the table."""
    if "skipped" in auto:
        return [f"auto (rollout_planner='auto'): not projected: {auto['skipped']}"]
    costs, m = auto["costs_ms"], auto["m"]
    totals = ", ".join(f"{t:g}" for t in auto["fit_totals"])
    versus = ", ".join(f"{'auto' if name == 'auto' else f'{name} -> {m}'} {ratio:.2f}x"
                       for name, ratio in auto["vs_grpo"].items() if name != "grpo" and ratio is not None)
    return [
        f"auto (rollout_planner='auto') on these costs: sampling {costs['sample_fixed']:.1f} ms + "
        f"{costs['sample_per_rollout']:.3f} ms per sampled rollout (a + b*N over N = {totals} rollouts per step), "
        f"training {costs['train_per_rollout']:.3f} ms per kept rollout",
        f"  pass rates: {auto['prompts']} training prompts x {auto['k']} samples of the starting model: mean "
        f"{auto['pass_rate']:.2f}, {round(auto['frac_all_equal'] * auto['prompts'])} of {auto['prompts']} all-equal "
        f"(as the planner plans once its ledger has seen each prompt {auto['k']} times)",
        f"  auto would give each prompt n = {auto['n_min']}..{auto['n_max']} (mean {auto['n_mean']:.1f}; "
        f"{100 * auto['frac_above_m']:.0f}% of prompts above m = {m}), in batches of {auto['prompts_per_step']}; "
        f"predicted signal per second vs GRPO (n = m): {versus}",
    ]


# ------------------------------------------------------------------------------------------------------------
# Table and CLI
# ------------------------------------------------------------------------------------------------------------
def _name(row: dict) -> str:
    """A row's setting as the table writes it: ``64 -> 16``, ``16 -> 8 x2`` (over-sampled), ``64 -> 16 k16``."""
    name = f"{row['n']} -> {row['m']}"
    if row.get("oversample_prompts", 1.0) != 1.0:
        name += f" x{row['oversample_prompts']:g}"
    if row.get("pilot_generations"):
        name += f" k{row['pilot_generations']}"
    return name


def format_table(result: dict) -> str:
    """The cost result as a text table (ms per step and phase, ratio to n = m with its range, per-rollout
    costs, memory, selection statistics), then a warning per ratio too noisy to trust."""
    rows = result["rows"]
    head = (f"{'n -> m':>13} {'generation':>13} {'scoring':>11} {'selection':>10} {'update':>13} {'step':>13} "
            f"{'ratio':>6} {'gen/rollout':>11} {'upd/kept':>8} {'peak GB':>7} {'0-std all/kept':>14} "
            f"{'kept std':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        measured = [s for s in r.get("per_step") or [] if not s["warmup"]]
        quartiles = {p: step_cost.summary([s["seconds"][p] for s in measured]) if measured else None
                     for p in PHASES}
        half_iqr = {p: (q["q75"] - q["q25"]) / 2 if q else r["seconds_std"][p] for p, q in quartiles.items()}
        cells = [f"{1e3 * r['seconds'][p]:.1f}±{1e3 * half_iqr[p]:.1f}" for p in PHASES]
        widths = (13, 11, 10, 13, 13)
        memory = "—" if r["update_peak_gb"] is None else f"{r['update_peak_gb']:.2f}"
        zero = "—" if r["frac_zero_std_all"] is None else \
            f"{r['frac_zero_std_all']:.2f} / {r['frac_zero_std_kept']:.2f}"
        std = "—" if r["kept_reward_std"] is None else f"{r['kept_reward_std']:.3f}"
        lines.append(f"{_name(r):>13} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths))
                     + f" {r['step_ratio']:>5.2f}x {r['generation_ms_per_sampled_rollout']:>11.2f}"
                     f" {r['update_ms_per_kept_rollout']:>8.2f} {memory:>7} {zero:>14} {std:>8}")
    s, machine = result["settings"], result["machine"]
    lines.append(f"ms per optimizer step: the median of {s['steps']} measured steps, split by phase, ± half the "
                 f"interquartile range ({s['schedule']}, {s.get('rounds', 1)} round(s); warm-up: at least "
                 f"{s['warmup']} steps, then until a step is within 25% of the next ones); ratio to n = m (GRPO): "
                 "turn by turn if interleaved, else of the medians; range: quartiles")
    for r in rows:
        ratio_range = r.get("step_ratio_range") or [None, None]
        if None not in ratio_range and r is not rows[0]:
            lines.append(f"{_name(r)}: ratio {r['step_ratio']:.2f}x, range {ratio_range[0]:.2f}-{ratio_range[1]:.2f}x "
                         f"({r['warmup_steps']} warm-up steps{'' if r.get('steady', True) else ', never steady'})")
        if r.get("warning"):
            lines.append(r["warning"])
    lines.append("gen/rollout = generation ms per sampled rollout; upd/kept = update ms per kept rollout; "
                 "0-std = fraction of groups whose rewards are all equal")
    for r in rows:
        if r.get("pilot_generations"):
            lines.append(f"kK = adaptive rollouts, pilot K: {r['n']} -> {r['m']} k{r['pilot_generations']} sampled "
                         f"{r['sampled_per_step']:.1f} rollouts per step in {r['rounds']:.2f} rounds on average "
                         f"(plain {r['n']} -> {r['m']}: {round(r['kept_per_step'] * r['n'] / r['m'])})")
        if r.get("oversample_step_ratio") is not None:
            lines.append(f"xO = oversample_prompts O: {r['n']} -> {r['m']} x{r['oversample_prompts']:g} samples "
                         f"{r['sampled_per_step']} rollouts per step for the same {r['kept_per_step']} kept; its step "
                         f"takes {r['oversample_step_ratio']:.2f}x the time of {r['n']} -> {r['m']} without "
                         f"(generation {_ratio(r, rows, 'generation')}, scoring {_ratio(r, rows, 'scoring')})")
    if result.get("auto") is not None:
        lines += format_auto(result["auto"])
    lines.append(f"device {machine['device']}; {machine['cpu_model']}, {machine['usable_cores']} cores, "
                 f"torch {machine['torch']}, transformers {machine['transformers']}, trl {machine['trl']}")
    return "\n".join(lines)


def _ratio(row: dict, rows: list[dict], phase: str) -> str:
    """``row``'s seconds of ``phase`` over those of the same n without over-sampling, as text."""
    plain = next(r for r in rows if r["n"] == row["n"] and r.get("oversample_prompts", 1.0) == 1.0)
    return f"{row['seconds'][phase] / plain['seconds'][phase]:.2f}x" if plain["seconds"][phase] > 0 else "—"


def _int_at_least(name: str, text: str, low: int = 1) -> int:
    """``int(text)`` if it is an integer >= low, else a ValueError naming the flag."""
    kind = "a positive integer" if low == 1 else f"an integer >= {low}"
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be {kind}, got {text!r}") from None
    if value < low:
        raise ValueError(f"{name} must be {kind}, got {text!r}")
    return value


def resolve_ns(text: str | None, m: int) -> list[int]:
    """``"16,64"`` -> [m, 16, 64] (sorted, unique, n = m always included); default [m, 2m, 4m]."""
    if text is None:
        return [m, 2 * m, 4 * m]
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError(f"--n needs comma-separated integers, e.g. --n {m},{2 * m},{4 * m}")
    ns = [_int_at_least("--n", item) for item in items]
    small = [n for n in ns if n < m]
    if small:
        raise ValueError(f"--n {small} is smaller than m={m}: PODS keeps m of the n sampled rollouts, so n >= m")
    return sorted({m, *ns})


def main(argv: Sequence[str] | None = None) -> int:
    """``pods cost``; returns the exit code (0, 2 on bad input, 1 on another failure)."""
    return run_guarded("pods cost", _main, argv)


def build_parser() -> argparse.ArgumentParser:
    """The `pods cost` argument parser: its own flags; any other is a `pods train` flag (the recipe)."""
    parser = argparse.ArgumentParser(
        prog="pods cost", allow_abbrev=False,
        description="Seconds per training step by phase for GRPO (n = m) and PODS (n -> m) on your recipe, "
        "measured with the real trainer. Any `pods train` flag (--config RECIPE: a packaged recipe's name or a YAML "
        "path; --model_name_or_path, batch sizes, --oversample_prompts, --pilot_generations, ...) sets the recipe.",
        epilog="For each setting cost sets these `pods train` flags itself, whatever the recipe says: "
        "--num_generations (each n: --n), --downsample_to (--m), --max_steps (--warmup + --steps), --logging_steps 1, "
        "no checkpoints, no evaluation, --output_dir (a temporary folder; --out is where the JSON goes).")
    parser.add_argument(*spellings("--n", "--num_generations"), default=None, help="rollouts sampled per prompt, "
                        "comma-separated (default: m, 2m, 4m; n = m is always measured as the GRPO reference)")
    parser.add_argument("--m", default=None, help="rollouts kept per prompt (default: the recipe's downsample_to, "
                        "which --downsample_to sets as in pods train)")
    parser.add_argument("--steps", default=str(DEFAULT_STEPS),
                        help=f"measured optimizer steps per setting (default {DEFAULT_STEPS})")
    parser.add_argument("--warmup", default=str(DEFAULT_WARMUP),
                        help=f"unmeasured steps first, per setting (default {DEFAULT_WARMUP})")
    parser.add_argument("--schedule", choices=("auto", "interleaved", "sequential"), default="auto",
                        help="interleaved: settings take steps in turn in one process (fair under machine "
                        "noise); sequential: one after the other (GPU memory per setting). auto: sequential on "
                        "CUDA or with vLLM (one engine at a time), else interleaved")
    parser.add_argument("--auto_prompts", default=str(DEFAULT_AUTO_PROMPTS),
                        help="after measuring, sample this many training prompts with the starting model for the "
                        "auto planner's projection (its n per prompt and predicted signal per second vs GRPO); 0 "
                        f"skips it (default {DEFAULT_AUTO_PROMPTS})")
    parser.add_argument("--auto_samples", default=str(DEFAULT_AUTO_SAMPLES),
                        help=f"samples per prompt for those pass rates (default {DEFAULT_AUTO_SAMPLES})")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    # a `pods train` flag (listed under the recipe's) that cost sets per setting: taken out of the recipe here
    parser.add_argument("--pilot_generations", default=None, help=argparse.SUPPRESS)
    one_line_parser_errors(parser)
    return parser


def _main(argv: list[str]) -> int:
    args, recipe_argv = build_parser().parse_known_args(argv)
    steps = _int_at_least("--steps", args.steps)
    warmup = _int_at_least("--warmup", args.warmup, low=0)
    auto_prompts = _int_at_least("--auto_prompts", args.auto_prompts, low=0)
    auto_samples = _int_at_least("--auto_samples", args.auto_samples)
    pilot = None if args.pilot_generations is None else \
        _int_at_least("--pilot_generations", args.pilot_generations, low=0) or None
    _, config, _ = parse_args(recipe_argv)  # the recipe as the user gave it: its m, and early errors
    m = config.downsample_to if args.m is None else _int_at_least("--m", args.m, low=2)
    ns = resolve_ns(args.n, m)
    pilot = pilot if pilot is not None else config.pilot_generations  # the flag, else the recipe's
    if pilot is not None and not [n for n in ns if n > m and n >= pilot]:
        raise ValueError(f"--pilot_generations {pilot} needs an n above m={m} and at least {pilot} to measure "
                         f"(got --n {','.join(map(str, ns))}); add one, e.g. --n {max(2 * m, pilot)}")
    result = measure(recipe_argv, ns, m, steps=steps, warmup=warmup, schedule=args.schedule,
                     oversample=config.oversample_prompts, pilot=pilot)
    if auto_prompts:
        result["auto"] = auto_projection(result, recipe_argv, auto_prompts, auto_samples)
    print(format_table(result))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, allow_nan=False))
        print(f"wrote {out}")
    return 0
