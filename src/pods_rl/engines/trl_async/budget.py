"""The rollout-budget planners in TRL's asynchronous worker: which prompts it samples and how many rollouts each gets.

``BudgetLoop._repeat_iterator`` (where TRL's generate loop takes ``(group_id, row)`` pairs) draws prompts a window of
``pods_groups_per_step`` at a time through ``WorkerBudget.draw``: ``greso`` skips prompts the ledger saw all-equal;
``knapsack`` and ``auto`` sample m of each and the worker tops the group up to its count; ``pilot_commit`` pilots
each prompt and commits each passing pilot alone (no buffer of B), under committed ids (0, 1, ...) since TRL counts
trained groups by id. Group ids count groups started, so the trainer's resume point stays a prefix of trained groups;
``WorkerBudget`` maps ids back to prompt positions. The child writes its state to ``pods_ledger_path`` (after each
window, at most every ``SAVE_INTERVAL_S`` after recorded groups, at stop); ``PODSLedgerCallback`` carries it through
checkpoints. More: docs/guides/async.md.

``auto`` plans each window on the sampling seconds the worker measures (``WorkerBudget.close``: between deliveries,
less its waits on the trainer); the seconds per trained rollout are ``pods_rollout_planner_args={"train_ms": ...}``,
refused without. Sampling overlaps training here, so on separate devices a step costs about the larger of the two;
the planner prices their sum (exact on one shared device, elsewhere erring towards m: GRPO).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import TrainerCallback

from pods_rl.budget.ledger import LEDGER_FILE, save_atomically
from pods_rl.budget.planners import available_planners
from pods_rl.budget.planners.base import needs_of
from pods_rl.budget.rollout_budget import BudgetSettings, RolloutBudget, check_inputs, check_rollout_planner
from pods_rl.engines.settings import PILOT_COMMIT_REASONS, check_planners, spelled
from pods_rl.tasks.extraction import completion_text

__all__ = ["BUDGET_KEYS", "BudgetLoop", "PODSLedgerCallback", "WorkerBudget", "check_budget_settings"]

logger = logging.getLogger("pods_rl")

INPUT_KEYS = ("pods_calibration_dataset", "pods_answer_extractor")  # the worker's keywords of a planner's inputs
# The worker's budget keywords (PODSRolloutLoop pops them before TRL's __init__); pods_seed, pods_adaptive_reward
# and pods_adaptive_budget are shared with selection and the adaptive rounds.
BUDGET_KEYS = ("pods_prompt_planner", "pods_prompt_planner_args", "pods_rollout_planner", "pods_rollout_planner_args",
               "pods_ledger_success_threshold", "pods_groups_per_step", "pods_ledger_path", "pods_ledger_resume",
               *INPUT_KEYS)
SAVE_INTERVAL_S = 1.0  # the least time between two writes of the state after recorded groups


def check_budget_settings(n: int, m: int, *, pilot: int | None = None, environment_factory=None, dataset=None,
                          reward_names=None, **settings) -> RolloutBudget | None:
    """Refuse planner settings the worker cannot carry out; return their budget (None without planners), with its
    planner's checked inputs. ``settings``: ``BUDGET_KEYS``, ``pods_adaptive_{budget,reward}``, ``pods_seed``."""
    unknown = sorted(set(settings) - {*BUDGET_KEYS, "pods_adaptive_budget", "pods_adaptive_reward", "pods_seed"})
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r} for the PODS worker")
    which, how_many = settings.get("pods_prompt_planner"), settings.get("pods_rollout_planner")
    check_planners("trl_async", {"which_prompts": which, "how_many": how_many}, available_planners)
    if which is None and how_many is None:
        return None
    names, reasons = spelled("trl_async", "budget"), PILOT_COMMIT_REASONS["trl_async"]
    check_rollout_planner(how_many, pilot=pilot is not None, n=n, m=m, names=names)
    if "costs" in needs_of(how_many) and (settings.get("pods_rollout_planner_args") or {}).get(
            "train_ms") is None:  # the "a run that logs no phase times": the worker logs no update time
        raise ValueError(f"pods_rollout_planner={how_many!r} in the asynchronous worker needs "
                         "pods_rollout_planner_args={'train_ms': MS}, the trainer's milliseconds per trained rollout: "
                         "the worker samples in its own process and sees no update times; measure them with `pods "
                         "cost` (its upd/kept column)")
    if how_many is not None:
        if environment_factory is not None:
            raise ValueError("pods_rollout_planner does not support environment_factory: the worker samples m of each "
                             "prompt and tops the group up to its count outside TRL's generate loop, which draws and "
                             "resets an environment per rollout")
        budget = settings.get("pods_adaptive_budget")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or not m <= budget <= n):
            raise ValueError(f"pods_adaptive_budget={budget!r}: Knapsack-RL's rollouts per prompt on average must be a "
                             f"number in [pods_m, num_generations] = [{m}, {n}]")
    adaptive_reward = settings.get("pods_adaptive_reward")
    if adaptive_reward is not None and reward_names is not None and adaptive_reward not in reward_names:
        raise ValueError(f"pods_adaptive_reward {adaptive_reward!r} is not one of this run's reward functions "
                         f"{list(reward_names)}: the planners' ledger counts successes by it")
    if dataset is not None and not hasattr(dataset, "__len__"):
        raise ValueError("the rollout-budget planners need a dataset with a length (a Dataset, not an "
                         "IterableDataset): the ledger knows a prompt by its dataset index")
    value = settings.get("pods_groups_per_step")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"pods_groups_per_step must be a positive integer (groups per training step), got {value!r}")
    # the worker's budget keywords: BudgetSettings' fields, prefixed "pods_"
    fields = {field.name for field in dataclasses.fields(BudgetSettings)}
    given = {key.removeprefix("pods_"): v for key, v in settings.items() if key.removeprefix("pods_") in fields}
    config = BudgetSettings(**{**given, "seed": int(given.get("seed") or 0)}, num_generations=n, downsample_to=m,
                            pilot_generations=pilot)
    budget = RolloutBudget.from_config(config, names=names, reasons=reasons,
                                       environment=environment_factory is not None)
    extractor = settings.get(INPUT_KEYS[1])
    check_inputs(budget, settings.get(INPUT_KEYS[0]), extractor, dataset, text=completion_text,
                 environment=environment_factory is not None, names=names)
    try:  # the worker's child receives it pickled: a lambda or a local function would fail at its start
        pickle.dumps(extractor)
    except Exception as err:  # noqa: BLE001 - pickling raises several types; each means the same here
        raise ValueError(f"pods_answer_extractor must pickle (the worker's child receives it): define it at a "
                         f"module's top level ({type(err).__name__}: {err})") from None
    return budget


