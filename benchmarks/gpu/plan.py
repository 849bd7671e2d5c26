"""The GPU preset's plan, as data: the calls of one 15-minute lease of one GPU, what each measures, its estimated
seconds and its hard limit, the sizes of every step (and their toy sizes for the CPU mode), and the exact command of
each call. ``h100.py plan`` prints it; tests/test_gpu_preset.py keeps it inside the budget.

The device's limits (its notes): a fresh machine starts in about 2-3 minutes; a command runs at most 10 minutes;
the machine stays warm a while after a call, then goes back; a session has 15 minutes of device time, its start,
idle time and close counted; 64 MiB travel per call; 8 files come back from ``$OUT``. A GPU is lent rarely and by
chance, so each lease adds a whole piece: call 1 the step costs, call 2 seeds of the study, which the next lease,
on any later day, continues from what the repository holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BUDGET_SECONDS = 15 * 60  # one lease: device time, machine start and idle counted
CALL_LIMIT_SECONDS = 9 * 60  # every call ends (its `timeout` inside) before this; the device stops it at 10 min
START_SECONDS = 150  # a fresh machine's start (the device notes: 2-3 minutes)
PER_CALL_SECONDS = 40  # per call: the tree and wheels carried there, the wheels installed, $OUT brought back and
#                        the next call issued inside the 30-s warm window
MARGIN_SECONDS = 25  # a call's stages end this long before its limit: its archives and record are written by then
CARRY_LIMIT_MIB = 60  # preflight's limit on what one call carries (the device takes 64 MiB)


@dataclass(frozen=True)
class Call:
    """One device call: ``h100.py STEP`` under ``timeout`` seconds (the call's hard end); ``estimate``: seconds it
    is expected to run (a study call runs to its deadline); ``measures``: what it brings back."""

    step: str
    timeout: int
    estimate: int
    measures: str


# Estimates from the H200's first lease (2026-11-28: call 1's stages took 15-70 s each; a `pods train` update of the
# shipped model 0.3-0.46 s): every call writes its real seconds to its JSON.
CALLS = (
    Call("answer", 330, 290,
         "the step costs: versions and nvidia-smi; the CUDA selection tests (CPU agreement, no host synchronization); "
         "pods cost n = 16, 32, 64, 128 -> 16 on the shipped model, plain and adaptive; a ~0.4B random-init model "
         "and pods cost n = 16, 64 -> 16 on it at completions of 128 and 32 tokens (median steps, warm-up until "
         "steady); the CUDA selection benchmark"),
    Call("study", 330, 330,
         "the study continued from the repository, phase by phase: paired seeds of GRPO n = 16 and PODS 64 -> 16, "
         "then auto (PODS that picks its own n, up to 64 -> 16), then adaptive PODS (pilot 16, up to 64 -> 16), "
         "then Knapsack-RL (32 rollouts a prompt on average, 16 to 64, "
         "-> 16), each against the same GRPO "
         "seeds, on the shipped model or the strong one (whichever has fewer finished runs), until its deadline; "
         "its report"),
)
# A GPU kind whose call-1 step costs are filed in the repository (``step_costs_filed``): the lease goes to the study,
# two study calls, the same command; the second, issued at once, finds the machine warm and continues the same
# model's study from its work folder (``study_call.choose_model``), its run in flight resumed from its checkpoint.
FILED_CALLS = (
    CALLS[1],
    Call("study", 330, 330,
         "the same command again at once, on the warm machine: the same model's study continues from its work "
         "folder (the run in flight resumes from its checkpoint; the cost is not measured again), until its "
         "deadline; its report"),
)

# The shipped tiny model (src/pods_rl/assets/tiny): call 1's model, and the study's with --model shipped.
SHIPPED_SHA256 = "f59f28d248876d73351f595c76fbf726db404843bcba7c23fe7e147a1f3a8b11"  # model.safetensors
SHIPPED_LR = 2e-4  # the tiny recipe's, swept on CPU (the evidence study)
ACCURACY_RANGE = (0.2, 0.8)  # starting held-out accuracy (sampled, T = 1) that leaves room to learn

# The strong tiny model (committed by the CPU evidence study; starts at 79-80%): the study's second model, no build.
STRONG_RELATIVE = "benchmarks/results/cpu-2core-amd-epyc/evidence/strong/model"
STRONG_LR = 1e-4  # the evidence study's for it
STUDY_MODELS = ("shipped", "strong")  # `study --model auto` takes the one with fewer finished seeds, shipped first
# A model built on the machine (`study --model built`; not in the 15-minute plan: its build takes a call's minutes).
MODEL = dict(hidden_size=768, num_layers=8, num_heads=12, steps=4000, batch_size=64, lr=6e-4, build_seconds=180)
# Call 1's model of GPU size: a ~0.4B random-init Qwen2 (hidden 1024, 24 layers, 16 heads: head_dim 64), one SFT
# step (its cost, not its accuracy, is measured), at two completion lengths.
BIG_MODEL = dict(hidden_size=1024, num_layers=24, num_heads=16, steps=1, batch_size=8, lr=1e-5,
                 completion_lengths=(128, 32), cost_n=(16, 64), cost_steps=4, cost_warmup=1)
# GRPO n = m = 16 against PODS max_variance 64 -> 16, then (``PHASES``) auto (``rollout_planner="auto"``: PODS that
# picks each prompt's n, from m up to the pairs' n, from the measured costs; the pairs' n and m), then adaptive PODS
# (pilot ``adaptive_pilot``, up to 64 -> 16), then Knapsack-RL (``knapsack_budget`` rollouts per prompt on average,
# m to n each);
# 8 prompts x 16 kept rollouts per update; seed by seed (GRPO s0, PODS s0, GRPO s1,
# ...), so a study stopped anywhere holds whole seeds but the last; 100 updates, evaluated every 10 (11 points per
# run: the levels statistic reads time to every accuracy level on them).
STUDY = dict(m=16, n=64, pilot=None, adaptive_pilot=16, knapsack_budget=32, seeds=8, updates=100, eval_every=10,
             eval_problems=400,
             eval_k=4, prompts=8, cost_n=(16, 64), cost_steps=3, cost_warmup=1, cost_seconds=40, report_seconds=30)
# The study's phases, in order: each pairs one method with GRPO n = m's seeds (run only where missing) and starts
# once every phase before it has all its seeds.
PHASES = ("pods", "auto", "adaptive", "knapsack")
# Call 1's stages and their estimated seconds (the call skips a stage whose estimate no longer fits its deadline).
ANSWER_STAGES = {"machine": 15, "cuda_tests": 30, "model": 1, "cost": 75, "big_model": 25, "cost_big_long": 60,
                 "cost_big_short": 35, "selection_bench": 30}
ANSWER = dict(cost_n=(16, 32, 64, 128), m=16, n=64, pilot=16, cost_steps=5, cost_warmup=1)
# Estimated seconds of one study run (start-up and 21 evaluations included), by method: the H200's 40-s runs took
# 0.30, 0.33 and 0.46 s per update on the shipped model, and an evaluation of 400 x 4 about 2 s.
RUN_SECONDS = {"grpo": 70, "pods": 75}
# The later phases' methods (their GRPO seeds are mostly there): adaptive rounds and the planners cost more
# generation; auto samples between 16 and 64 a prompt (its probes at 64), where 4x the rollouts cost ~1.1x a step.
PHASE_RUN_SECONDS = {"pods": 75, "auto": 80, "adaptive": 90, "knapsack": 85}

# The CPU mode (--cpu): every step through the same code at toy sizes, in a few minutes on 2 cores.
TINY_MODEL = dict(hidden_size=64, num_layers=2, num_heads=2, steps=20, batch_size=16, lr=3e-3, build_seconds=60)
TINY_STUDY = dict(m=4, n=8, pilot=None, adaptive_pilot=4, knapsack_budget=6, seeds=1, updates=2,
                  eval_every=2, eval_problems=8, eval_k=2, prompts=2,
                  cost_n=(4, 8), cost_steps=1, cost_warmup=1, cost_seconds=60, report_seconds=60)
TINY_ANSWER = dict(cost_n=(4, 8), m=4, n=8, pilot=4, cost_steps=1, cost_warmup=1)
TINY_BIG_MODEL = dict(hidden_size=64, num_layers=2, num_heads=2, steps=1, batch_size=8, lr=1e-5,
                      completion_lengths=(12, 8), cost_n=(4, 8), cost_steps=1, cost_warmup=1)
TINY_ACCURACY_RANGE = (0.0, 1.0)  # a 20-step toy model knows nothing: the gate is tested on its own
CPU_FLAGS = ("--use_cpu", "true", "--bf16", "false", "--max_completion_length", "12", "--eval_batch_size", "64",
             "--torch_threads", "1", "--task_args", "train_size=256,test_size=16")

# The GPU-only paths pods-rl has (docs/guides/gpu.md says, for each, where it has run; the H200's first lease
# recorded which ran in its gpu_paths.json).
GPU_PATHS = ("bf16", "nccl", "vllm_cuda", "deepspeed_gpu", "fsdp_gpu", "flash_attention_async")

INSTALL = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
           ".whl/*.whl && export PYTHONPATH=$PWD/src:/tmp/site HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "
           "PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 TOKENIZERS_PARALLELISM=false || exit 1")


def command(call: Call) -> str:
    """The device call's whole command: the wheels installed into /tmp/site (only what the image lacks, after
    src/ on PYTHONPATH), then the step under ``timeout``, its output also in ``$OUT/<step>.log``."""
    return (f"set -o pipefail; {INSTALL}; timeout -k 10 {call.timeout} python3 benchmarks/gpu/h100.py {call.step} "
            f"--out $OUT 2>&1 | tee $OUT/{call.step}.log")


def phase_method(phase: str, study: dict | None = None) -> tuple[str, list[str]]:
    """The run name of a phase's method and the `pods study` flags that declare it (beside ``--methods``)."""
    study = study or STUDY
    pods = f"pods-mv-n{study['n']}m{study['m']}"
    if phase == "pods":
        return pods, []
    if phase == "auto":  # n: the most rollouts a prompt may get (the pairs' n); no --adaptive_budget (auto refuses it)
        return f"{pods}-auto", ["--variant", "auto=--rollout_planner auto"]
    if phase == "adaptive":
        return f"{pods}-pilot{study['adaptive_pilot']}", ["--pilot", str(study["adaptive_pilot"])]
    if phase == "knapsack":  # a budget below n: at n a prompt's cap, every prompt would get n (PODS again)
        budget = study["knapsack_budget"]
        return f"{pods}-knapsack{budget}", ["--variant", f"knapsack{budget}=--rollout_planner knapsack "
                                                         f"--adaptive_budget {budget}"]
    raise ValueError(f"unknown study phase {phase!r}; the phases: {', '.join(PHASES)}")


