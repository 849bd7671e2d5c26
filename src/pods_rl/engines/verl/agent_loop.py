"""The rollout-budget planners on verl (0.9.x, v1 trainer): an agent loop manager that plans before generation, and an
agent loop worker that samples in rounds.

Load with ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=pods_rl.engines.verl.agent_loop.
PODSAgentLoopManager`` beside the PODS replay buffer, whose ``sampler_kwargs`` name the planners (``pods verl-args``
prints both). verl's TaskRunner builds the trainer (and so the buffer) and then the manager from one config object, in
one process: the manager plans from the buffer's ``RolloutBudget`` (the planners and the ledger ``PODSTrainer`` runs),
and the buffer records every sampled group into that ledger by the rows' dataset ``index``.

GRESO's skipped rows never reach a worker (refilled through ``refill_fn``, ``refill_rounds`` waves at most);
Knapsack-RL and auto set ``__rollout_n__`` per row; Reinforce-Ada's rounds and Pilot-Commit's pilot and commit run in
the worker's ``_run_prompt`` (docs/guides/verl.md, "Rollout budgets").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import ray
import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ, _settle_session_tasks

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners import make_planner
from pods_rl.budget.planners.base import rollout_metrics
from pods_rl.engines.verl.replay_buffer import live_buffer

__all__ = ["PODSAgentLoopManager", "PODSAgentLoopWorker", "hold_total", "row_ids", "worker_plan"]

logger = logging.getLogger("pods_rl")

_NO_BUFFER = ("PODSAgentLoopManager plans from the PODS replay buffer's ledger, but no PODS buffer was built from this "
              "config in this process: set trainer.v1.sampler.custom_sampler to pods_rl.engines.verl.replay_buffer's "
              "PODSReplayBuffer (`pods verl-args` prints both)")
_NO_REWARD = ("a planner's rounds need each rollout's reward when it is sampled, but this one has none (a colocated "
              "reward model scores later): set reward.reward_model.enable_resource_pool=True or use a rule-based "
              "reward")


def row_ids(batch: TensorDict) -> torch.Tensor:
    """(P,) int64 the rows' dataset ``index`` (verl's RLHFDataset copies it from ``extra_info.index``)."""
    index = batch["index"]
    if isinstance(index, NonTensorStack):
        index = index.tolist()
    return torch.as_tensor(index, dtype=torch.long).reshape(-1)


def hold_total(counts: torch.Tensor, total: int, low: int, high: int) -> torch.Tensor:
    """(P,) counts moved one rollout at a time, first rows first, until they sum to ``total`` within [low, high]
    (verl counts a mini-batch as ppo_mini_batch_size x rollout.n rows: the step's rollouts must not change)."""
    counts = counts.clamp(low, high).clone()
    order = list(range(len(counts)))
    while int(counts.sum()) != total:
        gap = total - int(counts.sum())
        step = 1 if gap > 0 else -1
        movable = [p for p in order if low <= int(counts[p]) + step <= high]
        if not movable:
            raise ValueError(f"cannot spread {total} rollouts over {len(counts)} prompts within [{low}, {high}]")
        for p in movable[:abs(gap)]:
            counts[p] += step
    return counts


class PODSAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent loop manager, planning each training dispatch with the PODS buffer's planners;
    ``decisions``: per dispatch, ``step``, ``wave``, ``uids``, ``ids`` (P,), ``kept`` (P,), ``counts`` (P,)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        # After verl's __init__, which sets its own worker class; create() starts the workers after this returns.
        self.agent_loop_workers_class = PODSAgentLoopWorker
        self.buffer = live_buffer(config)
        if self.buffer is None:
            raise ValueError(_NO_BUFFER)
        self.decisions: list[dict] = []
        self._wave, self._offered = 0, {}
        self._clock: list | None = None  # [step, its first dispatch (monotonic s), rollouts dispatched] for auto

    def generate_sequences(self, prompts: TensorDict) -> None:
        """Plan a training dispatch's rows (drop, count), dispatch the rest as verl does, refill what was dropped."""
        validate = "validate" in prompts.keys() and bool(_plain(prompts["validate"]))
        budget = self.buffer.budget
        if validate or budget is None or len(prompts) == 0:
            return super().generate_sequences(prompts)
        ids, step = row_ids(prompts), int(_plain(prompts["global_steps"]))
        self.buffer.resume_ledger(step)  # a resumed run plans its first step from the checkpoint's ledger
        if "costs" in budget.needs:
            self._observe_costs(step)
        # The bound on replacing prompts: waves of this dispatch's refills, and rows offered this step (Pilot-Commit's
        # replacements come from the buffer, one wave each); past it, rows are admitted whole.
        offered = self._offered.get(step, 0)
        self._offered = {step: offered + len(ids)}
        admit = (self._wave >= self.buffer.plan.refill_rounds
                 or offered >= self.config.data.train_batch_size * (1 + self.buffer.plan.refill_rounds))
        keep, metrics, started = torch.ones(len(ids), dtype=torch.bool), {}, time.perf_counter()
        if budget.which is not None:
            if not admit:
                generator = torch.Generator().manual_seed(hash((budget.seed, step, self._wave, offered)) & (2**63 - 1))
                plan = budget.which.plan(ids, budget.ledger, n=budget.n, generator=generator)
                keep = plan.rollouts > 0
                metrics.update(plan.metrics)
            else:  # the replacements ran out: admit the rows whole (the planner's readmit, bounded)
                metrics["pods/prompts_readmitted"] = float(len(ids))
        counts = torch.full((len(ids),), budget.which.settings.n_explore if budget.commits else self.buffer.plan.n,
                            dtype=torch.long)
        if budget.how_many is not None and bool(keep.any()):
            planned, allocated = budget.allocate(ids[keep])
            metrics.update(allocated)
            # auto spends what pays per measured second; Knapsack-RL's budget is the step's rows x rollout.n.
            counts[keep] = planned if "costs" in budget.needs else hold_total(
                planned, int(keep.sum()) * self.buffer.plan.n, budget.m, budget.n)
        counts = torch.where(keep, counts, 0)
        metrics.update(rollout_metrics(counts))
        metrics["pods/plan_seconds"] = time.perf_counter() - started  # the planners' own time (summed over a step)
        if self._clock is not None:
            self._clock[2] += int(counts.sum())
        uids = list(_plain(prompts["uid"]))
        self.decisions.append({"step": step, "wave": self._wave, "uids": uids, "ids": ids, "kept": keep,
                               "counts": counts, "admitted": admit})
        _add(self.buffer.plan_metrics, metrics)
        dropped = [uid for uid, k in zip(uids, keep.tolist()) if not k]
        if dropped:  # registered as pending by the trainer: cleared, or the buffer would wait for them
            tq.kv_clear(keys=dropped, partition_id="train")
        if bool(keep.any()):
            kept = prompts[keep]
            if budget.how_many is not None:
                kept["__rollout_n__"] = counts[keep]
            if budget.commits:  # the worker commits these whether or not their pilots pass
                kept["__pods_admit__"] = torch.full((int(keep.sum()),), admit)
            super().generate_sequences(kept)
        if dropped:
            self._wave += 1
            try:
                self.buffer.refill_fn(len(dropped))
            finally:
                self._wave -= 1
        return None

    def _observe_costs(self, step: int) -> None:
        """At a step's first dispatch, the step before it for auto: sampling = first dispatch to the end of the
        buffer's ``sample()``, update = from there to now (a save or validation there is set aside as a slow step)."""
        now = time.monotonic()
        if self._clock is not None and self._clock[0] == step:
            return
        done = self.buffer.sampled_at
        if self._clock is not None and done is not None and done[0] == self._clock[0]:
            self.buffer.budget.observe(sampled=self._clock[2], sample_seconds=done[1] - self._clock[1],
                                       trained=done[2], update_seconds=now - done[1])
        self._clock = [step, now, 0]


def _plain(value):
    """A NonTensorData's or NonTensorStack's Python value."""
    if isinstance(value, NonTensorData):
        return value.data
    if isinstance(value, NonTensorStack):
        return value.tolist()
    if torch.is_tensor(value) and value.dim() == 0:
        return value.item()
    return value


def _add(total: dict[str, float], metrics: dict[str, float]) -> None:
    """Sum counts over a step's dispatches; keep the last value of the rest."""
    for key, value in metrics.items():
        summed = key.startswith(("pods/prompts_", "pods/plan_"))  # plan_prompts, plan_rollouts, plan_seconds
        total[key] = total.get(key, 0.0) + value if summed else value


class PODSAgentLoopWorkerBase(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's TransferQueue agent loop worker, sampling a training prompt in rounds when the PODS buffer's
    ``sampler_kwargs`` name a planner that does (Reinforce-Ada's rounds, Pilot-Commit's pilot and commit); otherwise
    verl's worker unchanged."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.pods_plan = worker_plan(config)
        self.pods_rewards: dict[tuple[str, int], float | None] = {}

    @property
    def pods_rounds(self) -> bool:
        """True when training prompts are sampled in rounds."""
        plan = self.pods_plan
        return plan is not None and (plan.rounds is not None or (plan.budget is not None and plan.budget.commits))

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        if not self.pods_rounds or trajectory["validate"]:
            prompt.pop("__pods_admit__", None)
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        uid = prompt["uid"]
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": "running"})
        tag = {"status": "finished"}
        try:
            prompt.pop("__rollout_n__", None)  # the rounds decide the count
            admit = bool(_plain(prompt.pop("__pods_admit__", False)))
            if not prompt.pop("__do_sample__", True):
                raise ValueError("a planner's rounds sample; a greedy (__do_sample__=False) row cannot have rounds")
            cap, more = self._first_round()
            rewards = torch.full((1, cap), float("nan"), dtype=torch.float64)
            count = 0
            while more > 0:
                tasks = [asyncio.create_task(self._run_agent_loop(dict(sampling_params), trajectory=trajectory,
                                                                  trace=trace, session_id=count + i, **prompt))
                         for i in range(more)]
                errors = await _settle_session_tasks(tasks)
                if errors:
                    for error in errors:
                        logger.error("Error in a planned round for uid=%s", uid,
                                     exc_info=(type(error), error, error.__traceback__))
                    tag = {"status": "failure"}
                    break
                for session in range(count, count + more):
                    reward = self.pods_rewards.pop((uid, session), None)
                    if reward is None:
                        raise ValueError(_NO_REWARD)
                    rewards[0, session] = float(reward)
                count += more
                more, dropped = self._next_round(int(_plain(prompt["index"])), rewards, count, admit)
                if dropped:  # the buffer records it, evicts it and asks the dataloader for another
                    tag = {"status": "failure", "pods_pilot": "dropped"}
        except Exception as err:
            logger.exception("Error in _run_prompt: %s", err)
            tag = {"status": "failure"}
        finally:
            for key in [key for key in self.pods_rewards if key[0] == uid]:
                del self.pods_rewards[key]
        await tq.async_kv_put(key=uid, partition_id="train", tag=tag)

    def _first_round(self) -> tuple[int, int]:
        """(the most rollouts a prompt can get, the first round's)."""
        budget = self.pods_plan.budget
        if budget is not None and budget.commits:
            settings = budget.which.settings
            return settings.n_explore + settings.n_commit, settings.n_explore
        rounds = self._rounds_planner()
        return rounds.settings.cap, rounds.settings.round_repeat

    def _next_round(self, index: int, rewards: torch.Tensor, count: int, admit: bool) -> tuple[int, bool]:
        """(rollouts of the next round (0: done), whether the group is dropped) after ``count`` scored rollouts
        ``rewards`` (1, cap)."""
        budget = self.pods_plan.budget
        if budget is not None and budget.commits:
            settings = budget.which.settings
            if count > settings.n_explore:
                return 0, False
            # The planner's own verdict, on a fresh planner and ledger: nothing of the run's state lives here.
            judge = make_planner("pilot_commit", **dataclasses.asdict(settings))
            verdict = judge.after_pilot(torch.tensor([index]), rewards[:, :count], None,
                                        PromptLedger(budget.ledger.settings), step=0, evict=False)
            passed = bool(verdict.extra["passed"][0]) or admit
            return (settings.n_commit, False) if passed else (0, True)
        return int(self._rounds_planner().plan_round(rewards, torch.tensor([count]))[0]), False

    def _rounds_planner(self):
        if not hasattr(self, "_rounds"):
            self._rounds = make_planner("reinforce_ada", **self.pods_plan.rounds)
        return self._rounds

    async def _agent_loop_postprocess(self, output, validate, **kwargs) -> None:
        await super()._agent_loop_postprocess(output, validate, **kwargs)
        if self.pods_rounds and not validate:  # the session's reward, for the round's rule
            last = output[-1] if isinstance(output, list) else output
            self.pods_rewards[(kwargs["uid"], int(kwargs["session_id"]))] = last.reward_score


def worker_plan(config):
    """The planners the PODS buffer's ``sampler_kwargs`` of ``config`` name (a ``VerlBudget``), or None without the
    PODS buffer (built as the buffer builds them: the worker runs in a process of its own)."""
    from omegaconf import OmegaConf

    from pods_rl.engines.verl.batch_settings import SAMPLER_NAME
    from pods_rl.engines.verl.replay_buffer import PODSSettings, planners_of

    sampler = OmegaConf.select(config, "trainer.v1.sampler.custom_sampler.name", default=None)
    if sampler != SAMPLER_NAME:
        return None
    settings = PODSSettings.from_sampler_kwargs(config.trainer.v1.sampler.sampler_kwargs, config)
    return planners_of(settings, config, config.trainer.v1.trainer_mode)


PODSAgentLoopWorker = ray.remote(PODSAgentLoopWorkerBase)