class WorkerBudget:
    """The worker's planners, ledger and groups' prompt positions (id = position % ``dataset_size``); W =
    ``groups_per_step`` prompts planned together; ``start_index``: TRL's; ``clock``: seconds, for auto."""

    def __init__(self, budget: RolloutBudget, *, groups_per_step: int, dataset_size: int, start_index: int = 0,
                 seed: int = 0, clock: Callable[[], float] = time.monotonic):
        self.budget, self.window, self.dataset_size = budget, groups_per_step, dataset_size
        self.costs = budget.costs  # auto's costs (module docstring): windows, the trainer's waits
        self.costs.clock = clock
        self.start_index = self.next_position = start_index
        self.positions: list[int] = []  # group id (this session) -> the absolute position of its prompt
        # Pilot-Commit: a group trains only when its pilot passes, under a committed id the trainer counts
        self.committed: list[int] = []  # committed id (this session) -> the position of its prompt
        self.unjudged: dict[int, int] = {}  # group id -> position, for the pilots drawn and not yet judged
        self.generator = torch.Generator().manual_seed(seed)

    def prompt_id(self, position: int) -> int:
        """The ledger id of the prompt at ``position``: its dataset index."""
        return position % self.dataset_size

    def draw(self, next_row: Callable[[], dict]) -> tuple[list[tuple[int, dict, int]], dict]:
        """The next window's ``(group_id, row, rollouts)`` (``RolloutBudget.draw``) and the planners' metrics."""
        rows: list[tuple[int, dict]] = []  # (position, row), every one drawn

        def candidates(k: int) -> torch.Tensor:
            rows.extend((self.next_position + i, next_row()) for i in range(k))
            self.next_position += k
            return torch.tensor([self.prompt_id(position) for position, _ in rows[-k:]], dtype=torch.long)

        chosen, counts, metrics = self.budget.draw(candidates, self.window, self.generator,
                                                   patience=self.dataset_size)
        groups = []
        for (position, row), count in zip([rows[i] for i in chosen], counts.tolist(), strict=True):
            if self.commits:
                self.unjudged[len(self.positions)] = position
            groups.append((len(self.positions), row, count))
            self.positions.append(position)
        self.costs.open(group_id for group_id, _, _ in groups)
        return groups, metrics

    def close(self, group_id: int, *, sampled: int, trained: int) -> dict[str, float]:
        """A group is done: ``CostMeter.close`` (auto's costs; the worker sees no update seconds: ``train_ms``)."""
        return self.costs.close(group_id, sampled=sampled, trained=trained)

    @property
    def commits(self) -> bool:
        """True with Pilot-Commit: a group trains only when its pilot passes (``judge_pilot``), under a committed id."""
        return self.budget.commits

    def judge_pilot(self, group_id: int, rewards: list[float], *, step: int) -> tuple[int | None, dict[str, float]]:
        """Pilot-Commit's verdict on a pilot's deciding rewards (NaN: unscored): the committed id its rows carry to
        the trainer (None: nothing trains; a passing pilot is committed at once, alone) and the verdict's counters."""
        passed, metrics = self.budget.judge_one(self.prompt_id(self.positions[group_id]), rewards, step=step)
        self.unjudged.pop(group_id, None)
        committed = None
        if passed:
            committed = len(self.committed)
            self.committed.append(self.positions[group_id])
        return committed, metrics

    def record(self, group_id: int, rewards: list[float], *, step: int) -> dict[str, float]:
        """Note a group's deciding rewards (``RolloutBudget.note``): every W groups, recorded together; metrics."""
        position = self.positions[group_id]
        return self.budget.note(self.prompt_id(position), rewards, step=step, epoch=position // self.dataset_size,
                                every=self.window)

    # ---- state: saved by the worker, copied into checkpoints, loaded on resume ------------------------------------

    def state_dict(self) -> dict:
        """The budget's state (the unrecorded groups too), the generator's and this session's positions."""
        return {"budget": self.budget.state_dict(), "generator": self.generator.get_state(),
                "start_index": self.start_index, "next_position": self.next_position,
                "positions": torch.tensor(self.positions, dtype=torch.long),
                "committed": torch.tensor(self.committed, dtype=torch.long),
                "unjudged": torch.tensor(sorted(self.unjudged.values()), dtype=torch.long)}

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``state_dict`` to ``path`` atomically."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return save_atomically(self.state_dict(), path)

    def resume(self, path: str | os.PathLike, dataset_start_index: int) -> tuple[int, bool]:
        """Restore ``path``'s state for a session TRL starts at ``dataset_start_index`` (saved start + groups trained;
        Pilot-Commit: committed ones, unjudged pilots drawn again) -> (position to draw from, whether it was known)."""
        state = torch.load(Path(path), weights_only=True)
        self.budget.load_state_dict(state["budget"])
        self.generator.set_state(state["generator"])
        positions = (state["committed"] if self.commits else state["positions"]).tolist()
        offset = dataset_start_index - int(state["start_index"])
        found = 0 <= offset <= len(positions)
        position = (positions[offset] if offset < len(positions) else int(state["next_position"])) if found \
            else dataset_start_index
        if found and self.commits:
            position = min([position, *state["unjudged"].tolist()])
        self.start_index, self.next_position, self.positions = dataset_start_index, position, []
        self.committed, self.unjudged = [], {}
        return position, found


