"""The rollout-budget planners on verl (0.9.x, v1 trainer): an agent loop manager that plans before generation and a
worker that samples in rounds. Load it as ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` beside the PODS
replay buffer, whose ``sampler_kwargs`` name the planners (``pods verl-args`` prints both). The manager is handed that
buffer (``create``, ``task_runner_buffer``) and plans from its ``RolloutBudget`` (``PODSTrainer``'s planners and
ledger), which the buffer records every sampled group into, by the rows' dataset ``index``.

GRESO's skipped rows never reach a worker (refilled through ``refill_fn``, ``refill_rounds`` waves at most);
Knapsack-RL and auto set ``__rollout_n__`` per row; Reinforce-Ada's rounds run in the worker's ``_run_prompt``;
Pilot-Commit's pilots are judged once, by the buffer, before their commits are dispatched (docs/guides/verl.md).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import ray
import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ, _settle_session_tasks
from verl.utils import tensordict_utils as tu

from pods_rl.budget.planners.base import rollout_metrics
from pods_rl.budget.rollout_budget import step_generator
from pods_rl.engines.verl.replay_buffer import PODSReplayBuffer

__all__ = ["PODSAgentLoopManager", "PODSAgentLoopWorker", "hold_total", "row_ids", "task_runner_buffer"]

logger = logging.getLogger("pods_rl")

_NO_BUFFER = ("PODSAgentLoopManager plans from the PODS replay buffer's ledger, but none was handed to it (no PODS "
              "buffer was built from this config by verl's trainer): set trainer.v1.sampler.custom_sampler to "
              "pods_rl.engines.verl.replay_buffer's PODSReplayBuffer (`pods verl-args` prints both)")
_POLL_SECONDS = 0.05  # how often the manager looks for its pilots' rewards in TransferQueue
_NO_REWARD = ("a planner's rounds need each rollout's reward when it is sampled, but this one has none (a colocated "
              "reward model scores later): set reward.reward_model.enable_resource_pool=True or use a rule-based "
              "reward")


def row_ids(batch: TensorDict) -> torch.Tensor:
    """(P,) int64 the rows' dataset ``index`` (verl's RLHFDataset copies it from ``extra_info.index``)."""
    return torch.as_tensor(_plain(batch["index"]), dtype=torch.long).reshape(-1)


def hold_total(counts: torch.Tensor, total: int, low: int, high: int) -> torch.Tensor:
    """(P,) counts moved one rollout at a time, first rows first, until they sum to ``total`` within [low, high]
    (verl counts a mini-batch as ppo_mini_batch_size x rollout.n rows: the step's rollouts must not change)."""
    counts = counts.clamp(low, high).clone()
    while int(counts.sum()) != total:
        gap = total - int(counts.sum())
        step = 1 if gap > 0 else -1
        movable = [p for p in range(len(counts)) if low <= int(counts[p]) + step <= high]
        if not movable:
            raise ValueError(f"cannot spread {total} rollouts over {len(counts)} prompts within [{low}, {high}]")
        for p in movable[:abs(gap)]:
            counts[p] += step
    return counts


class PODSAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent loop manager, planning with the PODS buffer it is handed; ``decisions``: per dispatch,
    ``step``, ``wave``, ``uids``, ``ids`` (P,), ``kept`` (P,), ``counts`` (P,)."""

    def __init__(self, config, *args, pods_buffer: PODSReplayBuffer | None = None, **kwargs):
        super().__init__(config, *args, **kwargs)
        # After verl's __init__, which sets its own worker class; create() starts the workers after this returns.
        self.agent_loop_workers_class = PODSAgentLoopWorker
        if pods_buffer is None:
            raise ValueError(_NO_BUFFER)
        self.buffer = pods_buffer
        self.decisions: list[dict] = []
        self._wave, self._offered = 0, {}

    @classmethod
    def create(cls, *args, pods_buffer: PODSReplayBuffer | None = None, **kwargs):
        """verl's ``create`` (called by ``TaskRunnerV1.init_agent_loop_manager``), handed its trainer's PODS buffer."""
        if pods_buffer is None:
            pods_buffer = task_runner_buffer(kwargs["config"] if "config" in kwargs else args[0])
        return super().create(*args, pods_buffer=pods_buffer, **kwargs)

    def generate_sequences(self, prompts: TensorDict) -> None:
        """Plan a training dispatch's rows (drop, count), dispatch the rest as verl does, refill what was dropped."""
        validate = "validate" in prompts.keys() and bool(_plain(prompts["validate"]))
        budget = self.buffer.budget
        if validate or len(prompts) == 0:
            return super().generate_sequences(prompts)
        if budget is None:
            return self._dispatch(prompts)
        ids, step = row_ids(prompts), int(_plain(prompts["global_steps"]))
        self.buffer.resume_ledger(step)  # a resumed run plans its first step from the checkpoint's ledger
        budget.costs.dispatched(step)  # auto's costs: a step's first dispatch observes the step before it
        # The bound on replacing prompts (skipped rows, dropped pilots): waves of this dispatch's refills, and rows
        # offered this step; past it, rows are admitted whole.
        offered = self._offered.get(step, 0)
        self._offered = {step: offered + len(ids)}
        admit = (self._wave >= self.buffer.plan.refill_rounds
                 or offered >= self.config.data.train_batch_size * (1 + self.buffer.plan.refill_rounds))
        keep, metrics, started = torch.ones(len(ids), dtype=torch.bool), {}, time.perf_counter()
        if budget.which is not None:
            if not admit:
                plan = budget.screen(ids, step_generator(budget.seed, step, self._wave, offered))
                keep = plan.rollouts > 0
                metrics.update(plan.metrics)
            else:  # the replacements ran out: admit the rows whole (the planner's readmit, bounded)
                metrics["pods/prompts_readmitted"] = float(len(ids))
        pilot = budget.commits and not admit
        counts = torch.zeros(len(ids), dtype=torch.long)
        if bool(keep.any()):  # an admitted row gets a whole group, not a pilot
            planned, allocated = budget.first_counts(ids[keep]) if not budget.commits or pilot else (
                torch.full((int(keep.sum()),), budget.n, dtype=torch.long), {})
            metrics.update(allocated)
            # A fixed budget per prompt (Knapsack-RL's: rollout.n) holds the step at rows x rollout.n; auto has none.
            counts[keep] = planned if budget.budget_per_prompt is None else hold_total(
                planned, int(keep.sum()) * self.buffer.plan.n, budget.m, budget.n)
        metrics.update(rollout_metrics(counts))
        metrics["pods/plan_seconds"] = time.perf_counter() - started  # the planners' own time (summed over a step)
        budget.costs.sampled(int(counts.sum()))  # what this dispatch samples (auto's costs)
        uids = list(_plain(prompts["uid"]))
        self.decisions.append({"step": step, "wave": self._wave, "uids": uids, "ids": ids, "kept": keep,
                               "counts": counts, "admitted": admit})
        _add(self.buffer.plan_metrics, metrics)
        # Skipped rows and dropped pilots, registered by the trainer: cleared, or the buffer would wait for them.
        cleared = [uid for uid, k in zip(uids, keep.tolist()) if not k]
        if bool(keep.any()):
            kept = prompts[keep]
            if budget.how_many is not None or budget.commits:
                kept["__rollout_n__"] = counts[keep]
            if pilot:
                cleared += self._pilot_and_commit(kept, ids[keep], step)
            else:
                self._dispatch(kept)
        if cleared:
            self._clear_and_refill(cleared)
        return None

    def _clear_and_refill(self, keys: list[str]) -> None:
        """Clear ``keys`` (uids, a dropped pilot's sessions) from TransferQueue; refill a row per uid, a wave deeper."""
        tq.kv_clear(keys=keys, partition_id="train")
        self._wave += 1
        try:
            self.buffer.refill_fn(len({key.split("_")[0] for key in keys}))
        finally:
            self._wave -= 1

    def _dispatch(self, rows: TensorDict) -> None:
        """verl's dispatch of training ``rows``, handed the run's Reinforce-Ada when they sample in rounds."""
        if self.buffer.plan.rounds is not None:
            tu.assign_non_tensor_data(rows, "__pods_rounds__", self.buffer.plan.rounds)
        super().generate_sequences(rows)

    def _pilot_and_commit(self, rows: TensorDict, ids: torch.Tensor, step: int) -> list[str]:
        """Pilot-Commit: the workers sample ``rows``' pilots (``__rollout_n__`` each), the buffer's planner judges them
        once, the passed are committed to the rest of their group; returns the dropped pilots' keys."""
        tu.assign_non_tensor_data(rows, "__pods_pilot__", True)
        self._dispatch(rows)
        uids = list(_plain(rows["uid"]))
        tags, keys = self._pilots_scored(uids)
        scored = [p for p, uid in enumerate(uids) if "pods_pilot" in tags[uid]]  # (a failed one is verl's to refill)
        if not scored:
            return []
        rewards = torch.tensor([tags[uids[p]]["pods_pilot"] for p in scored], dtype=torch.float64)
        passed = self.buffer.judge_pilots(ids[scored], rewards, step)
        commits = [p for p, ok in zip(scored, passed.tolist()) if ok]
        if commits:
            commit = rows[torch.isin(torch.arange(len(uids)), torch.tensor(commits))]
            del commit["__pods_pilot__"]
            piloted = int(commit["__rollout_n__"][0])  # the group (rollout.n) is the pilot and its commit
            commit["__rollout_n__"] = torch.full((len(commits),), self.buffer.plan.n - piloted, dtype=torch.long)
            tu.assign_non_tensor_data(commit, "__pods_first_session__", piloted)
            self._dispatch(commit)
        dropped = {uids[p] for p, ok in zip(scored, passed.tolist()) if not ok}
        return [key for key in keys if key.split("_")[0] in dropped]

    def _pilots_scored(self, uids: list[str]) -> tuple[dict[str, dict], list[str]]:
        """Each pilot's tag once its worker has scored (or failed) it, and every TransferQueue key of ``uids``."""
        while True:
            listing = (tq.kv_list("train") or {}).get("train", {})
            tags = {uid: listing.get(uid) or {} for uid in uids}
            if all("pods_pilot" in tag or tag.get("status") == "failure" for tag in tags.values()):
                wanted = set(uids)
                return tags, [key for key in listing if key.split("_")[0] in wanted]
            time.sleep(_POLL_SECONDS)


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


def task_runner_buffer(config) -> PODSReplayBuffer | None:
    """The PODS buffer of the trainer whose ``TaskRunnerV1`` creates the manager from ``config`` (its caller's
    ``self.trainer``: verl 0.9 hands a manager nothing of the trainer's), or None; pinned by a verl-lane test."""
    frame = sys._getframe(1)
    while frame is not None:
        trainer = getattr(frame.f_locals.get("self"), "trainer", None)
        if trainer is not None and getattr(trainer, "config", None) is config:
            buffer = getattr(trainer, "replay_buffer", None)
            return buffer if isinstance(buffer, PODSReplayBuffer) else None
        frame = frame.f_back
    return None


class PODSAgentLoopWorkerBase(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's TransferQueue agent loop worker; rows the manager marks are sampled in rounds (``__pods_rounds__``), as a
    pilot with its rewards in its tag (``__pods_pilot__``) or as a commit after it (``__pods_first_session__``)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.init_pods()

    def init_pods(self) -> None:
        """PODS's state: the rewards of the rows it samples (by uid, session) and those rows' uids."""
        self.pods_rewards: dict[tuple[str, int], float | None] = {}
        self.pods_uids: set[str] = set()

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        # The run's Reinforce-Ada (its stop rule) or None; a pilot; a commit's first session.
        rounds, pilot = prompt.pop("__pods_rounds__", None), bool(prompt.pop("__pods_pilot__", False))
        first = int(prompt.pop("__pods_first_session__", 0))
        if trajectory["validate"] or (rounds is None and not pilot and not first):
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        uid = prompt["uid"]
        self.pods_uids.add(uid)
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": "running"})
        tag = {"status": "finished"}
        try:
            more = rounds.settings.round_repeat if rounds is not None else int(_plain(prompt.pop("__rollout_n__")))
            prompt.pop("__rollout_n__", None)  # the rounds decide the count
            if not prompt.pop("__do_sample__", True):
                raise ValueError("a planner's rounds sample; a greedy (__do_sample__=False) row cannot have rounds")
            rewards = torch.full((1, rounds.settings.cap if rounds is not None else first + more), float("nan"),
                                 dtype=torch.float64)
            count = first
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
                    if reward is None and (rounds is not None or pilot):
                        raise ValueError(_NO_REWARD)
                    rewards[0, session] = float("nan") if reward is None else float(reward)
                count += more
                more = 0 if rounds is None else int(rounds.plan_round(rewards, torch.tensor([count]))[0])
            if pilot and tag["status"] == "finished":  # running until the manager commits or drops it
                tag = {"status": "running", "pods_pilot": rewards[0, :count].tolist()}
        except Exception as err:
            logger.exception("Error in _run_prompt: %s", err)
            tag = {"status": "failure"}
        finally:
            self.pods_uids.discard(uid)
            for key in [key for key in self.pods_rewards if key[0] == uid]:
                del self.pods_rewards[key]
        await tq.async_kv_put(key=uid, partition_id="train", tag=tag)

    async def _agent_loop_postprocess(self, output, validate, **kwargs) -> None:
        await super()._agent_loop_postprocess(output, validate, **kwargs)
        if not validate and kwargs["uid"] in self.pods_uids:  # the session's reward: a round's rule, a pilot's verdict
            last = output[-1] if isinstance(output, list) else output
            self.pods_rewards[(kwargs["uid"], int(kwargs["session_id"]))] = last.reward_score


PODSAgentLoopWorker = ray.remote(PODSAgentLoopWorkerBase)
