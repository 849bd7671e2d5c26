"""What ``rollout_planner="auto"`` costs where it chooses m everywhere: its step against GRPO's, in interleaved turns.

Issue #74 asks auto to be free where PODS does not pay: at m everywhere its step within 1% of a GRPO step. Real ``pods
train`` trainers (``pods cost``'s ``build_trainer``) take optimizer steps in turn (``pods_rl.interleaved``), so a load
that drifts slows all alike: GRPO (n = m), auto (n = 4m) with a sampling cost so dear (``sample_ms``) that every
prompt gets m, and a control, GRPO built a second time (``--no-control`` leaves it out). Each round builds them anew,
the rounds cycling through every order of the trainers (the one built first ran about 1% faster), so that each is
built, and takes its turns, in each place equally often. Reported per round and as means over rounds with
bootstrap 95% intervals: each one's step-cost ratio to GRPO turn by turn (``step_cost.paired_ratio``, as ``pods
cost``), in wall-clock and in CPU seconds of the training thread; the CPU it spends in ``training_step`` around TRL's
own step, loss and backward, less GRPO's (``around_trl``); each phase's median, and the seconds fetching the next
batch, outside ``time/step``. Prints a table; JSON (with any ``MALLOC_*`` setting) to benchmarks/results/<machine>/
bench_auto_at_m.json (``--out``).

Each trainer samples from its own random streams, so at m everywhere auto's trajectory is GRPO's, step for step (the
same rewards, lengths and losses; checked, ``same_trajectory``), and so is the control's: they do the same work but
auto's own, which is what the CPU around TRL's step measures whole (the control's reads 0 but for the clock's noise).
The wall clock of two builds of one trainer differs by a few percent, more than the effect, partly through glibc's
per-thread malloc arenas: ``MALLOC_ARENA_MAX=1`` with fixed ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_``
narrow it.

    python benchmarks/bench_auto_at_m.py                     # the strong tiny model of the auto studies, m = 16
    python benchmarks/bench_auto_at_m.py --steps 20 --rounds 1   # a quick look
    python benchmarks/bench_auto_at_m.py --model src/pods_rl/assets/tiny --m 8 --prompts 16   # the shipped model
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install

from _machine import add_threads_argument, machine_info, results_dir  # noqa: E402

from pods_rl import step_cost  # noqa: E402
from pods_rl.bootstrap import bootstrap_ci  # noqa: E402
from pods_rl.commands.cost import PHASES, build_trainer, step_rows  # noqa: E402
from pods_rl.interleaved import train_interleaved  # noqa: E402

STRONG = Path(__file__).resolve().parent / "results" / "cpu-2core-amd-epyc" / "evidence" / "strong" / "model"
AT_M = '{"sample_ms": 1000000, "train_ms": 1}'  # a rollout dearer than any gain: auto gives every prompt m


def recipe(model: str, m: int, prompts: int = 8) -> list[str]:
    """The auto studies' recipe (``prompts`` x m kept rollouts per update), as ``pods train`` flags."""
    return ["--config", "tiny", "--model_name_or_path", model, "--learning_rate", "1e-4", "--train_limit", "512",
            "--per_device_train_batch_size", str(prompts * m), "--downsample_rule", "max_variance", "--seed", "80"]


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
OWN_KEYS = {name.lstrip("_") for name in OWN_WORK} | {"ledger"}


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
    timed(trainer, "compute_loss", "loss")  # the same work in both trainers (the same rows): the work around it is
    timed(trainer.accelerator, "backward", "backward")  # what differs (``around_trl``)
    for name in OWN_WORK:
        if hasattr(trainer, name):
            timed(trainer, name, name.lstrip("_"))
    if getattr(trainer, "_budget", None) is not None:
        timed(trainer._budget, "record", "ledger")
    return seconds


@contextmanager
def trl_step_clock(seconds_of: dict[int, dict[str, list[float]]]):
    """Inside: CPU seconds of each call of TRL's own ``GRPOTrainer._generate_and_score_completions`` that returns (the
    rows' generation, scoring and advantages; not the calls that only prepare prompts, which stop early) under the key
    ``trl`` of ``seconds_of[id(trainer)]``. Patched on the class: ``PODSTrainer`` reaches it through ``super()``."""
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_and_score_completions

    def timed(self, *args, **kwargs):
        start = time.thread_time()
        output = original(self, *args, **kwargs)
        seconds_of[id(self)].setdefault("trl", []).append(time.thread_time() - start)
        return output

    GRPOTrainer._generate_and_score_completions = timed
    try:
        yield
    finally:
        GRPOTrainer._generate_and_score_completions = original


