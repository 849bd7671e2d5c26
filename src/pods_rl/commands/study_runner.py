"""How `pods study` runs its training runs: `pods train` subprocesses over parallel slots, resumable.

A slot is a CPU share (``OMP_NUM_THREADS``) or a GPU (``CUDA_VISIBLE_DEVICES``): ``jobs`` slots run at once, on CPU
one per core by default, on CUDA one per visible GPU (slot i -> GPU i mod count: one GPU runs one run after another).
A run whose directory holds a finished run's summary.json is skipped; one with a complete checkpoint resumes from it
(``--resume_from_checkpoint true``); one stopped before its first checkpoint is moved to ``_incomplete/`` and
started over. A deadline (or Ctrl-C) stops the runs in flight gracefully: SIGTERM makes `pods train` finish its
step, save a checkpoint and exit, so the same command continues them. Progress: a line per finished run and every
``progress_every`` seconds (runs done / total, the updates of the runs in flight, time left from those done)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pods_rl.commands.study_paths import portable
from pods_rl.runlog import list_checkpoints, read_metrics, run_finished, run_stopped


@dataclass(frozen=True)
class Run:
    """One training run: ``method`` at learning rate ``lr`` and ``seed`` in ``run_dir``, for ``updates`` optimizer
    steps; ``argv``: its `pods train` flags (without the resume flag)."""

    method: str
    seed: int
    lr: float
    run_dir: Path
    updates: int
    argv: tuple[str, ...] = ()


def current_step(run_dir: Path) -> int:
    """The last optimizer step a run logged (0 before its first log row)."""
    steps = [row["step"] for row in read_metrics(run_dir) if "step" in row] if Path(run_dir).is_dir() else []
    return int(max(steps, default=0))


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds at least one complete checkpoint to resume from."""
    return Path(run_dir).is_dir() and bool(list_checkpoints(run_dir))


def visible_gpus() -> list[str]:
    """The GPU ids runs can be pinned to: ``CUDA_VISIBLE_DEVICES``'s entries, else 0..count-1."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None and given.strip():
        return [g.strip() for g in given.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def slot_envs(device: str, jobs: int, threads: int | None) -> list[dict]:
    """The environment of each parallel slot: its CPU threads, or the GPU its runs see."""
    base = {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if device == "cpu":
        return [{**base, "OMP_NUM_THREADS": str(threads or 1), "MKL_NUM_THREADS": str(threads or 1)}
                for _ in range(jobs)]
    gpus = visible_gpus()
    if not gpus:
        raise ValueError("the recipe trains on CUDA but no GPU is visible; pass --use_cpu true to train on CPU")
    return [{**base, "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} for i in range(jobs)]


@functools.cache
def run_machine(device: str) -> dict:
    """The machine a run ran on, as its study_run.json records it: ``label`` (the GPU and count on CUDA, else the
    CPU and its usable cores; the report pairs a seed's methods only on one label), ``boot`` (a hash of this
    boot's id: tells leases apart, names no host) and ``info`` (``pods_rl.machine.machine_info``)."""
    from pods_rl.machine import machine_info

    info = machine_info()
    on_gpu = device != "cpu" and info.get("gpu")
    label = f"{info['gpu']} x{info['gpu_count']}" if on_gpu else f"{info['cpu_model']}, {info['usable_cores']} cores"
    boot = Path("/proc/sys/kernel/random/boot_id")
    boot_hash = hashlib.sha256(boot.read_bytes()).hexdigest()[:8] if boot.is_file() else None
    return {"label": label, "boot": boot_hash, "info": info}


def run_machine_label(run_dir: Path) -> str | None:
    """The machine a run ran on (its study_run.json's ``machine.label``); None for runs that did not record it."""
    path = Path(run_dir) / "study_run.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    return (record.get("machine") or {}).get("label")


def same_machine_pairs(groups: dict[str, list], baseline: str) -> tuple[dict[str, list], dict | None]:
    """``groups`` without the runs whose machine differs from the baseline's run of the same seed, and
    {"seeds": {seed: {method: machine}}, "left_out": [run names]} (None when no run recorded its machine, so
    that studies from before machines were recorded report as they did)."""
    machines = {name: [run_machine_label(r.run_dir) for r in group] for name, group in groups.items()}
    if not any(label for labels in machines.values() for label in labels):
        return groups, None
    base = {r.seed: label for r, label in zip(groups.get(baseline, []), machines.get(baseline, []))}
    kept, seeds, left_out = {}, {}, []
    for name, group in groups.items():
        for run, label in zip(group, machines[name]):
            seeds.setdefault(run.seed, {})[name] = label or "not recorded"
            if run.seed in base and label != base[run.seed]:
                left_out.append(Path(run.run_dir).name)
            else:
                kept.setdefault(name, []).append(run)
    return kept, {"seeds": dict(sorted(seeds.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))),
                  "left_out": left_out}


