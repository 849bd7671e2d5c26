"""An asynchronous PODS run on CPU against a real vLLM server (issue #40 item 3).

A ``vllm serve`` process (vLLM's CPU build, dev mode) serves the tiny model over HTTP; TRL 1.16's
``AsyncGRPOTrainer`` trains with ``rollout_worker=`` the PODS worker (its child process samples n per prompt from the
server over HTTP, scores them, keeps m) and ``weight_transfer=`` ``DirectoryWeightTransfer`` (safetensors files and the
server's own weight-reload call instead of NCCL), constructed inside ``async_trainer_on_cpu`` (the CPU stand-ins for
TRL's two CUDA-only construction steps). The adaptive worker and Pilot-Commit's worker run against the same server.

What is checked, all of it for real: every group the trainer trains on (the rows of each micro-batch TRL's
``compute_loss`` takes, as its collator built them) has exactly m rows; the n scored rollouts of that group
(written by the reward function in
the worker's child) are n, and the kept rows are the m that ``pods_rl.downsample`` keeps from those n rewards; each
row's advantage is the one recomputed by hand on the kept m; and the weights reach the server: its greedy
completion of a fixed prompt changes, and its log-probs after training are the trained model's own.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")
pytest.importorskip("aiohttp")

import requests  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trl_trainer  # noqa: E402

from pods_rl.downsample import downsample  # noqa: E402
from pods_rl.engines.trl_async.cpu import (  # noqa: E402
    EXTENSION,
    DirectoryWeightTransfer,
    async_trainer_on_cpu,
)
from pods_rl.engines.trl_async.worker import pods_rollout_worker  # noqa: E402
from tests.vllm.server import free_port, serving  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

N, M = 6, 3  # rollouts sampled per prompt, kept per prompt
STEPS = 3
# Parses the tiny char tokenizer's replies (TRL's add_response_schema knows only the chat templates it ships).
CHAR_RESPONSE_TEMPLATE = {"defaults": {"role": "assistant"}, "start_anchor": "<|assistant|>",
                          "fields": {"content": {"close_pattern": r"</s>\s*", "content": "text"}}}
PROBE = [{"role": "user", "content": "12+7="}]


def logged_reward(completions, completion_ids, row, log_path, **kwargs):
    """Distinct characters of the reply (varied within a group); writes the group's n rollouts and rewards to
    ``log_path`` (it runs in the worker's child process, once per group, on all n)."""
    rewards = [float(len(set(c[0]["content"]))) for c in completions]
    log_group(log_path[0], row[0], completion_ids, rewards)
    return rewards


def log_group(log_path: str, row: int, completion_ids, rewards: list[float]) -> None:
    """Appends one scoring call (its row, completion ids and rewards) to ``log_path`` as a JSON line."""
    with open(log_path, "a") as log:
        log.write(json.dumps({"row": row, "completion_ids": [list(ids) for ids in completion_ids],
                              "rewards": rewards}) + "\n")


@pytest.fixture(scope="module")
def vllm_server(vllm_model_dir, tmp_path_factory):
    """``python -m vllm.entrypoints.openai.api_server`` on CPU, dev mode (``/pause``, ``/resume``,
    ``/collective_rpc``), pods-rl's reload extension; waits at most ``SERVER_START_S`` for ``/health``; killed (its
    process group) at the end."""
    log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(vllm_model_dir),
               "--dtype", "float32", "--port", str(port), "--host", "127.0.0.1", "--max-model-len", "256",
               "--max-num-seqs", "16", "--enforce-eager", "--worker-extension-cls", EXTENSION]
    url = f"http://127.0.0.1:{port}"
    with serving(command, url, log_path, env):
        yield url, str(vllm_model_dir), log_path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The trainer on one thread while it runs (as docs/guides/async.md's script does): the server's threads use the
    other core; with both on every core they fight for the two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def greedy(url: str, model: str, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    """The server's greedy completion of ``prompt_ids`` (8 tokens) and its log-probs."""
    response = requests.post(f"{url}/v1/completions", timeout=60, json={
        "model": model, "prompt": prompt_ids, "max_tokens": 8, "temperature": 0.0, "logprobs": 0,
        "return_token_ids": True, "ignore_eos": True})
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def model_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    start = len(prompt_ids)
    return torch.stack([logp[start + i - 1, token] for i, token in enumerate(completion_ids)])


def parity_reward(completions, row, log_path, **kwargs):
    """0 for the prompts of even rows (every group of theirs is all equal: an adaptive worker tops it up to n), the
    distinct characters of the reply for odd rows; writes each call's row and size to ``log_path``."""
    with open(log_path[0], "a") as log:
        log.write(json.dumps({"row": row[0], "scored": len(completions)}) + "\n")
    return [0.0 if r % 2 == 0 else float(len(set(c[0]["content"]))) for c, r in zip(completions, row, strict=True)]


def run_async_pods(url, model_dir, tmp_path, monkeypatch, reward=logged_reward, prompts=64, inflight=24, **pods):
    """Train ``STEPS`` steps; returns the rows (group id, completion ids, advantage, metrics) of each micro-batch
    the trainer's ``compute_loss`` took (as TRL's collator received them; the dataloader collates one micro-batch
    ahead, which is not trained), the n scored rollouts of each prompt, and the trainer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.response_template = CHAR_RESPONSE_TEMPLATE
    log_path = tmp_path / "groups.jsonl"
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}+{i % 7}="}] for i in range(prompts)],
                                 "row": list(range(prompts)), "log_path": [str(log_path)] * prompts})
    args = AsyncGRPOConfig(output_dir=str(tmp_path / "run"), num_generations=N, per_device_train_batch_size=2 * M,
                           gradient_accumulation_steps=1, max_steps=STEPS, learning_rate=0.05, bf16=False,
                           max_completion_length=12, temperature=1.0, token_budget=0, max_staleness=100,
                           weight_sync_steps=1, logging_steps=1, save_strategy="no", report_to=[],
                           # max_staleness=100 left this at 100 steps of rows (1200 requests at once): the CPU server
                           # dropped connections under that load, and a request dropped 3 times fails the worker
                           max_inflight_tasks=inflight,
                           vllm_server_base_url=url, dtype="float32", use_cpu=True)
    worker = pods_rollout_worker(model_dir, reward, args, dataset, tokenizer, pods_m=M, pods_rule="max_variance",
                                 **pods)
    collated, trained = [], []  # rows of each micro-batch the collator built; which of them compute_loss took
    collate, compute_loss = trl_trainer.DataCollatorForRollout.torch_call, AsyncGRPOTrainer.compute_loss

    def recording_collate(self, examples):
        (rows,) = examples
        collated.append([(s["group_id"], s["input_ids"][s["completion_mask"] == 1].tolist(), s["advantage"],
                          dict(s["metrics"])) for row in rows for s in row.samples])
        batch = collate(self, examples)
        batch["test_micro_batch"] = torch.full((self.num_processes,), len(collated) - 1)
        return batch

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        trained.append(collated[int(inputs["test_micro_batch"][0])])
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(trl_trainer.DataCollatorForRollout, "torch_call", recording_collate)
    monkeypatch.setattr(AsyncGRPOTrainer, "compute_loss", recording_compute_loss)
    transfer = DirectoryWeightTransfer(url, tmp_path / "weights")
    with async_trainer_on_cpu():
        trainer = AsyncGRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=dataset,
                                   processing_class=tokenizer, rollout_worker=worker, weight_transfer=transfer)
    trainer.train()
    assert transfer.syncs == 1 + STEPS  # the cold sync at train begin, then one per step (weight_sync_steps=1)
    groups = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    scored = defaultdict(list)  # row -> every scoring of it (a generation retried after a dropped connection
    for group in groups:        # is scored again, so a row can appear more than once)
        scored[group["row"]].append(group)
    return trained, scored, trainer


def test_async_pods_trains_against_a_real_vllm_server(vllm_server, tmp_path, monkeypatch):
    url, model_dir, server_log = vllm_server
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    probe = tokenizer.apply_chat_template(PROBE, add_generation_prompt=True, return_dict=False)
    before_ids, before_logps = greedy(url, model_dir, probe)
    initial = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    torch.testing.assert_close(torch.tensor(before_logps), model_logprobs(initial, probe, before_ids),
                               atol=2e-3, rtol=0)

    trained, scored, trainer = run_async_pods(url, model_dir, tmp_path, monkeypatch)

    # The trainer trained STEPS micro-batches (one per step), each of two whole groups of exactly M rows.
    assert len(trained) == STEPS, [len(batch) for batch in trained]
    rows_of = defaultdict(list)
    for batch in trained:
        assert len(batch) == 2 * M
        for group_id, completion, advantage, metrics in batch:
            rows_of[group_id].append((completion, advantage, metrics))
    assert len(rows_of) == 2 * STEPS and all(len(rows) == M for rows in rows_of.values()), \
        {g: len(rows) for g, rows in rows_of.items()}
    for group_id, rows in sorted(rows_of.items()):
        # ... selected by the rule from the N rollouts the worker scored for that prompt (the scoring whose rollouts
        # these are, when a retried generation scored the prompt twice)
        trained_completions = sorted(completion for completion, _, _ in rows)
        matches = []
        for group in scored[group_id]:
            assert len(group["completion_ids"]) == len(group["rewards"]) == N
            kept = downsample(torch.tensor([group["rewards"]], dtype=torch.float64), M, rule="max_variance")[0]
            if trained_completions == sorted(group["completion_ids"][i] for i in kept.tolist()):
                matches.append((group, kept.tolist()))
        assert matches, (f"group {group_id}: the trained rows are not the rule's m of any scoring of that prompt "
                         f"({len(scored[group_id])} scorings)")
        group, kept = matches[0]
        print(f"group {group_id}: n rewards {group['rewards']} -> trained rewards "
              f"{[metrics['reward'] for _, _, metrics in rows]}, advantages {[round(a, 4) for _, a, _ in rows]}")
        # ... with the advantages recomputed by hand on the kept M (TRL async's formula: population std)
        kept_rewards = [group["rewards"][i] for i in kept]
        mean = sum(kept_rewards) / M
        std = (sum((r - mean) ** 2 for r in kept_rewards) / M) ** 0.5
        for completion, advantage, metrics in rows:
            reward = group["rewards"][group["completion_ids"].index(completion)]
            assert metrics["reward"] == reward
            assert advantage == pytest.approx((reward - mean) / (std + 1e-8), abs=1e-9)
            assert metrics["pods/reward_all_mean"] == pytest.approx(sum(group["rewards"]) / N)

    # The weights reached the server: its greedy completion changed, and its log-probs are the trained model's.
    after_ids, after_logps = greedy(url, model_dir, probe)
    print(f"server greedy before: {before_ids} {before_logps}\nserver greedy after:  {after_ids} {after_logps}")
    trained_model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    loaded = trained_model.load_state_dict(trainer.model.state_dict(), strict=False)
    assert not loaded.missing_keys, loaded.missing_keys
    assert (after_ids, after_logps) != (before_ids, before_logps)
    assert not torch.allclose(model_logprobs(initial, probe, after_ids), torch.tensor(after_logps), atol=2e-3)
    torch.testing.assert_close(torch.tensor(after_logps), model_logprobs(trained_model, probe, after_ids),
                               atol=2e-3, rtol=0)


def test_adaptive_async_pods_tops_up_against_the_real_server(vllm_server, tmp_path, monkeypatch):
    """Adaptive rollouts (pilot 3 of n = 6, rounds of 3) against the server: the groups of even rows are all equal
    at every count, so the worker samples a second round of each from the server, scoring only the new rollouts,
    before keeping m; odd rows stop at their pilot when it is mixed. Every trained group has exactly m rows; which
    groups the trainer gets first is the queue's order (odd groups, one round, tend to come first)."""
    url, model_dir, _ = vllm_server
    # more prompts than the worker samples groups in the test, so that a row is one group (the dataset never cycles)
    trained, _, _ = run_async_pods(url, model_dir, tmp_path, monkeypatch, reward=parity_reward, pods_pilot=M,
                                   prompts=4096)
    calls = defaultdict(list)  # row (= group id) -> the sizes of its scoring calls, in order
    for line in (tmp_path / "groups.jsonl").read_text().splitlines():
        call = json.loads(line)
        calls[call["row"]].append(call["scored"])
    assert sum(map(len, calls.values())) < 4096  # fewer scoring calls (so groups) than prompts: no row repeats
    topped_up = [row for row, sizes in calls.items() if row % 2 == 0 and sizes == [M, M]]
    assert topped_up, dict(calls)  # the worker sampled a second round of all-equal groups from the server
    rows_of = defaultdict(list)
    for batch in trained:
        for group_id, _, advantage, metrics in batch:
            rows_of[group_id].append((advantage, metrics))
    assert len(rows_of) == 2 * STEPS, sorted(rows_of)
    for group_id, rows in sorted(rows_of.items()):
        assert len(rows) == M, (group_id, len(rows))
        sampled, rounds = rows[0][1]["pods/rollouts_sampled"], rows[0][1]["pods/rounds"]
        print(f"group {group_id}: {sampled:.0f} rollouts in {rounds:.0f} rounds; scoring calls {calls[group_id]}")
        assert sampled == M * rounds and rounds in (1, 2)
        assert calls[group_id] == [M] * int(rounds)  # each rollout scored once: the pilot, then the new round
        if group_id % 2 == 0:  # all equal: topped up to n, advantages 0
            assert (sampled, rows[0][1]["pods/frac_zero_std_pilot"]) == (N, 1.0)
            assert all(advantage == 0.0 for advantage, _ in rows)


def pilot_reward(completions, completion_ids, row, log_path, **kwargs):
    """A pilot (2 rollouts) by the row's class, the paper's three verdicts: rows 0 mod 3 mixed [1, 0] (passes), 1 mod 3
    [0, 0] (too hard), 2 mod 3 [1, 1] (solved: evicted); a commit (4 rollouts) 2 + the reply's distinct characters.
    Writes each call's row, completion ids and rewards to ``log_path``."""
    if len(completions) == 2:
        rewards = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]][row[0] % 3]
    else:
        rewards = [2.0 + len(set(c[0]["content"])) for c in completions]
    log_group(log_path[0], row[0], completion_ids, rewards)
    return rewards


