"""Call 1 of the GPU preset (``h100.py answer``): what a step costs on this GPU, in about 5 minutes.

Most valuable first: the machine and its versions; the CUDA selection tests (the rules agree with the CPU, and the
common path makes no host synchronization); `pods cost` at n = 16, 32, 64, 128 -> 16 on the shipped model, plain and
adaptive (each step-time ratio with its range, split into generation, scoring, selection and update); a ~0.4B
random-init model and `pods cost` on it at two completion lengths; the CUDA selection benchmark (time per call,
against a bare sort). Every cost is `pods cost`'s robust estimate (``pods_rl.step_cost``), every step kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import plan as P
from outbox import small_files
from session import (
    REPO,
    SHIPPED,
    Session,
    Stop,
    gate,
    machine_stage,
    python,
    recipe_flags,
    results_dir,
    sizes,
    start_accuracy,
    weights_sha256,
)


def cost_argv(args, model_dir: Path, lr: float, out: Path, big: bool = False, length: int | None = None) -> list[str]:
    """`pods cost` of call 1 on ``model_dir``: the shipped model at n = 16, 32, 64, 128 -> 16, plain and adaptive
    (pilot 16); or (``big``) the random-init model at n = 16, 64 -> 16 with completions of ``length`` tokens."""
    a, prompts = sizes(args)[0], sizes(args)[1]["prompts"]
    c = big_sizes(args) if big else a
    argv = [*python(), "-m", "pods_rl.commands.cli", "cost", *recipe_flags(args, model_dir, lr),
            "--n", ",".join(map(str, c["cost_n"])), "--m", str(a["m"]), "--downsample_to", str(a["m"]),
            "--per_device_train_batch_size", str(prompts * a["m"]), "--steps", str(c["cost_steps"]),
            "--warmup", str(c["cost_warmup"]), "--out", str(out)]
    return argv + (["--max_completion_length", str(length)] if big else ["--pilot_generations", str(a["pilot"])])


def big_sizes(args) -> dict:
    """Call 1's model of GPU size (``plan.BIG_MODEL``; CPU mode: ``plan.TINY_BIG_MODEL``)."""
    return P.TINY_BIG_MODEL if args.cpu else P.BIG_MODEL


def big_model_argv(args, out: Path) -> list[str]:
    """`pods build-tiny` of a random-init model of GPU size: one SFT step (its cost is measured, not its accuracy)."""
    b = big_sizes(args)
    return [*python(), "-m", "pods_rl.commands.cli", "build-tiny", "--out", str(out), "--device",
            "cpu" if args.cpu else "cuda", "--hidden-size", str(b["hidden_size"]), "--num-layers", str(b["num_layers"]),
            "--num-heads", str(b["num_heads"]), "--steps", str(b["steps"]), "--batch-size", str(b["batch_size"]),
            "--seed", "0", "--eval-problems", "4"]


def selection_argv() -> list[str]:
    """The CUDA selection tests: the rules agree on CPU and GPU, and the common path makes no host synchronization
    (under ``torch.cuda.set_sync_debug_mode("error")``); both skip without CUDA."""
    return [*python(), "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "tests/test_downsample.py::test_cpu_and_cuda_agree",
            "tests/test_selection_sync.py::test_no_synchronization_on_cuda"]


def bench_argv(args, out: Path) -> list[str]:
    """The selection benchmark (``benchmarks/bench_downsample.py``): max_variance, eager and deferred, against a bare
    sort, per call (CPU mode: its quick grid)."""
    grid = ["--quick"] if args.cpu else ["--batch-sizes", "64,512", "--group-sizes", "16,64,256,1024",
                                         "--reference-limit", "9000"]
    return [*python(), str(REPO / "benchmarks" / "bench_downsample.py"), "--device", "cpu" if args.cpu else "cuda",
            *grid, "--out", str(out)]


def cost_summary(cost: dict) -> dict:
    """From `pods cost`'s JSON: each setting's step-time ratio to GRPO and its split into phases, and selection's
    share of the step; the headline sentence."""
    rows = []
    for r in cost["rows"]:
        step = r["seconds"]["step"]
        rows.append({"setting": f"{r['n']} -> {r['m']}" + (f" k{r['pilot_generations']}" if r.get(
            "pilot_generations") else ""), "step_ratio": round(r["step_ratio"], 3), "step_seconds": round(step, 4),
            "share": {p: round(r["seconds"][p] / step, 3) for p in ("generation", "scoring", "selection", "update")}
            if step else None, "update_peak_gb": r.get("update_peak_gb"), "sampled_per_step": r.get("sampled_per_step"),
            "step_ratio_range": r.get("step_ratio_range"), "selection_ms": round(1e3 * r["seconds"]["selection"], 3),
            "warning": r.get("warning")})
    big = [r for r in rows if " k" not in r["setting"]][-1]
    adaptive = [r for r in rows if " k" in r["setting"]]
    text = (f"a PODS {big['setting']} step takes {big['step_ratio']:.2f}x a GRPO step (generation "
            f"{big['share']['generation']:.0%}, selection {big['share']['selection']:.1%}, update "
            f"{big['share']['update']:.0%} of it)")
    if adaptive:
        text += f"; adaptive {adaptive[-1]['setting']}: {adaptive[-1]['step_ratio']:.2f}x"
    return {"rows": rows, "headline": text}