def around_trl(seconds: dict[str, list[float]], start: int) -> dict[int, float]:
    """{step index: CPU seconds of ``training_step`` outside TRL's own step, loss and backward}, from step ``start``
    on: in GRPO, Trainer's and TRL's glue; in auto, the same glue and all that auto adds to the step."""
    parts = [seconds.get(key, []) for key in ("step", "trl", "loss", "backward")]
    if len({len(part) for part in parts}) != 1:  # one of each per optimizer step (no accumulation, one generation)
        raise RuntimeError(f"calls per step differ: {[len(part) for part in parts]} (step, trl, loss, backward)")
    return {k: step - trl - loss - backward for k, (step, trl, loss, backward) in enumerate(zip(*parts)) if k >= start}


def added_around_trl(result: dict, name: str) -> list[float]:
    """Per step measured in both trainers (``one_round``'s ``result``): the CPU seconds trainer ``name`` spends around
    TRL's step, loss and backward less GRPO's. For auto: everything it adds to ``training_step``, accounted or not;
    for the control (GRPO built again): 0 but for the clock's noise."""
    other, grpo = result[name]["around_trl"], result["grpo"]["around_trl"]
    return [other[k] - grpo[k] for k in sorted(set(other) & set(grpo))]


def own_work_per_step(seconds: dict[str, list[float]], steps: int, start: int) -> dict[str, float]:
    """{part: CPU seconds per measured step} of auto's own work, the first ``start`` steps left out (one call a step,
    ``_select_kept`` only where a step is not GRPO's own)."""
    total = max(len(seconds.get("step", [])) - start, 1)
    return {key: sum(values[start:]) / total for key, values in seconds.items() if key in OWN_KEYS}


def one_round(model: str, m: int, steps: int, order: list[str], tmp: Path, prompts: int = 8) -> dict:
    """GRPO, auto at m and (if in ``order``) the control, GRPO built again, trained in turn for ``steps`` measured
    steps (built in ``order``): their per-step rows, CPU clocks and batch seconds."""
    base = recipe(model, m, prompts)
    auto = ["--rollout_planner", "auto", "--adaptive_reward", "correctness_reward", "--rollout_planner_args", AT_M]
    settings = {"grpo": (base, m), "auto": (base + auto, 4 * m), "control": (base, m)}
    built = {name: build_trainer(settings[name][0], settings[name][1], m, steps + 4, tmp / name) for name in order}
    batches = {name: timed_batches(trainer) for name, (trainer, _) in built.items()}
    cpu = {name: cpu_clock(trainer) for name, (trainer, _) in built.items()}
    with trl_step_clock({id(trainer): cpu[name] for name, (trainer, _) in built.items()}):
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
                     "own_work": own_work_per_step(cpu[name], steps, start), "around_trl": around_trl(cpu[name], start),
                     "trajectory": {int(r["step"]): (r.get("reward"), r.get("loss"), r.get("completions/mean_length"))
                                    for r in rows}}
    return out


def round_summary(result: dict) -> dict:
    """One round's numbers: auto's and the control's step ratios to GRPO (wall clock and thread CPU, turn by turn), the
    CPU they add around TRL's step (ms), auto's accounted own work, and the share of steps that match GRPO's."""
    summary = {"n_mean": result["auto"]["n_mean"], "own_work": result["auto"]["own_work"]}
    for name in ("auto", "control"):
        if name not in result:
            continue
        same = [result[name]["trajectory"].get(step) == logged for step, logged in result["grpo"]["trajectory"].items()]
        summary[name] = {"ratio": step_cost.paired_ratio(result[name]["steps"], result["grpo"]["steps"]),
                         "cpu_ratio": step_cost.paired_ratio(result[name]["cpu_steps"], result["grpo"]["cpu_steps"]),
                         "added_ms": 1e3 * statistics.mean(added_around_trl(result, name)),
                         "same_trajectory": sum(same) / max(len(same), 1)}  # steps whose reward, loss, length match
    return summary


def round_line(k: int, order: list[str], summary: dict) -> str:
    """One printed line of round ``k``'s ``round_summary``."""
    parts = [f"{name}/GRPO step {summary[name]['ratio']['value']:.4f}, CPU {summary[name]['cpu_ratio']['value']:.4f}, "
             f"adds {summary[name]['added_ms']:+.2f} ms around TRL's step, steps as GRPO's "
             f"{100 * summary[name]['same_trajectory']:.0f}%" for name in ("auto", "control") if name in summary]
    return (f"round {k + 1} (built {', '.join(order)}): " + "; ".join(parts) + f"; auto's mean n "
            f"{summary['n_mean']:.2f}, own work {1e3 * sum(summary['own_work'].values()):.2f} ms")


