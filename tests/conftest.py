"""Shared fixtures: everything offline, tiny models built in the test session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialized tiny Qwen2 causal LM + the project's real char tokenizer, on disk."""
    from pods_rl.tiny import build_random_model

    return build_random_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2", hidden_size=32, num_layers=2)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A randomly initialized tiny Llama causal LM + the project's real char tokenizer, on disk."""
    from pods_rl.tiny import build_random_model

    return build_random_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", hidden_size=32, num_layers=2)