def study_phase(finished: list[str], study: dict | None = None) -> str | None:
    """The first phase whose method or GRPO n = m lacks a finished run of one of the study's seeds (None: all
    done). ``finished``: run names, ``<method>-s<seed>``."""
    study, done = study or STUDY, set(finished)
    for phase in PHASES:
        methods = (f"grpo-n{study['m']}", phase_method(phase, study)[0])
        if any(f"{method}-s{seed}" not in done for seed in range(study["seeds"]) for method in methods):
            return phase
    return None


# Call 1's record in a GPU kind's results folder (``h100.py keep`` files ``answer.json`` there), and where else a
# stage's results may be filed: the H200's first lease ran the #52 plan (its CUDA test stage was ``selection_test``)
# and measured the ~0.4B model and the selection benchmark in a script of its own (``cost-0.4b/``, ``selection/``).
FILED_RECORD = "answer.json"
FILED_ALIASES = {"cuda_tests": ("selection_test",)}
FILED_FILES = {"big_model": ("cost-0.4b/build_info.json",), "cost_big_long": ("cost-0.4b/cost_n*.json",),
               "selection_bench": ("selection/bench_downsample.json",)}


def filed_stages(folder: Path | None) -> dict[str, str | None]:
    """For each of call 1's stages (``ANSWER_STAGES``), where ``folder`` (a GPU kind's results folder) files its
    results: ``answer.json`` (its record, the stage done, not the CPU mode), a file of ``FILED_FILES``, or None."""
    folder = Path(folder) if folder is not None else None
    record = {}
    if folder is not None and (folder / FILED_RECORD).is_file():
        record = json.loads((folder / FILED_RECORD).read_text())
    done = {s["name"] for s in record.get("stages", ()) if s.get("status") == "done"} \
        if record.get("step") == "answer" and not record.get("cpu_mode") else set()
    filed = {}
    for stage in ANSWER_STAGES:
        name = next((n for n in (stage, *FILED_ALIASES.get(stage, ())) if n in done), None)
        files = [str(path.relative_to(folder)) for pattern in FILED_FILES.get(stage, ())
                 for path in sorted(folder.glob(pattern))] if folder is not None and name is None else []
        filed[stage] = (FILED_RECORD + (f" (as {name})" if name != stage else "")) if name else \
            (", ".join(files) if files else None)
    return filed