def mean_ci(values: list[float]) -> dict:
    """{"mean", "ci"}: the mean of ``values`` and its bootstrap 95% interval."""
    return {"mean": statistics.mean(values), "ci": list(bootstrap_ci(values))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(STRONG), help="a local model folder (default: the strong tiny model)")
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per update (the shipped model's studies: 16)")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per trainer and round")
    parser.add_argument("--rounds", type=int, default=6, help="pairs of rounds, cycling through every order of the "
                        "trainers (6 pairs: each of the 6 orders of three twice): each round builds them anew, and a "
                        "trainer's own speed varies between builds")
    parser.add_argument("--out", default="bench_auto_at_m.json", help="the JSON's name in the machine's results folder")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="leave out the control (GRPO built again): faster, but no measure of the noise")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    names = ["grpo", "auto"] + (["control"] if args.control else [])
    rounds, phases, batches, grpo_cpu = [], {name: {} for name in names}, {name: [] for name in names}, []
    with tempfile.TemporaryDirectory(prefix="pods-auto-at-m-") as tmp:
        orders = list(itertools.permutations(names))
        for k in range(2 * args.rounds):
            order = list(orders[k % len(orders)])
            result = one_round(args.model, args.m, args.steps, order, tmp=Path(tmp) / f"round{k}",
                               prompts=args.prompts)
            rounds.append(round_summary(result))
            grpo_cpu.extend(result["grpo"]["cpu_steps"].values())
            for name in names:
                for p, values in result[name]["phases"].items():
                    phases[name].setdefault(p, []).extend(values)
                batches[name].extend(result[name]["batch_seconds"])
            print(round_line(k, order, rounds[-1]), flush=True)
    grpo_cpu_ms = 1e3 * statistics.median(grpo_cpu)
    report = {name: {key: mean_ci([r[name][key]["value"] if isinstance(r[name][key], dict) else r[name][key]
                                   for r in rounds]) for key in ("ratio", "cpu_ratio", "added_ms", "same_trajectory")}
              for name in names[1:]}
    parts = sorted({part for r in rounds for part in r["own_work"]})
    own_ms = {part: 1e3 * statistics.mean(r["own_work"].get(part, 0.0) for r in rounds) for part in parts}
    ms = {name: {p: 1e3 * statistics.median(v) for p, v in phases[name].items()} for name in names}
    batch_ms = {name: 1e3 * statistics.median(v) for name, v in batches.items()}
    print(f"\n{len(rounds)} rounds of {args.steps} measured steps, m = {args.m}; means over rounds [95% CI]:")
    for name, numbers in report.items():
        print(f"  {name:<8} step ratio {numbers['ratio']['mean']:.4f} {_ci(numbers['ratio'])}, CPU ratio "
              f"{numbers['cpu_ratio']['mean']:.4f} {_ci(numbers['cpu_ratio'])}; adds "
              f"{numbers['added_ms']['mean']:+.2f} ms {_ci(numbers['added_ms'], '+.2f')} of CPU around TRL's step "
              f"({100 * numbers['added_ms']['mean'] / grpo_cpu_ms:+.2f}% of GRPO's {grpo_cpu_ms:.1f} ms)")
    print(f"  auto's accounted own work: {sum(own_ms.values()):.2f} ms a step "
          f"({', '.join(f'{k} {v:.2f}' for k, v in own_ms.items())})")
    print(f"{'phase (median ms)':<20}" + "".join(f"{name:>10}" for name in names))
    for p in PHASES:
        print(f"{p:<20}" + "".join(f"{ms[name][p]:>10.1f}" for name in names))
    print(f"{'next batch':<20}" + "".join(f"{batch_ms[name]:>10.1f}" for name in names) + "   (outside time/step)")
    out = results_dir() / args.out
    out.write_text(json.dumps({"machine": machine_info(), "command": "python benchmarks/bench_auto_at_m.py " +
                               " ".join(argv if argv is not None else sys.argv[1:]), "m": args.m,
                               "prompts": args.prompts, "steps": args.steps,
                               "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
                               "report": report, "grpo_step_cpu_ms": grpo_cpu_ms, "own_work_ms": own_ms,
                               "phase_ms": ms, "next_batch_ms": batch_ms, "rounds": rounds}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def _ci(numbers: dict, spec: str = ".4f") -> str:
    low, high = numbers["ci"]
    return f"[{low:{spec}}, {high:{spec}}]"


if __name__ == "__main__":
    raise SystemExit(main())
