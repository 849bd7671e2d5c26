"""PODS in TRL's asynchronous GRPO trainer: the rollout worker samples n per prompt, only the kept m reach the queue.

``trl.experimental.async_grpo.AsyncGRPOTrainer`` (TRL 1.12 to 1.16) trains from a queue of scored
``RolloutSample`` rows that its rollout worker fills from a spawned child process. This module gives that worker a
loop whose scoring step selects::

    worker = pods_rollout_worker(model, reward_funcs, args, train_dataset, pods_m=4)  # args.num_generations = n
    trainer = AsyncGRPOTrainer(model, reward_funcs, args, train_dataset, rollout_worker=worker)

Per group of n conversations of one prompt, ``PODSRolloutLoop._score_group``:

1. lets TRL's own ``_score_group`` score the whole group (the reward functions run once, on all n; TRL builds the
   rows: old log-probs, policy version, masks, tool metrics, multi-turn forks);
2. reads each conversation's rewards back from its rows' metrics (``rewards/<name>``, ``reward``), mapping rows to
   conversations by the lengths of ``group.completions_sequences`` (a conversation that produced no row is scored
   through a placeholder row, dropped afterwards);
3. keeps m with ``pods_rl.selection.select`` (every registered rule, the ``shorter``/``longer`` tiebreaks on
   ``len(group.completions_ids[i])``; feature rules get what the synchronous trainer gives them:
   ``rollout_features``);
4. returns the kept conversations' rows (all rows of a forked conversation), with the advantage recomputed on the
   kept m by TRL async's formula ((r - mean) / (population std + 1e-8), NaN reward -> 0), ``reward_std`` set to the
   kept std, and the ``pods/*`` selection metrics added to each row's metrics.

With m >= n it returns exactly what TRL returns. The trainer logs a row's metrics when it trains the row
(``DataCollatorForRollout._log_metrics``: the mean over a micro-batch's rows, then over the logging window), so the
``pods/*`` values are per-group values averaged over the trained rows: ``pods/groups_zero_std`` reads as the
fraction of groups whose kept rewards were all equal, ``pods/prompts_sampled`` as 1; ``reward`` and
``rewards/<name>`` are the kept rows' (``pods/reward_all_mean`` is the mean over all n).

What the trainer does with num_generations (checked against TRL 1.16's ``AsyncGRPOTrainer``): nothing that assumes
n rows per group. A step is a fixed count of rows (``per_device_train_batch_size * gradient_accumulation_steps *
processes``, or a token budget), so at m < n a step holds n/m times as many prompts; batchers group rows by
``group_id`` and split a group across ranks when needed (any size); the epoch stop counts distinct ``group_id``s
trained; ``args.num_generations`` enters only ``max_steps``'s safety ceiling when it is unset (``samples_per_epoch``,
larger than needed at m < n, harmless) and the default worker, which this one replaces. What it does with the
worker: it starts and stops it, reads ``rollout_buffer`` and ``metrics_queue``, and, because ``PODSRolloutWorker``
is an ``AsyncRolloutWorker``, saves and restores the prompt position for resume through ``_loop_kwargs``
(``dataset_start_index``), unchanged by selection (group ids are prompt positions). The one number tied to rows is
``max_inflight_tasks``: left at -1, TRL sets it to ``max_staleness * samples_per_step`` rollouts in flight; a group
now yields m rows for n rollouts, so ``pods_worker_kwargs`` scales it by n/m (rounded up) to keep the same
staleness horizon in rows.

TRL internals this module touches (pinned by tests/test_async_pods.py):

* ``async_rollout_worker._AsyncRolloutLoop``: subclassed; its keyword-only ``__init__`` (ours are popped first),
  ``async _score_group(self, group) -> list[RolloutSample]`` (called through ``super()``), ``reward_func_names``,
  and, for rules that take features, ``tokenizer`` and ``eos_token_ids`` (TRL >= 1.15).
* ``RolloutGroup``: reads ``completions_sequences``, ``completions_ids``, ``completions``, ``tool_call_counts``;
  copied with ``dataclasses.replace``. ``TrainingSequence``: built for the placeholder row.
* ``RolloutSample``: reads ``metrics["reward"]``, ``metrics["rewards/<name>"]``; writes ``advantage``,
  ``metrics["reward_std"]`` and ``metrics["pods/..."]``.
* ``AsyncRolloutWorker``: subclassed; the class attribute ``_loop_cls`` and ``**loop_kwargs`` forwarded to the loop.
* ``AsyncGRPOConfig``'s fields that ``AsyncGRPOTrainer.__init__`` passes to its default worker, read by
  ``pods_worker_kwargs`` the same way.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from trl.experimental.async_grpo.async_rollout_worker import (
    AsyncRolloutWorker,
    RolloutGroup,
    RolloutSample,
    TrainingSequence,
    _AsyncRolloutLoop,
)

from pods_rl.downsample import rule_takes_features
from pods_rl.selection import SelectionSettings, select

__all__ = ["PODSRolloutLoop", "PODSRolloutWorker", "pods_rollout_worker", "pods_worker_kwargs", "pods_settings",
           "kept_advantages", "DirectoryWeightTransfer", "async_trainer_on_cpu", "torch_tree_attention",
           "register_torch_tree_attention"]

logger = logging.getLogger("pods_rl")
EXTENSION = "pods_rl.integrations.vllm_server.ReloadWeightsExtension"  # the vLLM server's --worker-extension-cls

# How the async worker's users spell the settings (the one-line errors name these).
ASYNC_NAMES = {"m": "pods_m", "rule": "pods_rule", "tiebreak": "pods_tiebreak",
               "register": "pods_rl.register_rule in a module named by pods_rule_module"}
_PLACEHOLDER_ID = "pods-rl-placeholder"  # rollout_id of the row that scores a conversation without rows


def pods_settings(m: int, rule: str = "max_variance", tiebreak: str = "index", n: int | None = None,
                  rule_module: str | None = None) -> SelectionSettings:
    """Check the worker's PODS settings (one ``ValueError`` line each) and return them.

    Args:
        m: rollouts kept per prompt (``pods_m``), 2 <= m <= n.
        rule: a down-sampling rule's name (``pods_rule``).
        tiebreak: ``index``, ``shorter`` or ``longer`` (``pods_tiebreak``).
        n: rollouts sampled per prompt (``num_generations``), when known.
        rule_module: a module to import first, where the rule is registered (``pods_rule_module``): the loop runs in
            a spawned child, which has the rules registered at import time of the modules it imports, not those
            registered later in the launching script.
    """
    if rule_module:
        try:
            importlib.import_module(rule_module)
        except ImportError as err:
            raise ValueError(f"pods_rule_module={rule_module!r} could not be imported: {err}") from None
    settings = SelectionSettings.validated(m, rule, tiebreak, names=ASYNC_NAMES)
    if n is not None and m > n:
        raise ValueError(f"pods_m must be at most num_generations (the rollouts sampled per prompt, n={n}), got {m}.")
    return settings


def kept_advantages(rewards: np.ndarray) -> tuple[np.ndarray, float]:
    """TRL async's group advantage on the kept rewards (m,): ((r - mean) / (std + 1e-8), population std over the
    scored ones, NaN reward -> 0), and that std (NaN when none is scored). Op for op as ``_score_group``."""
    scored_mask = ~np.isnan(rewards)
    advantages = np.zeros_like(rewards)
    if not scored_mask.any():
        return advantages, float("nan")
    scored = rewards[scored_mask]
    advantages[scored_mask] = (scored - scored.mean()) / (scored.std() + 1e-8)
    return advantages, float(scored.std())


class PODSRolloutLoop(_AsyncRolloutLoop):
    """TRL's asynchronous rollout loop, sampling n = ``num_generations`` per prompt and queueing the kept m.

    Takes ``_AsyncRolloutLoop``'s keyword arguments plus ``pods_m``, ``pods_rule`` (default ``max_variance``),
    ``pods_tiebreak`` (default ``index``), ``pods_seed`` (for the ``random`` rule) and ``pods_rule_module``.
    """

    def __init__(self, *, pods_m: int, pods_rule: str = "max_variance", pods_tiebreak: str = "index",
                 pods_seed: int | None = None, pods_rule_module: str | None = None, **kwargs: Any):
        self.init_pods(pods_m, pods_rule, pods_tiebreak, pods_seed, pods_rule_module,
                       n=kwargs.get("num_generations", 8))
        super().__init__(**kwargs)

    def init_pods(self, m: int, rule: str = "max_variance", tiebreak: str = "index", seed: int | None = None,
                  rule_module: str | None = None, n: int | None = None) -> None:
        """Set the PODS settings (checked: ``pods_settings``) and the random rule's generator."""
        self.pods = pods_settings(m, rule, tiebreak, n=n, rule_module=rule_module)
        self.pods_generator = None if seed is None else torch.Generator().manual_seed(int(seed))

    async def _score_group(self, group: RolloutGroup) -> list[RolloutSample]:
        n, m = len(group.completions), self.pods.m
        if n <= m:
            return await super()._score_group(group)
        sizes = [max(1, len(rows)) for rows in group.completions_sequences]  # rows per conversation, placeholder: 1
        placeholder = TrainingSequence([], [], [], _PLACEHOLDER_ID)
        padded = dataclasses.replace(group, completions_sequences=[
            rows if rows else [placeholder] for rows in group.completions_sequences])
        samples = await super()._score_group(padded)
        if len(samples) != sum(sizes):
            raise RuntimeError(f"TRL's _score_group returned {len(samples)} rows for conversations of {sizes} rows: "
                               "pods_rl.integrations.async_grpo does not know this TRL's row layout.")
        starts = np.cumsum([0, *sizes])
        rows = [samples[starts[i]:starts[i + 1]] for i in range(n)]  # conversation i's rows
        kept, metrics = self.select_conversations(group, [conversation[0].metrics for conversation in rows])
        totals = np.array([rows[i][0].metrics["reward"] for i in kept], dtype=float)
        advantages, kept_std = kept_advantages(totals)
        out = []
        for i, advantage in zip(kept, advantages, strict=True):
            if not group.completions_sequences[i]:
                continue  # its placeholder row: the conversation counts in the group, it has nothing to train
            for sample in rows[i]:
                sample.advantage = float(advantage)
                sample.metrics["reward_std"] = kept_std
                sample.metrics.update(metrics)
                out.append(sample)
        return out

    def select_conversations(self, group: RolloutGroup, metrics: list[dict[str, float]]) -> tuple[list[int], dict]:
        """Which m of the group's n conversations to keep (ascending) and the ``pods/*`` metrics, from each
        conversation's scored metrics (TRL's ``rewards/<name>`` per reward source, ``reward`` their total).

        Where two reward sources share a name (one metrics key), the rule ranks the total and a feature rule's
        ``rewards_per_func`` is that one column."""
        names = list(self.reward_func_names)
        if names and len(set(names)) == len(names) and all(f"rewards/{name}" in metrics[0] for name in names):
            columns = [[row[f"rewards/{name}"] for name in names] for row in metrics]
        else:  # two sources share a key: TRL summed them into "reward" before the names collided
            columns = [[row["reward"]] for row in metrics]
        rewards_per_func = torch.tensor(columns, dtype=torch.float64).unsqueeze(0)  # (1, n, F)
        selection = select(rewards_per_func, torch.ones(rewards_per_func.shape[2], dtype=torch.float64), 1,
                           self.pods, features=self.rollout_features(group, rewards_per_func),
                           generator=self.pods_generator)
        return selection.kept[0].tolist(), selection.metrics

    def rollout_features(self, group: RolloutGroup, rewards_per_func: torch.Tensor) -> dict[str, torch.Tensor]:
        """What selection may look at besides the rewards, each (1, n), as the synchronous trainer gives it:
        ``lengths`` (tokens the model generated, tool results excluded; the tiebreaks read it) and, for rules that
        take features, ``rewards_per_func`` (1, n, F), ``truncated`` (the completion does not end on an eos or pad
        token: TRL's ``completions/clipped_ratio``), ``tool_calls`` and ``turns`` (the model's turns)."""
        features = {"lengths": torch.tensor([[len(ids) for ids in group.completions_ids]], dtype=torch.long)}
        if not rule_takes_features(self.pods.rule):
            return features
        eos_and_pad = {*(getattr(self, "eos_token_ids", None) or [self.tokenizer.eos_token_id]),
                       self.tokenizer.pad_token_id}
        features["rewards_per_func"] = rewards_per_func
        features["truncated"] = torch.tensor([[len(ids) > 0 and ids[-1] not in eos_and_pad
                                               for ids in group.completions_ids]])
        features["tool_calls"] = torch.tensor([group.tool_call_counts], dtype=torch.long)
        features["turns"] = torch.tensor([[sum(message.get("role") == "assistant" for message in completion)
                                           for completion in group.completions]], dtype=torch.long)
        return features


