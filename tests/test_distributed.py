"""Two processes on CPU (gloo) under `accelerate launch`: whole groups per process, equal kept rows per rank, and a
SIGTERM seen by one rank stops both at the same step."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "distributed_pods.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("oversample, pilot", [(1, 0), (2, 0), (1, 2)])
def test_two_process_pods_run(tmp_path, tiny_model_dir, oversample, pilot):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # `--multi_gpu` selects accelerate's torchrun launcher; with no GPU, torch.distributed falls back to gloo
    # (`--cpu` would pick the single-process launcher).
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()),
           str(SCRIPT), str(tiny_model_dir), str(out), str(oversample), str(pilot)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in records] == [2, 2]
    # Rank 1 alone got SIGTERM at step 2 of 3: both ranks stopped there (the graceful stop agrees across ranks).
    assert [(r["stopped_at"], r["stop_signal"]) for r in records] == [(2, "SIGTERM"), (2, "SIGTERM")]
    for record in records:
        # 2 steps; per step each rank trains on 2 prompts x m=2 kept rollouts.
        assert record["loss_rows"] == [4, 4]
        for prompts, kept in zip(record["generated_prompts"], record["kept_prompts"]):
            # Each rank generated whole groups: 2 * oversample prompts x n=6 rollouts, each prompt's rows together.
            assert len(prompts) == 12 * oversample
            groups = [prompts[i:i + 6] for i in range(0, len(prompts), 6)]
            assert all(len(set(g)) == 1 for g in groups)
            # The update got 2 whole kept groups (m=2 rows each) of this rank's own prompts.
            kept_groups = [kept[i:i + 2] for i in range(0, 4, 2)]
            assert len(kept) == 4 and all(len(set(g)) == 1 for g in kept_groups)
            assert all(any(p in g[0] for p in set(prompts)) for g in kept_groups)
        # Advantages are normalized within each kept group: they sum to ~0 per group.
        for sums in record["advantages_group_sums"]:
            assert all(abs(s) < 1e-3 for s in sums)
    # Both ranks ran the same generation rounds and counted the same (global) rollouts; adaptive: n=6 from a
    # pilot of 2 is at most 3 rounds, and fewer than 6 per prompt when a group mixed early.
    assert records[0]["rounds"] == records[1]["rounds"]
    assert records[0]["rollouts_sampled"] == records[1]["rollouts_sampled"]
    prompts_per_step = 2 * 2 * oversample
    for rounds, sampled in zip(records[0]["rounds"], records[0]["rollouts_sampled"]):
        if pilot:
            assert 1 < rounds <= 3 and 2 * prompts_per_step <= sampled <= 6 * prompts_per_step + 2 * 2 * 4
        else:
            assert rounds == 1 and sampled == 6 * prompts_per_step
    # The two ranks worked on different prompts in each step.
    for step in range(2):
        assert set(records[0]["generated_prompts"][step]).isdisjoint(records[1]["generated_prompts"][step])


SERVER_ROUNDS = Path(__file__).parent / "scripts" / "vllm_server_rounds.py"


def test_adaptive_rounds_through_vllm_server_mode_pair_every_completion_with_its_prompt(tmp_path, tiny_model_dir):
    """TRL's vLLM server mode (its own gather / de-duplicate / broadcast, a stand-in for the HTTP client) with
    adaptive rounds whose sizes differ between the ranks: all ranks use one num_generations per round (TRL
    de-duplicates every rank's prompts by the main process's), and every completion belongs to its row's prompt."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), str(SERVER_ROUNDS), str(tiny_model_dir), str(out)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    # Rank 0's rounds are full and uniform, rank 1's padded: the same number of rounds, one agreed size each.
    assert records[0]["round_generations"] == records[1]["round_generations"]
    assert len(records[0]["round_generations"]) > 2  # the pilot and more rounds, over 2 steps
    for record in records:
        assert record["pairs"]
        for question, answer in record["pairs"]:
            assert answer.startswith(question.split("*")[0]), (question, answer)  # the stand-in's own answer
