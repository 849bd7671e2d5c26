"""The GPU preset's plan, as data: the calls of one 30-minute chance on one H100, what each measures, its
estimated seconds and its hard limit, the sizes of every step (and their toy sizes for the CPU mode), and the
exact command of each call. ``h100.py plan`` prints it; tests/test_gpu_preset.py keeps it inside the budget.

The device's limits (its notes): a fresh machine starts in about 2-3 minutes; a command runs at most 10 minutes;
the machine stays warm 30 s after a call, then goes back; a session has at most 30 minutes of device time, starts,
idle time and closes counted (15 at present); 64 MiB travel per call; 8 files come back from ``$OUT``.
"""

from __future__ import annotations

from dataclasses import dataclass

BUDGET_SECONDS = 30 * 60  # one chance: device time, machine start and idle counted
SMALL_BUDGET_SECONDS = 15 * 60  # what a drawn task gets at present: call 1 alone must fit it
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


# Estimates, not measurements (nothing has run on a GPU yet): every call writes its real seconds to its JSON.
CALLS = (
    Call("answer", 400, 350,
         "the question alone: versions and nvidia-smi; the CUDA selection test; pods cost n = 16, 32, 64 -> 16 on the "
         "shipped model, plain and adaptive (step-time ratio split into generation, scoring, selection, update; "
         "selection's share of a step); pods train in bf16 on CUDA, 40 s each: GRPO, PODS 64 -> 16, adaptive PODS; "
         "NCCL and FSDP2 on one GPU tried; which GPU-only paths ran (gpu_paths.json)"),
    Call("study", 480, 480,
         "the GPU model built (fixed SFT steps, deterministic kernels), its sha256 checked against the recorded one, "
         "pods cost on it (n = 16, 32, 64 -> 16), its accuracy checked (0.2-0.8), then the study's runs until the "
         "deadline: GRPO, PODS 64 -> 16 and adaptive PODS, seed by seed"),
    Call("study", 480, 480,
         "the study continued (the model rebuilt first on a fresh machine; finished runs skipped), its report"),
)

# The shipped tiny model (src/pods_rl/assets/tiny): call 1's model, and the study's with --model shipped.
SHIPPED_SHA256 = "f59f28d248876d73351f595c76fbf726db404843bcba7c23fe7e147a1f3a8b11"  # model.safetensors
SHIPPED_LR = 2e-4  # the tiny recipe's, swept on CPU (the evidence study)
ACCURACY_RANGE = (0.2, 0.8)  # starting held-out accuracy (sampled, T = 1) that leaves room to learn

# The GPU model: a ~75.7M-parameter Qwen2 (hidden 768, 8 layers, 12 heads: head_dim 64) built as `pods build-tiny`
# builds the shipped one, for a fixed number of SFT steps (no time limit: the same weights every time).
MODEL = dict(hidden_size=768, num_layers=8, num_heads=12, steps=4000, batch_size=64, lr=6e-4, build_seconds=180)
# GRPO n = m = 16 against PODS max_variance 64 -> 16 and adaptive PODS (a pilot of 16, up to 64 -> 16), every
# method 8 prompts x 16 kept rollouts per update; seed by seed (GRPO s0, PODS s0, adaptive s0, GRPO s1, ...), so a
# study stopped anywhere holds whole seeds but the last; evaluated every 10 updates (21 points per run: the levels
# statistic reads time to every accuracy level on them).
STUDY = dict(m=16, n=64, pilot=16, seeds=8, updates=200, eval_every=10, eval_problems=400, eval_k=4, prompts=8,
             cost_n=(16, 32, 64), cost_steps=5, cost_warmup=2, cost_seconds=90, report_seconds=45)
# Call 1's stages and their estimated seconds (the call skips a stage whose estimate no longer fits its deadline).
ANSWER_STAGES = {"machine": 15, "selection_test": 25, "model": 1, "cost": 60, "train_grpo": 60, "train_pods": 60,
                 "train_adaptive": 60, "nccl": 10, "fsdp": 50}
ANSWER = dict(train_seconds=40, cost_n=(16, 32, 64), m=16, n=64, pilot=16, cost_steps=5, cost_warmup=2)
# Estimated seconds of one study run (start-up and 21 evaluations included) on the H100, by method.
RUN_SECONDS = {"grpo": 90, "pods": 130, "adaptive": 100}

