"""Priced time for `pods study --price_at COSTS`: each method's training timed at ANOTHER machine's step costs.

The learning is measured here; a step costs c0 + c_s x rollouts sampled + c_t x rollouts trained there, from `pods
cost`'s JSON or ``c0_ms,sample_ms,train_ms``; auto methods plan at the same costs. Shapes: R logged rows, E evals."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from pathlib import Path

import numpy as np

from pods_rl import stats

__all__ = ["PricedCosts", "check_runs_logged", "cost_file_mismatch", "parse_priced_costs", "priced_planner_argv",
           "priced_report", "priced_times", "step_counts"]

FLAG = "--price_at"
LABEL = "priced"


@dataclasses.dataclass(frozen=True)
class PricedCosts:
    """Milliseconds: c0 a step, c_s a sampled rollout, c_t a trained one; where they came from, and its recipe."""

    fixed_ms: float
    sample_ms: float
    train_ms: float
    source: str
    recipe_argv: tuple[str, ...] | None = None

    def step_ms(self, sampled, trained):
        """Priced milliseconds of steps that sampled ``sampled`` and trained ``trained`` rollouts (same shapes)."""
        return self.fixed_ms + self.sample_ms * np.asarray(sampled, dtype=np.float64) + self.train_ms * np.asarray(
            trained, dtype=np.float64)


def parse_priced_costs(spec: str | None) -> PricedCosts:
    """``--price_at``'s value (a `pods cost` JSON, or ``c0_ms,sample_ms,train_ms``); bad costs: a one-line error."""
    fix = f"give {FLAG} a `pods cost` JSON file or three numbers c0_ms,sample_ms,train_ms (e.g. 202,0.056,0.526)"
    if spec is None or not str(spec).strip():
        raise ValueError(f"{FLAG} is empty: {fix}")
    spec = str(spec).strip()
    if spec.endswith(".json") or Path(spec).is_file():
        return _from_cost_file(Path(spec), fix)
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != 3:
        raise ValueError(f"{FLAG} {spec!r}: expected 3 costs c0_ms,sample_ms,train_ms, got {len(parts)}; {fix}")
    values = []
    for name, text in zip(("c0_ms", "sample_ms", "train_ms"), parts):
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{FLAG} {spec!r}: {name} {text!r} is not a number; {fix}") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{FLAG} {spec!r}: {name} must be a finite number >= 0, got {text}; {fix}")
        values.append(value)
    return PricedCosts(*values, source=f"given: c0 {values[0]:g} ms, c_s {values[1]:g} ms, c_t {values[2]:g} ms")


