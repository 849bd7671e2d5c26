"""What pods-rl adds to a vLLM server that an asynchronous trainer updates: a weight reload that also reaches a tied
LM head.

Start the server with ``--worker-extension-cls pods_rl.engines.vllm.server.ReloadWeightsExtension`` (and
``VLLM_SERVER_DEV_MODE=1``); ``pods_rl.engines.trl_async.cpu.DirectoryWeightTransfer`` then calls
``pods_reload_weights`` through ``POST /collective_rpc``. This module imports nothing heavy: vLLM imports it in every
worker.

Why not vLLM's own ``reload_weights`` alone (vLLM 0.31, seen on its CPU build): it reloads layer by layer and re-runs
each reloaded layer's ``process_weights_after_loading``. A model whose LM head is tied to its embedding
(``tie_word_embeddings``, the tiny models here, small Qwen models) has no ``lm_head.weight`` in the checkpoint, so the
head layer is never reloaded: its weight shares the embedding's storage and takes the new values, but on CPU the head
computes from a copy packed at startup (``dispatch_cpu_unquantized_gemm(remove_weight=False)``), so the server keeps
sampling with the *initial* head. (vLLM's reload module lists tied weights among its limitations.) Measured before the
fix: after a reload the server's log-probs were exactly those of the new body with the old head.
"""

from __future__ import annotations


class ReloadWeightsExtension:
    """vLLM worker extension (``--worker-extension-cls``): its methods are added to every vLLM worker and can be
    called by name through ``collective_rpc``."""

    def pods_reload_weights(self, weights_path: str) -> list[str]:
        """``reload_weights`` from the safetensors files in ``weights_path`` (checkpoint names and format), then
        ``refresh_tied_head``. Returns the names of the heads refreshed."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return refresh_tied_head(self.model_runner.get_model())


def refresh_tied_head(model) -> list[str]:
    """Re-tie a vLLM model's LM head to its input embedding and re-run the head's ``process_weights_after_loading``
    (on CPU: repack the head from the current weight). Returns ``["lm_head"]``, or ``[]`` when the head is not tied."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return []
    if not hasattr(head, "weight") or not hasattr(embed, "weight"):
        return []  # a pipeline stage without the head or the embedding
    if head.weight is not embed.weight:
        head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return ["lm_head"]
