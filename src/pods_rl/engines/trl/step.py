"""The PODS step of ``PODSTrainer`` (``PODSStep``, a mixin before ``GRPOTrainer``), in
``PODSStep._generate_and_score_completions``: the planners first (where they give every prompt m, GRPO's own step on
those m rows), then prepare the prompts as TRL does, sample n per prompt and score them (phases "generation",
"scoring"), select m ("selection"), then run GRPOTrainer's own method on the B*m kept rows with num_generations = m,
its ``_generate`` and ``_calculate_rewards`` answered from ``KeptRollouts``; TRL's loss, backward and optimizer step
follow ("update"). The GRPOTrainer internals it touches are listed in ``trainer.py``'s docstring;
``docs/concepts/follow-a-step.md`` walks the step.

The contract (``tests/test_contract.py``): on the rows it keeps, the step produces what GRPOTrainer with m produces on
those rollouts, so whatever TRL keeps per rollout is cut to the kept rows first (``rows.py``). Nothing is computed for
the n - m dropped rollouts after selection. Batch sizes count *kept* rollouts.
"""

from __future__ import annotations

import functools
import logging
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from accelerate.utils import gather

from pods_rl.advantages import sampled_baseline_advantages
from pods_rl.budget.rollout_budget import candidate_ids
from pods_rl.downsample import rule_takes_features
from pods_rl.engines.trl.adapter import (
    add_extra_logs,
    batch_rollout_state,
    completions_column,
    count_tool_exceptions,
    extra_logs_set_aside,
    generation_metrics_dropped,
    grouped_by,
    kept_environments,
    log_generation_metrics,
    log_train_metrics,
    metrics_logged,
    one_sleep_per_step,
    put_back_metrics,
    round_rollout_state,
    stop_ids,
    take_extra_logs,
    tool_names,
    trl_prepared_prompts,
    trl_step_on,
)
from pods_rl.engines.trl.rounds import Rounds, RoundsHost
from pods_rl.engines.trl.rows import (
    Generated,
    Sampled,
    Scored,
    keep_extra_logs,
    mask_padding,
    padded_kept_rows,
    select_rows,
    tool_calls_and_failures,
    with_dataset_images,
    write_extra_fields,
)
from pods_rl.rollouts import rollout_features
from pods_rl.selection import all_equal, reward_totals, select

logger = logging.getLogger("pods_rl.trainer")


@dataclass(eq=False)
class KeptRollouts:
    """What TRL's step on the kept rows is answered with (``_generate``'s tuple, every process's kept rewards)."""

    generated: Generated
    rewards_per_func: torch.Tensor  # (B*m*processes, F)
    rescore_for_metrics: bool = False
    tool_calls: list[int] | None = None  # (B*m,) with tools: each kept rollout's tool calls and failed calls, as
    tool_failures: list[int] | None = None  # TRL's tool loop counted them
    rows: list[int] | None = None  # (B*m,) the kept rows' indices among the P*n sampled
    padded: list[bool] | None = None  # (B*m,) answer rounds: rows that pad a group that stopped below m