class BudgetLoop:
    """The planners' part of ``PODSRolloutLoop``: a mixin before TRL's ``_AsyncRolloutLoop`` (``super()``)."""

    budget: WorkerBudget | None = None
    _planned: dict[int, int]  # group id -> Knapsack-RL's rollouts for it (groups not yet closed)

    def init_budget(self, budget: RolloutBudget | None, *, groups_per_step: int, dataset_start_index: int,
                    seed: int | None, ledger_path: str | None, ledger_resume: str | None, logger) -> None:
        """Set up the budget in the child (None: no planner), resuming from ``ledger_resume``'s saved position."""
        self._planned, self._ledger_path, self._saved_at = {}, ledger_path, 0.0
        if budget is None:
            return
        self.budget = WorkerBudget(budget, groups_per_step=groups_per_step, dataset_size=len(self.dataset),
                                   start_index=dataset_start_index, seed=0 if seed is None else int(seed))
        if ledger_resume:
            position, found = self.budget.resume(ledger_resume, dataset_start_index)
            if not found:
                logger.warning("warning: the trainer resumes at prompt %d, which the saved ledger (%s) does not know: "
                               "the worker starts drawing there", dataset_start_index, ledger_resume)
            start = position % len(self.dataset)
            self._dataset_iter = iter(self.dataset.select(range(start, len(self.dataset)))) if start else iter(
                self.dataset)
        elif dataset_start_index > 0:
            logger.warning("warning: the trainer resumes at prompt %d without the worker's ledger (pass "
                           "PODSLedgerCallback(worker) to AsyncGRPOTrainer(callbacks=...)): the planners start from an "
                           "empty ledger, and the position counts trained groups, not the prompts skipped before "
                           "them", dataset_start_index)

    def _next_row(self) -> dict:
        """The dataset's next row, starting over at its end (as TRL's ``_repeat_iterator``)."""
        try:
            return next(self._dataset_iter)
        except StopIteration:
            self._dataset_iter = iter(self.dataset)
            return next(self._dataset_iter)

    def _repeat_iterator(self):
        if self.budget is None:
            yield from super()._repeat_iterator()
            return
        while True:
            groups, metrics = self.budget.draw(self._next_row)
            self.save_budget(force=True)  # the new groups' positions, before any of them is generated
            if metrics:
                self._push_metrics(metrics)
            for group_id, row, count in groups:
                if self.budget.budget.how_many is not None:
                    self._planned[group_id] = count
                for _ in range(self.num_generations):
                    yield group_id, row

    def close_group(self, group_id: int, *, sampled: int, trained: int) -> None:
        """A group's last rollouts are scored and its kept rows made: ``WorkerBudget.close`` (auto's costs)."""
        if self.budget is not None:
            metrics = self.budget.close(group_id, sampled=sampled, trained=trained)
            if metrics:
                self._push_metrics(metrics)

    def _push_metrics(self, values: dict) -> None:
        # TRL reports each wait on a full rollout buffer (the trainer) once it ends: auto's sampling seconds leave
        # those out.
        if self.budget is not None and "rollout/backpressure_s" in values:
            self.budget.costs.wait(float(values["rollout/backpressure_s"]))
        super()._push_metrics(values)

    def record_group(self, group_id: int, rewards: list[float]) -> None:
        """Note a scored group's deciding rewards in the ledger (pushing the metrics of a recording)."""
        if self.budget is None:
            return
        metrics = self.budget.record(group_id, rewards, step=self.model_version)
        if metrics:
            self._push_metrics(metrics)
        self.save_budget(force=bool(metrics))

    def save_budget(self, force: bool = False) -> None:
        """Write the state to ``pods_ledger_path`` (``force``, or ``SAVE_INTERVAL_S`` after the last write)."""
        if self.budget is None or not self._ledger_path:
            return
        now = time.monotonic()
        if force or now - self._saved_at >= SAVE_INTERVAL_S:
            self.budget.save(self._ledger_path)
            self._saved_at = now


