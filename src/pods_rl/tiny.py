"""The embedded tiny model, built locally (no hub): a byte-level tokenizer, random tiny causal LMs, the shipped copy.

    make_tokenizer()                 -> tokenizer (one token per byte, <think>/<answer> tags, chat template)
    build_random_model(out_dir, ...) -> Path  (random Qwen2/Llama + tokenizer, for fast tests)
    model_path()                     -> Path  (the copy shipped in pods_rl/assets/tiny)

Its SFT build (`pods build-tiny`) is ``pods_rl.engines.trl.sft.build_tiny``: TRL trains it."""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
# Role markers are special (generation prompt tokens are skipped on decode); the reasoning/answer tags are
# ordinary added tokens so that they survive `decode(..., skip_special_tokens=True)` and reach the rewards.
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
# The pre-tokenizer of Qwen2Tokenizer. transformers 5 loads any `model_type: qwen2` checkpoint's tokenizer as
# Qwen2Tokenizer, which rebuilds the pipeline (NFC + this split + ByteLevel) around the saved vocabulary; using
# the very same pipeline here makes the tokenizer identical whichever class AutoTokenizer picks.
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_alphabet() -> list[str]:
    """The 256 printable stand-ins of GPT-2 byte-level BPE, in byte order (space -> 'Ġ', newline -> 'Ċ')."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    others = iter(range(256, 512))  # the rest, in byte order, from 256 up
    return [chr(byte) if byte in printable else chr(next(others)) for byte in range(256)]


# Compact chat template: `<s><|system|>SYS\n<|user|>Q\n<|assistant|>A</s>`. Only assistant turns end with eos,
# so generation stops at eos; `add_generation_prompt` appends the assistant marker.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

ASSETS_DIR = Path(__file__).resolve().parent / "assets" / "tiny"


def make_tokenizer():
    """The byte-level, merge-free ``PreTrainedTokenizerFast``: 267 ids (4 special, 256 bytes, 3 roles, 4 tags).

    Any string round-trips; it reloads identically, also as the Qwen2Tokenizer transformers forces on qwen2."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in _byte_alphabet():
        vocab[ch] = len(vocab)
    # BPE without merges = one token per byte (the byte-level pre-tokenizer maps bytes to the alphabet).
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"],
        additional_special_tokens=ROLE_TOKENS,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
        padding_side="left",
    )
    tokenizer.add_tokens(TAG_TOKENS, special_tokens=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(tokenizer, arch: str, hidden_size: int, num_layers: int, num_heads: int | None,
                 max_position_embeddings: int = 512):
    """A Qwen2Config / LlamaConfig sized for CPU: intermediate 4 x hidden, head dim 32 (vLLM's CPU minimum)."""
    from transformers import LlamaConfig, Qwen2Config

    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    if hidden_size < 8 or num_layers < 1:
        raise ValueError(f"hidden_size must be >= 8 and num_layers >= 1, got {hidden_size}, {num_layers}")
    if num_heads is not None and num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads} (or leave it out for head dim 32)")
    num_heads = num_heads or max(1, hidden_size // 32)
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    )
    config_cls = Qwen2Config if arch == "qwen2" else LlamaConfig
    return config_cls(**common)


def build_random_model(out_dir, arch: str = "qwen2", hidden_size: int = 32, num_layers: int = 2,
                       num_heads: int | None = None, seed: int = 0) -> Path:
    """Save a random tiny causal LM (Qwen2 or Llama, ~30k parameters by default) and the tokenizer; returns the dir."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    tokenizer = make_tokenizer()
    config = tiny_config(tokenizer, arch, hidden_size, num_layers, num_heads)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def model_path() -> Path:
    """Path of the tiny model shipped inside the package (``pods_rl/assets/tiny``), HF format."""
    if not (ASSETS_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the embedded tiny model is missing from {ASSETS_DIR}; rebuild it with "
            f"`pods build-tiny --out {ASSETS_DIR}` (or reinstall pods-rl)"
        )
    return ASSETS_DIR


def sampled_accuracy(model, tokenizer, task, split: str = "test", num_problems: int = 200, k: int = 4,
                     temperature: float = 1.0, max_new_tokens: int = 48, batch_size: int = 256,
                     seed: int = 0) -> dict:
    """{"accuracy", "format", "num_problems", "k", "temperature"} of ``model`` with ``k`` samples per problem.

    ``temperature=0`` decodes greedily (k forced to 1)."""
    import torch

    dataset = task.load(split, limit=num_problems)
    greedy = temperature == 0
    k = 1 if greedy else k
    prompts = [p for p in dataset["prompt"] for _ in range(k)]  # (num_problems * k,)
    answers = [a for a in dataset["answer"] for _ in range(k)]
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
             if isinstance(p, list) else p for p in prompts]
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    model.eval()
    correct, formatted = [], []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=False).to(model.device)
            generate_kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature,
                                                                         top_k=0, top_p=1.0)
            output_ids = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                        **generate_kwargs)
            completions = tokenizer.batch_decode(output_ids[:, batch["input_ids"].shape[1] :],
                                                 skip_special_tokens=True)
            for completion, answer in zip(completions, answers[start : start + batch_size]):
                score = task.score(completion, answer)
                correct.append(score["correct"])
                formatted.append(score["format"])
    return {"accuracy": sum(correct) / len(correct), "format": sum(formatted) / len(formatted),
            "num_problems": len(dataset), "k": k, "temperature": temperature}


def corrupt_solution(solution: str, rng) -> str:
    """``solution`` with its final result (and the answer) off by a random 1..10: ``47+8=55`` -> ``47+8=52``."""
    head, _, tail = solution.rpartition("=")
    value = int(tail.split("</think>")[0])
    wrong = value + rng.choice([d for d in range(-10, 11) if d])
    return f"{head}={wrong}</think><answer>{wrong}</answer>"