class PODSRolloutWorker(AsyncRolloutWorker):
    """``AsyncRolloutWorker`` whose child runs ``PODSRolloutLoop``: pass it as ``rollout_worker=`` to
    ``AsyncGRPOTrainer``. Build it with ``pods_rollout_worker`` (the trainer's own default worker, with PODS).

    Keyword arguments: ``AsyncRolloutWorker``'s (forwarded to the loop in the child) and ``pods_m``, ``pods_rule``,
    ``pods_tiebreak``, ``pods_seed``, ``pods_rule_module``, checked here, in the launching process, before the
    child is spawned. TRL's ``AsyncRolloutWorker`` needs vLLM and aiohttp installed to be constructed.
    """

    _loop_cls = PODSRolloutLoop

    def __init__(self, *, pods_m: int, pods_rule: str = "max_variance", pods_tiebreak: str = "index",
                 pods_seed: int | None = None, pods_rule_module: str | None = None, **kwargs: Any):
        pods_settings(pods_m, pods_rule, pods_tiebreak, n=kwargs.get("num_generations", 8),
                      rule_module=pods_rule_module)
        super().__init__(pods_m=pods_m, pods_rule=pods_rule, pods_tiebreak=pods_tiebreak, pods_seed=pods_seed,
                         pods_rule_module=pods_rule_module, **kwargs)


