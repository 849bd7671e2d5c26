"""The guide's planner (docs/guides/writing-a-planner.md, examples/near_half_planner.py) as a user runs it: defined in
its own module, registered by importing it, run by name under PODSTrainer and TRL's asynchronous worker with no edit
to pods-rl; its counts reach the sampling. The verl lane runs it through verl's manager
(tests/verl/test_writing_a_planner.py)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from pods_rl.budget.ledger import PromptLedger, prompt_key
from pods_rl.budget.planners import base, make_planner
from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE, GUIDE = ROOT / "examples" / "near_half_planner.py", ROOT / "docs" / "guides" / "writing-a-planner.md"
N, M, B = 4, 2, 2  # rollouts sampled per prompt (at most), kept per prompt, kept groups per step


@pytest.fixture
def near_half(monkeypatch):
    """The example module imported (registering ``near_half``) into a copy of the planner registry, and every plan
    it makes: [(ids, rollouts)]."""
    monkeypatch.setattr(base, "_PLANNERS", base._PLANNERS.copy())
    module = importlib.reload(importlib.import_module("examples.near_half_planner"))
    plans = []
    plan = module.NearHalf.plan

    def recorded(self, ids, ledger, **kwargs):
        out = plan(self, ids, ledger, **kwargs)
        plans.append((out.ids.clone(), out.rollouts.clone()))
        return out

    monkeypatch.setattr(module.NearHalf, "plan", recorded)
    return module, plans


def test_the_guide_shows_the_example_module_as_it_is():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert EXAMPLE.read_text() in blocks


def test_the_planner_counts_by_the_ledgers_pass_rate_and_refuses_bad_knobs(near_half):
    ledger = PromptLedger()
    ledger.record(torch.tensor([0, 1, 2]), torch.tensor([[1.0] * 4, [1.0, 0.0] * 2, [0.0] * 4]), step=0)
    plan = make_planner("near_half", min_n=2, max_n=8).plan(torch.tensor([0, 1, 2, 3]), ledger, n=6)
    assert plan.rollouts.tolist() == [2, 8, 2, 6]  # solved, half, never, unseen (n)
    with pytest.raises(ValueError, match=r"^near_half min_n=3, max_n=2: need integers 1 <= min_n <= max_n$"):
        make_planner("near_half", min_n=3, max_n=2)


# ---- PODSTrainer -------------------------------------------------------------------------------------------------
def solved_by_parity(prompts, completions, **kwargs):
    """Even prompts always solved, odd ones by the completion's text (about half the time)."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        i = int(prompt[-1]["content"].split("+")[0])
        text = completion[0]["content"] if isinstance(completion, list) else completion
        out.append(1.0 if i % 2 == 0 else float(sum(map(ord, text)) % 2))
    return out


def test_podstrainer_runs_the_users_planner_by_name(tmp_path, tiny_model_dir, near_half):
    """Two passes over 4 prompts: each step samples what the planner counted (in [m, n]); the second pass,
    which the ledger knows, gives the always-solved prompts m and no prompt more than n."""
    _, plans = near_half
    args = PODSConfig(output_dir=str(tmp_path / "out"), use_cpu=True, seed=1, learning_rate=1e-2, max_steps=4,
                      max_completion_length=4, num_generations=N, downsample_to=M, per_device_train_batch_size=B * M,
                      logging_steps=1, report_to="none", save_strategy="no", beta=0.0, bf16=False,
                      dataloader_num_workers=0, shuffle_dataset=False, rollout_planner="near_half",
                      rollout_planner_args={"min_n": M, "max_n": N, "window": 4})
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+{i}="}] for i in range(4)]})
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          reward_funcs=[solved_by_parity], args=args, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.train()
    sampled = [row["pods/rollouts_sampled"] for row in trainer.state.log_history if "pods/rollouts_sampled" in row]
    assert len(plans) == len(sampled) == 4
    assert sampled == [float(rollouts.sum()) for _, rollouts in plans]
    assert [r.tolist() for _, r in plans[:2]] == [[N, N], [N, N]]  # the first pass: nothing recorded, n each
    evens = {prompt_key([{"role": "user", "content": f"{i}+{i}="}]) for i in (0, 2)}
    for ids, rollouts in plans[2:]:  # the second: an always-solved (even) prompt gets min_n = m
        assert [int(c) for i, c in zip(ids.tolist(), rollouts.tolist(), strict=True) if i in evens] == [M]


# ---- TRL's asynchronous worker -----------------------------------------------------------------------------------
def test_the_async_worker_runs_the_users_planner_by_name(tmp_path, monkeypatch, tiny_model_dir, near_half):
    """The module named by pods_rule_module (imported where the worker's child builds its loop), the planner by
    pods_rollout_planner: each group gets its planned count by top-ups, scored once each, and keeps m."""
    pytest.importorskip("trl.experimental.async_grpo")
    from tests.test_async_budget import budget_loop, pushed
    from tests.test_async_pods import SCORED, close_loop, run_loops

    _, plans = near_half
    SCORED.clear()
    loop = budget_loop(tmp_path, monkeypatch, tiny_model_dir, ["mixed", "flat"], pods_m=M, pods_groups_per_step=2,
                       pods_rule_module="examples.near_half_planner", pods_rollout_planner="near_half",
                       pods_rollout_planner_args={"min_n": 2, "max_n": 8, "window": 8})
    # The worker draws windows ahead of its records (how far is a race): a ledger that knows both prompts already
    # (their scripted outcomes: "mixed" 6 of 8, "flat" 0 of 8) makes every window's plan the same.
    loop.budget.budget.ledger.record(torch.tensor([0, 1]), torch.tensor([[0.0, 1, 0, 1, 1, 1, 1, 1], [0.0] * 8]),
                                     step=0)
    try:
        rows_by_group = run_loops(loop, groups=6)
    finally:
        close_loop(loop)
    assert plans and all(rollouts.tolist() == [6, 2] for _, rollouts in plans)  # 2 + round(6 x 4 x 3/4 x 1/4); 2
    planned = [count for _, rollouts in plans for count in rollouts.tolist()]  # [6, 2, 6, 2, ...]
    for group_id in range(6):
        samples = rows_by_group[group_id]
        count = int(samples[0].metrics["pods/rollouts_planned"])
        assert count == planned[group_id] == loop.sampled[group_id]
        assert sorted(j for g, j in SCORED if g == group_id) == list(range(count))
        assert len(samples) == M
    assert any("pods/rollouts_planned_per_prompt" in m for m in pushed(loop))
