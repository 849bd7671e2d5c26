"""The embedded tiny model, built locally (no hub): a byte-level tokenizer, random tiny causal LMs, the SFT build.

    make_tokenizer()                 -> tokenizer (one token per byte, <think>/<answer> tags, chat template)
    build_random_model(out_dir, ...) -> Path  (random Qwen2/Llama + tokenizer, for fast tests)
    build_tiny(out_dir, ...)         -> Path  (random init + TRL SFT on `arithmetic`; `pods build-tiny`)
    model_path()                     -> Path  (the copy shipped in pods_rl/assets/tiny)
"""

from __future__ import annotations

import json
import os
import platform
import time
from contextlib import contextmanager
from pathlib import Path

from pods_rl.tasks.arithmetic import ArithmeticTask

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
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    stand_in, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            stand_in[byte] = chr(byte)
        else:
            stand_in[byte] = chr(256 + extra)
            extra += 1
    return [stand_in[byte] for byte in range(256)]


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

    Any string round-trips; it reloads identically, also as the Qwen2Tokenizer transformers forces on qwen2.
    """
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


def _tiny_config(tokenizer, arch: str, hidden_size: int, num_layers: int, num_heads: int | None,
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
    config = _tiny_config(tokenizer, arch, hidden_size, num_layers, num_heads)
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

    ``temperature=0`` decodes greedily (k forced to 1).
    """
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


def _sft_dataset(task, size: int, wrong_fraction: float, seed: int):
    """SFTTrainer prompt/completion pairs (prompt -> worked solution), ``wrong_fraction`` of them corrupted."""
    import random

    from datasets import Dataset

    rng = random.Random(f"sft-noise-{seed}")
    problems = task.load("train", limit=size)
    solutions = [corrupt_solution(s, rng) if rng.random() < wrong_fraction else s for s in problems["solution"]]
    completions = [[{"role": "assistant", "content": solution}] for solution in solutions]
    return Dataset.from_dict({"prompt": problems["prompt"], "completion": completions})


# Long because build, SFT, evaluation and build_info read one set of settings, in order.
def build_tiny(out_dir=None, steps: int = 4000, batch_size: int = 64, learning_rate: float = 3e-3,
               wrong_fraction: float = 0.3, arch: str = "qwen2", hidden_size: int = 64, num_layers: int = 4,
               seed: int = 0,
               eval_problems: int = 200, eval_samples: int = 4, task_kwargs: dict | None = None,
               log=print, num_heads: int | None = None, max_seconds: float | None = None,
               device: str | None = None, threads: int | None = 1) -> Path:
    """Build the embedded tiny model: random init, then a short TRL SFT on `arithmetic`; returns ``out_dir``.

    Partly right on purpose, so RL has reward variance: ``wrong_fraction`` of the targets have a wrong result
    (default build: ~51% sampled at T=1, ~85% greedy). Accuracy jumps with ``steps`` rather than rising smoothly
    (benchmarks/results/cpu-2core-amd-epyc/tiny_model/). Saves the model, tokenizer and ``build_info.json``;
    same seed, ``threads`` (1: core-count independent), device and software reproduce the shipped model.
    ``max_seconds`` stops the SFT early.
    """
    import torch
    from transformers import AutoModelForCausalLM, set_seed

    device = _check_build(wrong_fraction, device, steps, batch_size, learning_rate, threads)
    out_dir = Path(out_dir) if out_dir is not None else ASSETS_DIR
    task_kwargs = dict(task_kwargs or {})
    task = ArithmeticTask(**task_kwargs)
    tokenizer = make_tokenizer()
    with _torch_threads(threads):
        set_seed(seed)
        model_config = _tiny_config(tokenizer, arch, hidden_size, num_layers, num_heads)
        model = AutoModelForCausalLM.from_config(model_config)
        num_params = sum(p.numel() for p in model.parameters())
        log(f"build-tiny: {arch} hidden={hidden_size} layers={num_layers} heads={model_config.num_attention_heads} "
            f"(head dim {hidden_size // model_config.num_attention_heads}; {num_params:,} parameters) on {device}; "
            f"SFT {steps} steps x {batch_size} on arithmetic {task_kwargs or '(defaults)'}, "
            f"{wrong_fraction:.0%} of the targets with a wrong result")
        train_dataset = _sft_dataset(task, min(steps * batch_size, task.train_size), wrong_fraction, seed)

        start = time.time()
        model, steps_done = _run_sft(model, tokenizer, train_dataset, steps, batch_size, learning_rate, seed, device,
                                     max_seconds)
        sft_seconds = time.time() - start

        accuracy = {
            "sampled_t1": sampled_accuracy(model, tokenizer, task, num_problems=eval_problems, k=eval_samples,
                                           temperature=1.0, seed=seed),
            "greedy": sampled_accuracy(model, tokenizer, task, num_problems=eval_problems, temperature=0),
        }
        log(f"build-tiny: SFT took {sft_seconds:.0f} s; held-out accuracy sampled(T=1, k={eval_samples}) "
            f"{accuracy['sampled_t1']['accuracy']:.3f}, greedy {accuracy['greedy']['accuracy']:.3f}")

        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)  # safetensors
        tokenizer.save_pretrained(out_dir)
        build_info = {
            "arch": arch, "hidden_size": hidden_size, "num_layers": num_layers,
            "num_heads": model_config.num_attention_heads,
            "head_dim": hidden_size // model_config.num_attention_heads, "num_parameters": num_params,
            "seed": seed, "sft": {"steps": steps, "steps_done": steps_done, "max_seconds": max_seconds,
                                  "batch_size": batch_size, "learning_rate": learning_rate,
                                  "lr_scheduler": "cosine", "wrong_fraction": wrong_fraction,
                                  "seconds": round(sft_seconds, 1), "device": device},
            "task": {"name": "arithmetic", "digits": task.digits, "operands": task.operands, "ops": task.ops,
                     "seed": task.seed, "train_problems": len(train_dataset)},
            "held_out_accuracy": accuracy, "versions": _versions(), "threads": torch.get_num_threads(),
        }
        (out_dir / "build_info.json").write_text(json.dumps(build_info, indent=2) + "\n")
        log(f"build-tiny: saved to {out_dir}")
        return out_dir


