"""The embedded tiny model: tokenizer, random tiny models, the shipped copy, and the SFT build path."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pods_rl import tiny
from pods_rl.engines.trl import sft
from pods_rl.tasks.arithmetic import ArithmeticTask

MESSAGES = [
    {"role": "system", "content": "Use <think></think><answer></answer>."},
    {"role": "user", "content": "47+8"},
    {"role": "assistant", "content": "<think>47+8=55</think><answer>55</answer>"},
]


def test_tokenizer_round_trips_and_tags_are_single_non_special_tokens():
    tok = tiny.make_tokenizer()
    text = "<think>12-34=-22\n</think> <answer>-22</answer>\tHéllo, 世界! ~`|{}"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text  # tags survive TRL's decode
    for tag in tiny.TAG_TOKENS:
        assert len(tok(tag).input_ids) == 1
    assert len(tok("12+34").input_ids) == 5  # one token per character
    assert {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id} == {0, 1, 2}


def test_chat_template_generation_prompt_and_eos():
    tok = tiny.make_tokenizer()
    prompt = tok.apply_chat_template(MESSAGES[:2], add_generation_prompt=True, tokenize=False)
    assert prompt == "<s><|system|>Use <think></think><answer></answer>.\n<|user|>47+8\n<|assistant|>"
    full = tok.apply_chat_template(MESSAGES, tokenize=False)
    assert full.startswith(prompt) and full.endswith("<answer>55</answer></s>")
    ids = tok.apply_chat_template(MESSAGES, tokenize=True)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    with pytest.raises(Exception, match="unknown role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_build_random_model_loads_with_auto_classes_and_generates(tmp_path, arch):
    path = tiny.build_random_model(tmp_path / arch, arch=arch, seed=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == arch
    assert sum(p.numel() for p in model.parameters()) < 100_000
    # Whatever class AutoTokenizer picks (transformers forces Qwen2Tokenizer on qwen2), ids must not change.
    reference = tiny.make_tokenizer()
    text = tok.apply_chat_template(MESSAGES, tokenize=False)
    assert tok(text).input_ids == reference(text).input_ids
    inputs = tok.apply_chat_template(MESSAGES[:2], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=5, do_sample=True, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_build_random_model_is_deterministic_and_validates(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(tiny.build_random_model(tmp_path / "a", seed=3))
    b = AutoModelForCausalLM.from_pretrained(tiny.build_random_model(tmp_path / "b", seed=3))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name
    with pytest.raises(ValueError, match="arch"):
        tiny.build_random_model(tmp_path / "c", arch="gpt2")
    with pytest.raises(ValueError, match="divisible"):
        tiny.build_random_model(tmp_path / "d", hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="num_heads"):
        tiny.build_random_model(tmp_path / "e", num_heads=0)


@pytest.mark.parametrize("hidden_size, heads", [(16, 1), (32, 1), (64, 2), (128, 4)])
def test_default_head_dim_is_32_which_vllm_cpu_serves(hidden_size, heads):
    # vLLM's CPU attention refuses head dim 16 (issue #24); the parameter count does not depend on the heads.
    config = tiny.tiny_config(tiny.make_tokenizer(), "qwen2", hidden_size, 2, None)
    assert (config.num_attention_heads, config.num_key_value_heads) == (heads, heads)
    four_heads = tiny.tiny_config(tiny.make_tokenizer(), "qwen2", hidden_size, 2, 4 if hidden_size >= 64 else 1)
    count = [sum(p.numel() for p in AutoModelForCausalLM.from_config(c).parameters()) for c in (config, four_heads)]
    assert count[0] == count[1]


def test_shipped_model_loads_and_solves_some_problems():
    path = tiny.model_path()
    info = json.loads((path / "build_info.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.use_cache  # generation speed depends on the KV cache
    assert sum(p.numel() for p in model.parameters()) == info["num_parameters"] < 3_000_000
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    assert head_dim == info["head_dim"] == 32  # vLLM's CPU build serves 32, not 16 (issue #24)
    result = tiny.sampled_accuracy(model, tok, ArithmeticTask(), num_problems=40, temperature=0)
    assert result["format"] > 0.9
    assert 0.1 < result["accuracy"] < 0.95  # partly right: room for RL, but clearly trained


def test_model_path_reports_a_missing_copy(monkeypatch, tmp_path):
    monkeypatch.setattr(tiny, "ASSETS_DIR", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="build-tiny"):
        tiny.model_path()


def test_build_tiny_end_to_end_small(tmp_path):
    threads_before = torch.get_num_threads()
    out = sft.build_tiny(tmp_path / "tiny", steps=3, batch_size=8, hidden_size=16, num_layers=1,
                         eval_problems=4, eval_samples=2, threads=1, log=lambda *_: None)
    assert torch.get_num_threads() == threads_before  # the build's thread count does not leak
    info = json.loads((out / "build_info.json").read_text())
    assert info["threads"] == 1
    assert info["sft"]["steps"] == 3 and info["hidden_size"] == 16
    assert (info["num_heads"], info["head_dim"]) == (1, 16)
    assert 0.0 <= info["held_out_accuracy"]["sampled_t1"]["accuracy"] <= 1.0
    assert (out / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.use_cache
    assert (AutoTokenizer.from_pretrained(out)("<answer>").input_ids
        == [tiny.make_tokenizer().convert_tokens_to_ids("<answer>")])


def test_build_tiny_takes_heads_and_a_time_limit(tmp_path):
    """The GPU preset's knobs: head count (head_dim >= 32) and an SFT time limit that ends before --steps."""
    out = sft.build_tiny(tmp_path / "t", steps=1000, batch_size=4, hidden_size=64, num_layers=1, num_heads=2,
                         max_seconds=0.01, device="cpu", eval_problems=2, eval_samples=1, log=lambda *_: None)
    info = json.loads((out / "build_info.json").read_text())
    assert info["num_heads"] == 2 and AutoModelForCausalLM.from_pretrained(out).config.num_attention_heads == 2
    assert 1 <= info["sft"]["steps_done"] < 1000 and info["sft"]["device"] == "cpu"
    with pytest.raises(ValueError, match="divisible by num_heads"):
        sft.build_tiny(tmp_path / "u", steps=1, hidden_size=64, num_heads=3, device="cpu", log=lambda *_: None)


def test_cli_rejects_bad_arguments(capsys):
    from pods_rl.commands import build_tiny

    assert build_tiny.main(["--steps", "0", "--out", "/nonexistent/never-written"]) == 2
    assert "positive" in capsys.readouterr().err
    assert build_tiny.main(["--num-heads", "0", "--out", "/nonexistent/never-written"]) == 2
    assert "num_heads" in capsys.readouterr().err
    assert build_tiny.main(["--threads", "0", "--out", "/nonexistent/never-written"]) == 2
    assert "threads" in capsys.readouterr().err