class PODSLedgerCallback(TrainerCallback):
    """Copies the worker's ledger into each checkpoint and hands it back on resume::

        trainer = AsyncGRPOTrainer(..., rollout_worker=worker, callbacks=[PODSLedgerCallback(worker)])

    Pass it to the constructor (not ``add_callback``): the worker must know the ledger before its child starts."""

    def __init__(self, worker):
        self.worker = worker

    def _kwargs(self) -> dict:
        return self.worker._loop_kwargs  # what AsyncRolloutWorker hands its child (TRL's resume state goes there too)

    def on_train_begin(self, args, state, control, **kwargs):
        """On a resume, point the worker at the checkpoint's ledger before it starts."""
        loop_kwargs = self._kwargs()
        loop_kwargs.pop("pods_ledger_resume", None)  # never carried over from an earlier train() call
        if not loop_kwargs.get("pods_ledger_path") or not state.global_step:
            return
        if getattr(self.worker, "_process", None) is not None:
            raise RuntimeError("PODSLedgerCallback ran after the rollout worker started: pass it as "
                               "AsyncGRPOTrainer(callbacks=[PODSLedgerCallback(worker)]), not with add_callback")
        saved = ledger_file(Path(args.output_dir) / f"checkpoint-{state.global_step}")
        if saved.is_file():
            loop_kwargs["pods_ledger_resume"] = str(saved)
        else:
            logger.warning("warning: %s holds no worker ledger: the planners start from an empty one", saved.parent)

    def on_save(self, args, state, control, **kwargs):
        """Copy the worker's state file into the checkpoint just written."""
        live = self._kwargs().get("pods_ledger_path")
        if not live or not state.is_world_process_zero:
            return
        if not Path(live).is_file():
            logger.warning("warning: the worker has written no ledger yet (%s): checkpoint-%d holds none", live,
                           state.global_step)
            return
        target = ledger_file(Path(args.output_dir) / f"checkpoint-{state.global_step}")
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(live, partial)  # (the worker replaces the file by rename: a copy never sees half of it)
        os.replace(partial, target)


def ledger_file(checkpoint_dir: str | os.PathLike) -> Path:
    """Where a checkpoint holds the worker's state."""
    return Path(checkpoint_dir) / LEDGER_FILE

