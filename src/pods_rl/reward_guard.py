"""Reward functions are user code: each call gets a time budget, and what it returns is checked, by name.

``guard_reward_funcs(funcs, timeout_s)`` wraps every plain (or ``async``) reward function with TRL's signature
``f(prompts, completions, **kwargs) -> list[float | None]`` so that:

- a call that runs past ``timeout_s`` seconds is interrupted (in the main thread; see ``pods_rl.deadline``), its
  completions score ``None`` (TRL's "not scored": left out of the weighted sum), one warning names the function,
  and ``pods/reward_timeouts`` counts it; ``MAX_TIMEOUTS_IN_A_ROW`` such calls in a row stop the run with one line
  (a function that always hangs is a bug, not bad luck);
- a return value that TRL would choke on, or silently misread, is a ``RewardFunctionError`` (a ValueError) naming
  the function and what it returned: ``None`` (a missing ``return``), a string, a dict, the wrong number of
  rewards, strings or other non-numbers inside, infinities, NaN (None means "not scored"), and magnitudes beyond
  ``MAX_ABS_REWARD`` (a scale bug that makes training diverge);
- an exception raised inside is re-raised as a ``RewardFunctionError`` naming the function (the original chained).

Reward models (``nn.Module``) and hub ids are left to TRL. The wrapper keeps the function's ``__name__`` (TRL names
metrics after it) and its attributes (``reward_weight``)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
from collections.abc import Callable, Sequence

from pods_rl import activity, deadline

logger = logging.getLogger(__name__)

DEFAULT_REWARD_TIMEOUT_S = 120.0  # per call of one reward function (one batch of completions)
# The largest reward magnitude taken as meant. Group normalisation makes the scale of rewards irrelevant to the
# update, so nothing is gained above O(1); float32, in which TRL sums, weights and normalises them, keeps 7 digits,
# so differences between rewards of 1e7 and more round away, and their squares (the group variance) overflow to
# infinity past ~1e19, which turns every advantage into NaN. A reward beyond 1e6 is a scale bug (an unnormalised
# count, a log-likelihood's exp, a sentinel like 1e30), not a signal.
MAX_ABS_REWARD = 1e6
MAX_TIMEOUTS_IN_A_ROW = 3
TIMEOUT_METRIC = "pods/reward_timeouts"  # reward-function calls cut short in this scoring round


class RewardFunctionError(ValueError):
    """A reward function misbehaved (returned something unusable, raised, or hung call after call)."""


class RewardTimeout(deadline.Expired):
    """Raised inside a reward function whose call ran past its budget."""


def function_name(func) -> str:
    """The name TRL gives a reward function in its metrics (``rewards/<name>/mean``)."""
    return getattr(func, "__name__", None) or type(func).__name__


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_NAN_NOTED: set[str] = set()


def _note_nan_once(name: str) -> None:
    """Say once per reward function that its NaN rewards are read as "not scored", and that None says so."""
    if name not in _NAN_NOTED:
        _NAN_NOTED.add(name)
        logger.warning("reward function %r returned NaN for some completions: read as not scored, as GRPOTrainer "
                       "reads it (return None for a completion it does not score: the documented way; a NaN from a "
                       "0/0 or a log of 0 is scored as nothing too)", name)


def check_rewards(name: str, output, num_completions: int, step: int | None = None) -> list[float | None]:
    """``output`` of reward function ``name`` as the list TRL expects: one float (or None: not scored) per
    completion, each finite and within ``MAX_ABS_REWARD``; a NaN is read as None, as GRPOTrainer reads it (noted
    once per function). Raises ``RewardFunctionError`` naming the function,
    what it returned and (when given) the training ``step`` being scored otherwise."""
    want = f"a list of {num_completions} numbers, one per completion (None for one it does not score)"
    at = f" at step {step}" if step is not None else ""
    if output is None:
        raise RewardFunctionError(f"reward function {name!r} returned None; it must return {want}: does it end "
                                  "with `return rewards`?")
    if isinstance(output, (str, bytes, dict)) or not hasattr(output, "__iter__"):
        raise RewardFunctionError(f"reward function {name!r} returned a {type(output).__name__} "
                                  f"({_describe(output)}); it must return {want}")
    if hasattr(output, "tolist") and callable(output.tolist):  # a tensor or an array
        output = output.tolist()
    values = list(output)
    if len(values) != num_completions:
        raise RewardFunctionError(f"reward function {name!r} returned {len(values)} rewards for "
                                  f"{num_completions} completions; it must return {want}")
    checked = []
    for i, value in enumerate(values):
        if value is None:
            checked.append(None)
            continue
        if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
            value = value.item()  # a 0-d tensor or numpy scalar
        if not isinstance(value, (int, float)):  # bool is an int: True scores 1.0
            hint = " (convert it with float())" if isinstance(value, str) else ""
            raise RewardFunctionError(f"reward function {name!r} returned a {type(value).__name__} for completion "
                                      f"{i} ({_describe(value)}){hint}; it must return {want}")
        value = float(value)
        if math.isinf(value):
            raise RewardFunctionError(f"reward function {name!r} returned {value} for completion {i}{at}; rewards "
                                      "must be finite (an infinite reward makes every advantage NaN)")
        if math.isnan(value):
            # GRPOTrainer reads NaN as None ("not scored": it turns None into NaN and ignores both in its sums), and
            # so does pods-rl; an infinity or an absurd value is still a bug that stops the run.
            _note_nan_once(name)
            checked.append(None)
            continue
        if abs(value) > MAX_ABS_REWARD:
            raise RewardFunctionError(f"reward function {name!r} returned {value:g} for completion {i}{at}: beyond "
                                      f"the bound of {MAX_ABS_REWARD:g}, a reward-scale bug that would make the "
                                      "training diverge; rescale it (e.g. to [0, 1]: the group normalisation makes "
                                      "the scale irrelevant to learning)")
        checked.append(value)
    return checked


def _count_completions(args: tuple, kwargs: dict) -> int | None:
    completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
    try:
        return len(completions)
    except TypeError:
        return None


def _step(kwargs: dict) -> int | None:
    """The optimizer step being scored (1-based), from TRL's ``trainer_state`` keyword; None outside a trainer."""
    state = kwargs.get("trainer_state")
    step = getattr(state, "global_step", None)
    return step + 1 if isinstance(step, int) else None


