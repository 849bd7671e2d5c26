"""A few verl training steps with the rollout-budget planners, on CPU: verl's real trainer (its buffer, dispatch,
refill and TransferQueue protocol), PODS's real agent loop manager and worker; only the LLM is a table.

What is real: ``PPOTrainer.prepare_step`` -> ``_add_batch_to_generate`` -> ``_submit_batch_to_rollout`` (prompts
registered pending in TransferQueue) -> ``PODSAgentLoopManager.generate_sequences`` -> verl's
``AgentLoopManagerTQ.generate_sequences`` (``ray.get`` over the workers) -> the worker's ``generate_sequences`` and
``_run_prompt`` -> verl's ``_agent_loop_postprocess`` writing every rollout into TransferQueue; the refill through
``refill_fn`` (``_add_prompts_to_generate``); the PODS buffer's ``sample()`` and its ledger. What stands in: the
dataloader (a counter over dataset indices, its state copied on resume as verl restores ``data.pt``), the agent loop's
LLM call (``_run_agent_loop`` returns a fixed response with a reward from ``reward(index, session)``), and the worker
runs in this process (verl's needs a model and an LLM server), called through an object with ``.remote``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import numpy as np
import ray
import torch

from pods_rl.engines.verl.agent_loop import PODSAgentLoopManager, PODSAgentLoopWorkerBase

MANAGER = ("+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
           "pods_rl.engines.verl.agent_loop.PODSAgentLoopManager")
KW = "+trainer.v1.sampler.sampler_kwargs."


def reward(index: int, session: int) -> float:
    """The lane's reward: index % 4 = 0 always right, 1 never, 2 every other session, 3 first right at session 5."""
    kind = index % 4
    return [1.0, 0.0, float(session % 2), float(session == 5)][kind]


class LaneWorker(PODSAgentLoopWorkerBase):
    """PODS's worker with its LLM call replaced by ``reward``; ``generated``: (step, uid, index, session) in order."""

    def __init__(self, config):  # verl's __init__ loads a tokenizer and an LLM client: none here
        self.config = config
        self.reward_loop_worker_handles, self.teacher_client, self.distillation_enabled = None, None, False
        self.processor, self.tokenizer, self.hf_model_type = None, None, None
        self.background_tasks = set()
        self.init_pods()
        self.generated: list[tuple[int, str, int, int]] = []

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

        index, session = int(kwargs["index"]), int(kwargs["session_id"])
        self.generated.append((int(kwargs["global_steps"]), kwargs["uid"], index, session))
        output = AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=[5, 6, 7, 8], response_mask=[1] * 4,
                                 reward_score=reward(index, session), metrics=AgentLoopMetrics())
        return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)


class InProcess:
    """A stand-in for a Ray actor handle: ``handle.generate_sequences.remote(chunk)`` runs the worker to the end of
    every rollout on one event loop of its own and returns an ObjectRef, as verl's manager expects."""

    def __init__(self, worker: LaneWorker):
        self.worker, self.generate_sequences = worker, self
        self.loop = asyncio.new_event_loop()

    def remote(self, chunk):
        async def run():
            await self.worker.generate_sequences(chunk)
            while self.worker.background_tasks:
                await asyncio.gather(*list(self.worker.background_tasks))

        self.loop.run_until_complete(run())
        return ray.put(None)


class Rows:
    """The dataloader's stand-in: ``gen_batch_size`` rows at a time from dataset indices 0..size-1, in order."""

    def __init__(self, trainer, size: int, position: int = 0):
        self.trainer, self.size, self.position = trainer, size, position

    def __call__(self):
        from verl.utils import tensordict_utils as tu
        from verl.utils.dataset.rl_dataset import collate_fn

        config = self.trainer.config.data
        count = config.get("gen_batch_size", None) or config.train_batch_size
        indices = [(self.position + i) % self.size for i in range(count)]
        self.position += count
        batch = collate_fn([{"raw_prompt": f"question {i}", "index": i, "data_source": "lane"} for i in indices])
        batch["uid"] = np.array([str(uuid.uuid4()) for _ in indices], dtype=object)
        return tu.get_tensordict(batch)


