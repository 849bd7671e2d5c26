"""Shared fixtures: everything offline, tiny models built in the test session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# Optional engines have their own test lanes (tests/<lane>/), each run by .ci/run in that engine's own
# environment: `python -m pytest -q --lane vllm tests/vllm`. The main suite never collects them, so it needs
# neither engine installed.
ENGINE_LANES = ("vllm", "verl", "deepspeed")
_TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser):
    parser.addoption("--lane", choices=ENGINE_LANES, default=None,
                     help="collect one engine lane's tests (tests/<lane>/); needs that engine installed")


def pytest_ignore_collect(collection_path, config):
    """Leave out every engine lane's directory except the one asked for with --lane."""
    lane = config.getoption("--lane")
    path = Path(collection_path).resolve()
    for engine in ENGINE_LANES:
        if engine != lane and (path == _TESTS / engine or _TESTS / engine in path.parents):
            return True
    return None


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


@pytest.fixture(scope="session")
def two_step_run(tmp_path_factory, tiny_model_dir):
    """A finished 2-step `pods train` run (cpu/smoke) with checkpoint-1, checkpoint-2 and final/; tests copy it
    (``shutil.copytree``) before changing it."""
    from pods_rl.commands.train import main as train_main

    run_dir = tmp_path_factory.mktemp("two-steps") / "run"
    assert train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir",
                       str(run_dir), "--eval_before_after", "false", "--max_steps", "2", "--save_strategy", "steps",
                       "--save_steps", "1"]) == 0
    return run_dir


@pytest.fixture
def scratch_registry(monkeypatch):
    """A copy of the down-sampling rule registry, so rules registered by a test vanish after it (a rule left behind
    would be run by every later test that loops over ``available_rules()``)."""
    import importlib

    ds_module = importlib.import_module("pods_rl.downsample")  # (`pods_rl.downsample` is also the function)
    monkeypatch.setattr(ds_module, "_RULES", dict(ds_module._RULES))
    monkeypatch.setattr(ds_module, "_FEATURE_RULES", set(ds_module._FEATURE_RULES))