class _Budget:
    """Time budget and timeout streak of one reward function."""

    def __init__(self, name: str, timeout_s: float | None):
        self.name = name
        self.timeout_s = timeout_s if timeout_s and timeout_s > 0 and timeout_s != math.inf else None
        self.timeouts_in_a_row = 0

    def timed_out(self, num_completions: int | None, kwargs: dict) -> list[None]:
        """Account for a call that ran past the budget: its completions score None; too many in a row stop."""
        self.timeouts_in_a_row += 1
        if self.timeouts_in_a_row >= MAX_TIMEOUTS_IN_A_ROW:
            raise RewardFunctionError(
                f"reward function {self.name!r} ran past its time budget of {self.timeout_s:g} s on "
                f"{self.timeouts_in_a_row} calls in a row ({num_completions} completions per call); make it "
                "faster (or bound its own waits), or raise reward_timeout_s (flag --reward_timeout_s)")
        logger.warning("reward function %r ran past its time budget of %g s on %s completions: they are not "
                       "scored this step (None); %d more calls in a row like this stop the run (reward_timeout_s, "
                       "flag --reward_timeout_s, raises the budget)", self.name, self.timeout_s, num_completions,
                       MAX_TIMEOUTS_IN_A_ROW - self.timeouts_in_a_row)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(TIMEOUT_METRIC, 1.0)
        return [None] * (num_completions or 0)

    def ok(self, output, num_completions: int | None, kwargs: dict) -> list[float | None]:
        """A call within the budget: the streak ends; ``output`` checked (``check_rewards``) when its size is known."""
        self.timeouts_in_a_row = 0
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and self.timeout_s is not None:
            log_metric(TIMEOUT_METRIC, 0.0)
        return output if num_completions is None else check_rewards(self.name, output, num_completions, _step(kwargs))


def _raised(name: str, err: BaseException) -> RewardFunctionError:
    if isinstance(err, SystemExit):  # sys.exit() in user code must not end the run without a word
        return RewardFunctionError(f"reward function {name!r} called sys.exit({err.code!r})")
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {first}")


def guard_reward_func(func: Callable, timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S) -> Callable:
    """``func`` with a per-call time budget and checked return values (see the module docstring); the same
    object if it is already guarded."""
    if getattr(func, "__pods_guarded__", False):
        return func
    name = function_name(func)
    budget = _Budget(name, timeout_s)
    call = type(func).__call__ if not inspect.isroutine(func) else None  # a callable object: its method
    is_async = inspect.iscoroutinefunction(func) or (call is not None and inspect.iscoroutinefunction(call))

    if is_async:
        import asyncio

        async def guarded(*args, **kwargs):
            n = _count_completions(args, kwargs)
            try:
                if budget.timeout_s is None:
                    output = await func(*args, **kwargs)
                else:
                    output = await asyncio.wait_for(func(*args, **kwargs), budget.timeout_s)
            except asyncio.TimeoutError:
                return budget.timed_out(n, kwargs)
            except RewardFunctionError:
                raise
            except (Exception, SystemExit) as err:  # noqa: BLE001 - user code: name it
                raise _raised(name, err) from err
            return budget.ok(output, n, kwargs)
    else:
        def guarded(*args, **kwargs):
            n = _count_completions(args, kwargs)
            try:
                with (deadline.time_limit(budget.timeout_s or 0, lambda: RewardTimeout(name)) as limit,
                      activity.doing(f"the reward function {name!r}")):
                    output = func(*args, **kwargs)
            except RewardFunctionError:
                raise
            except (Exception, SystemExit) as err:  # noqa: BLE001 - user code: name it
                raise _raised(name, err) from err
            if limit.expired:
                return budget.timed_out(n, kwargs)
            return budget.ok(output, n, kwargs)

    with contextlib.suppress(AttributeError, TypeError):  # a callable object without __name__ / __dict__
        functools.update_wrapper(guarded, func)
    guarded.__name__ = name
    guarded.__pods_guarded__ = True
    guarded.budget = budget
    return guarded


def guard_reward_funcs(funcs, timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S):
    """``guard_reward_func`` over TRL's ``reward_funcs`` argument (one function or a list); reward models (modules)
    and hub ids (strings) are returned unchanged."""
    def guard(func):
        if isinstance(func, str) or not callable(func) or _is_module(func):
            return func
        return guard_reward_func(func, timeout_s)

    if isinstance(funcs, Sequence) and not isinstance(funcs, str):
        return [guard(f) for f in funcs]
    return guard(funcs)


def _is_module(func) -> bool:
    try:
        from torch import nn
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return isinstance(func, nn.Module)


def reward_weights_of(funcs) -> list[float] | None:
    """The ``reward_weight`` each reward function carries (a task's functions do; see ``Task.reward_funcs``),
    1.0 for one that carries none; None when no function carries one (TRL's default, all 1.0, then applies)."""
    funcs = list(funcs) if isinstance(funcs, Sequence) and not isinstance(funcs, str) else [funcs]
    weights = [getattr(f, "reward_weight", None) for f in funcs]
    if all(w is None for w in weights):
        return None
    return [1.0 if w is None else float(w) for w in weights]
