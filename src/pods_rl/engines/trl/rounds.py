"""Adaptive rollouts in ``PODSTrainer``: a pilot round of k rollouts per prompt, then rounds for the prompts the
adaptive rule (``pods_rl.adaptive.plan_round``) keeps open, until each has m..n. A round is one ``_generate`` and one
``_calculate_rewards`` of GRPOTrainer's over its rows:

    RoundBook                 which of the P*n slots each round's rollouts fill, and what they scored (no TRL)
    _agreed_round_rows        every process runs the same rounds with as many rows (TRL gathers per-row tensors)
    _agreed_run_length        the length of one prompt's runs of rows, which vLLM's server mode relies on
    _round_rollout_state      each row gets its slot's environment and tool dicts; padding rows get fresh ones
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from accelerate.utils import gather

from pods_rl.adaptive import group_is_mixed, plan_round, ranks_within
from pods_rl.engines.trl.rows import (
    Generated,
    Sampled,
    arrange_rounds,
    generation_metrics_dropped,
    metrics_logged,
    place_extra_logs,
    put_back_metrics,
    take_extra_logs,
    write_extra_fields,
)
from pods_rl.selection import reward_totals

ROUND = "round"  # PODSStep._pods_call inside an adaptive round (see trainer_step)


class RoundBook:
    """One step's rounds for a process's P prompts, n slots each (prompt p's in p*n .. p*n + n - 1). ``more`` (P,):
    rollouts in the next round; ``counts`` (P,): so far; ``rewards`` (P, n): deciding rewards, NaN past ``counts``;
    ``per_func`` (P*n, F)."""

    def __init__(self, num_prompts: int, n: int, first: int | torch.Tensor):
        self.P, self.n = num_prompts, n
        self.more = torch.full((num_prompts,), first, dtype=torch.long) if isinstance(first, int) \
            else first.clone().long()  # (P,)
        self.counts = torch.zeros(num_prompts, dtype=torch.long)
        self.rewards = torch.full((num_prompts, n), float("nan"), dtype=torch.float64)
        self.per_func: torch.Tensor | None = None
        self.outputs: list[tuple] = []
        self.slots: list[list[int]] = []
        self.extra_logs: list[dict[str, list]] = []
        self.rows_generated = 0  # every process's rows of every round, padding included
        self.pilot_all_equal: torch.Tensor | None = None  # (P,) after the pilot

    @property
    def open_rows(self) -> int:
        """Rollouts this process generates in the next round."""
        return int(self.more.sum())

    def next_slots(self) -> list[int]:
        """The next round's slots, prompt by prompt: p*n + counts[p] + j for each new rollout j."""
        owners = torch.repeat_interleave(torch.arange(self.P), self.more).tolist()
        return [p * self.n + int(self.counts[p]) + j for p, j in zip(owners, ranks_within(owners))]

    def record(self, generated: tuple, slots: list[int], per_func: torch.Tensor, deciding: torch.Tensor,
               extra_logs: dict[str, list], rows_generated: int) -> None:
        """Note a round: output, rewards ``per_func`` (len(slots), F), ``deciding`` (len(slots),), log_extra."""
        if self.per_func is None:
            self.per_func = torch.full((self.P * self.n, per_func.shape[1]), float("nan"), dtype=per_func.dtype)
        self.per_func[slots] = per_func
        self.rewards.view(-1)[slots] = deciding
        self.outputs.append(generated)
        self.slots.append(slots)
        self.extra_logs.append(extra_logs)
        self.counts += self.more
        self.rows_generated += rows_generated
        if self.pilot_all_equal is None:
            self.pilot_all_equal = (~group_is_mixed(self.rewards, self.counts)).double()

    def arranged(self) -> tuple[Generated, dict[str, list]]:
        """The rounds' rollouts as P*n rows (``arrange_rounds``) and their log_extra columns by row."""
        generated = arrange_rounds(self.outputs, self.slots, self.P, self.n)
        return generated, place_extra_logs(self.extra_logs, self.slots, self.P * self.n)


class RoundsStep:
    """The adaptive rounds (``_sample_in_rounds``) of ``PODSStep``."""

    _adaptive_reward_index = None  # column of rewards_per_func that decides "mixed" (None: the total)

    # Long because the round loop shares the book, the batch state and the mode swap; split, each part passes them all.
    def _sample_in_rounds(self, inputs: list[dict], prompts: list, num_sampled: int,
                          first: torch.Tensor | None = None, ids: torch.Tensor | None = None):
        """Rounds until no process has a prompt open; returns ``Sampled``. ``first`` (P,): the planners' first round
        (else ``pilot_generations``); later ones from ``adaptive_rule`` or Pilot-Commit's commit (of ``ids`` (P,)).
        A process with fewer open rows pads its round with throw-away rows."""
        args, n, m = self.args, self.num_generations, self.downsample_to
        round_size = args.adaptive_round_size or args.pilot_generations
        budget = None if args.adaptive_budget is None else int(args.adaptive_budget * num_sampled)
        book = RoundBook(num_sampled, n, args.pilot_generations if first is None else first)
        planned = book.more > 0  # (P,) the prompts sampled this step
        trainable = None  # (P,) bool, after Pilot-Commit's pilot
        rank, weights, user_metrics = self.accelerator.process_index, self.reward_weights.cpu().double(), False
        with _one_sleep_per_step(self), self._batch_rollout_state() as batch:
            while True:
                round_rows = self._agreed_round_rows(book.open_rows)
                if round_rows == 0:
                    break
                slots = book.next_slots()
                padding = round_rows - len(slots)
                with self._round_rollout_state(batch, slots, padding, inputs, prompts) as (rows, texts):
                    self.num_generations = self._agreed_run_length(book.more, round_rows)
                    self._pods_call = ROUND
                    try:
                        with generation_metrics_dropped(self):
                            generated = Generated(*self._generate(texts))
                        write_extra_fields(rows, generated.extra_fields)
                        with metrics_logged(self) as logged:
                            round_per_func = self._calculate_rewards(rows, texts, generated.completions,
                                                                     generated.completion_ids)
                        extra_logs = take_extra_logs(self, round_rows)
                    finally:
                        self.num_generations = n
                        self._pods_call = None
                put_back_metrics(self, logged, owned=True)
                user_metrics |= any(not name.startswith("pods/") for name in logged)
                with self._phase("selection"):
                    local = round_per_func[rank * round_rows: rank * round_rows + len(slots)].cpu()  # (rows, F)
                    book.record(generated, slots, local, self._deciding_rewards(local, weights),
                                {c: v[:len(slots)] for c, v in extra_logs.items()}, round_per_func.shape[0])
                    if args.is_adaptive:
                        book.more = plan_round(book.rewards, book.counts, m, n, round_size, args.adaptive_rule,
                                               budget=budget) * planned
                    elif trainable is None and self._budget is not None and self._budget.commits:
                        book.more, trainable, metrics = self._budget.commit(  # Pilot-Commit's commit round
                            ids, book.rewards, book.counts, self._kept_groups_per_process, step=self.state.global_step,
                            rank=rank, gather=gather, device=self.accelerator.device)
                        self._log_train_metrics(metrics)
                    else:  # the planners' one round (Pilot-Commit's two)
                        book.more = torch.zeros_like(book.more)
        with self._phase("selection"):
            generated, extra_logs = book.arranged()
            write_extra_fields(inputs, generated.extra_fields)
            rewards_per_func = gather(book.per_func.to(self.accelerator.device))  # (P*n*processes, F)
            metrics = self._metrics["train"]
            metrics["pods/rollouts_sampled"].append(float(book.rows_generated))
            metrics["pods/rounds"].append(float(len(book.outputs)))
            equal = book.pilot_all_equal[planned]  # (sampled prompts,) all-equal after the first round
            total, count = gather(torch.tensor([[equal.sum().item(), float(len(equal))]],
                                               device=self.accelerator.device)).sum(0).tolist()
            metrics["pods/frac_zero_std_pilot"].append(total / count if count else float("nan"))
        self._note_reward_variance(rewards_per_func)  # once per step, on the finished groups
        return Sampled(generated, rewards_per_func, book.counts, extra_logs, user_metrics, trainable)

    def _deciding_rewards(self, rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(rows, F) -> (rows,) the reward that decides "mixed": ``adaptive_reward``'s column, or the total."""
        if self._adaptive_reward_index is None:
            return reward_totals(rewards_per_func.double(), weights)
        return rewards_per_func[:, self._adaptive_reward_index].double()

    def _agreed_round_rows(self, local_rows: int) -> int:
        """The next round's rows on every process: the most any has open (0: done). A collective."""
        device = self.accelerator.device
        return int(gather(torch.tensor([local_rows], device=device)).max())

    def _agreed_run_length(self, more: torch.Tensor, round_rows: int) -> int:
        """``num_generations`` for the round's ``_generate``: the processes' common run length of one prompt's rows,
        else 1 (TRL's vLLM server de-duplicates gathered prompts by it). A collective."""
        open_counts = more[more > 0]
        uniform = round_rows == int(more.sum()) and len(set(open_counts.tolist())) == 1
        run = int(more.max()) if uniform else 1
        runs = gather(torch.tensor([run], device=self.accelerator.device))  # (processes,)
        return run if bool((runs == run).all()) else 1

    @contextmanager
    def _batch_rollout_state(self):
        """The batch's per-rollout state as TRL prepared it ({name: per-row list}), yielded and restored on leaving."""
        names = ("environments", "_batch_environments", "_sync_tool_dicts", "_async_tool_dicts")
        batch = {name: getattr(self, name) for name in names if getattr(self, name, None) is not None}
        try:
            yield batch
        finally:
            for name, values in batch.items():
                setattr(self, name, values)

    @contextmanager
    def _round_rollout_state(self, batch: dict, slots: list[int], padding: int, inputs: list[dict], prompts: list):
        """Yields the round's rows (``slots``, then ``padding`` throw-away rows) and prompts, with TRL's per-rollout
        state set so each row's tools reach its slot's environment. Padding rows repeat the first prompt, prepared
        by TRL with fresh environment instances."""
        rows = [dict(inputs[i]) for i in slots]
        texts = [prompts[i] for i in slots]
        padded = {name: [] for name in batch}
        if padding:
            pad_inputs = [dict(inputs[0]) for _ in range(padding)]
            if batch:  # tools or environments
                pool = getattr(self, "_environment_pool", None)
                if pool is not None:  # TRL creates (and resets) a fresh instance for each padding row
                    self._environment_pool = {name: [] for name in pool}
                try:
                    texts += self._rollout_prompts(pad_inputs)
                finally:
                    if pool is not None:
                        self._environment_pool = pool
                padded = {name: list(getattr(self, name)) for name in batch}
            else:
                texts += [prompts[0]] * padding
            rows += pad_inputs
        for name, values in batch.items():
            setattr(self, name, [values[i] for i in slots] + padded[name])
        yield rows, texts


@contextmanager
def _one_sleep_per_step(trainer):
    """Adaptive rounds with vLLM's sleep mode (colocate): one weight push and one sleep per step, not per round.

    TRL sleeps the engine at level 2 after every ``generate`` and pushes the weights again before the next; inside
    the block ``sleep`` is deferred (the weights stay) and runs once on leaving."""
    generation = getattr(trainer, "vllm_generation", None)
    if not (getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "colocate"
            and getattr(generation, "enable_sleep_mode", False) and getattr(generation, "llm", None) is not None):
        yield
        return
    engine, generate = generation.llm, generation.generate
    sleep, deferred = engine.sleep, []

    def defer_sleep(level: int = 1, *args, **kwargs):
        deferred.append((level, args, kwargs))

    def generate_and_stay_awake(*args, **kwargs):
        try:
            return generate(*args, **kwargs)
        finally:
            generation._llm_weights_sleeping = False  # its sleep was deferred: the weights are still loaded

    engine.sleep, generation.generate = defer_sleep, generate_and_stay_awake
    try:
        yield
    finally:
        engine.sleep, generation.generate = sleep, generate
        if deferred:
            level, args, kwargs = deferred[-1]
            sleep(level, *args, **kwargs)
            generation._llm_weights_sleeping = True
