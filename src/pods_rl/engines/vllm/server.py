"""A vLLM worker extension for servers an asynchronous trainer updates: a weight reload that also reaches a tied head.

Start the server with ``--worker-extension-cls pods_rl.engines.vllm.server.ReloadWeightsExtension`` (and
``VLLM_SERVER_DEV_MODE=1``); ``DirectoryWeightTransfer`` calls ``pods_reload_weights`` through ``collective_rpc``.
Imports nothing heavy: vLLM imports it in every worker.

Why: vLLM's ``reload_weights`` (0.31) reloads only the layers in the checkpoint; a tied LM head has no
``lm_head.weight`` there, and on CPU the head computes from a copy packed at startup, so the server kept sampling
with the *initial* head (measured: new body, old head).
"""

from __future__ import annotations


class ReloadWeightsExtension:
    """vLLM worker extension: its methods join every worker, callable by name through ``collective_rpc``."""

    def pods_reload_weights(self, weights_path: str) -> list[str]:
        """``reload_weights`` from ``weights_path``'s safetensors, then ``refresh_tied_head``; the heads refreshed."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return refresh_tied_head(self.model_runner.get_model())


def refresh_tied_head(model) -> list[str]:
    """Re-tie the LM head to the embedding and repack it; ``["lm_head"]``, or ``[]`` when not tied."""
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