def pods_worker_kwargs(model: str, reward_funcs, args, train_dataset=None, processing_class=None, *, pods_m: int,
                       pods_rule: str = "max_variance", pods_tiebreak: str = "index", pods_seed: int | None = None,
                       pods_rule_module: str | None = None, tools=None, environment_factory=None,
                       lora_name: str | None = None, num_processes: int | None = None) -> dict[str, Any]:
    """The keyword arguments of ``PODSRolloutWorker``: those ``AsyncGRPOTrainer.__init__`` gives its default
    ``AsyncRolloutWorker`` (from the same ``args``), n = ``args.num_generations`` rollouts per prompt, the PODS
    settings, and ``max_inflight_tasks`` scaled by n/m when ``args`` leaves it to the trainer (-1); only the
    arguments the installed TRL's loop takes (TRL 1.12/1.13 have no ``lora_name``, before 1.15 no ``eos_token_ids``).

    Args:
        model: the model's name or path, as given to ``AsyncGRPOTrainer`` (the name the vLLM server serves).
        reward_funcs: a reward function or a list of them (picklable: module-level functions).
        args: the ``AsyncGRPOConfig`` the trainer gets.
        train_dataset: the prompts; None only with an ``environment_factory`` (then placeholder prompts, as TRL).
        processing_class: the tokenizer; default ``AutoTokenizer.from_pretrained(model)``.
        pods_m: rollouts kept per prompt, 2 <= m <= n.
        pods_rule: the down-sampling rule's name.
        pods_tiebreak: ``index``, ``shorter`` or ``longer`` (completion tokens).
        pods_seed: seeds the ``random`` rule's generator in the child (None: unseeded).
        pods_rule_module: a module the child imports first, where a rule of yours is registered.
        tools: as given to ``AsyncGRPOTrainer``.
        environment_factory: as given to ``AsyncGRPOTrainer``.
        lora_name: the adapter name vLLM serves when the trainer syncs a PEFT adapter (TRL's is ``"trl-policy"``);
            None for full weights.
        num_processes: training processes (default ``args.world_size``), for ``max_inflight_tasks``.
    """
    from transformers import AutoTokenizer

    n = args.num_generations
    pods_settings(pods_m, pods_rule, pods_tiebreak, n=n, rule_module=pods_rule_module)
    init_kwargs = args.model_init_kwargs or {}
    revision, trust = init_kwargs.get("revision"), args.trust_remote_code
    if processing_class is None:
        processing_class = AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust)
    if processing_class.pad_token is None:
        processing_class.pad_token = processing_class.eos_token
    reward_funcs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    if train_dataset is None and environment_factory is not None:
        from datasets import Dataset

        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
        train_dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * rows})
    inflight = args.max_inflight_tasks
    if inflight < 0:
        processes = args.world_size if num_processes is None else num_processes
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * processes
        inflight = math.ceil(max(args.max_staleness, 1) * per_step * n / pods_m)
    kwargs = dict(
        model_name=model, lora_name=lora_name, dataset=train_dataset, reward_funcs=reward_funcs,
        processing_class=processing_class, eos_token_ids=_eos_token_ids(model, processing_class, revision, trust),
        tools=tools, environment_factory=environment_factory, num_generations=n, max_inflight_tasks=inflight,
        queue_maxsize=args.queue_maxsize, vllm_server_url=args.vllm_server_base_url,
        max_tokens=args.max_completion_length, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, request_timeout=args.request_timeout,
        chat_template_kwargs=args.chat_template_kwargs, max_tool_calling_iterations=args.max_tool_calling_iterations,
        log_completions=args.log_completions, num_completions_to_print=args.num_completions_to_print,
        fork_threshold_tokens=args.fork_threshold_tokens, pods_m=pods_m, pods_rule=pods_rule,
        pods_tiebreak=pods_tiebreak, pods_seed=pods_seed, pods_rule_module=pods_rule_module)
    # TRL before 1.14 has no lora_name, before 1.15 no eos_token_ids (its loop then stops on the tokenizer's eos)
    accepted = inspect.signature(_AsyncRolloutLoop.__init__).parameters
    if lora_name is not None and "lora_name" not in accepted:
        raise ValueError("lora_name (adapter-only vLLM sync) needs TRL >= 1.14's asynchronous GRPO trainer.")
    return {key: value for key, value in kwargs.items() if key in accepted or key.startswith("pods_")}


