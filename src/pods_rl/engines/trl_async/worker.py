"""PODS in TRL's asynchronous GRPO trainer: the rollout worker samples n per prompt, only the kept m reach the queue.

    worker = pods_rollout_worker(model, reward_funcs, args, train_dataset, pods_m=4)  # args.num_generations = n
    trainer = AsyncGRPOTrainer(model, reward_funcs, args, train_dataset, rollout_worker=worker)

Each group's rows are those GRPO at m would make, plus ``pods/*`` metrics; top-ups run in the worker's event loop.
Design: docs/guides/async.md. The TRL internals used (``_AsyncRolloutLoop``, ``RolloutGroup``,
``TrainingSequence``, ``RolloutSample.metrics``, ``_loop_cls``) are pinned by tests/test_async_{pods,budget}.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import os
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

from pods_rl.adaptive import group_is_mixed, plan_round
from pods_rl.budget.ledger import LEDGER_FILE
from pods_rl.budget.planners.base import member
from pods_rl.downsample import rule_takes_features
from pods_rl.engines.trl_async.budget import (
    BUDGET_KEYS,
    BudgetLoop,
    PODSLedgerCallback,
    check_budget_settings,
)
from pods_rl.engines.trl_async.scoring import (
    ScoredConversation,
    conversations_at,
    recording,
    replaying,
    reward_funcs_as,
    sampled_advantages,
)
from pods_rl.engines.trl_async.settings import (
    ADAPTIVE_NAMES,
    adaptive_settings,
    check_advantage_baseline,
    check_worker_settings,
    pods_settings,
)
from pods_rl.rollouts import rollout_features
from pods_rl.selection import select

__all__ = ["PODSLedgerCallback", "PODSRolloutLoop", "PODSRolloutWorker", "pods_rollout_worker", "pods_worker_kwargs",
           "pods_settings"]

logger = logging.getLogger("pods_rl")

_PLACEHOLDER_ID = "pods-rl-placeholder"  # rollout_id of the row that scores a conversation without rows


class PODSRolloutLoop(BudgetLoop, _AsyncRolloutLoop):
    """TRL's asynchronous rollout loop queueing the kept m of n; ``pods_*`` keywords as in ``pods_worker_kwargs``."""

    def __init__(self, *, pods_m: int, pods_rule: str = "max_variance", pods_tiebreak: str = "index",
                 pods_seed: int | None = None, pods_rule_module: str | None = None, pods_pilot: int | None = None,
                 pods_round_size: int | None = None, pods_adaptive_rule: str = "until_mixed",
                 pods_adaptive_reward: str | None = None, pods_adaptive_budget: float | None = None,
                 pods_advantage_baseline: str = "kept", **kwargs: Any):
        n = kwargs.get("num_generations", 8)
        planners = {key: kwargs.pop(key) for key in BUDGET_KEYS if key in kwargs}
        self.init_pods(pods_m, pods_rule, pods_tiebreak, pods_seed, pods_rule_module, n=n,
                       advantage_baseline=pods_advantage_baseline)
        self.adaptive = adaptive_settings(pods_pilot, n, pods_m, pods_adaptive_rule, pods_round_size,
                                          pods_adaptive_budget, pods_adaptive_reward,
                                          environment_factory=kwargs.get("environment_factory"))
        budget = check_budget_settings(n, pods_m, pilot=pods_pilot, environment_factory=kwargs.get(
            "environment_factory"), dataset=kwargs.get("dataset"), pods_adaptive_budget=pods_adaptive_budget,
            pods_seed=pods_seed, **planners)
        super().__init__(**kwargs)
        self.deciding_key = "reward" if pods_adaptive_reward is None else f"rewards/{pods_adaptive_reward}"
        if self.adaptive is not None:
            self.adaptive.check_reward(self.reward_func_names, ADAPTIVE_NAMES)
        if self.adaptive is not None or (budget is not None and (budget.how_many is not None or budget.commits)):
            # in rounds: TRL's generate loop samples a group's first, the worker tops it up
            self.init_top_ups(n, _rollouts_a_group_starts(n, pods_m, budget, pods_pilot=pods_pilot, **planners))
        if budget is not None and pods_adaptive_reward not in (None, *self.reward_func_names):
            raise ValueError(f"pods_adaptive_reward {pods_adaptive_reward!r} is not one of this run's reward "
                             f"functions {list(self.reward_func_names)}: the planners' ledger counts successes by it")
        self.init_budget(budget, groups_per_step=planners.get("pods_groups_per_step") or 1,
                         dataset_start_index=kwargs.get("dataset_start_index", 0), seed=pods_seed,
                         ledger_path=planners.get("pods_ledger_path"),
                         ledger_resume=planners.get("pods_ledger_resume"), logger=logger)

    async def _calibrate(self) -> None:
        """A planner's calibration when due, its held-out prompts sampled with the server's current weights."""
        wanted = self.budget.budget.calibration_rows(self.model_version)
        if wanted is None:
            return
        rows, k = wanted
        replies = await asyncio.gather(*(self._sample(row["prompt"], k, group_id=-1) for row in rows))
        completions = [reply[0] for replies_of_row in replies for reply in replies_of_row]  # each row's k in turn
        self._push_metrics(self.budget.budget.fit_calibration(rows, completions, step=self.model_version))

    def init_pods(self, m: int, rule: str = "max_variance", tiebreak: str = "index", seed: int | None = None,
                  rule_module: str | None = None, n: int | None = None, advantage_baseline: str = "kept") -> None:
        """Set the checked PODS settings and the random rule's generator."""
        self.pods = pods_settings(m, rule, tiebreak, n=n, rule_module=rule_module)
        self.advantage_baseline = check_advantage_baseline(advantage_baseline)
        self.pods_generator = None if seed is None else torch.Generator().manual_seed(int(seed))

    def init_top_ups(self, n: int, first: int) -> None:
        """Rollouts in rounds: a group is emitted after ``first`` rollouts and topped up to at most ``pods_n``."""
        self.pods_n, self.num_generations = n, first
        self._scored: dict[int, list[ScoredConversation]] = {}  # group id -> its conversations scored so far
        self._rounds: dict[int, int] = {}  # group id -> rounds sampled so far
        self._pilots: dict[int, int] = {}  # group id -> rollouts of its first round (< pilot when some failed)
        self._committed: dict[int, int] = {}  # Pilot-Commit: group id -> its committed id (groups not yet closed)
        self._top_ups: set[asyncio.Task] = set()
        self._top_up_slots = asyncio.Semaphore(max(1, self.max_inflight_tasks))
        self._top_up_error: BaseException | None = None

    async def _score_group(self, group: RolloutGroup) -> list[RolloutSample]:
        adaptive, rounds = getattr(self, "adaptive", None), getattr(self, "pods_n", None) is not None
        if not rounds and self.budget is None and self.pods.m >= self.num_generations:
            return await super()._score_group(group)  # m = n: TRL's own
        if not group.completions:  # nothing came back for this prompt: nothing to score or train
            if self.budget is not None:
                self.budget.unjudged.pop(group.group_id, None)  # (a resume need not draw it again)
                self.close_group(group.group_id, sampled=0, trained=0)
            return []
        if not rounds:
            scored = await self.score_conversations(group)
            self.record_group(group.group_id, self.deciding_rewards(scored)[0].tolist())
            return await self.kept_rows(group, scored)
        if self._top_up_error is not None:
            raise self._top_up_error
        scored = self._scored.pop(group.group_id, [])
        scored += await self.score_conversations(group, start=len(scored))  # the new conversations only
        rounds = self._rounds.pop(group.group_id, 0) + 1
        pilot = self._pilots.pop(group.group_id, len(scored))
        commits = self.budget is not None and self.budget.commits
        if commits and rounds == 1:  # Pilot-Commit's verdict on the pilot: commit it, or train nothing of it
            more = self.judge_pilot(group.group_id, scored)
            if not more:
                return []
        elif self.budget is not None and "answer_rounds" in self.budget.budget.needs:
            await self._calibrate()  # before the first group it judges
            more = self.budget.budget.group_more(group.completions)
        else:
            more = self.plan_top_up(scored, group.group_id)
        if more:  # all equal so far / short of its count: sample more in the background, score them when they arrive
            self._scored[group.group_id], self._rounds[group.group_id] = scored, rounds
            self._pilots[group.group_id] = pilot
            task = asyncio.create_task(self.top_up(group, more))
            self._top_ups.add(task)
            task.add_done_callback(self._top_up_done)
            return []
        self.record_group(group.group_id, self.deciding_rewards(scored)[0].tolist())
        metrics = {"pods/rollouts_sampled": float(len(scored)), "pods/rounds": float(rounds)}
        if adaptive is not None:
            pilot_rewards = self.deciding_rewards(scored[:pilot])
            metrics["pods/frac_zero_std_pilot"] = float(not group_is_mixed(pilot_rewards, torch.tensor([pilot])))
        elif commits:  # the trainer counts committed groups: the rows carry the committed id
            metrics["pods/pilot_rollouts"] = float(pilot)
            group = dataclasses.replace(group, group_id=self._committed.pop(group.group_id))
        else:
            metrics["pods/rollouts_planned"] = float(self._planned.pop(group.group_id, len(scored)))
        samples = await self.kept_rows(group, scored, metrics)
        self.close_group(group.group_id, sampled=len(scored), trained=min(len(scored), self.pods.m))
        return samples

    def judge_pilot(self, group_id: int, scored: list[ScoredConversation]) -> int:
        """Pilot-Commit's verdict on a scored pilot: ``n_commit`` rollouts to sample, or 0 (nothing trains)."""
        rewards = self.deciding_rewards(scored)[0].tolist()
        committed, metrics = self.budget.judge_pilot(group_id, rewards, step=self.model_version)
        self._push_metrics(metrics)
        if committed is None:
            self.record_group(group_id, rewards)
            return 0
        self._committed[group_id] = committed
        return self.budget.budget.which.settings.n_commit

    async def score_conversations(self, group: RolloutGroup, start: int = 0) -> list[ScoredConversation]:
        """Metrics and reward outputs of conversations ``start:``, by TRL's ``_score_group`` (rows discarded)."""
        group = conversations_at(group, range(start, len(group.completions)))
        sizes = [max(1, len(rows)) for rows in group.completions_sequences]  # rows per conversation, placeholder: 1
        placeholder = TrainingSequence([], [], [], _PLACEHOLDER_ID)
        padded = dataclasses.replace(group, completions_sequences=[
            rows if rows else [placeholder] for rows in group.completions_sequences])
        outputs, recorded = recording(self.reward_funcs)
        with reward_funcs_as(self, recorded):
            samples = await super()._score_group(padded)
        if len(samples) != sum(sizes):
            raise RuntimeError(f"TRL's _score_group returned {len(samples)} rows for conversations of {sizes} rows: "
                               "pods_rl.engines.trl_async.worker does not know this TRL's row layout.")
        starts = np.cumsum([0, *sizes])
        return [ScoredConversation(samples[starts[i]].metrics, tuple(output[i] for output in outputs))
                for i in range(len(sizes))]

    async def kept_rows(self, group: RolloutGroup, scored: list[ScoredConversation],
                        extra: dict | None = None) -> list[RolloutSample]:
        """TRL's rows for the kept m scored as their own group (rewards replayed), with ``pods/*`` and ``extra``."""
        kept, metrics = self.select_conversations(group, [conversation.metrics for conversation in scored])
        metrics.update(extra or {})
        with reward_funcs_as(self, replaying(scored, kept, len(self.reward_funcs))):
            samples = await super()._score_group(conversations_at(group, kept))
        if getattr(self, "advantage_baseline", "kept") == "sampled":  # every row of a kept conversation gets its own
            rows = [len(group.completions_sequences[i]) for i in kept]
            for sample, advantage in zip(samples, np.repeat(sampled_advantages(scored, kept), rows), strict=True):
                sample.advantage = float(advantage)
        for sample in samples:
            sample.metrics.update(metrics)
        return samples

    # --- adaptive rollouts: top-ups in the background ------------------------------------------------------------

    def deciding_rewards(self, scored: list[ScoredConversation]) -> torch.Tensor:
        """(1, len(scored)) ``pods_adaptive_reward``'s rewards, else the total: what decides mixed and the ledger."""
        key = getattr(self, "deciding_key", "reward")
        return torch.tensor([[conversation.metrics[key] for conversation in scored]], dtype=torch.float64)

    def plan_top_up(self, scored: list[ScoredConversation], group_id: int | None = None) -> int:
        """Rollouts this group gets next (0: closed): the adaptive rule's, or up to Knapsack-RL's planned count."""
        count, n = len(scored), self.pods_n
        if self.adaptive is None:
            return max(self._planned.get(group_id, count) - count, 0)
        rewards = torch.full((1, n), float("nan"), dtype=torch.float64)
        rewards[:, :count] = self.deciding_rewards(scored)
        budget = None if self.adaptive.budget is None else round(self.adaptive.budget)
        more = plan_round(rewards, torch.tensor([count]), self.pods.m, n, self.adaptive.round_size,
                          self.adaptive.rule, budget=budget)
        return int(more[0])

    async def top_up(self, group: RolloutGroup, more: int) -> None:
        """Sample ``more`` conversations of the prompt, append them and queue the group (its pilot's version) again."""
        for completion, ids, sequences, calls, failures, rollout_reward in await self._sample(
                group.prompts[0], more, group_id=group.group_id):
            group.prompts.append(group.prompts[0])
            group.completions.append(completion)
            group.completions_ids.append(ids)
            group.completions_sequences.append(sequences)
            group.tool_call_counts.append(calls)
            group.tool_failure_counts.append(failures)
            group.rollout_rewards.append(rollout_reward)
            if group.env_rewards:  # (filled only where an environment owns a reward, which a pilot refuses)
                group.env_rewards.append(None)
            self._total_completion_tokens += len(ids)
        for values in group.reward_kwargs.values():
            values.extend(values[:1] * more)
        await self._groups_to_score.put(group)

    async def _sample(self, prompt, k: int, *, group_id: int) -> list[tuple]:
        """k replies of TRL's ``_generate_one`` for ``prompt``, beside the groups' rollouts (``max_inflight_tasks``)."""
        tool_dict = {tool.__name__: tool for tool in self._standalone_tools}

        async def one():
            async with self._top_up_slots:
                return await self._generate_one(prompt, tool_dict=tool_dict, tools=self.tools, group_id=group_id)

        return await asyncio.gather(*(one() for _ in range(k)))

    def _top_up_done(self, task: asyncio.Task) -> None:
        self._top_ups.discard(task)
        if not task.cancelled() and task.exception() is not None and self._top_up_error is None:
            self._top_up_error = task.exception()  # raised by the next _score_group: the worker fails, as TRL's

    async def _score_loop(self, stop_event: asyncio.Event) -> None:
        try:
            await super()._score_loop(stop_event)
        finally:  # top-ups still sampling when the loop stops are cancelled, not left pending
            top_ups = list(getattr(self, "_top_ups", ()))
            for task in top_ups:
                task.cancel()
            await asyncio.gather(*top_ups, return_exceptions=True)
            self.save_budget(force=True)  # the planners' state as the worker leaves it

    def select_conversations(self, group: RolloutGroup, metrics: list[dict[str, float]]) -> tuple[list[int], dict]:
        """The kept conversations' indices (ascending) and the ``pods/*`` metrics, ranked on ``rewards/<name>``."""
        names = list(self.reward_func_names)
        if names and len(set(names)) == len(names) and all(f"rewards/{name}" in metrics[0] for name in names):
            columns = [[row[f"rewards/{name}"] for name in names] for row in metrics]
        else:  # two sources share a key: TRL summed them into "reward" before the names collided
            columns = [[row["reward"]] for row in metrics]
        rewards_per_func = torch.tensor(columns, dtype=torch.float64).unsqueeze(0)  # (1, n, F)
        selection = select(rewards_per_func, torch.ones(rewards_per_func.shape[2], dtype=torch.float64), 1,
                           self.pods, features=self.rollout_features(group, rewards_per_func),
                           generator=self.pods_generator)
        return [i for i in selection.kept[0].tolist() if i >= 0], selection.metrics  # (-1 pads a group below m)

    def rollout_features(self, group: RolloutGroup, rewards_per_func: torch.Tensor) -> dict[str, torch.Tensor]:
        """Selection's features, each (1, n), as ``pods_rl.rollouts.rollout_features`` gives them (``lengths`` always;
        for feature rules also ``rewards_per_func`` (1, n, F), ``truncated``, ``tool_calls``, ``turns``)."""
        if not rule_takes_features(self.pods.rule):
            return rollout_features(group.completions_ids, 1)
        eos = getattr(self, "eos_token_ids", None) or [self.tokenizer.eos_token_id]  # TRL < 1.15: the tokenizer's
        turns = [sum(message.get("role") == "assistant" for message in completion) for completion in group.completions]
        return rollout_features(group.completions_ids, 1, stop_ids={*eos, self.tokenizer.pad_token_id},
                                tool_calls=group.tool_call_counts, turns=turns, rewards_per_func=rewards_per_func)


