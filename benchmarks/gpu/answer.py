"""Call 1 of the GPU preset (``h100.py answer``): the question alone, on the shipped model, in about 6 minutes.

Most valuable first: the machine and its versions; the CUDA selection test; `pods cost` at n = 16, 32, 64 -> 16,
plain and adaptive (the step-time ratio, split into generation, scoring, selection and update); `pods train` in
bf16 on CUDA for GRPO, PODS 64 -> 16 and adaptive PODS; then NCCL and FSDP2 on one GPU. ``gpu_paths.json`` says
which of the GPU-only paths ran.
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
    Skip,
    Stop,
    gate,
    machine_stage,
    python,
    recipe_flags,
    run_summary,
    sizes,
    start_accuracy,
    weights_sha256,
)


def answer_methods(a: dict) -> list[tuple[str, int, list[str]]]:
    """Call 1's `pods train` runs: (name, n, extra flags): GRPO n = m, PODS n -> m, adaptive PODS (pilot, up to n)."""
    m, n, k = a["m"], a["n"], a["pilot"]
    return [(f"grpo-n{m}", m, []), (f"pods-mv-n{n}m{m}", n, []),
            (f"pods-mv-n{n}m{m}-pilot{k}", n, ["--pilot_generations", str(k)])]


def train_argv(args, name: str, n: int, extra: list[str], run_dir: Path) -> list[str]:
    """`pods train` of call 1: ``ANSWER['train_seconds']`` of training in bf16 (CPU mode: 2 updates), evaluated
    before and after."""
    a = sizes(args)[0]
    budget = ["--max_steps", "2", "--logging_steps", "1"] if args.cpu else ["--max_steps", "100000", "--max_train_seconds",
                                                    str(a["train_seconds"])]
    evals = ["--eval_num_problems", "8", "--eval_k", "2"] if args.cpu else ["--eval_num_problems", "400",
                                                                            "--eval_k", "4"]
    return [*python(), "-m", "pods_rl.commands.cli", "train", *recipe_flags(args, SHIPPED, P.SHIPPED_LR),
            "--num_generations", str(n), "--downsample_to", str(a["m"]), "--per_device_train_batch_size",
            str(sizes(args)[1]["prompts"] * a["m"]), "--seed", "0",
            *budget, *evals, "--eval_every_seconds", "1e9", "--eval_before_after", "true", "--save_strategy", "no",
            "--save_every_seconds", "1e9", "--run_figure", "false", "--disable_tqdm", "true",
            "--output_dir", str(run_dir), *extra]


def cost_argv(args, model_dir: Path, lr: float, out: Path) -> list[str]:
    """`pods cost` of call 1: n = 16, 32, 64 -> 16, plain and adaptive (pilot 16), on ``model_dir``."""
    a, prompts = sizes(args)[0], sizes(args)[1]["prompts"]
    return [*python(), "-m", "pods_rl.commands.cli", "cost", *recipe_flags(args, model_dir, lr),
            "--n", ",".join(map(str, a["cost_n"])), "--m", str(a["m"]), "--downsample_to", str(a["m"]),
            "--pilot_generations", str(a["pilot"]),
            "--per_device_train_batch_size", str(prompts * a["m"]), "--steps", str(a["cost_steps"]),
            "--warmup", str(a["cost_warmup"]), "--out", str(out)]