class PODSStep:
    """The PODS step, mixed into ``PODSTrainer(PODSStep, GRPOTrainer)``: ``super()`` here is GRPOTrainer. Reads
    ``num_generations`` (n), ``downsample_to`` (m), ``args`` (a ``PODSConfig``), set by ``PODSTrainer.__init__``."""

    # Class-level defaults, so that a trainer built without __init__ (TRL's tests build GRPOTrainers with
    # object.__new__) behaves as plain GRPO.
    _budget = None  # the planners and the prompt ledger (budget.RolloutBudget), None without planners
    _adaptive_reward_index = None  # column of rewards_per_func that decides "mixed" (None: the total)
    _selects = False
    phase_clock = None
    _at_m = None  # while a step runs as GRPO's own (``_grpo_step_at_m``): the rewards TRL's scoring returned
    _no_variance_rounds = 0  # generation rounds in a row in which no group's rewards varied
    _warned_no_variance = False
    # Generation rounds in a row without any reward variance before the terminal hears of it (once per run).
    NO_VARIANCE_WARN_ROUNDS = 10

    def _generate_and_score_completions(self, inputs):
        """One PODS training step, its phases in order; returns TRL's batch for the B*m kept rows."""
        if not self.model.training or not self._selects:
            return super()._generate_and_score_completions(inputs)  # evaluation, or GRPO (m = n)
        n = self.num_generations
        self._check_whole_groups(inputs)  # P*n rows: P prompts (B kept groups x oversample_prompts), n times each
        num_sampled = len(inputs) // n  # P
        # 1. the planners: which prompts get rollouts and how many (None, None without planners); first, so that a
        # step at m prepares only the rows GRPO would
        ids, first = self._plan_rollouts(inputs)  # (P,), (P,)
        if self._plain_at_m(first):  # m for each of the B prompts: nothing to select, GRPO's own step
            return self._grpo_step_at_m(inputs, ids)
        # 2. the prompts, prepared by TRL's own code (environments, tool dicts, images) on copies the step annotates
        inputs = [dict(x) for x in inputs]
        prompts = self._rollout_prompts(inputs)  # (P*n,)
        raised = count_tool_exceptions(self, len(inputs)) if self.tools else None  # (P*n,) live, with tools
        # 3. generate and score n per prompt (or in rounds)
        sampled = self._sample_rollouts(inputs, prompts, num_sampled, first, ids)  # P*n rollouts, rewards, logs
        if self._budget is not None:
            self._budget.costs.sampled(int(sampled.counts.sum()))  # the auto planner's N (the phase clock's step)
            self._record_in_ledger(ids, sampled.rewards_per_func, sampled.counts, n)
        # 4. select: m of each group's n, B of the P groups
        kept = self._select_kept(inputs, prompts, sampled, raised)  # kept.rows (B*m,)
        # 5. TRL's own step on the kept rows: log-probs, advantages grouped by m, metrics
        output = self._train_on_kept(inputs, prompts, sampled, kept)
        if kept.padded is not None:  # padding rows out of the loss; the answer rounds' metrics (collectives)
            padding = mask_padding(output, kept.padded, self._gather)
            counts = self._gather(sampled.counts.reshape(-1)).cpu()  # (P * processes,)
            log_train_metrics(self, self._budget.round_metrics(counts, padding))
        if self.args.advantage_baseline == "sampled":  # 6. advantages baselined on every sampled rollout instead
            self._use_sampled_baseline(output, sampled, kept.rows, len(inputs))
        return output

    def _check_whole_groups(self, inputs: list[dict]) -> None:
        """Raise unless ``inputs`` holds at least B whole groups of n rows."""
        n, num_groups = self.num_generations, self._kept_groups_per_process  # B, local
        if len(inputs) % n != 0:
            raise RuntimeError(f"PODS expects whole groups of n={n} rollouts per process, got {len(inputs)} rows.")
        if len(inputs) // n < num_groups:
            raise RuntimeError(f"PODS expects at least {num_groups} groups per process, got {len(inputs) // n}.")

    def _plan_rollouts(self, inputs: list[dict]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The candidates' ``ids`` (P,) and the planners' rollouts per prompt (P,); None, None without planners."""
        if self._budget is None:
            return None, None
        ids = candidate_ids(inputs, self.num_generations)  # (P,)
        # a planner's calibration, when due: with the current policy, before the step that needs it
        log_train_metrics(self, self._budget.calibrate(
            self._sample_held_out, step=self.state.global_step, rank=self.accelerator.process_index,
            processes=self.accelerator.num_processes, per_device_rows=self.args.per_device_train_batch_size,
            gather=self._gather))
        first, metrics = self._budget.plan(ids, self._kept_groups_per_process, step=self.state.global_step,
                                           rank=self.accelerator.process_index, pilot=self.args.pilot_generations)
        log_train_metrics(self, metrics)
        return ids, first

    def _plain_at_m(self, first: torch.Tensor | None) -> bool:
        """Whether the step is GRPO's own on every process: the planners gave each of exactly B prompts m rollouts
        and nothing decides later (no rounds, answer rounds, sampled baseline, tools or environments)."""
        if first is None or self.args.is_adaptive or self.args.advantage_baseline == "sampled" or self.tools:
            return False
        if self._budget.needs & {"pilot", "answer_rounds", "reward_rounds"} or getattr(self, "environments", None):
            return False
        at_m = len(first) == self._kept_groups_per_process and bool((first == self.downsample_to).all())
        return not self._any_process(not at_m)

    def _grpo_step_at_m(self, inputs: list[dict], ids: torch.Tensor) -> dict:
        """GRPOTrainer's own step on each prompt's first m rows (auto where sampling does not pay: GRPO, not PODS
        with nothing to choose); its rewards go to the ledger and the cost meter as a sampled step's do."""
        n, m, num_prompts = self.num_generations, self.downsample_to, len(ids)
        self._at_m = []
        try:
            with grouped_by(self, m):  # TRL's advantages, grouped by the m rows each prompt has; rows of their own,
                output = super()._generate_and_score_completions(  # as GRPO's loader gives them
                    [dict(inputs[p * n + j]) for p in range(num_prompts) for j in range(m)])
            every_process = self._at_m[0]  # (P*m*processes, F)
        finally:
            self._at_m = None
        log_train_metrics(self, {"pods/rollouts_sampled": float(every_process.shape[0]), "pods/rounds": 1.0})
        self._budget.costs.sampled(num_prompts * m)
        self._record_in_ledger(ids, self._local_rows(every_process, num_prompts * m),
                               torch.full((num_prompts,), m), m)
        return output

    def _select_kept(self, inputs: list[dict], prompts: list, sampled: Sampled,
                     raised: list[int] | None) -> KeptRollouts:
        """Phase "selection": the B*m rollouts ``pods_rl.selection.select`` keeps of this process's P*n."""
        n = self.num_generations
        num_sampled = len(inputs) // n  # P
        with self._phase("selection"):
            local_rewards_per_func = sampled.rewards_per_func  # (P*n, F)
            counts = sampled.counts if sampled.trainable is None else torch.where(sampled.trainable, sampled.counts, 0)
            selection = select(local_rewards_per_func.view(num_sampled, n, -1), self.reward_weights.cpu(),
                               self._kept_groups_per_process, self.args.selection_settings, counts=counts,
                               aggregation=self.multi_objective_aggregation,
                               features=self._rollout_features(sampled.generated, local_rewards_per_func,
                                                               num_sampled, n),
                               generator=self._selection_generator, gather=self._gather)
            log_train_metrics(self, selection.metrics)
            kept_rows, padded = selection.kept_rows, None  # (B*m,)
            if self._budget is not None and "answer_rounds" in self._budget.needs:  # stopped below m: padding rows
                kept_rows, padded = padded_kept_rows(selection.kept, selection.groups, n)
            generated = select_rows(sampled.generated, kept_rows, len(inputs))
            kept = KeptRollouts(generated=with_dataset_images(generated, prompts, kept_rows),
                                rewards_per_func=self._gather(local_rewards_per_func[kept_rows]),
                                rescore_for_metrics=self._any_process(sampled.user_metrics), rows=kept_rows,
                                padded=padded)
            if raised is not None:
                kept.tool_calls, kept.tool_failures = tool_calls_and_failures(
                    generated.completions, tool_names(self, kept_rows), self.max_tool_calling_iterations,
                    [raised[i] for i in kept_rows])
        return kept

    def _train_on_kept(self, inputs: list[dict], prompts: list, sampled: Sampled, kept: KeptRollouts) -> dict:
        """GRPOTrainer's own ``_generate_and_score_completions`` on the kept rows (their prompts, log_extra values)."""
        add_extra_logs(self, keep_extra_logs(sampled.extra_logs, kept.rows))

        def generate(prompts: list) -> Generated:  # what TRL's `_generate` logs, for the kept rows (GRPO with m's)
            log_generation_metrics(self, kept.generated, kept.tool_calls, kept.tool_failures)
            return kept.generated

        def calculate_rewards(inputs, prompts, completions, completion_ids_list) -> torch.Tensor:
            if kept.rescore_for_metrics:
                self._rescore_for_metrics(inputs, prompts, completions, completion_ids_list)
            return kept.rewards_per_func

        with grouped_by(self, self.downsample_to), kept_environments(self, kept.rows):
            return trl_step_on(self, super()._generate_and_score_completions, _kept_inputs(inputs, prompts, kept.rows),
                               generate, calculate_rewards)

    def _use_sampled_baseline(self, output: dict, sampled: Sampled, kept_rows: list[int], num_rows: int) -> None:
        """``advantage_baseline="sampled"``: TRL's advantages of the kept rows replaced, in the batch and the
        completions table, by ones baselined on every sampled rollout."""
        n = self.num_generations
        rewards_per_func = sampled.rewards_per_func.view(num_rows // n, n, -1)  # (P, n, F)
        totals = reward_totals(rewards_per_func, self.reward_weights)  # (P, n) TRL's sum; NaN: unscorable
        counts = sampled.counts  # (P,)
        padding = torch.arange(totals.shape[1], device=totals.device) >= counts.to(totals.device).unsqueeze(1)
        totals = totals.masked_fill(padding, float("nan"))
        advantages = sampled_baseline_advantages(totals, kept_rows, scale=self.args.scale_rewards == "group")
        output["advantages"] = advantages.to(output["advantages"].device, output["advantages"].dtype)
        every = self._gather(advantages).cpu().tolist()  # the completions table's column: every process's rows
        logged = completions_column(self, "advantages")
        for i, value in enumerate(every):
            logged[len(logged) - len(every) + i] = value

    @property
    def _kept_groups_per_process(self) -> int:
        """B: the groups of m kept rollouts this process trains on per generation."""
        return self.args.per_device_train_batch_size * self.args.steps_per_generation // self.downsample_to

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` concatenated over processes along dim 0 (accelerate's ``gather``, on this process's device)."""
        return gather(tensor.to(self.accelerator.device))

    def _local_rows(self, tensor: torch.Tensor, num_rows: int) -> torch.Tensor:  # this process's, of a gathered one
        rank = self.accelerator.process_index
        return tensor[rank * num_rows:(rank + 1) * num_rows].cpu()

    def _any_process(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any process (a collective: every process calls it)."""
        if self.accelerator.num_processes == 1:
            return bool(flag)
        return bool(self._gather(torch.tensor([float(flag)])).max() > 0)

    def _record_in_ledger(self, ids: torch.Tensor, rewards_per_func: torch.Tensor, counts: torch.Tensor,
                          width: int) -> None:
        """Every process's scored groups into the prompt ledger (one collective), by their deciding reward:
        ``rewards_per_func`` (P*width, F) this process's, ``counts`` (P,) the real rollouts of each group."""
        deciding = self._deciding_rewards(rewards_per_func, self.reward_weights.cpu().double())
        log_train_metrics(self, self._budget.record(
            ids, deciding.view(len(ids), width), counts, step=self.state.global_step,
            epoch=int(self.state.epoch or 0), gather=gather if self.accelerator.num_processes > 1 else None,
            device=self.accelerator.device))

    def _sample_rollouts(self, inputs: list[dict], prompts: list, num_sampled: int,
                         first: torch.Tensor | None = None, ids: torch.Tensor | None = None) -> Sampled:
        """The P*n rollouts of ``inputs`` generated and scored: in one call, or rounds (adaptive, or the planners'
        ``first`` (P,)). TRL's per-rollout buffers (metrics, ``log_extra``) taken out: the kept rows get theirs back."""
        if self.args.is_adaptive or first is not None:
            sampled = self._sample_in_rounds(inputs, prompts, first, ids)
            with self._phase("selection"):
                every_process = self._gather(sampled.rewards_per_func)  # (P*n*processes, F)
        else:
            scored = self._generate_and_score(inputs, prompts)
            every_process = scored.gathered_rewards  # (P*n*processes, F)
            log_train_metrics(self, {"pods/rollouts_sampled": float(every_process.shape[0]), "pods/rounds": 1.0})
            counts = torch.full((num_sampled,), self.num_generations, dtype=torch.long)
            sampled = Sampled(scored.generated, self._local_rows(every_process, len(inputs)), counts,
                              scored.extra_logs, scored.user_metrics)
        self._note_reward_variance(every_process)  # once per step, on every process's whole groups
        return sampled

    def _sample_in_rounds(self, inputs: list[dict], prompts: list, first: torch.Tensor | None,
                          ids: torch.Tensor | None) -> Sampled:
        """The rounds (``rounds.Rounds``), given what they need of the step; vLLM sleeps once per step."""
        weights = self.reward_weights.cpu().double()
        with one_sleep_per_step(self), batch_rollout_state(self) as batch:
            host = RoundsHost(sample_round=functools.partial(self._sample_round, batch, inputs, prompts),
                              gather=self._gather,
                              deciding_rewards=functools.partial(self._deciding_rewards, weights=weights),
                              phase=self._phase, next_round=None if self._budget is None else self._next_round)
            rounds = Rounds(self.args, self.num_generations, self.downsample_to, self.accelerator.process_index, host)
            sampled, metrics = rounds.sample(inputs, first, ids)
        log_train_metrics(self, metrics)
        return sampled

    def _sample_round(self, batch: dict, inputs: list[dict], prompts: list, slots: list[int], padding: int,
                      run_length: int) -> Scored:
        """One round: ``slots``' rows + ``padding`` throw-away rows in their rollout state, grouped by run_length."""
        with round_rollout_state(self, batch, slots, padding, inputs, prompts, self._rollout_prompts) as (rows, texts):
            with grouped_by(self, run_length):
                return self._generate_and_score(rows, texts)

    def _generate_and_score(self, rows: list[dict], prompts: list) -> Scored:
        """GRPOTrainer's ``_generate`` and ``_calculate_rewards`` over ``rows``; TRL's per-rollout buffers taken out."""
        with generation_metrics_dropped(self):
            generated = Generated(*self._generate(prompts))  # (rows) rollouts
        write_extra_fields(rows, generated.extra_fields)  # rollout_func extras are reward inputs (as in TRL)
        with metrics_logged(self) as logged:
            gathered_rewards = self._calculate_rewards(rows, prompts, generated.completions,
                                                       generated.completion_ids)  # (rows*processes, F)
        extra_logs = take_extra_logs(self, len(rows))
        put_back_metrics(self, logged, owned=True)
        return Scored(generated, gathered_rewards, extra_logs, any(not name.startswith("pods/") for name in logged))

    def _sample_held_out(self, rows: list[dict], k: int) -> list:
        """A planner's held-out ``rows``, k completions each in turn, sampled by the current policy through TRL's own
        ``_generate`` (timed as generation; a collective under several processes)."""
        prompts = self._rollout_prompts([dict(row) for row in rows for _ in range(k)])
        with grouped_by(self, k), generation_metrics_dropped(self):
            return Generated(*self._generate(prompts)).completions

    def _next_round(self, *args, first: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The planners' next round after one of the rounds (``RolloutBudget.next_round``), its metrics logged."""
        more, trainable, metrics = self._budget.next_round(
            *args, self._kept_groups_per_process, first=first, step=self.state.global_step,
            rank=self.accelerator.process_index, gather=gather, device=self.accelerator.device)
        log_train_metrics(self, metrics)
        return more, trainable

    def _deciding_rewards(self, rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(rows, F) -> (rows,) the reward that decides "mixed": ``adaptive_reward``'s column, or the total."""
        if self._adaptive_reward_index is None:
            return reward_totals(rewards_per_func.double(), weights)
        return rewards_per_func[:, self._adaptive_reward_index].double()

    def _rollout_prompts(self, inputs: list[dict]) -> list:
        """The prompts GRPOTrainer hands ``_generate`` for ``inputs`` (TRL's code: adapter.trl_prepared_prompts)."""
        return trl_prepared_prompts(self, super()._generate_and_score_completions, inputs)

    def _rollout_features(self, generated: tuple, rewards_per_func: torch.Tensor, num_prompts: int, n: int):
        """What selection may look at besides the rewards, each (P, n) (``pods_rl.rollouts.rollout_features``);
        None when the rule and tiebreak read rewards only."""
        takes_features = rule_takes_features(self.args.selection_settings.rule)
        if self.args.selection_settings.tiebreak == "index" and not takes_features:
            return None
        generated = Generated(*generated)
        return rollout_features(generated.completion_ids, num_prompts,
                                stop_ids=stop_ids(self),
                                tool_mask=generated.tool_mask,
                                rewards_per_func=rewards_per_func if takes_features else None)

    # ---- GRPOTrainer's two calls, timed (TRL's step on the kept rows has them answered: adapter.trl_step_on) ------

    def _generate(self, prompts: list):
        with self._phase("generation"):
            return super()._generate(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self._phase("scoring"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training and (not self._selects or self._at_m is not None):  # TRL's own step (GRPO)
            self._note_reward_variance(rewards_per_func)  # (N, F), gathered over processes; PODS's: once a step
            if self._at_m is not None:
                self._at_m.append(rewards_per_func)
        return rewards_per_func

    def _rescore_for_metrics(self, inputs, prompts, completions, completion_ids_list) -> None:
        """Score the kept rows again for the reward functions' ``log_metric`` values only (TRL's metrics describe the
        rows it trains on); rewards and ``log_extra`` stay the first scoring's. Only in steps that log metrics."""
        with extra_logs_set_aside(self), self._phase("scoring"), metrics_logged(self) as logged:
            super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        put_back_metrics(self, logged, owned=False)

    def _phase(self, name: str):
        """The phase clock's context for ``name`` (nothing to time on a trainer built without __init__)."""
        return nullcontext() if self.phase_clock is None else self.phase_clock.phase(name)

    def _note_reward_variance(self, rewards_per_func: torch.Tensor) -> None:
        """Count rounds in which every group's rewards were all equal (nothing learned); warn once after
        ``NO_VARIANCE_WARN_ROUNDS`` in a row."""
        rewards = reward_totals(rewards_per_func, self.reward_weights).view(-1, self.num_generations).cpu()  # (G, n)
        if not bool(all_equal(rewards).all()):
            self._no_variance_rounds = 0
            return
        self._no_variance_rounds += 1
        if (self._no_variance_rounds < self.NO_VARIANCE_WARN_ROUNDS or self._warned_no_variance
                or not self.accelerator.is_main_process):
            return
        self._warned_no_variance = True
        scored = rewards[~torch.isnan(rewards)]
        logger.warning(
            "warning: no group of completions has had any reward variance for the last %d generation rounds "
            "(step %d; mean reward %.3g): every advantage is 0, so nothing is learned. Likely cause: %s.",
            self._no_variance_rounds, self.state.global_step,
            scored.mean().item() if scored.numel() else float("nan"),
            _no_variance_cause(scored, getattr(self.args, "temperature", 1.0), self.num_generations))


def _no_variance_cause(scored: torch.Tensor, temperature: float | None, n: int) -> str:
    """The likeliest reason why no group's rewards varied, from the rewards scored (1-d) and the sampling."""
    if scored.numel() == 0:
        return "no reward function scored any completion (all returned None)"
    if temperature is not None and temperature < 0.5:
        return (f"near-greedy sampling (temperature {temperature:g}) makes the {n} completions of a prompt alike: "
                "raise --temperature (TRL's default is 1.0)")
    if bool((scored == scored[0]).all()):
        return (f"every completion of every prompt scores {scored[0].item():g}: a reward function that returns a "
                "constant, gold answers that no completion can match (check the task's data), or a task far too "
                "easy or too hard for this model")
    return ("each prompt is either always solved or never solved by this model: use problems nearer its level, or "
            "more completions per prompt (--num_generations)")


def _kept_inputs(inputs: list[dict], prompts: list, rows: list[int]) -> list[dict]:
    """The kept rows for TRL's call: each with its rollout's prompt (observation and images in its messages), so
    without the ``image(s)`` columns, which TRL would add again."""
    return [{**{k: v for k, v in inputs[i].items() if k not in ("image", "images")}, "prompt": prompts[i]}
            for i in rows]