def _check_build(wrong_fraction: float, device: str | None, steps: int, batch_size: int, learning_rate: float,
                 threads: int | None) -> str:
    """``build_tiny``'s settings checked before anything is built; returns the device (default: cuda if any)."""
    import torch

    if not 0.0 <= wrong_fraction < 1.0:
        raise ValueError(f"wrong_fraction must be in [0, 1), got {wrong_fraction}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device; use --device cpu")
    if steps < 1 or batch_size < 1 or learning_rate <= 0:
        raise ValueError(f"steps, batch_size and learning_rate must be positive, got {steps}, {batch_size}, "
                         f"{learning_rate}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return device


def _run_sft(model, tokenizer, train_dataset, steps: int, batch_size: int, learning_rate: float, seed: int,
             device: str, max_seconds: float | None):
    """(model ready to sample, steps taken) after TRL's ``SFTTrainer`` on ``train_dataset`` (cosine schedule)."""
    import tempfile

    from transformers import GenerationConfig
    from trl import SFTConfig, SFTTrainer

    # transformers 5.2x renamed gradient_checkpointing to activation_checkpointing (warning on the old name)
    no_checkpointing = {"activation_checkpointing" if "activation_checkpointing" in SFTConfig.__dataclass_fields__
                        else "gradient_checkpointing": False}
    with tempfile.TemporaryDirectory() as scratch_dir:
        config = SFTConfig(
            output_dir=scratch_dir, max_steps=steps, per_device_train_batch_size=batch_size,
            learning_rate=learning_rate, lr_scheduler_type="cosine", warmup_steps=max(1, steps // 20),
            weight_decay=0.0, max_length=256, seed=seed, data_seed=seed, use_cpu=device == "cpu",
            bf16=False, tf32=device == "cuda", **no_checkpointing, save_strategy="no", report_to=[],
            logging_steps=max(1, steps // 10), disable_tqdm=True, dataset_num_proc=None,
        )
        callbacks = [_stop_after(max_seconds)] if max_seconds else None
        trainer = SFTTrainer(model=model, args=config, train_dataset=train_dataset, processing_class=tokenizer,
                             callbacks=callbacks)
        with _deterministic(device == "cuda"):
            trainer.train()
    model = trainer.model.eval()  # evaluated where it trained
    model.config.use_cache = True  # the trainer turns the KV cache off; generation needs it back
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model, trainer.state.global_step


def _versions() -> dict:
    """The library versions a build records."""
    import torch

    return {"torch": torch.__version__, "transformers": _version("transformers"), "trl": _version("trl"),
            "python": platform.python_version()}


@contextmanager
def _torch_threads(threads: int | None):
    """Run the block with ``threads`` torch CPU threads (None: as they are), then restore the previous count."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _deterministic(on: bool):
    """Deterministic kernels where torch has them (warn elsewhere), so a GPU rebuild reproduces; then restore."""
    if not on:
        yield
        return
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _stop_after(seconds: float):
    """A TrainerCallback that ends training after ``seconds`` of it (the step in progress completes)."""
    from transformers import TrainerCallback

    class StopAfter(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            if time.time() - self.start > seconds:
                control.should_training_stop = True

    return StopAfter()


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)
