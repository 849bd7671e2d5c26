"""Helpers of the verl lane: verl's real config, its real trainer classes, and rollouts written into TransferQueue in
verl's own format (imported by the tests as ``verl_lane``; fixtures live in conftest.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import torch

SAMPLER = ("trainer.v1.sampler.custom_sampler.path=pkg://pods_rl.engines.verl.replay_buffer",
           "trainer.v1.sampler.custom_sampler.name=PODSReplayBuffer")


def verl_config(*overrides: str):
    """verl's own ``ppo_trainer`` config composed by Hydra with ``overrides`` (as `python3 -m
    verl.trainer.main_ppo ...` would, minus the launch)."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def pods_overrides(m: int, n: int, *extra: str, train_batch_size: int = 4, ppo_mini_batch_size: int = 1,
                   estimator: str = "grpo") -> list[str]:
    """Overrides for a small PODS run: ``train_batch_size`` prompts of n rollouts per step, m kept of each, actor
    (and critic) mini-batches of ``ppo_mini_batch_size x n`` kept rows (verl's unit)."""
    return [f"algorithm.adv_estimator={estimator}", f"data.train_batch_size={train_batch_size}",
            f"actor_rollout_ref.rollout.n={n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={ppo_mini_batch_size}",
            f"critic.ppo_mini_batch_size={ppo_mini_batch_size}", *SAMPLER, f"+trainer.v1.sampler.sampler_kwargs.m={m}",
            *extra]


def make_trainer(*overrides: str, mode: str = "sync"):
    """verl's real trainer class for ``mode``, constructed from the config: its ``__init__`` builds the replay
    buffer through ``PPOTrainer._build_replay_buffer`` (no workers: those need GPUs)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    if not any(o.startswith("trainer.v1.trainer_mode=") for o in overrides):
        overrides = (f"trainer.v1.trainer_mode={mode}", *overrides)
    config = verl_config(*overrides)
    return get_trainer_cls(mode)(config)


def put_group(rewards, *, partition: str = "train", lengths=None, sessions=None, outputs: int = 1,
              status: str = "finished", global_steps: int = 0, with_rewards: bool = True,
              dataset_index: int | None = None) -> str:
    """Write one prompt group into TransferQueue as verl's rollout does (AgentLoopWorkerTQ): each session's
    outputs under ``{uid}_{session}_{index}`` with verl's own ``AgentLoopOutput.as_dict()`` fields (the reward on
    the last response token of ``rm_scores``) and tags, then the prompt's status. Returns the uid.

    ``lengths``: response tokens per session (default 4 + session); ``sessions``: session ids (default 0..n-1;
    fewer make a ragged group); ``outputs``: outputs per session (multi-output agent loops; every output carries
    the session's reward, as verl copies it); ``dataset_index``: the prompt's dataset index,
    stored with every rollout as
    verl's agent loop stores the dataset row's fields (RLHFDataset's ``index``, from ``extra_info.index``).
    """
    from transfer_queue import kv_batch_put, kv_put
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    uid = str(uuid.uuid4())
    sessions = list(range(len(rewards))) if sessions is None else list(sessions)
    lengths = [4 + s for s in sessions] if lengths is None else list(lengths)
    keys, fields, tags = [], [], []
    for session, reward, length in zip(sessions, rewards, lengths, strict=True):
        for index in range(outputs):
            prompt_ids = [1, 2, 3]
            output = AgentLoopOutput(prompt_ids=prompt_ids, response_ids=[5 + (i % 7) for i in range(length)],
                                     response_mask=[1] * length, reward_score=float(reward) if with_rewards else None,
                                     metrics=AgentLoopMetrics())
            sample = output.as_dict()
            sample["input_ids"] = torch.cat([sample["prompts"], sample["responses"]])
            sample["attention_mask"] = torch.ones_like(sample["input_ids"])
            sample["position_ids"] = torch.arange(sample["input_ids"].numel())
            sample["loss_mask"] = sample["response_mask"]
            sample["uid"] = uid
            sample["session_id"] = session
            if dataset_index is not None:
                sample["index"] = dataset_index
            keys.append(f"{uid}_{session}_{index}")
            fields.append(sample)
            tags.append({"status": "success", "prompt_len": len(prompt_ids), "response_len": length,
                         "seq_len": len(prompt_ids) + length, "global_steps": global_steps,
                         "min_global_steps": global_steps, "max_global_steps": global_steps})
    kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id=partition)
    kv_put(key=uid, partition_id=partition, tag={"is_prompt": True, "status": status, "global_steps": global_steps})
    return uid


def keys_by_uid(keys) -> dict[str, list[str]]:
    """``{uid: [session ids as ints]}`` for ``{uid}_{session}_{index}`` keys (each session once)."""
    out: dict[str, list[int]] = {}
    for key in keys:
        uid, session, _ = key.rsplit("_", 2)
        if int(session) not in out.setdefault(uid, []):
            out[uid].append(int(session))
    return {uid: sorted(s) for uid, s in out.items()}


def stored_keys(partition: str = "train") -> set[str]:
    """Every key TransferQueue holds in ``partition`` (trajectories and prompt statuses)."""
    import transfer_queue as tq

    return set((tq.kv_list(partition) or {}).get(partition, {}))