# The CPU mode (--cpu): every step through the same code at toy sizes, in a few minutes on 2 cores.
TINY_MODEL = dict(hidden_size=64, num_layers=2, num_heads=2, steps=20, batch_size=16, lr=3e-3, build_seconds=60)
TINY_STUDY = dict(m=4, n=8, pilot=4, seeds=1, updates=2, eval_every=2, eval_problems=8, eval_k=2, prompts=2,
                  cost_n=(4, 8), cost_steps=1, cost_warmup=1, cost_seconds=60, report_seconds=60)
TINY_ANSWER = dict(train_seconds=None, cost_n=(4, 8), m=4, n=8, pilot=4, cost_steps=1, cost_warmup=1)
TINY_ACCURACY_RANGE = (0.0, 1.0)  # a 20-step toy model knows nothing: the gate is tested on its own
CPU_FLAGS = ("--use_cpu", "true", "--bf16", "false", "--max_completion_length", "12", "--eval_batch_size", "64",
             "--torch_threads", "1", "--task_args", "train_size=256,test_size=16")

# The GPU-only paths pods-rl has (docs/guides/gpu.md says, for each, where it has run): call 1 records which ran.
GPU_PATHS = ("bf16", "nccl", "vllm_cuda", "deepspeed_gpu", "fsdp_gpu", "flash_attention_async")

INSTALL = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
           ".whl/*.whl && export PYTHONPATH=$PWD/src:/tmp/site HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "
           "PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 TOKENIZERS_PARALLELISM=false || exit 1")


def command(call: Call) -> str:
    """The device call's whole command: the wheels installed into /tmp/site (only what the image lacks, after
    src/ on PYTHONPATH), then the step under ``timeout``, its output also in ``$OUT/<step>.log``."""
    return (f"set -o pipefail; {INSTALL}; timeout -k 10 {call.timeout} python3 benchmarks/gpu/h100.py {call.step} "
            f"--out $OUT 2>&1 | tee $OUT/{call.step}.log")


def study_seconds(study: dict | None = None) -> int:
    """Estimated seconds of every run of the study (``RUN_SECONDS`` per method x seeds)."""
    study = study or STUDY
    return study["seeds"] * sum(RUN_SECONDS.values())


def study_run_seconds(calls: tuple[Call, ...] = CALLS) -> float:
    """Seconds one chance's study calls leave to the study's runs: each call's limit less the margin it keeps, the
    machine stage and the report; the first also builds the model and measures its cost."""
    studies = [c for c in calls if c.step == "study"]
    held = sum(c.timeout - MARGIN_SECONDS - ANSWER_STAGES["machine"] - STUDY["report_seconds"] for c in studies)
    return held - (MODEL["build_seconds"] + STUDY["cost_seconds"] if studies else 0)


def timeline(calls: tuple[Call, ...] = CALLS) -> list[tuple[str, int]]:
    """(what, seconds) for the chance: the machine's start, then each call at its hard limit plus the per-call
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


def plan_text() -> str:
    """The plan as a table: each call's limit, estimate and what it measures; the total against the budget."""
    lines = [f"{'':8} {'limit':>6} {'est.':>6}  what", f"{'start':8} {START_SECONDS / 60:5.1f}m {'':>6}  a fresh machine"]
    for i, call in enumerate(CALLS, 1):
        lines.append(f"{'call ' + str(i):8} {call.timeout / 60:5.1f}m {call.estimate / 60:5.1f}m  {call.step}: "
                     f"{call.measures}")
    total = sum(seconds for _, seconds in timeline())
    runs, per_seed = study_seconds(), sum(RUN_SECONDS.values())
    held = study_run_seconds()
    lines += [f"total {total / 60:.1f} min of {BUDGET_SECONDS // 60} (calls at their limits, {PER_CALL_SECONDS} s "
              f"per call to carry, install and bring back); call 1 alone: "
              f"{(START_SECONDS + CALLS[0].timeout + PER_CALL_SECONDS) / 60:.1f} min (fits "
              f"{SMALL_BUDGET_SECONDS // 60}: {fitting_calls(SMALL_BUDGET_SECONDS)} call)",
              f"the study: {STUDY['seeds']} seeds x 3 methods, about {runs / 60:.0f} min of runs ({per_seed / 60:.1f} "
              f"per seed); one chance's study calls leave about {held / 60:.1f} min to runs (after the model's build, "
              f"its cost and the reports): about {held / per_seed:.1f} seeds a chance, the rest in later chances "
              "(resumable)"]
    return "\n".join(lines)