def pods_rollout_worker(model: str, reward_funcs, args, train_dataset=None, processing_class=None, *, pods_m: int,
                        **kwargs: Any) -> PODSRolloutWorker:
    """A ``PODSRolloutWorker`` built as ``AsyncGRPOTrainer`` builds its default worker, sampling
    n = ``args.num_generations`` per prompt and keeping ``pods_m``; the arguments are ``pods_worker_kwargs``'s."""
    return PODSRolloutWorker(**pods_worker_kwargs(model, reward_funcs, args, train_dataset, processing_class,
                                                  pods_m=pods_m, **kwargs))


def _eos_token_ids(model: str, processing_class, revision: str | None, trust_remote_code: bool) -> list[int]:
    """Every eos id of the model's generation config, the tokenizer's first if missing: what ``AsyncGRPOTrainer``
    gives its worker, read from the files instead of a loaded model."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(model, revision=revision)
    except OSError:  # no generation_config.json: from_pretrained derives it from the model's config
        config = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
        generation_config = GenerationConfig.from_model_config(config)
    eos = generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return eos if processing_class.eos_token_id in eos else [processing_class.eos_token_id, *eos]


# --- Weight transfer without NCCL -----------------------------------------------------------------------------------


class DirectoryWeightTransfer:
    """TRL's ``WeightTransferProtocol`` (``AsyncGRPOTrainer(weight_transfer=...)``) through a directory and the vLLM
    server's own weight reload, instead of TRL's ``WeightTransferClient`` (NCCL, CUDA only). Works on CPU.

    Each sync, between TRL's ``pause`` and ``resume``:

    1. ``send_weights`` writes the trainer's ``(name, tensor)`` stream (TRL's ``_streaming_iter``: checkpoint names,
       the adapter merged) to ``directory/model.safetensors`` (written aside, then renamed over the last one);
    2. asks the server to load it: ``POST /collective_rpc`` with ``{"method": "pods_reload_weights", "kwargs":
       {"weights_path": directory}}``, a method of ``pods_rl.integrations.vllm_server.ReloadWeightsExtension`` (start
       the server with ``--worker-extension-cls`` naming it): vLLM's own ``reload_weights`` on every worker (a
       layerwise reload that re-runs each layer's ``process_weights_after_loading``, so vLLM's CPU kernels repack the
       new weights), then the tied LM head refreshed, which vLLM's reload leaves stale (see that module);
    3. ``POST /reset_prefix_cache`` (best effort: while paused requests hold blocks it is refused, and the server's
       cached prefixes may then carry key/values of the previous weights for a while).

    ``pause``/``resume`` are TRL's (``POST /pause?mode=keep``, ``POST /resume``). The server must be started with
    ``VLLM_SERVER_DEV_MODE=1`` (these endpoints exist only in dev mode; checked on vLLM 0.31's CPU build), with
    ``--worker-extension-cls pods_rl.integrations.vllm_server.ReloadWeightsExtension``, and must be able to read
    ``directory`` (same machine or a shared filesystem). Every sync writes and reads the whole model once: fine for
    CPU and small models, slower than NCCL for large ones.

    Args:
        server_url: the vLLM server's base URL (``AsyncGRPOConfig.vllm_server_base_url``).
        directory: where the weights are written (created; made absolute, since the server resolves it).
        timeout: seconds allowed for one reload.
    """

    def __init__(self, server_url: str, directory: str | os.PathLike, timeout: float = 1800.0):
        self.server_url = server_url.rstrip("/")
        self.directory = Path(directory).absolute()
        self.timeout = timeout
        self.syncs = 0

    def post(self, path: str, timeout: float, **kwargs: Any):
        """POST to the server; a ``RuntimeError`` naming the endpoint when it fails (404: not in dev mode)."""
        import requests

        response = requests.post(f"{self.server_url}{path}", timeout=timeout, **kwargs)
        if response.status_code == 404:
            raise RuntimeError(f"the vLLM server at {self.server_url} has no {path}: start it with "
                               "VLLM_SERVER_DEV_MODE=1")
        if response.status_code != 200:
            raise RuntimeError(f"vLLM server {path} failed: {response.status_code} {response.text[:500]}")
        return response

    def init_weight_transfer(self, wait_s: float = 240.0) -> None:
        """Wait (at most ``wait_s``) for the server's ``/health``; create the directory."""
        import time

        import requests

        deadline = time.monotonic() + wait_s
        while True:
            try:
                if requests.get(f"{self.server_url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the vLLM server at {self.server_url} did not answer /health in {wait_s:.0f} s")
            time.sleep(1)
        self.directory.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        """Freeze the server's requests before the weights change (TRL's ``POST /pause?mode=keep``)."""
        self.post("/pause", 300, params={"mode": "keep"})

    def send_weights(self, iterator) -> None:
        """Write the ``(name, tensor)`` stream to ``directory/model.safetensors`` and have the server reload it."""
        from safetensors.torch import save_file

        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in iterator}
        written = self.directory / "model.safetensors.partial"
        save_file(tensors, str(written), metadata={"format": "pt"})
        written.replace(self.directory / "model.safetensors")
        try:
            self.post("/collective_rpc", self.timeout, json={
                "method": "pods_reload_weights", "kwargs": {"weights_path": str(self.directory)},
                "timeout": self.timeout})
        except RuntimeError as err:
            if "pods_reload_weights" in str(err) and "attribute" in str(err):
                raise RuntimeError(f"{err}\nStart the vLLM server with --worker-extension-cls {EXTENSION}") from None
            raise
        self.syncs += 1
        try:
            self.post("/reset_prefix_cache", 60)
        except RuntimeError as err:
            logger.warning("pods-rl: the vLLM server kept its prefix cache after a weight reload: %s", err)

    def resume(self) -> None:
        """Let the server generate again (``POST /resume``)."""
        self.post("/resume", 300)

    def destroy(self) -> None:
        """Remove the weights file (the server has loaded it)."""
        (self.directory / "model.safetensors").unlink(missing_ok=True)


