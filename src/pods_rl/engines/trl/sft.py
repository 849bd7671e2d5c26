"""The embedded tiny model's build (`pods build-tiny`): random init, then TRL's ``SFTTrainer`` on `arithmetic`.

The tokenizer, the model's shape and the shipped copy are ``pods_rl.tiny``'s; ``build_tiny`` trains it (``run_sft``).
"""

from __future__ import annotations

import json
import os
import platform
import time
from contextlib import contextmanager
from pathlib import Path

from pods_rl import tiny
from pods_rl.tasks.arithmetic import ArithmeticTask
from pods_rl.tiny import corrupt_solution, make_tokenizer, sampled_accuracy, tiny_config


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
    out_dir = Path(out_dir) if out_dir is not None else tiny.ASSETS_DIR
    task_kwargs = dict(task_kwargs or {})
    task = ArithmeticTask(**task_kwargs)
    tokenizer = make_tokenizer()
    with _torch_threads(threads):
        set_seed(seed)
        model_config = tiny_config(tokenizer, arch, hidden_size, num_layers, num_heads)
        model = AutoModelForCausalLM.from_config(model_config)
        num_params = sum(p.numel() for p in model.parameters())
        log(f"build-tiny: {arch} hidden={hidden_size} layers={num_layers} heads={model_config.num_attention_heads} "
            f"(head dim {hidden_size // model_config.num_attention_heads}; {num_params:,} parameters) on {device}; "
            f"SFT {steps} steps x {batch_size} on arithmetic {task_kwargs or '(defaults)'}, "
            f"{wrong_fraction:.0%} of the targets with a wrong result")
        train_dataset = _sft_dataset(task, min(steps * batch_size, task.train_size), wrong_fraction, seed)

        start = time.time()
        model, steps_done = run_sft(model, tokenizer, train_dataset, steps, batch_size, learning_rate, seed, device,
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


def run_sft(model, tokenizer, train_dataset, steps: int, batch_size: int, learning_rate: float, seed: int,
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
