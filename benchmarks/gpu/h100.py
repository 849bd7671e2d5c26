"""The GPU preset: what one lent GPU can add to the PODS study in one 15-minute lease, with no hub and no internet.

    python benchmarks/gpu/h100.py plan                  # the calls, each one's limit and what it measures; the budget
    python benchmarks/gpu/h100.py plan --gpu "NVIDIA H200"   # a lease on that kind: its step costs filed, two studies
    python benchmarks/gpu/h100.py commands              # each device call's whole command (benchmarks/gpu/README.md)
    python benchmarks/gpu/h100.py preflight             # what a call carries (the tree and .whl): fails above 60 MiB
    python benchmarks/gpu/h100.py answer --out $OUT     # call 1, on the GPU machine: the step costs (~5 min)
    python benchmarks/gpu/h100.py study --out $OUT      # call 2: the study's next seeds, from what the repository holds
    python benchmarks/gpu/h100.py keep FILES_AT         # here, after each call: file what came back
    python benchmarks/gpu/h100.py all --dry-run         # no GPU, nothing run or written: imports, commands, plan
    python benchmarks/gpu/h100.py answer --cpu --out D --work W   # the same code at toy sizes on CPU (study too)

Each call writes its results into ``$OUT`` as they are produced, each file whole (``outbox.Outbox``), so that a call
killed at any moment brings back what it had: ``<step>.log`` (its output), ``answer.json`` or ``study-call.json`` (the
call's record: every stage with its status and seconds, and the numbers), ``model.json`` and the archives. Every
stage checks the time left before it starts (the call's ``timeout`` in ``plan.CALLS``, less a margin to pack) and is
skipped, and recorded as skipped, when its estimate does not fit. Nothing between calls or leases needs the machine:
the study's state travels in the repository (``keep`` files the study archive under ``benchmarks/results/<gpu>/``,
merged with the one there; the next call, on any later day, carries it and skips the finished runs). The study's
models are committed (the shipped and the strong tiny model): nothing is built on the machine for it. On a GPU kind
whose call-1 step costs the repository already files (``plan.step_costs_filed``: its ``answer.json`` under
``benchmarks/results/<gpu>/``), the lease runs no call 1: two study calls (``plan.calls_for``; ``--gpu`` names the
kind to ``plan``, ``commands`` and ``all --dry-run``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # plan, session, answer, study_call, outbox, carry, wheels
import plan as P  # noqa: E402
from answer import answer, bench_argv, big_model_argv, big_sizes, cost_argv, selection_argv, shipped_model  # noqa: E402
from carry import preflight  # noqa: E402
from outbox import keep  # noqa: E402
from session import REPO, RESULTS_ROOT, SHIPPED, machine_slug  # noqa: E402  (session's, from benchmarks/_machine)
from study_call import dry_run_study, study  # noqa: E402


def kind_folder(gpu: str | None, root: Path = RESULTS_ROOT) -> Path | None:
    """The results folder of the GPU kind ``gpu`` names: its folder name (``gpu-nvidia-h200``), the GPU's name as
    torch gives it (``NVIDIA H200``, slugged as ``_machine.machine_slug`` does), a part of either that only one
    folder under ``root`` has (``H200``), or words holding one folder's GPU name whole (the device's ``status``:
    "one NVIDIA H200 GPU (about 139 GiB of GPU memory)"); None when ``gpu`` is None."""
    if not gpu:
        return None
    slug = machine_slug({"gpu": gpu.removeprefix("gpu-")})
    if (root / slug).is_dir():
        return root / slug
    named = f"-{slug.removeprefix('gpu-')}-"
    folders = [d for d in sorted(root.glob("gpu-*")) if d.is_dir()]
    found = [d for d in folders if named in f"-{d.name}-"] or \
        [d for d in folders if f"-{d.name.removeprefix('gpu-')}-" in named]
    return found[0] if len(found) == 1 else root / slug


def lease_folder(args) -> Path | None:
    """The folder ``plan``, ``commands`` and the dry run read a kind's filed results from: ``--results``, or
    ``--gpu``'s (``kind_folder``); a named folder that does not exist gets one line on stderr (the kinds filed)."""
    folder = args.results or kind_folder(args.gpu, args.results_root)
    if folder is not None and not folder.is_dir():
        kinds = ", ".join(d.name for d in sorted(Path(args.results_root).glob("gpu-*")) if d.is_dir()) or "none"
        print(f"h100.py: no results folder {folder} (GPU kinds filed: {kinds}): the plan of a kind with nothing "
              "filed", file=sys.stderr)
    return folder


