"""Selection without host synchronization: on the common path (a built-in rule on float32 or 16-bit rewards, no
tiebreak) `downsample_deferred` reads no value back from the device, so a CUDA pipeline is not held by it.

On CPU a torch function mode stands for the device: it fails on every call that reads a tensor's value into Python
(``bool()``, ``.item()``, ``.tolist()``, ``.numpy()``, ``int()``, ``float()``, ``torch.equal``, ``nonzero``), and
numpy's CPU sort is switched off so that the rules take the path they take on CUDA. On a GPU,
``torch.cuda.set_sync_debug_mode("error")`` checks the same thing on the real device.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

from pods_rl.downsample import downsample, downsample_deferred, max_variance_reference, raise_unless_ok

HOST_READS = {torch.Tensor.__bool__, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy,
              torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.equal, torch.nonzero,
              torch.Tensor.nonzero, torch.Tensor.cpu}


class NoHostReads(TorchFunctionMode):
    """Fails on any torch call that would move a tensor's value to the host (a synchronization on CUDA)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            raise AssertionError(f"host read on the selection path: {getattr(func, '__name__', func)}")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def device_path(monkeypatch):
    module = importlib.import_module("pods_rl.downsample")  # (the package's `downsample` is the function)
    monkeypatch.setattr(module, "_numpy", None)  # torch.sort, as on CUDA


def test_the_detector_catches_a_host_read():
    with NoHostReads(), pytest.raises(AssertionError, match="host read"):
        bool(torch.ones(3).all())
    with NoHostReads(), pytest.raises(AssertionError, match="host read"):
        torch.ones(3).sum().item()
    with NoHostReads(), pytest.raises(AssertionError, match="host read"):
        downsample(torch.rand(4, 8), 2)  # the eager form reads the check's flag once, at its end


@pytest.mark.parametrize("rule", ["max_variance", "max_reward", "random"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_common_path_reads_nothing_back(device_path, rule, dtype):
    rewards = (torch.rand(64, 16, generator=torch.Generator().manual_seed(0)) * 4).round() / 4  # ties, dyadic
    rewards = rewards.to(dtype)
    with NoHostReads():
        kept, ok = downsample_deferred(rewards, 4, rule, generator=torch.Generator().manual_seed(1))
        kept_all, ok_all = downsample_deferred(rewards, 16, rule)  # m = n keeps all
    assert ok.dim() == 0 and bool(ok) and bool(ok_all) and kept_all.shape == (64, 16)
    eager = downsample(rewards, 4, rule, generator=torch.Generator().manual_seed(1))
    assert torch.equal(kept, eager)
    if rule == "max_variance":  # exact: the paper's rule, one group at a time
        assert kept[:5].tolist() == [max_variance_reference(r, 4) for r in rewards[:5].double().tolist()]


@pytest.mark.parametrize("bad, message", [(float("nan"), "NaN in group"), (float("inf"), "infinite values"),
                                          (1e300, "spread too wide")])
def test_bad_rewards_are_flagged_and_raised_when_read(device_path, bad, message):
    rewards = torch.rand(4, 8, dtype=torch.float64 if bad == 1e300 else torch.float32)
    rewards[2, 3] = bad
    if bad == 1e300:
        rewards[2, 4] = -1e300
    kept, ok = downsample_deferred(rewards, 2)
    assert kept.shape == (4, 2) and not bool(ok)
    with pytest.raises(ValueError, match=message):
        raise_unless_ok(ok, rewards)
    with pytest.raises(ValueError, match=message):
        downsample(rewards, 2)
    rewards[2] = 0.5
    assert bool(downsample_deferred(rewards, 2)[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_synchronization_on_cuda():
    rewards = ((torch.rand(512, 64, device="cuda") * 4).round() / 4).float()  # (B, n)
    downsample_deferred(rewards, 16)  # warm-up: lazy initialization may synchronize once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for rule in ("max_variance", "max_reward", "random"):
            kept, ok = downsample_deferred(rewards, 16, rule, generator=torch.Generator("cuda").manual_seed(0))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool(ok) and kept.device.type == "cuda"
    assert torch.equal(downsample_deferred(rewards, 16)[0].cpu(), downsample(rewards.cpu(), 16))