def machine_lines(study: dict) -> list[str]:
    """The machine of each seed, and the runs left out because their seed's baseline ran on another machine."""
    machines = study.get("machines")
    if not machines:
        return []
    lines = ["\nmachine of each seed (a seed's methods are paired only when they ran on the same machine):"]
    for seed, by_method in machines["seeds"].items():
        kinds = set(by_method.values())
        lines.append(f"  seed {seed}: " + (f"{kinds.pop()} (all methods)" if len(kinds) == 1 else "; ".join(
            f"{name} {label}" for name, label in by_method.items())))
    if machines["left_out"]:
        lines.append(f"  left out of the pairing (ran on another machine than {study['baseline']}'s run of the same "
                     f"seed): {', '.join(machines['left_out'])}")
    return lines


def drop_weights(run_dir: Path) -> None:
    """Remove a FINISHED run's model weights (final/ and checkpoints): the report reads only its logs."""
    if not run_finished(run_dir):
        raise ValueError(f"{run_dir} has not finished; its checkpoints are needed to resume it")
    for path in [Path(run_dir) / "final", *Path(run_dir).glob("checkpoint-*")]:
        if path.is_dir():
            shutil.rmtree(path)


def redirected(command: str, argv: list[str], log) -> int:
    """``pods COMMAND ARGV`` in this process (the command's own code, imported only now: TRL takes seconds) with
    this process's output (file descriptors 1 and 2, so that logging handlers and C libraries follow) going to the
    open file ``log``; returns its exit code."""
    from pods_rl.commands.cli import COMMANDS

    module, name = COMMANDS[command]
    main = getattr(importlib.import_module(module), name)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    for fd in (1, 2):
        os.dup2(log.fileno(), fd)
    try:
        return int(main(list(argv)) or 0)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def prepare(run: Run) -> tuple[list[str], bool]:
    """The `pods train` flags that start or continue ``run``, and whether it resumes: from its last complete
    checkpoint if it has one; a run directory without one (stopped before its first save) is moved to
    ``_incomplete/`` beside it (nothing is deleted) and the run starts over."""
    run_dir = Path(run.run_dir)
    resume = has_checkpoint(run_dir)
    if run_dir.exists() and not resume:
        aside = run_dir.parent / "_incomplete" / f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), str(aside))
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return [*run.argv, *(["--resume_from_checkpoint", "true"] if resume else [])], resume