def dry_run(args) -> int:
    """No GPU, nothing run or written: the plan against the budget, each call's command, what every stage runs
    (with ``pods study --dry-run`` on the study's exact flags) and the imports it needs."""
    import torch

    import pods_rl
    import pods_rl.commands.build_tiny  # noqa: F401
    import pods_rl.commands.cost  # noqa: F401
    import pods_rl.engines.trl.trainer  # noqa: F401  (TRL's GRPOTrainer and the supported-range check)

    print(f"dry run: pods_rl from {pods_rl.__file__} (version {pods_rl.__version__}), torch {torch.__version__}, "
          f"CUDA {'available' if torch.cuda.is_available() else 'not available here'}", flush=True)
    folder = lease_folder(args)
    print(P.plan_text(folder))
    codes = []
    for i, call in enumerate(P.calls_for(folder), 1):
        text = P.command(call)
        print(f"call {i} ({len(text)} characters): {text}")
        codes.append(0 if len(text) <= 2000 else 1)
    shipped = shipped_model(args)
    print(f"shipped model: sha256 {shipped['sha256'][:12]} as recorded, starting accuracy {shipped['start_accuracy']}")
    work = args.work / "answer"
    if args.step in ("answer", "all"):
        print("=== answer (dry run)")
        b = big_sizes(args)
        for argv in (selection_argv(), cost_argv(args, SHIPPED, P.SHIPPED_LR, work / "cost.json"),
                     big_model_argv(args, work / "big"),
                     *(cost_argv(args, work / "big", b["lr"], work / f"cost_big_{n}.json", big=True, length=n)
                       for n in b["completion_lengths"]), bench_argv(args, work / "sel")):
            print("+ " + shlex.join(argv))
    if args.step in ("study", "all"):
        print("=== study (dry run)")
        codes.append(dry_run_study(args))
    fits = all(sum(s for _, s in P.timeline(calls)) <= P.BUDGET_SECONDS and all(
        c.timeout <= P.CALL_LIMIT_SECONDS for c in calls) for calls in (P.CALLS, P.FILED_CALLS))
    codes.append(0 if fits else 1)
    print(f"dry run: {'ok' if not any(codes) else 'failed'}", flush=True)
    return 1 if any(codes) else 0


def main(argv: list[str] | None = None) -> int:
    """The preset's command line (see the module docstring); exit code 0, 1 (a stage failed), 2 (bad input), 3
    (stopped: one line says why)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["plan", "commands", "preflight", "answer", "study", "keep", "all"])
    parser.add_argument("src", nargs="?", default=None, help="keep: the folder the device brought back")
    parser.add_argument("--out", type=Path, default=None, help="where results go as they are produced ($OUT)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/pods-gpu"), help="work folder (default /tmp/pods-gpu)")
    parser.add_argument("--results", type=Path, default=None, help="this machine's results folder in the repository "
                        "(default benchmarks/results/<machine>): the recorded model and the study archives")
    parser.add_argument("--results-root", type=Path, default=RESULTS_ROOT, help="keep: where machines' folders are")
    parser.add_argument("--model", choices=["auto", "shipped", "strong", "built"], default="auto",
                        help="study: the shipped or the strong tiny model (committed: no build), auto (default: the "
                        "one whose study the repository holds fewer finished runs of), or a GPU model built here")
    parser.add_argument("--cpu", action="store_true", help="toy sizes on CPU: every stage through the same code")
    parser.add_argument("--dry-run", action="store_true", help="nothing run or written: plan, commands, imports")
    parser.add_argument("--carry", default=".whl", help="preflight: carried paths, comma-separated (default .whl)")
    parser.add_argument("--gpu", default=None, help="plan, commands, all --dry-run: the lent GPU's kind (its name, "
                        "e.g. 'NVIDIA H200', or its results folder's, gpu-nvidia-h200): where its step costs are "
                        "filed, the lease runs the study twice instead of call 1")
    args = parser.parse_args(argv)
    if args.step == "plan":
        print(P.plan_text(lease_folder(args)))
        return 0
    if args.step == "commands":
        print("\n".join(P.command(c) for c in P.calls_for(lease_folder(args))))
        return 0
    if args.step == "preflight":
        ok, line = preflight(REPO, [c for c in args.carry.split(",") if c], P.CARRY_LIMIT_MIB)
        print(line)
        return 0 if ok else 1
    if args.step == "keep":
        if not args.src:
            parser.error("keep needs the folder the device brought back (its files_at)")
        print("\n".join(keep(Path(args.src), args.results_root)))
        return 0
    if args.dry_run:
        return dry_run(args)
    if args.step == "all":
        parser.error("all is for --dry-run; on the machine run answer, then study (see `plan`)")
    if args.out is None:
        parser.error(f"{args.step} needs --out (on the machine: --out $OUT)")
    return answer(args) if args.step == "answer" else study(args)


if __name__ == "__main__":
    raise SystemExit(main())
