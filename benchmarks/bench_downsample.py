"""Micro-benchmark of pods_rl.downsample(rule="max_variance").

Compares, for B groups of n rollouts with m = n / 4 kept:
  * ``max_variance``: the batched implementation (one sort + prefix sums, no Python loop over groups);
  * ``reference``: a straightforward transcription of the paper's Algorithm 2: a Python loop over groups
    that sorts each group and recomputes the variance of the k lowest + m - k highest for every k in 0..m
    (O(m^2) per group);
  * ``sort``: a bare ``torch.sort`` of the same (B, n) tensor (the issue's yardstick);
  * ``numpy_sort`` (CPU only): a bare ``numpy.sort`` of it. On CPU ``max_variance`` sorts its int64 keys
    with numpy, whose SIMD sort beats torch.sort, so this is the tighter floor there.

Timing: warm-up, then the three are timed in interleaved blocks (so background load hits them alike) and
each reports the median per-call time over its blocks; the reference runs one call per block, in fewer
blocks when it is slow (a time budget per case). ``--threads 1`` is recommended on a small shared machine.
Writes a table to stdout and JSON + PNG to benchmarks/results/<machine>/bench_downsample.{json,png}.

    python benchmarks/bench_downsample.py            # full grid on CPU
    python benchmarks/bench_downsample.py --quick    # small grid, fewer repeats (smoke test)
    python benchmarks/bench_downsample.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for _machine
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # pods_rl without pip install

from _machine import add_threads_argument, device_or_none, machine_info, machine_slug, results_dir  # noqa: E402

from pods_rl.downsample import downsample, downsample_deferred  # noqa: E402

# Done-criteria from the issue, checked and printed with the table.
SPEEDUP_CASE = (512, 64)  # (B, n): batched must be >= 100x faster than the reference loop here
MIN_SPEEDUP = 100.0
SORT_RATIO_MIN_ELEMENTS = 32768  # where B * n >= this, batched must be within 4x of a bare sort
MAX_SORT_RATIO = 4.0


def reference_max_variance(rewards: torch.Tensor, m: int) -> torch.Tensor:
    """Paper's Algorithm 2, one group at a time: sort, then try every k lowest + (m - k) highest.

    rewards: (B, n). Returns (B, m) kept indices, ascending. O(B * m^2) work plus B Python iterations.
    """
    B, n = rewards.shape
    kept = []
    for group in rewards:  # (n,)
        values, order = torch.sort(group)
        best_var, best_k = -1.0, 0
        for k in range(m + 1):
            subset = torch.cat([values[:k], values[n - (m - k) :]])
            var = subset.var(unbiased=False).item()
            if var > best_var:
                best_var, best_k = var, k
        idx = torch.cat([order[:best_k], order[n - (m - best_k) :]])
        kept.append(idx.sort().values)
    return torch.stack(kept)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _block_time(fn, calls: int, device: torch.device) -> float:
    """Seconds per call of ``fn`` averaged over ``calls`` back-to-back calls."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls


def _calls_for(fn, device: torch.device, target_s: float) -> tuple[int, float]:
    """Calls per block so one block lasts about ``target_s`` (at least 1), and one warm-up call's time."""
    fn()  # warm-up (allocator, lazy init)
    one = _block_time(fn, 1, device)
    return max(1, int(target_s / max(one, 1e-7))), one


