"""The shipped verl recipes (recipes/verl/*.sh) against verl itself: their overrides compose in verl's Hydra config,
pass verl's `validate_config`, and build the PODS buffer through verl's trainer without a refusal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from verl_lane import make_trainer, verl_config

from pods_rl.engines.verl.replay_buffer import PODSReplayBuffer
from pods_rl.recipes import RECIPES_DIR

pytestmark = [pytest.mark.verl, pytest.mark.timeout(240)]


@pytest.mark.parametrize("script, estimator", [("gsm8k_grpo_pods.sh", "grpo"), ("gsm8k_ppo_pods.sh", "gae")])
def test_recipe_is_a_valid_verl_config(script, estimator, tiny_model_dir):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    env = {**os.environ, "DRY_RUN": "1", "MODEL_PATH": str(tiny_model_dir),  # no hub here: a local tiny Qwen2
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", str(RECIPES_DIR / "verl" / script)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    overrides = result.stdout.splitlines()
    config = verl_config(*overrides)
    assert config.algorithm.adv_estimator == estimator and need_critic(config) == (estimator == "gae")
    assert not need_reference_policy(config)  # no KL term, as the paper
    # validate_config's last check imports vLLM (a GPU build) only to read its allowed LoRA ranks (64 is one of
    # them): name another rollout engine for this call so that it runs every other check on CPU.
    validate_config(verl_config(*overrides, "actor_rollout_ref.rollout.name=sglang"), use_reference_policy=False,
                    use_critic=need_critic(config))
    trainer = make_trainer(*overrides)
    buffer = trainer.replay_buffer
    assert isinstance(buffer, PODSReplayBuffer)
    assert ((buffer.pods.n, buffer.pods.m, buffer.pods.rule, buffer.pods.response_length)
        == (64, 16, "max_variance", 512))