def selection_argv() -> list[str]:
    """The CUDA selection test (tests/test_downsample.py: max_variance, max_reward and random agree on CPU and GPU)."""
    return [*python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_downsample.py", "-k", "cuda_agree"]


def fsdp_argv(args, run_dir: Path) -> list[str]:
    """`pods train` for 3 updates under `accelerate launch` with the shipped FSDP2 config, one process."""
    config = REPO / "src" / "pods_rl" / "recipes" / "accelerate" / "fsdp.yaml"
    return [*python(), "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes", "1",
            "-m", "pods_rl.commands.cli", "train", *recipe_flags(args, SHIPPED, P.SHIPPED_LR), "--max_steps", "3",
            "--eval_before_after", "false", "--save_strategy", "no", "--run_figure", "false", "--disable_tqdm",
            "true", "--output_dir", str(run_dir)]


NCCL_PROBE = """
import json, socket, torch, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
x = torch.arange(4.0, device="cuda"); dist.all_reduce(x); dist.broadcast(x, 0); dist.barrier()
print(json.dumps({"ok": x.tolist() == [0.0, 1.0, 2.0, 3.0], "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
dist.destroy_process_group()
"""


def cost_summary(cost: dict) -> dict:
    """From `pods cost`'s JSON: each setting's step-time ratio to GRPO and its split into phases, and selection's
    share of the step; the headline sentence."""
    rows = []
    for r in cost["rows"]:
        step = r["seconds"]["step"]
        rows.append({"setting": f"{r['n']} -> {r['m']}" + (f" k{r['pilot_generations']}" if r.get(
            "pilot_generations") else ""), "step_ratio": round(r["step_ratio"], 3), "step_seconds": round(step, 4),
            "share": {p: round(r["seconds"][p] / step, 3) for p in ("generation", "scoring", "selection", "update")}
            if step else None, "update_peak_gb": r.get("update_peak_gb"), "sampled_per_step": r.get("sampled_per_step")})
    big = [r for r in rows if " k" not in r["setting"]][-1]
    adaptive = [r for r in rows if " k" in r["setting"]]
    text = (f"a PODS {big['setting']} step takes {big['step_ratio']:.2f}x a GRPO step (generation "
            f"{big['share']['generation']:.0%}, selection {big['share']['selection']:.1%}, update "
            f"{big['share']['update']:.0%} of it)")
    if adaptive:
        text += f"; adaptive {adaptive[-1]['setting']}: {adaptive[-1]['step_ratio']:.2f}x"
    return {"rows": rows, "headline": text}


def answer(args) -> int:
    """Call 1: the question alone, on the shipped model (see plan.CALLS)."""
    call = Session(args, "answer", "answer.json")
    a = sizes(args)[0]
    work = call.work / "answer"
    files = lambda: small_files(work)  # noqa: E731
    pack = lambda: call.outbox.pack("answer-files.tgz", work, files())  # noqa: E731
    work.mkdir(parents=True, exist_ok=True)
    call.work = work
    try:
        est = P.ANSWER_STAGES
        call.stage("machine", est["machine"], lambda: machine_stage(call))
        call.stage("selection_test", est["selection_test"], lambda: selection_test(call))
        call.stage("model", est["model"], lambda: shipped_model(args))
        call.stage("cost", est["cost"], lambda: answer_cost(call))
        pack()
        for (name, n, extra), key in zip(answer_methods(a), ("train_grpo", "train_pods", "train_adaptive")):
            call.stage(f"train_{name}", est[key], lambda n=n, name=name, extra=extra: answer_train(call, name, n, extra))
            call.outbox.write_json("gpu_paths.json", gpu_paths(call))
            pack()
        call.stage("nccl", est["nccl"], lambda: nccl_probe(call))
        call.stage("fsdp", est["fsdp"], lambda: fsdp_probe(call))
    except Stop as stop:
        print(f"h100.py answer: stopped: {stop}", flush=True)
        return 3
    finally:
        call.record["gpu_paths"] = gpu_paths(call)
        call.outbox.write_json("gpu_paths.json", call.record["gpu_paths"])
        if "cost" in call.record:
            call.record["headline"] = call.record["cost"]["headline"]
            print(f"h100.py answer: {call.record['headline']}", flush=True)
        call.save()
        pack()
    return 1 if call.failed else 0


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


def answer_cost(call: Session) -> dict:
    """`pods cost` on the shipped model; the summary (ratios, phases, selection's share) into the record."""
    out = call.work / "cost.json"
    code = call.run(cost_argv(call.args, SHIPPED, P.SHIPPED_LR, out), call.work / "cost.log", 240)
    if code or not out.is_file():
        raise RuntimeError(f"pods cost failed (exit {code})")
    summary = cost_summary(json.loads(out.read_text()))
    print(f"  {summary['headline']}", flush=True)
    return summary


def answer_train(call: Session, name: str, n: int, extra: list[str]) -> dict:
    """One `pods train` run of call 1 and its numbers."""
    run_dir = call.work / "runs" / name
    code = call.run(train_argv(call.args, name, n, extra, run_dir), call.work / "runs" / f"{name}.log", 150)
    summary = {**run_summary(run_dir), "exit_code": code}
    if code or not summary["finished"]:
        raise RuntimeError(f"pods train {name} did not finish (exit {code})")
    print(f"  {name}: {summary['updates']} updates, accuracy {summary['accuracy_before']} -> "
          f"{summary['accuracy_after']}, {summary['seconds_per_update']}", flush=True)
    return summary


def nccl_probe(call: Session) -> dict:
    """NCCL on one rank: init, all_reduce, broadcast, barrier (skipped on CPU)."""
    if call.args.cpu:
        raise Skip("CPU mode: NCCL needs CUDA")
    log = call.work / "nccl.log"
    code = call.run([*python(), "-c", NCCL_PROBE], log, 60)
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
    return {**(json.loads(lines[-1]) if lines else {"ok": False}), "exit_code": code}


def fsdp_probe(call: Session) -> dict:
    """`pods train` under accelerate's FSDP2 config on one GPU (skipped on CPU: accelerate has no FSDP there)."""
    if call.args.cpu:
        raise Skip("CPU mode: accelerate has no FSDP on CPU")
    run_dir = call.work / "runs" / "fsdp"
    code = call.run(fsdp_argv(call.args, run_dir), call.work / "runs" / "fsdp.log", 120)
    return {"finished": code == 0 and (run_dir / "summary.json").is_file(), "exit_code": code}


def gpu_paths(call: Session) -> dict:
    """{path: {ran, how or why}} for each of ``plan.GPU_PATHS``, from this call's stages (and what is installed)."""
    import importlib.util

    stages = {s["name"]: s for s in call.record["stages"]}
    trains = [call.record.get(n) for n in stages if n.startswith("train_")]
    bf16 = [t for t in trains if t and t.get("finished") and t.get("bf16") and t.get("device") == "cuda"]
    out = {"bf16": {"ran": bool(bf16), "how": f"pods train in bf16 on CUDA: {len(bf16)} of 3 runs finished"}}
    nccl = call.record.get("nccl") or {}
    out["nccl"] = {"ran": bool(nccl.get("ok")), "how": "torch.distributed all_reduce and broadcast over NCCL, 1 rank",
                   "status": stages.get("nccl", {}).get("status")}
    fsdp = call.record.get("fsdp") or {}
    out["fsdp_gpu"] = {"ran": bool(fsdp.get("finished")), "how": "pods train under accelerate launch with the "
                       "shipped fsdp config (FSDP2), 1 GPU, 1 process (no sharding across ranks)",
                       "status": stages.get("fsdp", {}).get("status")}
    for path, module in (("vllm_cuda", "vllm"), ("deepspeed_gpu", "deepspeed")):
        installed = importlib.util.find_spec(module) is not None
        out[path] = {"ran": False, "why": f"{module} is installed but the preset does not run it" if installed
                     else f"{module} is not in the image (and is not carried: too large)"}
    out["flash_attention_async"] = {"ran": False, "why": "the async trainer needs a vLLM server (not in the image) "
                                    "and TRL's FlashAttention-3 kernel comes from the Hub (no network there)"}
    return out