def bench_case(
    B: int, n: int, device: torch.device, blocks: int, block_s: float, ref_budget_s: float,
    with_reference: bool = True,
) -> dict:
    m = n // 4
    gen = torch.Generator().manual_seed(1000 * B + n)
    rewards = torch.rand((B, n), generator=gen).to(device)  # (B, n) float32

    fns = {
        "max_variance": lambda: downsample(rewards, m, "max_variance"),
        # the same selection with its check left on the device (no host read per call: what a trainer pays on CUDA)
        "max_variance_deferred": lambda: downsample_deferred(rewards, m, "max_variance"),
        "sort": lambda: torch.sort(rewards, dim=1),
    }
    if device.type == "cpu":
        import numpy as np

        rewards_np = rewards.numpy()
        fns["numpy_sort"] = lambda: np.sort(rewards_np, axis=1)
    calls = {name: _calls_for(fn, device, block_s)[0] for name, fn in fns.items()}

    # The reference's warm-up call also checks that it agrees with the batched version. It can take
    # seconds per call, so it runs in as many blocks as fit in its budget (at least one); on a GPU its
    # B x (m + 1) synchronizing steps can take minutes, so large cases may skip it (--reference-limit).
    agree, ref_blocks = None, 0
    if with_reference:
        start = time.perf_counter()
        ref_kept = reference_max_variance(rewards, m)
        ref_warmup_s = time.perf_counter() - start
        fast_kept = downsample(rewards, m, "max_variance")
        kept_var = rewards.double().gather(1, fast_kept).var(1, unbiased=False)
        ref_var = rewards.double().gather(1, ref_kept).var(1, unbiased=False)
        agree = bool(torch.allclose(kept_var, ref_var, rtol=1e-6, atol=1e-12))
        ref_blocks = max(1, min(blocks, int(ref_budget_s / ref_warmup_s)))

    # Interleaved blocks, so that load from other processes hits all three alike.
    times: dict[str, list[float]] = {name: [] for name in [*fns, "reference"]}
    for block in range(blocks):
        for name, fn in fns.items():
            times[name].append(_block_time(fn, calls[name], device))
        if block < ref_blocks:
            times["reference"].append(_block_time(lambda: reference_max_variance(rewards, m), 1, device))

    result = {
        "B": B,
        "n": n,
        "m": m,
        "elements": B * n,
        "max_variance_s": statistics.median(times["max_variance"]),
        "max_variance_deferred_s": statistics.median(times["max_variance_deferred"]),
        "sort_s": statistics.median(times["sort"]),
        "reference_s": statistics.median(times["reference"]) if times["reference"] else None,
        "reference_repeats": len(times["reference"]),
        "numpy_sort_s": statistics.median(times["numpy_sort"]) if "numpy_sort" in times else None,
        "reference_agrees": agree,
        "max_variance_blocks_s": times["max_variance"],
        "sort_blocks_s": times["sort"],
        "reference_calls_s": times["reference"],
    }
    result["speedup_vs_reference"] = (result["reference_s"] / result["max_variance_s"]
                                      if result["reference_s"] is not None else None)
    result["ratio_to_sort"] = result["max_variance_s"] / result["sort_s"]
    result["deferred_ratio_to_sort"] = result["max_variance_deferred_s"] / result["sort_s"]
    if result["numpy_sort_s"] is not None:
        result["ratio_to_numpy_sort"] = result["max_variance_s"] / result["numpy_sort_s"]
    return result


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "skipped"
    if seconds >= 1:
        return f"{seconds:8.2f} s "
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds * 1e6:8.1f} us"