class PODSRolloutWorker(AsyncRolloutWorker):
    """``AsyncRolloutWorker`` running ``PODSRolloutLoop``; checks the ``pods_*`` keywords before spawning its child."""

    _loop_cls = PODSRolloutLoop

    def __init__(self, *, pods_m: int, **kwargs: Any):
        check_worker_settings(pods_m, kwargs.get("num_generations", 8), kwargs.get("reward_funcs") or [],
                              kwargs.get("environment_factory"), dataset=kwargs.get("dataset"),
                              **{key: value for key, value in kwargs.items() if key.startswith("pods_")})
        super().__init__(pods_m=pods_m, **kwargs)


# Long because it mirrors AsyncGRPOTrainer.__init__'s worker construction, one setting after another.
def pods_worker_kwargs(model: str, reward_funcs, args, train_dataset=None, processing_class=None, *, pods_m: int,
                       tools=None, environment_factory=None, lora_name: str | None = None,
                       num_processes: int | None = None, **pods: Any) -> dict[str, Any]:
    """``PODSRolloutWorker``'s keyword arguments, as ``AsyncGRPOTrainer.__init__`` builds its default worker's from
    ``args`` (n = ``args.num_generations``; ``max_inflight_tasks`` -1 scaled to m), plus the PODS settings, filtered
    to what the installed TRL's loop takes.

    Args: model, reward_funcs (picklable), args, train_dataset (None only with environment_factory), tools,
    environment_factory as for ``AsyncGRPOTrainer``; processing_class (default ``AutoTokenizer`` of model);
    ``pods_m``: kept per prompt, 2 <= m <= n; ``lora_name``: the PEFT adapter vLLM serves (TRL >= 1.14);
    ``num_processes`` (default ``args.world_size``). ``**pods``: ``pods_rule``, ``pods_tiebreak``, ``pods_seed``,
    ``pods_rule_module``, ``pods_advantage_baseline`` (``kept``/``sampled``); adaptive: ``pods_pilot`` (k),
    ``pods_round_size``, ``pods_adaptive_rule``, ``pods_adaptive_reward`` (decides mixed; the ledger counts by it),
    ``pods_adaptive_budget``; planners: ``pods_prompt_planner``, ``pods_rollout_planner``, their ``*_args``,
    ``pods_ledger_success_threshold``, ``pods_groups_per_step`` (default rows per step / m), ``pods_ledger_path``
    (default ``args.output_dir/pods_ledger.pt``), ``pods_ledger_resume``.
    """
    from transformers import AutoTokenizer

    n = args.num_generations
    reward_funcs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    budget = check_worker_settings(pods_m, n, reward_funcs, environment_factory, dataset=train_dataset, **pods)
    init_kwargs = args.model_init_kwargs or {}
    revision, trust = init_kwargs.get("revision"), args.trust_remote_code
    if processing_class is None:
        processing_class = AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust)
    if processing_class.pad_token is None:
        processing_class.pad_token = processing_class.eos_token
    if train_dataset is None and environment_factory is not None:
        from datasets import Dataset

        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
        train_dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * rows})
    processes = args.world_size if num_processes is None else num_processes
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * processes  # rows
    inflight = args.max_inflight_tasks
    if inflight < 0:  # TRL's horizon in rows; a group starts with `started` rollouts and yields m rows
        started = _rollouts_a_group_starts(n, pods_m, budget, **pods)
        inflight = math.ceil(max(args.max_staleness, 1) * per_step * started / pods_m)
    if pods.get("pods_prompt_planner") or pods.get("pods_rollout_planner"):  # the planners' window and state file
        pods.setdefault("pods_groups_per_step", math.ceil(per_step / pods_m))
        pods.setdefault("pods_ledger_path", os.path.join(args.output_dir, LEDGER_FILE))
    kwargs = dict(
        model_name=model, lora_name=lora_name, dataset=train_dataset, reward_funcs=reward_funcs,
        processing_class=processing_class, eos_token_ids=_eos_token_ids(model, processing_class, revision, trust),
        tools=tools, environment_factory=environment_factory, num_generations=n, max_inflight_tasks=inflight,
        queue_maxsize=args.queue_maxsize, vllm_server_url=args.vllm_server_base_url,
        max_tokens=args.max_completion_length, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, request_timeout=args.request_timeout,
        chat_template_kwargs=args.chat_template_kwargs, max_tool_calling_iterations=args.max_tool_calling_iterations,
        log_completions=args.log_completions, num_completions_to_print=args.num_completions_to_print,
        fork_threshold_tokens=args.fork_threshold_tokens, pods_m=pods_m, **pods)
    # TRL before 1.14 has no lora_name, before 1.15 no eos_token_ids (its loop then stops on the tokenizer's eos)
    accepted = inspect.signature(_AsyncRolloutLoop.__init__).parameters
    if lora_name is not None and "lora_name" not in accepted:
        raise ValueError("lora_name (adapter-only vLLM sync) needs TRL >= 1.14's asynchronous GRPO trainer.")
    return {key: value for key, value in kwargs.items() if key in accepted or key.startswith("pods_")}


