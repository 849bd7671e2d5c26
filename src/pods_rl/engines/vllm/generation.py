"""Generation for evaluation with vLLM (CUDA, or vLLM's CPU build): ``pods eval``'s ``--backend vllm``.

``pods_rl.generation`` chooses the backend and re-exports ``generate_vllm``; only this module imports vLLM there.
"""

from __future__ import annotations

import gc
import tempfile

import numpy as np

from pods_rl.engines.vllm import cpu as vllm_cpu
from pods_rl.models import is_adapter_dir, load_model_and_tokenizer

__all__ = ["generate_vllm"]


def generate_vllm(model_path, prompt_ids: list[list[int]], k: int, temperature: float, max_new_tokens: int,
                  seed: int, trust_remote_code: bool = False) -> tuple[list[list[str]], np.ndarray]:
    """Sample ``k`` completions per prompt with vLLM; returns as ``generate_hf``. PEFT adapters are merged into a
    temporary full model first; the engine is torn down afterwards so the next checkpoint can load."""
    import torch
    from vllm import LLM, SamplingParams  # an optional dependency: only this backend needs it
    from vllm.platforms import current_platform

    memory = {"kv_cache_memory_bytes": vllm_cpu.EVAL_KV_CACHE_BYTES} if current_platform.is_cpu() else {}

    tmp = None
    if is_adapter_dir(model_path):
        model, tokenizer = load_model_and_tokenizer(model_path, device="cpu", trust_remote_code=trust_remote_code)
        tmp = tempfile.TemporaryDirectory(prefix="pods-merged-")
        model.save_pretrained(tmp.name)
        tokenizer.save_pretrained(tmp.name)
        del model
        model_path = tmp.name
    greedy = temperature == 0
    try:
        llm = LLM(model=str(model_path), seed=seed, dtype="auto", enable_prefix_caching=True,
                  trust_remote_code=bool(trust_remote_code), **memory)
        # No per-request seed: SamplingParams(seed=s) gives every prompt the same random stream, so sample j of
        # all prompts would be drawn together (correlated repeats, inflated standard error). The engine's seed
        # (LLM(seed=...)) keeps the evaluation reproducible.
        params = SamplingParams(n=1 if greedy else k, temperature=float(temperature), top_p=1.0,
                                max_tokens=max_new_tokens)
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=True)
        completions = [[o.text for o in out.outputs] for out in outputs]
        lengths = np.array([[len(o.token_ids) for o in out.outputs] for out in outputs], dtype=int)
    finally:
        try:
            del llm
        except NameError:
            pass
        gc.collect()
        torch.cuda.empty_cache()
        if tmp is not None:
            tmp.cleanup()
    if greedy:
        completions = [c * k for c in completions]
        lengths = np.repeat(lengths, k, axis=1)
    return completions, lengths
