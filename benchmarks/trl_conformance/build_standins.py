"""Build local stand-ins for the hub models and data that TRL's GRPOTrainer tests load, without downloading.

    python benchmarks/trl_conformance/build_standins.py WORKDIR --trl-snapshot GIT_DIR

writes, under WORKDIR/trl-internal-testing/ (the tests load these ids, and both `transformers` and `datasets` treat
an id that names an existing local directory as that directory, so pytest is run from WORKDIR):

- tiny-Qwen2ForCausalLM-2.5: Qwen2ForCausalLM with the shapes of TRL's generator script
  (scripts/generate_tiny_models/for_causal_lm/qwen2_for_causal_lm_2_5.py: hidden 8, 4 heads, 2 KV heads,
  2 layers, intermediate 32, bfloat16, TRL's init), with the stand-in tokenizer below;
- tiny-Qwen2ForSequenceClassification-2.5: Qwen2ForSequenceClassification, num_labels=1, hidden 16 (same source,
  for_sequence_classification/qwen2_for_sequence_classification_2_5.py);
- zen: the `trl-internal-testing/zen` dataset, every config and split, produced by running TRL's own
  scripts/generate_zen_dataset.py from the snapshot with its `push_to_hub` redirected to local parquet files (the
  dataset's README declares the configs, as on the hub).

The real tiny models carry Qwen2.5-32B-Instruct's 151k-token tokenizer, which cannot be downloaded here. The
stand-in is a byte-level tokenizer (one token per UTF-8 byte, Qwen2's pre-tokenizer) with Qwen2.5's special tokens
(`<|endoftext|>` pad, `<|im_start|>`, `<|im_end|>` eos, no bos), its tool-call tags, and Qwen2.5's exact chat
template (TRL ships it as trl/chat_templates/qwen2_5.jinja); the generation config copies Qwen2.5-Instruct's
sampling defaults. Model weights are random (as on the hub), so only shapes and plumbing matter.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

ORG = "trl-internal-testing"
CAUSAL_LM = "tiny-Qwen2ForCausalLM-2.5"
SEQ_CLS = "tiny-Qwen2ForSequenceClassification-2.5"

# Qwen2.5's special tokens (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct), in its id order.
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_NONSPECIAL = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                   "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
# Qwen2.5's pre-tokenizer split (what transformers' Qwen2Tokenizer uses).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _byte_alphabet() -> list[str]:
    """GPT-2 byte-level BPE's 256 printable stand-ins, in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    out, extra = [], 0
    for byte in range(256):
        if byte in printable:
            out.append(chr(byte))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def qwen25_chat_template() -> str:
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    return path.read_text()


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN_SPECIAL[1:],
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
        split_special_tokens=False,
    )
    tokenizer.add_tokens(QWEN_NONSPECIAL, special_tokens=False)
    tokenizer.chat_template = qwen25_chat_template()
    return tokenizer


def generation_config(tokenizer):
    from transformers import GenerationConfig

    # Qwen2.5-Instruct's generation_config.json, with this tokenizer's ids.
    return GenerationConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05,
    )


