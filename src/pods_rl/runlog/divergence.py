"""Divergence: a run whose numbers stopped being numbers is stopped before it writes them into a checkpoint.

``DivergenceGuard`` checks the gradients before each optimizer step (one NaN gradient makes every weight NaN in one
AdamW step), the trainable weights after it and the logged loss / grad norm / reward / KL, and raises
``TrainingDiverged``; `pods train` prints ``divergence_message``. So every checkpoint written was checked at its
step. Ranks agree on each check (one all-reduce); under ZeRO only the logged values are checked."""

from __future__ import annotations

import math
from collections.abc import Iterable

from transformers import TrainerCallback

# Logged training quantities that must be finite (TRL's names). Others are left alone on purpose: a reward
# function that scores nothing in a batch logs a NaN mean for itself (TRL's nanmean), which is not divergence.
WATCHED_LOGS = ("loss", "grad_norm", "reward", "reward_std", "kl", "entropy")
# A mean reward (or spread) above this, logged before the divergence, points at the reward scale as the cause.
LARGE_REWARD = 1e3


class TrainingDiverged(ValueError):
    """A non-finite ``quantity`` at ``step`` (1-based), ``where`` (a parameter's name)."""

    def __init__(self, step: int, quantity: str, where: str = "", value: float | None = None):
        self.step, self.quantity, self.where, self.value = step, quantity, where, value
        shown = f" ({value})" if value is not None else ""
        at = f" in {where}" if where else ""
        super().__init__(f"step {step}: {quantity} is not finite{shown}{at}")


def first_nonfinite(named_tensors: Iterable[tuple[str, object]]):
    """The name of the first tensor of ``named_tensors`` holding a NaN or an infinity, or None. One
    ``aminmax`` per tensor (30x faster on CPU than ``isfinite().all()``)."""
    import torch

    by_device: dict = {}
    for name, tensor in named_tensors:
        if tensor is not None and hasattr(tensor, "to_local"):
            # FSDP2 shards each parameter (and gradient) as a DTensor: this rank checks its own shard, without a
            # collective per tensor (``agree`` in the guard makes one decision of all ranks' answers).
            tensor = tensor.to_local()
        if tensor is None or tensor.numel() == 0 or not tensor.is_floating_point():
            continue
        names, extremes = by_device.setdefault(tensor.device, ([], []))
        names.append(name)
        extremes.append(torch.stack(torch.aminmax(tensor.detach())).float())  # (2,): min, max
    for names, extremes in by_device.values():
        finite = torch.isfinite(torch.stack(extremes)).all(dim=1)  # (num_tensors,) bool
        if not bool(finite.all()):
            return names[int((~finite).nonzero()[0])]
    return None


def agreed_nonfinite(named_tensors: Iterable[tuple[str, object]]) -> str | None:
    """``first_nonfinite`` agreed by all ranks (one all-reduce; every rank must call it at the same
    point): this rank's name, ``"a shard on another rank"``, or None."""
    from pods_rl import ranks

    bad = first_nonfinite(named_tensors)
    if ranks.world_size() > 1 and ranks.any_rank(bad is not None) and bad is None:
        return "a shard on another rank"
    return bad


def check_finite_weights(model, step: int) -> None:
    """Raise ``TrainingDiverged`` on every rank if a trainable weight is non-finite (before a save)."""
    bad = agreed_nonfinite((n, p) for n, p in model.named_parameters() if p.requires_grad)
    if bad is not None:
        raise TrainingDiverged(step, "a weight", where=bad)