def planned_run(*overrides: str, dataset: int = 8, position: int = 0):
    """verl's sync trainer with PODS's buffer, manager and a ``LaneWorker``; returns (trainer, manager, worker)."""
    from verl_lane import make_trainer

    given = {override.split("=")[0] for override in overrides}
    extra = [o for o in ("data.gen_batch_size=1", MANAGER) if o.split("=")[0] not in given]
    trainer = make_trainer(*overrides, *extra)
    trainer._fetch_one_gen_batch = Rows(trainer, dataset, position)
    manager = PODSAgentLoopManager(config=trainer.config, llm_client=None, pods_buffer=trainer.replay_buffer)
    worker = LaneWorker(trainer.config)
    manager.agent_loop_workers = [InProcess(worker)]
    trainer.agent_loop_manager = manager  # as verl's fit() does
    return trainer, manager, worker


def run_steps(trainer, steps, *, start: int = 1) -> list[dict]:
    """verl's step up to the buffer's ``sample()`` (generation, selection, the ledger), ``steps`` times; each step's
    metrics. The GPU phases (log-probs, update) are not run; the trained keys are cleared as fit() does."""
    import transfer_queue as tq

    out = []
    worker = trainer.agent_loop_manager.agent_loop_workers[0].worker
    for step in range(start, start + steps):
        trainer.global_steps = step
        generated, began = len(worker.generated), time.perf_counter()
        trainer.prepare_step()
        dispatched = time.perf_counter()
        batch, metrics = trainer.replay_buffer.sample(global_steps=step, partition_id="train",
                                                      batch_size=trainer.config.data.train_batch_size)
        tq.kv_clear(keys=batch.keys, partition_id="train")
        out.append({**metrics, "keys": batch.keys})
        _log_cost(trainer, step, metrics, dispatch=dispatched - began, sample=time.perf_counter() - dispatched,
                  rollouts=len(worker.generated) - generated, trained=len(batch.keys))
    return out


def _log_cost(trainer, step: int, metrics: dict, **measured) -> None:
    """With PODS_VERL_COSTS=FILE, one JSON line per step for benchmarks/verl_planner_costs.py: the planners, the
    step, its seconds (``dispatch``: planning, dispatch, the stand-in generation and the refills; ``sample``: the
    buffer's sample(), selection and the ledger), the planners' own seconds, rollouts generated, prompts offered."""
    path = os.environ.get("PODS_VERL_COSTS")
    if not path:
        return
    planners = trainer.replay_buffer.pods.planners or {}
    label = "+".join(str(planners[key]) for key in ("prompt_planner", "rollout_planner") if planners.get(key))
    record = {"planners": label or "none", "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
              "step": step, **measured, "plan_seconds": metrics.get("pods/plan_seconds", 0.0),
              "offered": metrics.get("pods/plan_prompts", 0.0)}
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def sessions_by_uid(worker: LaneWorker) -> dict[str, list[int]]:
    """{uid: the sessions generated for it, in order}."""
    out: dict[str, list[int]] = {}
    for _, uid, _, session in worker.generated:
        out.setdefault(uid, []).append(session)
    return out


def budget_state(buffer) -> dict:
    """The buffer's ledger, by prompt (its rows' order follows TransferQueue's, which is not fixed), and the planners'
    state, as plain values (to compare two runs)."""
    ledger, budget = buffer.ledger, buffer.budget
    stats = ledger.stats(ledger.ids.sort().values)
    columns = {name: value.tolist() for name, value in vars(stats).items() if torch.is_tensor(value)}
    planners = {} if budget is None else {name: _plain(planner.state_dict()) for name, planner in
                                          (("which", budget.which), ("how_many", budget.how_many))
                                          if planner is not None}  # (a planner may be falsy: Pilot-Commit's buffer)
    return {"ledger": columns, **planners}


def _plain(value):
    if torch.is_tensor(value):
        return value.tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value
