"""What lets TRL's asynchronous GRPO trainer run without CUDA: a weight transfer without NCCL, and CPU stand-ins for
its two CUDA-only construction steps (peak FLOPs, tree attention)::

    transfer = DirectoryWeightTransfer(args.vllm_server_base_url, "runs/weights")
    with async_trainer_on_cpu():
        trainer = AsyncGRPOTrainer(..., rollout_worker=worker, weight_transfer=transfer)

Nothing here knows PODS: the same pieces run TRL's own asynchronous GRPO on a CPU.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

__all__ = ["EXTENSION", "DirectoryWeightTransfer", "wait_for_health", "async_trainer_on_cpu", "torch_tree_attention",
           "register_torch_tree_attention"]

logger = logging.getLogger("pods_rl")
EXTENSION = "pods_rl.engines.vllm.server.ReloadWeightsExtension"  # the vLLM server's --worker-extension-cls


# --- Weight transfer without NCCL -----------------------------------------------------------------------------------


def wait_for_health(url: str, wait_s: float, process=None) -> None:
    """Poll ``url``'s ``/health`` until 200; TimeoutError after ``wait_s``, RuntimeError if ``process`` exits."""
    import time

    import requests

    deadline = time.monotonic() + wait_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited ({process.returncode}) before answering /health")
        try:
            if requests.get(f"{url.rstrip('/')}/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the vLLM server at {url} did not answer /health in {wait_s:.0f} s")
        time.sleep(1)


class DirectoryWeightTransfer:
    """TRL's ``WeightTransferProtocol`` through a directory and the vLLM server's own weight reload (no NCCL: CPU).

    Each sync writes ``directory/model.safetensors`` and has the server reload it (``pods_reload_weights`` of
    ``EXTENSION``), then resets its prefix cache. The server needs ``VLLM_SERVER_DEV_MODE=1``, the extension and read
    access to ``directory``; ``timeout``: seconds for one reload."""

    def __init__(self, server_url: str, directory: str | os.PathLike, timeout: float = 1800.0):
        self.server_url = server_url.rstrip("/")
        self.directory = Path(directory).absolute()
        self.timeout = timeout
        self.syncs = 0

    def post(self, path: str, timeout: float, **kwargs: Any):
        """POST to the server; a ``RuntimeError`` naming the endpoint when it fails (404: not in dev mode)."""
        import requests

        response = requests.post(f"{self.server_url}{path}", timeout=timeout, **kwargs)
        if response.status_code == 404:
            raise RuntimeError(f"the vLLM server at {self.server_url} has no {path}: start it with "
                               "VLLM_SERVER_DEV_MODE=1")
        if response.status_code != 200:
            raise RuntimeError(f"vLLM server {path} failed: {response.status_code} {response.text[:500]}")
        return response

    def init_weight_transfer(self, wait_s: float = 240.0) -> None:
        """Wait (at most ``wait_s``) for the server's ``/health``; create the directory."""
        wait_for_health(self.server_url, wait_s)
        self.directory.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        """Freeze the server's requests before the weights change (TRL's ``POST /pause?mode=keep``)."""
        self.post("/pause", 300, params={"mode": "keep"})

    def send_weights(self, iterator) -> None:
        """Write the ``(name, tensor)`` stream to ``directory/model.safetensors`` and have the server reload it."""
        from safetensors.torch import save_file

        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in iterator}
        written = self.directory / "model.safetensors.partial"
        save_file(tensors, str(written), metadata={"format": "pt"})
        written.replace(self.directory / "model.safetensors")
        try:
            self.post("/collective_rpc", self.timeout, json={
                "method": "pods_reload_weights", "kwargs": {"weights_path": str(self.directory)},
                "timeout": self.timeout})
        except RuntimeError as err:
            if "pods_reload_weights" in str(err) and "attribute" in str(err):
                raise RuntimeError(f"{err}\nStart the vLLM server with --worker-extension-cls {EXTENSION}") from None
            raise
        self.syncs += 1
        try:
            self.post("/reset_prefix_cache", 60)
        except RuntimeError as err:
            logger.warning("pods-rl: the vLLM server kept its prefix cache after a weight reload: %s", err)

    def resume(self) -> None:
        """Let the server generate again (``POST /resume``)."""
        self.post("/resume", 300)

    def destroy(self) -> None:
        """Remove the weights file (the server has loaded it)."""
        (self.directory / "model.safetensors").unlink(missing_ok=True)