def step_costs_filed(folder: Path | None) -> bool:
    """Whether call 1's step costs (its ``cost`` stage: `pods cost` on the shipped model) are filed in ``folder``."""
    return filed_stages(folder)["cost"] is not None


def calls_for(folder: Path | None) -> tuple[Call, ...]:
    """The lease's calls on a GPU kind whose results folder is ``folder`` (None: a kind not named): two study calls
    where its step costs are filed (``FILED_CALLS``), else call 1 then a study call (``CALLS``)."""
    return FILED_CALLS if step_costs_filed(folder) else CALLS


def skipped_text(folder: Path) -> str:
    """What a lease on a kind with filed step costs does not measure again, and where each stage's results are."""
    stages = filed_stages(folder)
    record = json.loads((Path(folder) / FILED_RECORD).read_text())
    where: dict[str, list[str]] = {}
    for stage, place in stages.items():
        where.setdefault(place or "", []).append(stage)
    parts = [f"{', '.join(names)} in {place}" for place, names in where.items() if place]
    missing = where.get("", [])
    text = (f"skipped: call 1 (answer: the step costs, ~{CALLS[0].estimate / 60:.1f} min), filed for this GPU "
            f"kind in benchmarks/results/{Path(folder).name}/ (call 1 of {record.get('started', '?')[:10]}): "
            + "; ".join(parts))
    if missing:
        text += (f"; not filed, and not measured by this lease either: {', '.join(missing)} (`h100.py answer` "
                 f"measures {'it' if len(missing) == 1 else 'them'})")
    return text


