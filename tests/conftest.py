"""Shared fixtures: everything offline, tiny models built in the test session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
# The tests use TRL's experimental features on purpose (rollout_func, environment_factory, the asynchronous
# trainer): TRL's notice that they are experimental, once per use, tells them nothing.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# Under pytest-xdist (`make test`: one worker per core) each worker gets its share of the cores: torch's default of
# a thread per core in every worker oversubscribes them, and its spinning threads then make steps several times slower.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# Optional engines have their own test lanes (tests/<lane>/), each run by .ci/run in that engine's own
# environment: `python -m pytest -q --lane vllm tests/vllm`. The main suite never collects them, so it needs
# neither engine installed. gpu_image: the GPU preset end to end on CPU, with the GPU image's versions.
ENGINE_LANES = ("vllm", "verl", "deepspeed", "gpu_image")
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
    monkeypatch.setattr(ds_module, "_RULES", ds_module._RULES.copy())


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory):
    """A random Gemma 3 vision-language model (~19k parameters) and its processor, saved to disk."""
    import torch
    import trl
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
    )

    from pods_rl.tiny import make_tokenizer

    tokenizer = make_tokenizer()
    tokenizer.add_tokens(["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<image_soft_token>",
                          "<end_of_image>"], special_tokens=True)
    tokenizer._set_model_specific_special_tokens(special_tokens={
        "boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"})
    template = (Path(trl.__file__).parent / "chat_templates" / "gemma3.jinja").read_text()
    tokenizer.chat_template = template
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 32, "width": 32}),
                                tokenizer=tokenizer, chat_template=template, image_seq_length=4)
    token = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        text_config=dict(vocab_size=len(tokenizer), num_hidden_layers=2, hidden_size=16, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=32, layer_types=None,
                         max_position_embeddings=512, sliding_window=64),
        vision_config=dict(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                           image_size=32, patch_size=8),
        mm_tokens_per_image=4, image_token_index=token("<image_soft_token>"), boi_token_index=token("<start_of_image>"),
        eoi_token_index=token("<end_of_image>"), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-gemma3")
    Gemma3ForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)
    return out