# --- Running TRL's asynchronous trainer on CPU (no CUDA) ----------------------------------------------------------


def torch_tree_attention(module, query, key, value, attention_mask, *, tree_kv_index, tree_cu_seqlens_q,
                         tree_cu_seqlens_k, tree_max_seqlen_q=None, tree_max_seqlen_k=None, scaling=None,
                         sliding_window=None, softcap=None, **kwargs):
    """TRL's tree attention in plain torch off CUDA (CUDA tensors go to TRL's kernel), same contract: segment s's
    queries are rows ``cu_q[s]:cu_q[s+1]``, its keys ``tree_kv_index[cu_k[s]:cu_k[s+1]]``, causal bottom-right."""
    if query.is_cuda:
        from trl.experimental.async_grpo.packing import tree_attention

        return tree_attention(module, query, key, value, attention_mask, tree_kv_index=tree_kv_index,
                              tree_cu_seqlens_q=tree_cu_seqlens_q, tree_cu_seqlens_k=tree_cu_seqlens_k,
                              tree_max_seqlen_q=tree_max_seqlen_q, tree_max_seqlen_k=tree_max_seqlen_k,
                              scaling=scaling, sliding_window=sliding_window, softcap=softcap, **kwargs)
    q = query[0]  # (heads, tokens, dim)
    k, v = (x[0].index_select(1, tree_kv_index) for x in (key, value))  # (kv heads, path rows, dim)
    k, v = (x.repeat_interleave(q.shape[0] // x.shape[0], dim=0) for x in (k, v))  # grouped-query attention
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    out = torch.empty_like(q)
    cu_q, cu_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        qs, ks, vs = q[:, cu_q[s]:cu_q[s + 1]], k[:, cu_k[s]:cu_k[s + 1]], v[:, cu_k[s]:cu_k[s + 1]]
        scores = (qs @ ks.transpose(-1, -2)) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        rows = torch.arange(qs.shape[1]).unsqueeze(1) + (ks.shape[1] - qs.shape[1])  # each query's own key
        cols = torch.arange(ks.shape[1]).unsqueeze(0)
        visible = (cols <= rows) & ((cols > rows - sliding_window) if sliding_window else True)
        out[:, cu_q[s]:cu_q[s + 1]] = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ vs
    return out.transpose(0, 1).unsqueeze(0), None


def register_torch_tree_attention() -> None:
    """Register ``torch_tree_attention`` under TRL's tree-attention name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from trl.experimental.async_grpo.packing import TREE_ATTENTION

    AttentionInterface.register(TREE_ATTENTION, torch_tree_attention)
    AttentionMaskInterface.register(TREE_ATTENTION, lambda **kwargs: None)


@contextmanager
def async_trainer_on_cpu():
    """CPU stand-ins, while ``AsyncGRPOTrainer`` is constructed without CUDA, for ``get_peak_flops_per_device``
    (None: MFU off) and ``register_tree_attention`` (``torch_tree_attention``, registered globally). A no-op with
    CUDA; yields whether the stand-ins are in place."""
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module

    if torch.cuda.is_available():
        yield False
        return
    stand_ins = {"get_peak_flops_per_device": lambda accelerator, dtype: None,
                 "register_tree_attention": register_torch_tree_attention}
    originals = {name: getattr(trainer_module, name) for name in stand_ins if hasattr(trainer_module, name)}
    for name in originals:  # a TRL without one of them (before tree packing, MFU) needs no stand-in for it
        setattr(trainer_module, name, stand_ins[name])
    try:
        yield True
    finally:
        for name, original in originals.items():
            setattr(trainer_module, name, original)
