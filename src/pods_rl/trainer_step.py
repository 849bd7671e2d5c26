"""The PODS step of ``PODSTrainer`` (``PODSStep``, a mixin before ``GRPOTrainer`` in its bases), top to bottom:
prepare the prompts as TRL does, sample, score, select, then hand TRL the kept rows. Its methods override or call
GRPOTrainer's internals, listed with the rest of the TRL surface in ``pods_rl.trainer``'s docstring
(``tests/test_trl_surface.py`` pins them). ``docs/concepts/follow-a-step.md`` walks it with file:function names.

One training step (``PODSStep._generate_and_score_completions``)::

    inputs: P prompts per process (B kept groups x oversample_prompts), each row repeated n times
      -> _rollout_prompts         (P*n prompts)   TRL's own preparation, stopped at its `_generate` call
                                                  (environments drawn and reset, tool dicts, images)
      -> _sample_rollouts         (P*n rollouts)  phase "generation" then "scoring": one `_generate` +
                                                  `_calculate_rewards` (GRPOTrainer's), or adaptive rounds
                                                  (_sample_in_rounds: a pilot of k, then rounds for the prompts
                                                  pods_rl.plan_round keeps open; each prompt ends with m..n)
      -> pods_rl.selection.select (P, n, F) -> kept (P, m), groups (B,), pods/* metrics   phase "selection"
      -> GRPOTrainer._generate_and_score_completions on the B*m kept rows only, with num_generations = m: its
         `_generate` and `_calculate_rewards` calls are answered from what was computed above (KeptRollouts);
         padding, old/reference log-probs, the advantages (TRL's own, grouped by m: GRPO with m rollouts) and
         TRL's metrics are TRL's. Each kept row gets its own environment instance back, not reset again.
      -> loss / backward / optimizer step on B*m rows  phase "update" (TRL's)

Nothing is computed for the n - m discarded rollouts after selection: no log-probs, no loss, no backward.
Evaluation samples ``num_generations_eval`` completions per prompt, m when unset (what GRPO with m costs).
Batch sizes (``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``steps_per_generation``,
``generation_batch_size``) all count *kept* rollouts, so a PODS run and a GRPO run with n = m have the
same update cost; only the generation batch is n/m (times oversample_prompts) larger.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
from accelerate.utils import gather

from pods_rl.adaptive import group_is_mixed, plan_round
from pods_rl.downsample import rule_takes_features
from pods_rl.rollouts import images_in_messages, tool_turns
from pods_rl.selection import all_equal, reward_totals, select
from pods_rl.trainer_config import TRL_RANGE  # importing it checks the TRL version first

logger = logging.getLogger("pods_rl.trainer")


class Generated(NamedTuple):
    """``GRPOTrainer._generate``'s 8-tuple, by name (a tuple still: TRL unpacks it as its own). Per-rollout lists,
    except ``extra_fields`` (a ``rollout_func``'s: per-rollout lists or per-batch values) and the Nones TRL leaves
    where a feature is off. ``tests/test_trl_surface.py`` pins the names against TRL's ``return``."""

    prompt_ids: list
    completion_ids: list
    tool_mask: list | None
    completions: list
    logprobs: list | None
    extra_fields: dict | None
    images: list | None
    tool_images: list | None


@dataclass(eq=False)
class KeptRollouts:
    """What TRL's call on the kept rows is answered with: ``_generate``'s tuple and the (gathered) rewards."""

    generated: Generated
    rewards_per_func: torch.Tensor  # (B*m*processes, F)


PREPARE, ROUND = "prepare", "round"


class PODSStep:
    """The PODS step, mixed into ``PODSTrainer`` (``class PODSTrainer(PODSStep, GRPOTrainer)``): ``super()`` here is
    GRPOTrainer. Reads the trainer's ``num_generations`` (n), ``downsample_to`` (m), ``args`` (a ``PODSConfig``:
    ``args.selection_settings``), ``reward_weights`` and ``_selection_generator``, set by ``PODSTrainer.__init__``."""

    # The step's one mode: what a call of `_generate` / `_calculate_rewards` made from inside the step is for.
    #   None           TRL's own call (evaluation; GRPO at m = n): generate and score, timed
    #   PREPARE        TRL is preparing the prompts (`_rollout_prompts`): `_generate` answers with PromptsPrepared
    #   ROUND          an adaptive round: generate and score; the reward variance is noted once per step instead
    #   KeptRollouts   TRL's call on the kept rows: both are answered from it
    # Class-level defaults, so that a trainer built without __init__ (TRL's tests build GRPOTrainers with
    # object.__new__) behaves as plain GRPO.
    _pods_call: str | KeptRollouts | None = None
    _adaptive_reward_index = None  # column of rewards_per_func that decides "mixed" (None: the total)
    _selects = False
    phase_clock = None
    _no_variance_rounds = 0  # generation rounds in a row in which no group's rewards varied
    _warned_no_variance = False
    # Generation rounds in a row without any reward variance before the terminal hears of it (once per run).
    NO_VARIANCE_WARN_ROUNDS = 10

    def _generate_and_score_completions(self, inputs):
        if not self.model.training or not self._selects:
            return super()._generate_and_score_completions(inputs)
        n, m = self.num_generations, self.downsample_to
        if len(inputs) % n != 0:
            raise RuntimeError(f"PODS expects whole groups of n={n} rollouts per process, got {len(inputs)} rows.")
        num_sampled = len(inputs) // n  # P, local: B * oversample_prompts prompts
        num_groups = self.args.per_device_train_batch_size * self.args.steps_per_generation // m  # B, local, updated
        if num_sampled < num_groups:
            raise RuntimeError(f"PODS expects at least {num_groups} groups per process, got {num_sampled}.")
        inputs = [dict(x) for x in inputs]  # rows are annotated below; leave the dataloader's dicts alone
        prompts = self._rollout_prompts(inputs)  # as GRPOTrainer prepares them: environments, tools, images

        # (P*n) rollout rows (prompt p's in rows p*n.., the first counts[p] real), (N, F) gathered, counts (P,)
        generated, rewards_per_func, counts = self._sample_rollouts(inputs, prompts, num_sampled)

        with self._phase("selection"):
            rank = self.accelerator.process_index
            local_rewards_per_func = rewards_per_func[rank * len(inputs):(rank + 1) * len(inputs)].cpu()  # (P*n, F)
            selection = select(local_rewards_per_func.view(num_sampled, n, -1), self.reward_weights.cpu(),
                               num_groups, self.args.selection_settings, counts=counts,
                               aggregation=self.multi_objective_aggregation,
                               features=self._rollout_features(generated, local_rewards_per_func, num_sampled, n),
                               generator=self._selection_generator, gather=self._gather)
            for name, value in selection.metrics.items():
                self._metrics["train"][name].append(value)
            kept_rows = selection.kept_rows  # (B*m,)
            kept = KeptRollouts(
                generated=_with_dataset_images(_select_rows(generated, kept_rows, len(inputs)), prompts, kept_rows),
                rewards_per_func=self._gather(local_rewards_per_func[kept_rows]))

        # Everything below (log-probs, advantages, metrics, the loss) is TRL's own, on the kept rows only, each
        # with the prompt it was generated from (its environment's observation and its images included).
        self._pods_call = kept
        self.num_generations = m  # TRL groups the kept rewards by num_generations
        try:
            with self._kept_environments(kept_rows):
                return super()._generate_and_score_completions(_kept_inputs(inputs, prompts, kept_rows))
        finally:
            self.num_generations = n
            self._pods_call = None

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` concatenated over processes along dim 0 (accelerate's ``gather``, on this process's device)."""
        return gather(tensor.to(self.accelerator.device))

    def _sample_rollouts(self, inputs: list[dict], prompts: list, num_sampled: int):
        """Generate and score the rollouts of the P = ``num_sampled`` prompts of ``inputs`` (P*n rows, each prompt's
        row repeated n times; extra fields of a ``rollout_func`` are written into them).

        Returns ``generated`` (``_generate``'s tuple, P*n rows: prompt p's rollouts in rows p*n .. p*n + counts[p] - 1,
        the rest copies of its first rollout that selection never sees), ``rewards_per_func`` (N = P*n*processes, F)
        gathered over processes, NaN on the copies, and ``counts`` (P,): n for every prompt without
        ``pilot_generations``, else m..n from the adaptive rounds (``_sample_in_rounds``).
        """
        n = self.num_generations
        if self.args.is_adaptive:
            generated, rewards_per_func, counts = self._sample_in_rounds(inputs, prompts, num_sampled)
        else:
            generated = Generated(*self._generate(prompts))  # (P*n) rollouts
            _write_extra_fields(inputs, generated.extra_fields)  # rollout_func extras are reward inputs (as in TRL)
            rewards_per_func = self._calculate_rewards(inputs, prompts, generated.completions,
                                                       generated.completion_ids)  # (N, F)
            counts = torch.full((num_sampled,), n, dtype=torch.long)
            metrics = self._metrics["train"]
            metrics["pods/rollouts_sampled"].append(float(rewards_per_func.shape[0]))
            metrics["pods/rounds"].append(1.0)
        return generated, rewards_per_func, counts

    def _sample_in_rounds(self, inputs: list[dict], prompts: list, num_sampled: int):
        """Adaptive rollouts: a pilot round of k per prompt, then rounds for the prompts ``adaptive_rule`` keeps open.

        Whether a group is mixed is judged on ``adaptive_reward`` (one reward function, e.g. correctness) or by default
        on the weighted total that selection uses; ``pods/frac_zero_std_pilot`` is the share all-equal on it after
        the pilot. Each round is one ``_generate`` + ``_calculate_rewards`` call over this process's open rows. All processes
        run the same rounds (a round runs while any process has a prompt open) with the same number of rows
        (TRL gathers per-row tensors): a process with fewer open rows pads its round with copies of its first
        prompt, which are generated (and counted in ``pods/rollouts_sampled``) but thrown away. Same return layout
        as ``_sample_rollouts``.
        """
        args, n, m = self.args, self.num_generations, self.downsample_to
        k = args.pilot_generations
        round_size = args.adaptive_round_size or k
        budget = None if args.adaptive_budget is None else int(args.adaptive_budget * num_sampled)
        P, rank, device = num_sampled, self.accelerator.process_index, self.accelerator.device
        rewards = torch.full((P, n), float("nan"), dtype=torch.float64)  # (P, n) deciding rewards so far, padded
        local_per_func = None  # (P*n, F) each rollout's rewards per function, NaN where none (yet)
        counts = torch.zeros(P, dtype=torch.long)  # (P,)
        outputs, slots = [], []  # per round: _generate's tuple and each kept row's slot p*n + j
        more = torch.full((P,), k, dtype=torch.long)  # (P,) rollouts to add this round
        sampled, rounds, pilot_all_equal = 0, 0, None
        weights = self.reward_weights.cpu().double()
        with _one_sleep_per_step(self):  # vLLM sleep mode: awake between rounds, asleep after the last
            while True:
                local_rows = int(more.sum())
                round_rows = int(gather(torch.tensor([local_rows], device=device)).max())  # the collective: any open?
                if round_rows == 0:
                    break
                owners = torch.repeat_interleave(torch.arange(P), more).tolist()  # (local_rows,) prompt of each row
                round_slots = [p * n + int(counts[p]) + j for p, j in zip(owners, _ranks_within(owners))]
                # Each new rollout takes the row (and the prompt as TRL prepared it: images included) of its slot.
                round_rows_idx = round_slots + [0] * (round_rows - local_rows)
                round_inputs = [dict(inputs[i]) for i in round_rows_idx]
                round_prompts = [prompts[i] for i in round_rows_idx]
                uniform = round_rows == local_rows and len(set(more[more > 0].tolist())) == 1
                group = int(more.max()) if uniform else 1  # rows come in runs of `group` copies of one prompt
                # TRL's vLLM server mode de-duplicates every rank's gathered prompts by the main process's
                # num_generations: a rank whose rows are not in runs of that size would get another prompt's
                # completions. So the ranks agree: their common run length, else 1 (no de-duplication).
                groups = gather(torch.tensor([group], device=device))  # (processes,)
                self.num_generations = group if bool((groups == group).all()) else 1
                self._pods_call = ROUND
                try:
                    generated = Generated(*self._generate(round_prompts))
                    _write_extra_fields(round_inputs, generated.extra_fields)
                    round_per_func = self._calculate_rewards(round_inputs, round_prompts, generated.completions,
                                                             generated.completion_ids)
                finally:
                    self.num_generations = n
                    self._pods_call = None
                with self._phase("selection"):
                    local = round_per_func[rank * round_rows: rank * round_rows + local_rows].cpu()  # (local_rows, F)
                    if local_per_func is None:
                        local_per_func = torch.full((P * n, local.shape[1]), float("nan"), dtype=local.dtype)
                    local_per_func[round_slots] = local
                    if self._adaptive_reward_index is None:  # the total that selection uses, NaN where unscored
                        summed = reward_totals(local.double(), weights)
                    else:  # one reward function's (e.g. correctness): mixed = some right and some wrong
                        summed = local[:, self._adaptive_reward_index].double()
                    rewards.view(-1)[round_slots] = summed
                    outputs.append(generated)
                    slots.append(round_slots)
                    counts += more
                    sampled += round_per_func.shape[0]
                    rounds += 1
                    if pilot_all_equal is None:
                        pilot_all_equal = (~group_is_mixed(rewards, counts)).double()  # (P,)
                    more = plan_round(rewards, counts, m, n, round_size, args.adaptive_rule, budget=budget)
        with self._phase("selection"):
            generated = _arrange_rounds(outputs, slots, P, n)
            _write_extra_fields(inputs, generated.extra_fields)
            rewards_per_func = gather(local_per_func.to(device))  # (P*n*processes, F)
            metrics = self._metrics["train"]
            metrics["pods/rollouts_sampled"].append(float(sampled))
            metrics["pods/rounds"].append(float(rounds))
            metrics["pods/frac_zero_std_pilot"].append(gather(pilot_all_equal.to(device)).mean().item())
        self._note_reward_variance(rewards_per_func)  # once per step, on the finished groups
        return generated, rewards_per_func, counts

    def _rollout_prompts(self, inputs: list[dict]) -> list:
        """The prompts GRPOTrainer hands to ``_generate`` for ``inputs`` (B*n rows), prepared by TRL's own code.

        Runs GRPOTrainer._generate_and_score_completions up to its ``_generate`` call, which answers by raising
        ``PromptsPrepared``: TRL draws each row's environment from its pool and resets it (its observation joins
        the prompt), builds the per-rollout tool dicts and puts the dataset's images into the messages, exactly as
        it would for GRPO. Nothing is generated or scored here.
        """
        self._pods_call = PREPARE
        try:
            super()._generate_and_score_completions(inputs)
        except PromptsPrepared as prepared:
            return prepared.prompts
        finally:
            self._pods_call = None
        raise RuntimeError("GRPOTrainer._generate_and_score_completions returned without calling _generate: this TRL "
                           f"is not one pods-rl supports (trl{TRL_RANGE}).")

    @contextmanager
    def _kept_environments(self, kept_rows: list[int]):
        """Inside TRL's call on the kept rows, each kept row gets back the environment instance its rollout ran in,
        untouched: TRL draws from a pool holding exactly those instances, and their ``reset`` returns nothing for
        the call (the kept prompts already carry the observation). The dropped rollouts' instances stay in TRL's
        pool for the next batch; afterwards ``self.environments`` lists the whole batch's, as after GRPO's step."""
        environments = getattr(self, "environments", None)
        if not environments:
            yield
            return
        names, pool = self._batch_environments, self._environment_pool
        kept_pool = {name: [] for name in pool}
        for i in kept_rows:
            kept_pool[names[i]].append(environments[i])
        kept = {id(environments[i]): environments[i] for i in kept_rows}
        for environment in kept.values():
            environment.reset = _no_observation  # an instance attribute: the class's reset is not touched
        self._environment_pool = kept_pool
        try:
            yield
        finally:
            for environment in kept.values():
                vars(environment).pop("reset", None)
            self._environment_pool = pool
            self.environments, self._batch_environments = environments, names

    def _rollout_features(self, generated: tuple, rewards_per_func: torch.Tensor, num_prompts: int, n: int):
        """What selection may look at besides the rewards, each (P, n): ``lengths`` tokens the model generated (tool
        results excluded; the tiebreaks read it) and, for rules that take features, ``rewards_per_func`` (P, n, F)
        from this process's (P*n, F), ``truncated`` (bool: hit max_completion_length, as TRL's clipped_ratio),
        ``tool_calls`` and ``turns`` (model turns of a multi-turn rollout; 0 and 1 without tools). None when the
        rule sees rewards only."""
        takes_features = rule_takes_features(self.args.selection_settings.rule)
        if self.args.selection_settings.tiebreak == "index" and not takes_features:
            return None
        generated = Generated(*generated)
        completion_ids, tool_mask = generated.completion_ids, generated.tool_mask
        counts = [sum(mask) for mask in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        features = {"lengths": torch.tensor(counts, dtype=torch.long).view(num_prompts, n)}
        if not takes_features:
            return features
        # The stop tokens TRL itself counts for clipped_ratio: TRL >= 1.13 keeps the generation config's EOS ids too
        # (eos_token_ids); 1.12 knows only the tokenizer's.
        eos_ids = getattr(self, "eos_token_ids", None) or [self._tokenizer.eos_token_id]
        eos_and_pad = {*eos_ids, self._tokenizer.pad_token_id}
        truncated = torch.tensor([len(ids) > 0 and ids[-1] not in eos_and_pad for ids in completion_ids])
        calls, turns = tool_turns(tool_mask, len(completion_ids))
        features["rewards_per_func"] = rewards_per_func.view(num_prompts, n, -1)
        features["truncated"] = truncated.view(num_prompts, n)
        features["tool_calls"] = torch.tensor(calls, dtype=torch.long).view(num_prompts, n)
        features["turns"] = torch.tensor(turns, dtype=torch.long).view(num_prompts, n)
        return features

    # ---- the two GRPOTrainer calls the step answers (see _pods_call) ------------------------------------------

    def _generate(self, prompts: list):
        if self._pods_call == PREPARE:
            raise PromptsPrepared(prompts)
        if isinstance(self._pods_call, KeptRollouts):
            return self._pods_call.generated
        with self._phase("generation"):
            return super()._generate(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if isinstance(self._pods_call, KeptRollouts):
            return self._pods_call.rewards_per_func
        with self._phase("scoring"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training and self._pods_call != ROUND:  # (adaptive rounds note it once, on whole groups)
            self._note_reward_variance(rewards_per_func)  # (N, F), gathered over processes
        return rewards_per_func

    def _phase(self, name: str):
        """The phase clock's context for ``name`` (nothing to time on a trainer built without __init__)."""
        return nullcontext() if self.phase_clock is None else self.phase_clock.phase(name)

    def _note_reward_variance(self, rewards_per_func: torch.Tensor) -> None:
        """Count generation rounds in which every group's n rewards were all equal (all advantages 0: nothing is
        learned); after ``NO_VARIANCE_WARN_ROUNDS`` in a row, say so once with the likely cause."""
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


@contextmanager
def _one_sleep_per_step(trainer):
    """Adaptive rounds with vLLM's sleep mode (colocate): one weight push and one sleep per step, not per round.

    TRL puts the engine to sleep after every ``generate`` call at level 2 (its weights discarded) and pushes the
    whole model again before the next; the rounds of one step call it several times with the same weights. Inside
    the block the engine's ``sleep`` is deferred and TRL is told the weights stayed (they did): the rounds after
    the first generate at once. On leaving, the engine sleeps once, as TRL would have after the last round. (A
    ``wake_up`` of an engine that is awake is a no-op in vLLM.)"""
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


def _write_extra_fields(inputs: list[dict], extra_fields: dict | None) -> None:
    """Write a rollout_func's extra fields (per-rollout lists or per-batch values) into the rows of ``inputs``."""
    for key, values in (extra_fields or {}).items():
        for i, row in enumerate(inputs):
            row[key] = values[i] if isinstance(values, list) else values


def _ranks_within(owners: list[int]) -> list[int]:
    """For each entry, how many earlier entries have the same value: [3, 3, 5, 3] -> [0, 1, 0, 2]."""
    seen: dict[int, int] = {}
    ranks = []
    for owner in owners:
        ranks.append(seen.get(owner, 0))
        seen[owner] = ranks[-1] + 1
    return ranks


def _arrange_rounds(outputs: list[tuple], slots: list[list[int]], num_prompts: int, n: int) -> Generated:
    """Merge the rounds' ``_generate`` tuples into one of P*n rows: row ``slots[r][i]`` holds round r's i-th row
    (a round's padding rows, past ``len(slots[r])``, are dropped); a slot no round filled holds a copy of its
    prompt's first rollout (slot p*n, always filled by the pilot). Per-batch values (anything that is not a list
    with a row for each of a round's rows) come from the first round."""
    rows_per_round = [len(round_slots) for round_slots in slots]
    empty = object()

    def merge(values):
        if isinstance(values[0], dict):
            return {key: merge([v[key] for v in values]) for key in values[0]}
        per_rollout = all(isinstance(v, list) and len(v) >= rows for v, rows in zip(values, rows_per_round))
        if not per_rollout or len(values[0]) == 0:
            return values[0]  # None, or a per-batch value (e.g. TRL's empty tool_images without tools)
        merged = [empty] * (num_prompts * n)
        for value, round_slots in zip(values, slots):
            for i, slot in enumerate(round_slots):
                merged[slot] = value[i]
        return [merged[slot - slot % n] if value is empty else value for slot, value in enumerate(merged)]

    return Generated(*(merge([output[i] for output in outputs]) for i in range(len(outputs[0]))))


def _select_rows(generated: tuple, rows: list[int], num_rows: int) -> Generated:
    """Keep ``rows`` of every per-rollout entry of ``GRPOTrainer._generate``'s output tuple."""

    def pick(value):
        if isinstance(value, list) and len(value) == num_rows:
            return [value[i] for i in rows]
        if isinstance(value, dict):
            return {k: pick(v) for k, v in value.items()}
        return value  # None, or a per-batch scalar

    return Generated(*(pick(value) for value in generated))


class PromptsPrepared(BaseException):  # noqa: N818 - a signal, not an error; BaseException passes any `except Exception`
    """Raised by ``PODSStep._generate`` while TRL prepares the prompts (see ``_rollout_prompts``): a
    BaseException, so that no ``except Exception`` of TRL's on the way catches it."""

    def __init__(self, prompts: list):
        super().__init__("prompts prepared")
        self.prompts = prompts


def _no_observation(**kwargs):
    """Stands in for a kept environment's ``reset`` during TRL's call on the kept rows: nothing to add."""
    return None


def _kept_inputs(inputs: list[dict], prompts: list, rows: list[int]) -> list[dict]:
    """The kept rows as TRL's call on them gets them: each with the prompt its rollout was generated from
    (observation and images in its messages), so without the ``image(s)`` columns, which TRL would put in again."""
    return [{**{k: v for k, v in inputs[i].items() if k not in ("image", "images")}, "prompt": prompts[i]}
            for i in rows]


def _with_dataset_images(generated: Generated, prompts: list, rows: list[int]) -> Generated:
    """``_generate``'s tuple for the kept rows, with the dataset's images where it has none (``images`` is None after
    a ``rollout_func``: TRL then uses the dataset's, which ``_kept_inputs`` takes off the rows)."""
    if generated.images is not None:
        return generated
    images = [images_in_messages(prompts[i]) for i in rows]
    if not any(images):
        return generated
    return generated._replace(images=images)