def init_weights_tiny_model(model):
    """TRL's init for its tiny test models (scripts/generate_tiny_models/_common.py)."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Linear):
            if module.bias is not None:
                nn.init.zeros_(module.bias)
            nn.init.xavier_uniform_(module.weight)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def _qwen2_config(tokenizer, **shape):
    from transformers import Qwen2Config

    # Qwen2.5-32B-Instruct's config.json, scaled down as TRL's scripts do (shape overrides).
    return Qwen2Config(
        vocab_size=len(tokenizer), max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, use_sliding_window=False, sliding_window=131072, max_window_layers=64,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=tokenizer.eos_token_id,
        **shape,
    )


def build_models(org_dir: Path, seed: int = 0) -> None:
    import torch
    from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

    tokenizer = make_tokenizer()
    gen = generation_config(tokenizer)
    specs = [
        (CAUSAL_LM, Qwen2ForCausalLM, dict(hidden_size=8, num_attention_heads=4, num_key_value_heads=2,
                                          num_hidden_layers=2, intermediate_size=32)),
        (SEQ_CLS, Qwen2ForSequenceClassification, dict(num_labels=1, hidden_size=16, num_attention_heads=4,
                                                        num_key_value_heads=2, num_hidden_layers=2,
                                                        intermediate_size=32)),
    ]
    for name, cls, shape in specs:
        torch.manual_seed(seed)
        config = _qwen2_config(tokenizer, **shape)
        model = cls(config).to(dtype=torch.bfloat16)
        init_weights_tiny_model(model)
        model.generation_config = gen
        out = org_dir / name
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        gen.save_pretrained(out)
        with torch.no_grad():  # smoke test, as TRL's scripts do
            logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
        assert not torch.isnan(logits).any(), name
        print(f"built {out} ({sum(p.numel() for p in model.parameters())} parameters, vocab {len(tokenizer)})")


def build_zen(org_dir: Path, trl_git_dir: str) -> None:
    """Run the snapshot's scripts/generate_zen_dataset.py with push_to_hub writing local parquet files."""
    from datasets import DatasetDict

    source = subprocess.run(["git", f"--git-dir={trl_git_dir}", "show", "HEAD:scripts/generate_zen_dataset.py"],
                            check=True, capture_output=True, text=True).stdout
    out = org_dir / "zen"
    out.mkdir(parents=True, exist_ok=True)
    configs = []

    def save_locally(self, repo_id, config_name="default", **kwargs):
        files = []
        for split, ds in self.items():
            path = out / config_name / f"{split}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(path))
            files.append({"split": split, "path": f"{config_name}/{split}.parquet"})
        configs.append({"config_name": config_name, "data_files": files})

    module = types.ModuleType("generate_zen_dataset")
    sys.modules[module.__name__] = module  # its @dataclass looks its module up
    exec(compile(source, "generate_zen_dataset.py", "exec"), module.__dict__)
    original = DatasetDict.push_to_hub
    DatasetDict.push_to_hub = save_locally
    try:
        module.main(test_size=0.1, push_to_hub=True, repo_id=f"{ORG}/zen")
    finally:
        DatasetDict.push_to_hub = original
    lines = ["---", "configs:"]
    for config in configs:
        lines.append(f"- config_name: {config['config_name']}")
        lines.append("  data_files:")
        for f in config["data_files"]:
            lines.append(f"  - split: {f['split']}")
            lines.append(f"    path: {f['path']}")
    lines += ["---", "", "Local stand-in for trl-internal-testing/zen (built by benchmarks/trl_conformance/"
              "build_standins.py from TRL's scripts/generate_zen_dataset.py).", ""]
    (out / "README.md").write_text("\n".join(lines))
    print(f"built {out} ({len(configs)} configs: {', '.join(c['config_name'] for c in configs)})")


def check(workdir: Path) -> None:
    """Load the stand-ins the way the tests do, from WORKDIR, offline."""
    import os

    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        ds = load_dataset(f"{ORG}/zen", "standard_prompt_only", split="train")
        conv = load_dataset(f"{ORG}/zen", "conversational_prompt_only", split="test")
        tok = AutoTokenizer.from_pretrained(f"{ORG}/{CAUSAL_LM}")
        AutoModelForCausalLM.from_pretrained(f"{ORG}/{CAUSAL_LM}")
        AutoModelForSequenceClassification.from_pretrained(f"{ORG}/{SEQ_CLS}", num_labels=1)
        text = tok.apply_chat_template(conv[0]["prompt"], tokenize=False, add_generation_prompt=True)
        assert tok.decode(tok(text)["input_ids"]) == text
        print(f"check: zen standard_prompt_only train has {len(ds)} rows; {type(tok).__name__} "
              f"eos={tok.eos_token!r} pad={tok.pad_token!r}; chat prompt {text!r}")
    finally:
        os.chdir(cwd)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--trl-snapshot", required=True, help="git dir of a huggingface/trl snapshot")
    args = parser.parse_args(argv)
    org_dir = args.workdir / ORG
    build_models(org_dir)
    build_zen(org_dir, args.trl_snapshot)
    (org_dir / "BUILT_BY.json").write_text(json.dumps({"script": "benchmarks/trl_conformance/build_standins.py",
                                                        "python": sys.version.split()[0]}) + "\n")
    check(args.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