# --- Running TRL's asynchronous trainer on CPU (no CUDA) ----------------------------------------------------------


def torch_tree_attention(module, query, key, value, attention_mask, *, tree_kv_index, tree_cu_seqlens_q,
                         tree_cu_seqlens_k, tree_max_seqlen_q=None, tree_max_seqlen_k=None, scaling=None,
                         sliding_window=None, softcap=None, **kwargs):
    """TRL's tree attention (``trl.experimental.async_grpo.packing.tree_attention``) in plain torch, for tensors off
    CUDA; CUDA tensors go to TRL's own (a FlashAttention-3 kernel fetched from the Hub, CUDA only).

    Same contract as the kernel call: segment s's queries are ``query`` rows ``cu_q[s]:cu_q[s+1]``, its keys and
    values the rows ``tree_kv_index[cu_k[s]:cu_k[s+1]]`` (its root-to-segment path, the segment last), causal
    aligned bottom-right as FlashAttention does when a segment has fewer queries than keys."""
    if query.is_cuda:
        from trl.experimental.async_grpo.packing import tree_attention

        return tree_attention(module, query, key, value, attention_mask, tree_kv_index=tree_kv_index,
                              tree_cu_seqlens_q=tree_cu_seqlens_q, tree_cu_seqlens_k=tree_cu_seqlens_k,
                              tree_max_seqlen_q=tree_max_seqlen_q, tree_max_seqlen_k=tree_max_seqlen_k,
                              scaling=scaling, sliding_window=sliding_window, softcap=softcap, **kwargs)
    q = query[0]  # (heads, tokens, dim)
    k, v = (x[0].index_select(1, tree_kv_index) for x in (key, value))  # (kv heads, path rows, dim)
    k, v = (x.repeat_interleave(q.shape[0] // x.shape[0], dim=0) for x in (k, v))  # grouped-query attention
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    out = torch.empty_like(q)
    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        qs, ks, vs = q[:, cu_q[s]:cu_q[s + 1]], k[:, cu_k[s]:cu_k[s + 1]], v[:, cu_k[s]:cu_k[s + 1]]
        scores = (qs @ ks.transpose(-1, -2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        rows = torch.arange(qs.shape[1]).unsqueeze(1) + (ks.shape[1] - qs.shape[1])  # each query's own key
        cols = torch.arange(ks.shape[1]).unsqueeze(0)
        visible = (cols <= rows) & ((cols > rows - sliding_window) if sliding_window else True)
        out[:, cu_q[s]:cu_q[s + 1]] = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ vs
    return out.transpose(0, 1).unsqueeze(0), None


def register_torch_tree_attention() -> None:
    """Register ``torch_tree_attention`` under TRL's tree-attention name (what ``register_tree_attention`` does
    with the CUDA kernel)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from trl.experimental.async_grpo.packing import TREE_ATTENTION

    AttentionInterface.register(TREE_ATTENTION, torch_tree_attention)
    AttentionMaskInterface.register(TREE_ATTENTION, lambda **kwargs: None)


@contextmanager
def async_trainer_on_cpu():
    """While ``AsyncGRPOTrainer`` is constructed on a machine without CUDA, two of its CUDA-only steps get CPU
    stand-ins; a no-op where CUDA is available. Yields True when they are in place.

    - ``get_peak_flops_per_device`` asks CUDA for the device name (``AssertionError: Torch not compiled with CUDA
      enabled``): it returns None, TRL's own value for an unknown device (MFU metrics off, the rest logged).
    - ``register_tree_attention`` registers a FlashAttention-3 kernel fetched from the Hub (CUDA only):
      ``register_torch_tree_attention`` registers ``torch_tree_attention``, the same attention in plain torch.
      The registration is global (transformers' registry) and outlives the block; CUDA tensors still reach TRL's
      kernel through it.
    """
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module

    if torch.cuda.is_available():
        yield False
        return
    stand_ins = {"get_peak_flops_per_device": lambda accelerator, dtype: None,
                 "register_tree_attention": register_torch_tree_attention}
    originals = {name: getattr(trainer_module, name) for name in stand_ins if hasattr(trainer_module, name)}
    for name in originals:  # a TRL without one of them (before tree packing, MFU) needs no stand-in for it
        setattr(trainer_module, name, stand_ins[name])
    try:
        yield True
    finally:
        for name, original in originals.items():
            setattr(trainer_module, name, original)