def study_seconds(study: dict | None = None) -> int:
    """Estimated seconds of every run of the study (``RUN_SECONDS`` per method x seeds)."""
    study = study or STUDY
    return study["seeds"] * sum(RUN_SECONDS.values())


def study_run_seconds(calls: tuple[Call, ...] = CALLS) -> float:
    """Seconds one lease's study calls leave to the study's runs: each call's limit less the margin it keeps, the
    machine stage, the report and (once a lease, the first time on a model: the lease's calls continue one model's
    study) the study's own cost."""
    studies = [c for c in calls if c.step == "study"]
    held = sum(c.timeout - MARGIN_SECONDS - ANSWER_STAGES["machine"] - STUDY["report_seconds"] for c in studies)
    return held - (STUDY["cost_seconds"] if studies else 0)


def timeline(calls: tuple[Call, ...] = CALLS) -> list[tuple[str, int]]:
    """(what, seconds) for the lease: the machine's start, then each call at its hard limit plus the per-call
    overhead (a call that ends early leaves time over)."""
    return [("machine start", START_SECONDS),
            *((f"call {i}: {c.step}", c.timeout + PER_CALL_SECONDS) for i, c in enumerate(calls, 1))]


def fitting_calls(budget: int, calls: tuple[Call, ...] = CALLS) -> int:
    """How many of ``calls``, in order, fit ``budget`` seconds (start and overheads counted)."""
    used, count = START_SECONDS, 0
    for call in calls:
        used += call.timeout + PER_CALL_SECONDS
        if used > budget:
            break
        count += 1
    return count


def plan_text(folder: Path | None = None) -> str:
    """The plan of a lease on the GPU kind whose results folder is ``folder`` (``calls_for``; None: a kind not
    named) as a table: each call's limit, estimate and what it measures; the total against the budget; what a kind
    with filed step costs skips."""
    calls = calls_for(folder)
    lines = [f"{'':8} {'limit':>6} {'est.':>6}  what",
             f"{'start':8} {START_SECONDS / 60:5.1f}m {'':>6}  a fresh machine"]
    for i, call in enumerate(calls, 1):
        lines.append(f"{'call ' + str(i):8} {call.timeout / 60:5.1f}m {call.estimate / 60:5.1f}m  {call.step}: "
                     f"{call.measures}")
    total = sum(seconds for _, seconds in timeline(calls))
    runs, per_seed = study_seconds(), sum(RUN_SECONDS.values())
    held = study_run_seconds(calls)
    studies = sum(c.step == "study" for c in calls)
    lines.append(f"total {total / 60:.1f} min of {BUDGET_SECONDS // 60} (calls at their limits, {PER_CALL_SECONDS} s "
                 f"per call to carry, install and bring back; every command under {CALL_LIMIT_SECONDS // 60} min)")
    if calls is FILED_CALLS:
        lines.append(skipped_text(folder))
    else:
        lines.append(f"a GPU kind whose step costs are filed (benchmarks/results/<gpu>/{FILED_RECORD}, its cost stage "
                     "done): `h100.py plan --gpu NAME` gives the whole lease to the study (two study calls)")
    leave = "study call leaves" if studies == 1 else f"{studies} study calls leave"
    lines += [f"the study: {STUDY['seeds']} seeds x {len(RUN_SECONDS)} methods per model, about {runs / 60:.0f} "
              f"min of runs ({per_seed / 60:.1f} per seed); a lease's {leave} about {held / 60:.1f} min to runs: about "
              f"{held / per_seed:.1f} seeds a lease, the rest in later leases (resumable from the repository)",
              "then its phases, in order, each once the one before has all its seeds and paired with the same GRPO "
              "seeds: " + ", ".join(f"{phase} ({phase_method(phase)[0]}, ~{PHASE_RUN_SECONDS[phase]} s a seed)"
                                     for phase in PHASES)]
    return "\n".join(lines)