def _fmt_speedup(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def print_table(results: list[dict]) -> list[str]:
    """Print the results table and the done-criteria; return the failed criteria (empty if all hold)."""
    with_numpy = all(r.get("numpy_sort_s") is not None for r in results)
    header = (
        f"{'B':>5} {'n':>5} {'m':>5} | {'max_variance':>12} {'sort':>12} {'reference':>12} (reps) | "
        f"{'x faster than ref':>17} {'x sort':>7}" + (f" {'numpy sort':>12} {'x np':>6}" if with_numpy else "")
    )
    print(header)
    print("-" * len(header))
    for r in results:
        flag = " *" if r["elements"] >= SORT_RATIO_MIN_ELEMENTS else "  "
        print(
            f"{r['B']:>5} {r['n']:>5} {r['m']:>5} | {_fmt_time(r['max_variance_s']):>12} "
            f"{_fmt_time(r['sort_s']):>12} {_fmt_time(r['reference_s']):>12} ({r['reference_repeats']:>3}) | "
            f"{_fmt_speedup(r['speedup_vs_reference']):>17} {r['ratio_to_sort']:>7.2f}{flag}"
            + (f"{_fmt_time(r['numpy_sort_s']):>12} {r['ratio_to_numpy_sort']:>6.2f}" if with_numpy else "")
            + ("" if r["reference_agrees"] is not False else "  REFERENCE DISAGREES")
        )
    print(f"(* B*n >= {SORT_RATIO_MIN_ELEMENTS}: must be within {MAX_SORT_RATIO:g}x of sort)")
    print("deferred check (downsample_deferred, no host read): " + ", ".join(
        f"B={r['B']} n={r['n']} {_fmt_time(r['max_variance_deferred_s'])} ({r['deferred_ratio_to_sort']:.2f}x sort)"
        for r in results if r.get("max_variance_deferred_s") is not None))

    failures = []
    by_case = {(r["B"], r["n"]): r for r in results}
    if SPEEDUP_CASE in by_case and by_case[SPEEDUP_CASE]["speedup_vs_reference"] is not None:
        s = by_case[SPEEDUP_CASE]["speedup_vs_reference"]
        ok = s >= MIN_SPEEDUP
        B, n = SPEEDUP_CASE
        print(
            f"[{'PASS' if ok else 'FAIL'}] B={B}, n={n}, m={n // 4}: {s:.0f}x faster than the reference "
            f"loop (need >= {MIN_SPEEDUP:g}x)"
        )
        if not ok:
            failures.append("speedup")
    big = [r for r in results if r["elements"] >= SORT_RATIO_MIN_ELEMENTS]
    if big:
        worst = max(big, key=lambda r: r["ratio_to_sort"])
        ok = worst["ratio_to_sort"] <= MAX_SORT_RATIO
        print(
            f"[{'PASS' if ok else 'FAIL'}] within {MAX_SORT_RATIO:g}x of a bare sort wherever B*n >= "
            f"{SORT_RATIO_MIN_ELEMENTS}: worst {worst['ratio_to_sort']:.2f}x at B={worst['B']}, n={worst['n']}"
        )
        if not ok:
            failures.append("sort_ratio")
    if any(r["reference_agrees"] is False for r in results):
        print("[FAIL] the batched result's variance differs from the reference's")
        failures.append("agreement")
    return failures


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch_sizes = sorted({r["B"] for r in results})
    fig, axes = plt.subplots(
        1, len(batch_sizes), figsize=(4.5 * len(batch_sizes), 4), sharey=True, squeeze=False
    )
    for ax, B in zip(axes[0], batch_sizes):
        rows = sorted((r for r in results if r["B"] == B), key=lambda r: r["n"])
        for key, label, style in [
            ("reference_s", "reference loop (Alg. 2)", "o--"),
            ("max_variance_s", "max_variance (batched)", "s-"),
            ("sort_s", "bare torch.sort", "^:"),
            ("numpy_sort_s", "bare numpy.sort", "v:"),
        ]:
            points = [(r["n"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("group size n (m = n/4)")
        ax.set_title(f"B = {B} groups")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("seconds per call (median)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    parser.add_argument("--quick", action="store_true", help="small grid and few repeats (smoke test)")
    add_threads_argument(parser)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: results/<machine>/)")
    parser.add_argument("--batch-sizes", default=None, help="B values, comma-separated (default 1,64,512)")
    parser.add_argument("--group-sizes", default=None, help="n values, comma-separated (default 16,...,4096)")
    parser.add_argument("--reference-limit", type=int, default=None,
                        help="skip the reference loop where B x (m + 1) exceeds this (its steps synchronize)")
    parser.add_argument("--stem", default=None, help="output file name stem (default bench_downsample)")
    args = parser.parse_args(argv)

    device = device_or_none(args.device)
    if device is None:
        return 2
    if args.quick:
        batch_sizes, group_sizes, blocks, block_s, ref_budget_s = [1, 512], [16, 64, 256], 3, 0.02, 2.0
    else:
        batch_sizes, group_sizes, blocks, block_s, ref_budget_s = (
            [1, 64, 512],
            [16, 64, 256, 1024, 4096],
            9,
            0.1,
            10.0,
        )

    if args.batch_sizes:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.group_sizes:
        group_sizes = [int(n) for n in args.group_sizes.split(",")]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = machine_info()
    if device.type == "cpu":
        info = {**info, "gpu": None}  # a CPU run on a GPU host belongs with CPU results
    out_dir = args.out or results_dir(machine_slug(info))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"device={device} cpu={info['cpu_model']} threads={info['torch_threads']} gpu={info['gpu']}")

    results = []
    for B in batch_sizes:
        for n in group_sizes:
            with_reference = args.reference_limit is None or B * (n // 4 + 1) <= args.reference_limit
            r = bench_case(B, n, device, blocks, block_s, ref_budget_s, with_reference)
            results.append(r)
            print(
                f"  B={B:<4} n={n:<5} max_variance {_fmt_time(r['max_variance_s'])}  sort "
                f"{_fmt_time(r['sort_s'])}  reference {_fmt_time(r['reference_s'])}",
                flush=True,
            )
    print()
    failures = print_table(results)

    stem = args.stem or ("bench_downsample_quick" if args.quick else "bench_downsample")
    payload = {
        "benchmark": "downsample max_variance vs paper Algorithm 2 reference loop vs bare torch.sort "
        "(and numpy.sort on CPU)",
        "device": str(device),
        "dtype": "float32",
        "m": "n // 4",
        "timing": f"median over {blocks} interleaved blocks of ~{block_s}s each (reference: one call per "
        f"block in up to {blocks} blocks, as many as fit in {ref_budget_s}s), after warm-up",
        "torch_threads": torch.get_num_threads(),
        "machine": info,
        "criteria": {
            "min_speedup_vs_reference_at_B512_n64": MIN_SPEEDUP,
            "max_ratio_to_sort_where_B_times_n_ge_32768": MAX_SORT_RATIO,
            "failed": failures,
        },
        "results": results,
    }
    (out_dir / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(
        results, out_dir / f"{stem}.png", f"pods_rl.downsample max_variance on {device} ({info['cpu_model']})"
    )
    print(f"wrote {out_dir / (stem + '.json')} and .png")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