def test_pilot_commit_in_the_worker_against_the_real_server(vllm_server, tmp_path, monkeypatch):
    """Pilot-Commit (pilot 2 + commit 4 = n) against the server, over 12 prompts the worker cycles through: only the
    pilots that pass get their 4 commit rollouts from the server, and only they train, m of the 6 kept by the rule
    and advantages recomputed on those m; the solved prompts are evicted and skipped when drawn again."""
    url, model_dir, _ = vllm_server
    trained, scored, trainer = run_async_pods(
        url, model_dir, tmp_path, monkeypatch, reward=pilot_reward, prompts=12, inflight=8,
        pods_prompt_planner="pilot_commit", pods_prompt_planner_args={"n_explore": 2, "n_commit": 4})
    for row, calls in scored.items():
        sizes = {len(call["rewards"]) for call in calls}
        # only passing pilots get commit rollouts (a pilot scored as the run stopped may have none yet)
        assert sizes <= ({2, 4} if row % 3 == 0 else {2}), (row, [len(c["rewards"]) for c in calls])
    rows_of = defaultdict(list)
    for batch in trained:
        for group_id, completion, advantage, metrics in batch:
            rows_of[group_id].append((completion, advantage, metrics))
    assert len(rows_of) == 2 * STEPS, sorted(rows_of)
    for group_id, rows in sorted(rows_of.items()):
        assert len(rows) == M
        metrics = rows[0][2]
        assert (metrics["pods/rollouts_sampled"], metrics["pods/rounds"], metrics["pods/pilot_rollouts"]) == (N, 2, 2)
        # the trained rows are the rule's m of a mixed row's pilot + commit (the scoring they came from)
        trained_completions = sorted(completion for completion, _, _ in rows)
        matches = []
        for row in range(0, 12, 3):
            pilots = [call for call in scored[row] if len(call["rewards"]) == 2]
            commits = [call for call in scored[row] if len(call["rewards"]) == 4]
            for pilot in pilots:
                for commit in commits:
                    ids, rewards = (pilot["completion_ids"] + commit["completion_ids"],
                                    pilot["rewards"] + commit["rewards"])
                    kept = downsample(torch.tensor([rewards], dtype=torch.float64), M, rule="max_variance")[0]
                    if trained_completions == sorted(ids[i] for i in kept.tolist()):
                        matches.append((ids, rewards, kept.tolist()))
        assert matches, f"committed group {group_id}: not the rule's m of any mixed row's pilot and commit"
        ids, rewards, kept = matches[0]
        kept_rewards = [rewards[i] for i in kept]
        mean = sum(kept_rewards) / M
        std = (sum((r - mean) ** 2 for r in kept_rewards) / M) ** 0.5
        for completion, advantage, row_metrics in rows:
            reward = rewards[ids.index(completion)]
            assert row_metrics["reward"] == reward
            assert advantage == pytest.approx((reward - mean) / (std + 1e-8), abs=1e-9)
    totals = defaultdict(float)
    for log in trainer.state.log_history:
        for key, value in log.items():
            if key.startswith("pods/") and key.endswith("_total"):
                totals[key] += value
    print(dict(totals), {row: [len(c["rewards"]) for c in calls] for row, calls in sorted(scored.items())})
    assert totals["pods/pilot_passed_total"] >= 2 * STEPS and totals["pods/pilot_too_hard_total"] >= 1
    assert max(rows_of) < totals["pods/pilot_passed_total"]  # committed ids count the commits: 0, 1, ...
    assert totals["pods/prompts_evicted_total"] >= 1 and totals["pods/prompts_skipped_evicted_total"] >= 1
    # an evicted prompt is drawn again only while its first pilot waits for its verdict; a too-hard one every pass
    solved, too_hard = (sum(len(scored[row]) for row in range(first, 12, 3)) for first in (2, 1))
    assert solved < too_hard, (solved, too_hard)
