"""C-GRPO in TRL's asynchronous worker (``pods_rollout_planner="cgrpo"``).

A group starts with budget_grid[0] rollouts from TRL's generate loop and is topped up (the worker's background
top-ups) to the next budget until its prediction set is a singleton, or k_max; then PODS keeps m of its k (all k when
k <= m: the asynchronous trainer scores each group apart, so a short group trains as it is, nothing is padded). The
thresholds are calibrated in the worker's event loop on ``pods_calibration_dataset``, each prompt sampled k_max times
by the server's current weights, before the first group is judged and every ``recalibrate_every`` model versions;
the calibration's rollouts are pushed as ``pods/cgrpo_calibration_rollouts``. ``pods_answer_extractor`` must pickle
(a module-level function): the worker's child receives it.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable

import torch

from pods_rl.budget.planners.cgrpo import CGRPO, calibration_rows, encode_answers
from pods_rl.tasks.extraction import completion_text

CGRPO_KEYS = ("pods_calibration_dataset", "pods_answer_extractor")  # the worker's keywords of C-GRPO's


def check_worker_cgrpo(planner: CGRPO, dataset, *, environment_factory=None, **settings) -> list[dict]:
    """The calibration rows for the worker, once checked (one line each; the same checks as ``PODSTrainer``'s)."""
    if environment_factory is not None:
        raise ValueError("pods_rollout_planner='cgrpo' does not support environment_factory: the stop rule reads one "
                         "answer per completion")
    if planner.settings.score != "aps":
        raise ValueError(f"pods_rollout_planner='cgrpo' with score={planner.settings.score!r} needs a verifier per "
                         "completion, which the worker does not take: use score='aps' with pods_answer_extractor")
    try:
        rows = calibration_rows(planner.settings, settings.get("pods_calibration_dataset"),
                                settings.get("pods_answer_extractor"), dataset)
    except ValueError as err:  # the worker's spelling of the two keywords
        raise ValueError(str(err).replace("calibration_dataset", "pods_calibration_dataset").replace(
            "answer_extractor=", "pods_answer_extractor=")) from None
    try:  # the worker's child receives it pickled: a lambda or a local function would fail at its start
        pickle.dumps(settings["pods_answer_extractor"])
    except Exception as err:  # noqa: BLE001 - pickling raises several types; each means the same here
        raise ValueError(f"pods_answer_extractor must pickle (the worker's child receives it): define it at a "
                         f"module's top level ({type(err).__name__}: {err})") from None
    return rows


class WorkerCGRPO:
    """The worker's C-GRPO: the planner, the calibration rows, the answer extractor."""

    def __init__(self, planner: CGRPO, rows: list[dict], answer_extractor: Callable):
        self.planner, self.rows, self.extract = planner, rows, answer_extractor

    async def more(self, loop, group) -> int:
        """Rollouts the scored ``group`` gets next (0: it stops), calibrating first when due (``loop``: the
        worker's ``PODSRolloutLoop``)."""
        if self.planner.calibration_due(loop.model_version):
            loop._push_metrics(await self.calibrate(loop))
        grid, k_max = list(self.planner.settings.budget_grid), self.planner.settings.k_max
        count = len(group.completions)
        if count not in grid:  # a rollout the server failed to return: on to the next budget before judging
            return next((k - count for k in grid if k > count), 0)
        codes, _ = encode_answers([[self.extract(completion_text(c)) for c in group.completions]], k_max)
        return int(self.planner.next_round(codes, torch.tensor([count]), torch.tensor([True]))[0])

    async def calibrate(self, loop) -> dict[str, float]:
        """Sample each calibration prompt k_max times with the server's current weights, fit the thresholds."""
        s = self.planner.settings
        k_max, rows = s.k_max, self.rows[:self.planner.calibration_size(len(self.rows))]
        tool_dict = {tool.__name__: tool for tool in loop._standalone_tools}

        async def one(prompt):
            async with loop._top_up_slots:
                return await loop._generate_one(prompt, tool_dict=tool_dict, tools=loop.tools, group_id=-1)

        replies = await asyncio.gather(*(one(row["prompt"]) for row in rows for _ in range(k_max)))
        answers = [[self.extract(completion_text(reply[0])) for reply in replies[i * k_max:(i + 1) * k_max]]
                   for i in range(len(rows))]
        codes, gold = encode_answers(answers, k_max, [row[s.calibration_answer_column] for row in rows])
        return self.planner.calibrate(codes, gold, step=loop.model_version)