def answer(args) -> int:
    """Call 1: the step costs on this GPU (see plan.CALLS and the module docstring)."""
    call = Session(args, "answer", "answer.json")
    work = call.work / "answer"
    pack = lambda: call.outbox.pack("answer-files.tgz", work, small_files(work))  # noqa: E731
    work.mkdir(parents=True, exist_ok=True)
    call.work = work
    try:
        est = P.ANSWER_STAGES
        call.stage("machine", est["machine"], lambda: machine_stage(call))
        filed_note(call)
        call.stage("cuda_tests", est["cuda_tests"], lambda: selection_test(call))
        call.stage("model", est["model"], lambda: shipped_model(args))
        call.stage("cost", est["cost"], lambda: answer_cost(call, cost_argv(args, SHIPPED, P.SHIPPED_LR,
                                                                               work / "cost.json"), "cost"))
        pack()
        big = work / "big"
        call.stage("big_model", est["big_model"], lambda: build_big(call, big))
        for length, name in zip(big_sizes(args)["completion_lengths"], ("cost_big_long", "cost_big_short")):
            argv = cost_argv(args, big, big_sizes(args)["lr"], work / f"{name}.json", big=True, length=length)
            call.stage(name, est[name], lambda argv=argv, name=name: answer_cost(call, argv, name))
            pack()
        call.stage("selection_bench", est["selection_bench"], lambda: selection_bench(call))
    except Stop as stop:
        print(f"h100.py answer: stopped: {stop}", flush=True)
        return 3
    finally:
        if "cost" in call.record:
            call.record["headline"] = call.record["cost"]["headline"]
            print(f"h100.py answer: {call.record['headline']}", flush=True)
        call.save()
        pack()
    return 1 if call.failed else 0


def filed_note(call: Session) -> None:
    """One line (and ``already_filed`` in the record) when this GPU kind's step costs are filed in the repository
    already: the lease's plan for it (``plan.calls_for``) runs the study instead; measured again here on purpose."""
    if "machine" not in call.record:
        return
    folder = results_dir(call.args, call.record["machine"]["info"])
    if P.step_costs_filed(folder):
        call.record["already_filed"] = P.filed_stages(folder)
        print(f"h100.py answer: this GPU kind's step costs are filed already ({folder.name}/{P.FILED_RECORD}): "
              "measured again (`h100.py plan --gpu NAME` gives such a lease to the study)", flush=True)


def build_big(call: Session, out: Path) -> dict:
    """The random-init model of GPU size (kept on a warm machine); its parameter count."""
    if not (out / "build_info.json").is_file():
        code = call.run(big_model_argv(call.args, out), call.work / "big-build.log", 120)
        if code:
            raise RuntimeError(f"pods build-tiny of the big model failed (exit {code})")
    info = json.loads((out / "build_info.json").read_text())
    return {"num_parameters": info["num_parameters"], "hidden_size": info["hidden_size"],
            "num_layers": info["num_layers"]}


def selection_bench(call: Session) -> dict:
    """The selection benchmark: seconds per call of max_variance (eager, deferred) and of a bare sort, per case."""
    out = call.work / "sel"
    code = call.run(bench_argv(call.args, out), call.work / "selection_bench.log", 180)
    found = sorted(out.glob("bench_downsample*.json"))
    if not found:
        raise RuntimeError(f"bench_downsample.py wrote no JSON (exit {code})")
    rows = json.loads(found[0].read_text())["results"]
    return {"exit_code": code, "cases": [{k: r.get(k) for k in ("B", "n", "m", "max_variance_s",
                                                                  "max_variance_deferred_s", "sort_s", "ratio_to_sort",
                                                                  "deferred_ratio_to_sort")} for r in rows]}


def selection_test(call: Session) -> dict:
    """Run the CUDA selection test; its status from pytest's summary line (passed, skipped on CPU, failed)."""
    log = call.work / "selection_test.log"
    code = call.run(selection_argv(), log, 120)
    last = (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
    status = "passed" if " passed" in last and "failed" not in last else "skipped" if " skipped" in last else "failed"
    if status == "failed":
        raise RuntimeError(f"the CUDA selection test failed (exit {code}): {last}")
    return {"status": status, "summary": last}


def shipped_model(args) -> dict:
    """The shipped model's sha256 against the recorded one, and its starting accuracy (build_info) in range."""
    sha = weights_sha256(SHIPPED)
    if sha != P.SHIPPED_SHA256:
        raise Stop(f"the shipped model's weights have sha256 {sha[:12]}, not the recorded {P.SHIPPED_SHA256[:12]}: "
                   "a Git LFS pointer or another model (update plan.SHIPPED_SHA256 if it was rebuilt on purpose)")
    accuracy = start_accuracy(SHIPPED)
    gate(accuracy, P.ACCURACY_RANGE)
    return {"model": "shipped", "sha256": sha, "start_accuracy": accuracy}


def answer_cost(call: Session, argv: list[str], name: str) -> dict:
    """One `pods cost` of call 1; its summary (ratios with ranges, phases, selection's share) into the record."""
    out = call.work / f"{name}.json"
    code = call.run(argv, call.work / f"{name}.log", 240)
    if code or not out.is_file():
        raise RuntimeError(f"pods cost failed (exit {code})")
    summary = cost_summary(json.loads(out.read_text()))
    print(f"  {summary['headline']}", flush=True)
    return summary