class DivergenceGuard(TrainerCallback):
    """Stop training at the first non-finite gradient, weight or logged quantity (``TrainingDiverged``).
    Put it after the callbacks that log; ``last_logs`` keeps the last finite row, for the likely cause."""

    def __init__(self):
        self.last_logs: dict = {}
        self.updates = 0  # optimizer steps this process made (0: whatever diverged came with the model)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        """Before the update: every trainable gradient finite, else ``TrainingDiverged`` (nothing saved yet)."""
        # Under fp16 the gradient scaler expects infinite gradients now and then: it skips that step and lowers its
        # scale (the weights stay finite, and are checked after the step anyway).
        if model is None or getattr(args, "fp16", False):
            return
        bad = agreed_nonfinite((n, p.grad) for n, p in model.named_parameters() if p.requires_grad)
        if bad is not None:
            raise TrainingDiverged(state.global_step + 1, "the gradient", where=bad)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        """After the update: every trainable weight finite, before any checkpoint of this step is written."""
        if model is not None:
            check_finite_weights(model, state.global_step + 1)
        self.updates += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        """A non-finite logged loss, grad norm, reward, KL or entropy stops the run, naming the quantity."""
        for key in WATCHED_LOGS:
            value = (logs or {}).get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                raise TrainingDiverged(state.global_step, f"the logged {key}", value=value)
        self.last_logs.update({k: v for k, v in (logs or {}).items() if k in WATCHED_LOGS})


def likely_cause(learning_rate: float | None, last_logs: dict, updates: int | None = None) -> str:
    """The likely cause in words: the model as loaded (no update yet), the reward scale, or the learning rate."""
    if updates == 0:
        return ("the model as loaded (it diverged before this run changed it: check its weights and --dtype; "
                "a resumed checkpoint may hold weights a too high learning rate made huge)")
    reward = max(abs(last_logs.get("reward", 0.0) or 0.0), abs(last_logs.get("reward_std", 0.0) or 0.0))
    lr = f" {learning_rate:g}" if learning_rate is not None else ""
    if reward > LARGE_REWARD:
        return (f"the reward scale (the last logged rewards reached {reward:.3g}: rescale them, e.g. to [0, 1]) or "
                f"the learning rate (--learning_rate{lr})")
    return f"a learning rate too high (--learning_rate{lr}: lower it, e.g. 10x) or rewards of a large scale"


def divergence_message(err: TrainingDiverged, run_dir, last_checkpoint, learning_rate, last_logs: dict,
                       updates: int | None = None) -> str:
    """The one line for a divergence: step, quantity, likely cause, what was (not) saved, and the way
    on (the last checkpoint, and the resume command)."""
    resume = f"--output_dir {run_dir} --resume_from_checkpoint"
    if last_checkpoint is not None:
        way_on = (f"the last finite checkpoint is {last_checkpoint}: resume from it with a lower learning rate "
                  f"({resume} {last_checkpoint} --learning_rate LR --accept_config_changes true)")
    elif updates == 0:
        way_on = "no checkpoint was saved before it: fix the model (or its --dtype) and start again"
    else:
        way_on = "no checkpoint was saved before it: start again with a lower --learning_rate"
    return (f"training diverged at {err}: likely {likely_cause(learning_rate, last_logs, updates)}; nothing of step "
            f"{err.step} was saved; {way_on}")


# What torch's samplers raise when the model's output probabilities hold a NaN or an infinity.
SAMPLING_OVERFLOW = "probability tensor contains either"


def as_divergence(err: BaseException, global_step: int) -> TrainingDiverged | None:
    """``err`` as a ``TrainingDiverged`` when it is one or sampling failed on non-finite probabilities; else None."""
    if isinstance(err, TrainingDiverged):
        return err
    if isinstance(err, RuntimeError) and SAMPLING_OVERFLOW in str(err):
        # The weights were finite after the last step (checked), but so large that the outputs overflow.
        return TrainingDiverged(global_step + 1, "the model's output distribution", where="generation (sampling)")
    return None


def divergence_line(trainer, err: TrainingDiverged, run_dir, last_checkpoint) -> str:
    """``divergence_message`` for ``trainer`` (its learning rate, and its guard's last logs and update count)."""
    guard = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, DivergenceGuard)), None)
    last_logs, updates = (guard.last_logs, guard.updates) if guard is not None else ({}, None)
    return divergence_message(err, run_dir, last_checkpoint, trainer.args.learning_rate, last_logs, updates)