def _rollouts_a_group_starts(n: int, m: int, budget, **pods: Any) -> int:
    """Rollouts TRL's generate loop samples per group before top-ups: n, the pilot k, m (Knapsack), n_explore
    (Pilot-Commit's pilot) or an "answer_rounds" planner's first round."""
    if budget is not None and (budget.commits or "answer_rounds" in budget.needs):
        return member(budget.which if budget.commits else budget.how_many, "first_round")(n)
    return pods.get("pods_pilot") or (m if pods.get("pods_rollout_planner") else n)


def pods_rollout_worker(model: str, reward_funcs, args, train_dataset=None, processing_class=None, *, pods_m: int,
                        **kwargs: Any) -> PODSRolloutWorker:
    """A ``PODSRolloutWorker`` built as ``AsyncGRPOTrainer`` builds its default; arguments as ``pods_worker_kwargs``."""
    return PODSRolloutWorker(**pods_worker_kwargs(model, reward_funcs, args, train_dataset, processing_class,
                                                  pods_m=pods_m, **kwargs))


def _eos_token_ids(model: str, processing_class, revision: str | None, trust_remote_code: bool) -> list[int]:
    """The generation config's eos ids (the tokenizer's first if missing), as ``AsyncGRPOTrainer`` gives its worker."""
    from transformers import AutoConfig, GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(model, revision=revision)
    except OSError:  # no generation_config.json: from_pretrained derives it from the model's config
        config = AutoConfig.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)
        generation_config = GenerationConfig.from_model_config(config)
    eos = generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return eos if processing_class.eos_token_id in eos else [processing_class.eos_token_id, *eos]