class Runner:
    """Runs `pods train` subprocesses ``jobs`` at a time, one per slot; prints progress; honours a deadline."""

    def __init__(self, device: str, jobs: int, threads: int | None = None, deadline: float | None = None,
                 progress_every: float = 60.0, keep_weights: bool = True, in_process: bool = False):
        if in_process and jobs != 1:
            raise ValueError("--in-process runs one run at a time: drop --jobs or set it to 1")
        self.device, self.jobs, self.deadline, self.progress_every = device, jobs, deadline, progress_every
        self.keep_weights, self.in_process = keep_weights, in_process
        self.envs = slot_envs(device, jobs, threads)
        self.stop = threading.Event()  # set: start no more runs
        self.procs: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()

    def run_all(self, runs: list[Run], what: str) -> list[dict]:
        """Train every unfinished run of ``runs`` (in the given order); returns one record per run started."""
        todo = [r for r in runs if not run_finished(r.run_dir)]
        print(f"pods study: {what}: {len(runs)} runs, {len(runs) - len(todo)} done before, {len(todo)} to go, "
              f"{self.jobs} at a time on {self.device}", flush=True)
        if not todo or self.stop.is_set():
            return []
        slots = list(range(self.jobs))
        start_steps = {r.run_dir: current_step(r.run_dir) for r in todo}
        records: list[dict] = []
        started = time.monotonic()
        watch_done = threading.Event()
        threading.Thread(target=self._watch, args=(todo, start_steps, records, started, watch_done),
                         daemon=True).start()

        def work(run: Run) -> None:
            with self.lock:
                if self.stop.is_set():
                    return
                slot = slots.pop(0)
            try:
                record = self._run_one(run, slot)
            finally:
                with self.lock:
                    slots.append(slot)
            records.append(record)
            self._report_done(record, len(records), len(todo), todo, start_steps, started)

        if self.in_process:  # in the main thread: `pods train` installs its signal handlers there
            try:
                for run in todo:
                    if self.stop.is_set() or (self.deadline is not None and time.monotonic() > self.deadline):
                        self.stop.set()
                        break
                    work(run)
            finally:
                watch_done.set()
            return records
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        try:
            futures = [pool.submit(work, run) for run in todo]
            for future in futures:
                while not future.done():
                    time.sleep(0.2)  # wake often: Ctrl-C and SIGTERM reach the main thread here
                    if self.deadline is not None and time.monotonic() > self.deadline:
                        self.halt("the --max-minutes budget is spent")
                future.result()
        except BaseException:
            self.halt("interrupted")
            raise
        finally:
            pool.shutdown(wait=True)  # the workers return once their runs have exited
            watch_done.set()
        return records

    def halt(self, why: str) -> None:
        """Start no more runs; ask the runs in flight to stop gracefully (they save a checkpoint first)."""
        if self.stop.is_set():
            return
        self.stop.set()
        with self.lock:
            live = [p for p in self.procs.values() if p.poll() is None]
        if live:
            print(f"pods study: {why}: stopping {len(live)} run(s) in flight gracefully (each saves a checkpoint; "
                  "the same command continues them)", flush=True)
        for proc in live:
            proc.send_signal(signal.SIGTERM)

    def _run_one(self, run: Run, slot: int) -> dict:
        run_dir = run.run_dir
        argv, resume = prepare(run)
        env = {**os.environ, **self.envs[slot]}
        log_path = run_dir.parent / f"{run_dir.name}.log"
        start = time.monotonic()
        with open(log_path, "a" if resume else "w") as log:
            if self.in_process:
                returncode = redirected("train", argv, log)
            else:
                # A new session: a Ctrl-C in the terminal reaches only the study, which stops the runs itself
                # with one SIGTERM (a second signal would make `pods train` abort without a checkpoint).
                proc = subprocess.Popen([sys.executable, "-m", "pods_rl.commands.cli", "train", *argv], env=env,
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                with self.lock:
                    self.procs[run_dir.name] = proc
                if self.stop.is_set():  # halted while this run was starting
                    proc.send_signal(signal.SIGTERM)
                returncode = proc.wait()
                with self.lock:
                    self.procs.pop(run_dir.name, None)
        finished = returncode == 0 and run_finished(run_dir)
        # Stopped by the study: it saved a checkpoint, or the SIGTERM came before `pods train` installed its
        # handler (the last seconds before a deadline): nothing was lost, the same command starts it again.
        stopped = run_stopped(run_dir) or (self.stop.is_set() and (has_checkpoint(run_dir)
                                                                   or returncode == -signal.SIGTERM))
        status = "done" if finished else "stopped" if stopped else "failed"
        if stopped:
            self.stop.set()
        # paths under the current folder relative to it (still usable from it): the record names no machine's folder
        record = portable({"name": run_dir.name, "method": run.method, "seed": run.seed, "lr": run.lr,
                           "run_dir": str(run_dir), "status": status,
                           "wall_seconds": round(time.monotonic() - start, 1), "returncode": returncode,
                           "resumed": resume, "log": str(log_path),
                           "device": self.envs[slot].get("CUDA_VISIBLE_DEVICES", "cpu"),
                           "machine": run_machine(self.device), "command": shlex.join(["pods", "train", *argv])})
        if finished:
            (run_dir / "study_run.json").write_text(json.dumps(record, indent=1) + "\n")
            if not self.keep_weights:
                drop_weights(run_dir)
        return record

    def _report_done(self, record: dict, done: int, total: int, todo, start_steps, started) -> None:
        done_run = record["status"] == "done"
        summary = json.loads((Path(record["run_dir"]) / "summary.json").read_text()) if done_run else {}
        before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
        accuracy = f", accuracy {before:.3f} -> {after:.3f}" if before is not None and after is not None else ""
        print(f"[{done}/{total}] {record['name']}: {record['status']} in {record['wall_seconds']:.0f} s{accuracy}; "
              f"{self._eta(todo, start_steps, started)}", flush=True)
        if record["status"] == "failed":
            tail = Path(record["log"]).read_text(errors="replace").strip().splitlines()[-5:]
            print("   " + "\n   ".join(tail), flush=True)

    def _eta(self, todo: list[Run], start_steps: dict, started: float) -> str:
        """Elapsed time and time left, from the optimizer steps done so far in this invocation."""
        steps = {r.run_dir: (r.updates if run_finished(r.run_dir) else current_step(r.run_dir)) for r in todo}
        done = sum(max(0, steps[r.run_dir] - start_steps[r.run_dir]) for r in todo)
        left = sum(max(0, r.updates - steps[r.run_dir]) for r in todo)
        elapsed = time.monotonic() - started
        eta = f"~{left * elapsed / done / 60:.1f} min left" if done else "time left not known yet"
        return f"{elapsed / 60:.1f} min elapsed, {eta}"

    def _watch(self, todo, start_steps, records, started, done: threading.Event) -> None:
        """Every ``progress_every`` seconds: runs done / total, the runs in flight and their updates, time left."""
        by_name = {r.run_dir.name: r for r in todo}
        while not done.wait(self.progress_every):
            with self.lock:
                live = [name for name in self.procs if name in by_name]
            running = ", ".join(f"{name} at update {current_step(by_name[name].run_dir)}/{by_name[name].updates}"
                                for name in live)
            print(f"pods study: {len(records)}/{len(todo)} runs done; running: {running or 'none'}; "
                  f"{self._eta(todo, start_steps, started)}", flush=True)