def _from_cost_file(path: Path, fix: str) -> PricedCosts:
    from pods_rl.auto_projection import costs_from_rows

    if not path.is_file():
        raise ValueError(f"{FLAG} {path}: no such file; {fix}")
    try:
        cost = json.loads(path.read_text())
        rows = cost["rows"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{FLAG} {path}: not a `pods cost` JSON (no 'rows'); {fix}") from None
    try:
        fitted = costs_from_rows(rows)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{FLAG} {path}: its rows do not give the costs ({err})") from None
    recipe = (cost.get("settings") or {}).get("recipe_argv")
    return PricedCosts(1e3 * fitted["fixed_s"], 1e3 * fitted["sample_s"], 1e3 * fitted["train_s"],
                       source=f"`pods cost` file {path.name} (sampling fitted a + b*N over its rows' totals "
                              f"{sorted(set(fitted['totals']))})", recipe_argv=tuple(recipe) if recipe else None)


def flag_value(argv, name: str) -> str | None:
    """The last value of ``--name`` (or ``--name=value``) in ``argv``."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def without_flag(argv, name: str) -> list[str]:
    """``argv`` without ``--name value`` and ``--name=value``."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            kept.append(arg)
    return kept


def cost_file_mismatch(costs: PricedCosts, recipe_argv) -> str | None:
    """A warning line where the cost file's ``--config``, ``--model_name_or_path`` or ``--task`` is not the study's."""
    if costs.recipe_argv is None:
        return None
    differ = []
    for name in ("--config", "--model_name_or_path", "--task"):
        theirs, ours = flag_value(costs.recipe_argv, name), flag_value(list(recipe_argv), name)
        if theirs != ours:
            differ.append(f"{name} {theirs or '(default)'} there, {ours or '(default)'} here")
    if not differ:
        return None
    return (f"pods study: warning: {FLAG}'s costs were measured on another model or task than this study's ("
            + "; ".join(differ) + "): the priced times price this study's rollouts at that recipe's step costs")


def priced_planner_argv(extra, costs: PricedCosts) -> tuple[str, ...]:
    """A method's extra `pods train` flags, an auto method's ``--rollout_planner_args`` given the priced costs."""
    from pods_rl.budget.planners import needs_of

    extra = list(extra)
    if "costs" not in needs_of(flag_value(extra, "--rollout_planner")):  # auto: it plans from these costs
        return tuple(extra)
    given = flag_value(extra, "--rollout_planner_args")
    try:
        knobs = json.loads(given) if given else {}
    except ValueError:
        raise ValueError(f"--rollout_planner_args {given!r} is not JSON: {FLAG} merges its costs into it; give it as "
                         "a JSON object, e.g. '{\"max_n\": 64}'") from None
    knobs.update(fixed_ms=costs.fixed_ms, sample_ms=costs.sample_ms, train_ms=costs.train_ms)
    # the old --rollout_planner_args (either spelling) goes; the merged one goes last
    return *without_flag(extra, "--rollout_planner_args"), "--rollout_planner_args", json.dumps(knobs, sort_keys=True)


def step_counts(run: stats.RunData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps (R,), rollouts sampled per step (R,), rollouts trained per step (R,)) of a run's logged training rows
    (each row the mean of its logging window). Sampled: the logged ``pods/rollouts_sampled``, else, for a run whose
    n is fixed (no planner), n per kept group of its config. ValueError (one line) where neither tells it."""
    from pods_rl.runlog import read_metrics

    config = run.config or {}
    try:
        trained = float(config["per_device_train_batch_size"]) * float(config.get("gradient_accumulation_steps") or 1)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{run.run_dir}: its config.yaml does not give the rollouts trained per step "
                         f"(per_device_train_batch_size); priced time needs it") from None
    fixed_n = not any(config.get(k) for k in ("rollout_planner", "prompt_planner", "pilot_generations",
                                              "adaptive_budget"))
    rows = [r for r in read_metrics(run.run_dir) if "loss" in r and "step" in r]
    if not rows:
        raise ValueError(f"{run.run_dir}: no logged training rows (metrics.jsonl): priced time needs each step's "
                         "rollouts sampled and trained")
    steps, sampled = [], []
    for row in rows:
        if "pods/rollouts_sampled" in row:
            sampled.append(float(row["pods/rollouts_sampled"]))
        elif fixed_n and config.get("num_generations") and config.get("downsample_to"):
            sampled.append(trained * float(config["num_generations"]) / float(config["downsample_to"]))
        else:
            raise ValueError(f"{run.run_dir}: its logged rows hold no pods/rollouts_sampled and its n varies (a "
                             "planner or pilot): priced time needs the rollouts sampled per step; rerun with this "
                             "pods-rl, which logs them")
        steps.append(float(row["step"]))
    order = np.argsort(steps, kind="stable")
    return np.asarray(steps)[order], np.asarray(sampled)[order], np.full(len(steps), trained)


def priced_times(run: stats.RunData, costs: PricedCosts) -> np.ndarray:
    """(E,) priced seconds up to each evaluation: sum over steps of c0 + c_s x sampled + c_t x trained."""
    # each logged row's mean stands for the steps since the row before
    steps, sampled, trained = step_counts(run)
    span = np.diff(np.concatenate([[0.0], steps]))  # (R,) steps each row stands for
    cumulative = np.concatenate([[0.0], np.cumsum(span * costs.step_ms(sampled, trained) / 1e3)])  # (R+1,)
    if (run.steps < 0).any():
        raise ValueError(f"{run.run_dir}: some evaluations carry no optimizer step; priced time needs them")
    return np.interp(run.steps.astype(float), np.concatenate([[0.0], steps]), cumulative)


def check_runs_logged(groups: dict[str, list[stats.RunData]]) -> None:
    """Refuse (one line, the first run that fails) a study whose runs do not tell rollouts sampled and trained."""
    for group in groups.values():
        for run in group:
            step_counts(run)


def priced_report(groups: dict[str, list[stats.RunData]], baseline: str, costs: PricedCosts,
                  n_boot: int = 2000) -> dict:
    """{"label": "priced", "costs", "methods": {name: {seconds_per_step, rollouts sampled/trained per step,
    to_levels}}}: every method's time to each accuracy level on the priced axis, paired by seed against the
    baseline (``stats.level_time_ratios``), as the measured ``to_levels`` are."""
    priced = {name: [dataclasses.replace(run, times=priced_times(run, costs)) for run in group]
              for name, group in groups.items()}
    levels = stats.level_time_ratios(priced, baseline, n_boot=n_boot)
    methods = {}
    for name, group in groups.items():
        counts = [step_counts(run) for run in group]
        sampled = [float(np.average(s, weights=np.diff(np.concatenate([[0.0], st])))) for st, s, _ in counts]
        trained = [float(t[0]) for _, _, t in counts]
        methods[name] = {"seconds_per_step": stats.mean_se([float(costs.step_ms(s, t)) / 1e3
                                                             for s, t in zip(sampled, trained)]),
                         "rollouts_sampled_per_step": stats.mean_se(sampled),
                         "rollouts_trained_per_step": stats.mean_se(trained),
                         "to_levels": (levels.get(name) or {}).get("time") if name != baseline else None}
    return {"label": LABEL, "costs": dataclasses.asdict(costs), "methods": methods,
            "rule": "priced seconds per step = c0 + c_s x rollouts sampled + c_t x rollouts trained; learning as "
                    "measured here"}


def priced_lines(priced: dict | None, labels: dict[str, str]) -> list[str]:
    """The report's priced section: the costs, and per method its priced step and time to levels vs the baseline."""
    if not priced:
        return []
    c = priced["costs"]
    lines = [f"\nPRICED time (not measured here): each step priced c0 {c['fixed_ms']:g} ms + c_s {c['sample_ms']:g} "
             f"ms x rollouts sampled + c_t {c['train_ms']:g} ms x rollouts trained ({c['source']}); learning as "
             "measured here:"]
    for name, entry in priced["methods"].items():
        seconds, levels = entry["seconds_per_step"][0], entry["to_levels"]
        ratio = "baseline" if levels is None else (
            f"priced time to levels: {levels['ratio']:.2f}x the baseline's speed" + (
                f" [{levels['ci95'][0]:.2f}, {levels['ci95'][1]:.2f}]" if levels.get("ci95") and None not in
                levels["ci95"] else ""))
        lines.append(f"  {labels.get(name, name)[:34]:<34} priced {seconds:.3f} s/step "
                     f"({entry['rollouts_sampled_per_step'][0]:.0f} sampled, "
                     f"{entry['rollouts_trained_per_step'][0]:.0f} trained); {ratio}")
    return lines


def describe(costs: PricedCosts) -> str:
    """One line for the study's log: the priced costs and their source."""
    return (f"pods study: {FLAG}: steps priced at c0 {costs.fixed_ms:g} ms + c_s {costs.sample_ms:g} ms/sampled + "
            f"c_t {costs.train_ms:g} ms/trained ({costs.source}); auto methods plan with these costs: "
            + shlex.join(["--rollout_planner_args", json.dumps({"fixed_ms": costs.fixed_ms,
                                                                 "sample_ms": costs.sample_ms,
                                                                 "train_ms": costs.train_ms}, sort_keys=True)]))
