"""The PODS step of ``PODSTrainer`` (``PODSStep``, a mixin before ``GRPOTrainer`` in its bases): sample, score,
select, then hand TRL the kept rows. Its methods override or call GRPOTrainer's internals, listed with the rest of
the TRL surface in ``pods_rl.trainer``'s docstring (``tests/test_trl_surface.py`` pins them).

How a training step flows (``PODSTrainer._generate_and_score_completions``)::

    prompts (P = B * oversample_prompts per process, each repeated n times)   # whole groups per process
      -> self._rollout_prompts                (P*n prompts)  # TRL's own preparation, stopped at `_generate`:
                                                             # environments drawn and reset, tool dicts, images
      -> self._generate                       (P*n rollouts) # phase "generation" (multi-turn with tools)
      -> self._calculate_rewards              (P*n, F)       # phase "scoring"
         (adaptive rollouts, pilot_generations = k: one _generate + _calculate_rewards per round, k for
         every prompt, then rounds for the prompts pods_rl.plan_round keeps open; each ends with m..n)
      -> pods_rl.downsample_ragged(reward, counts, m)  (P, m)  # phase "selection" (tiebreak, features); the
                                                             # reward: weighted sum, or per-function standardized
                                                             # over the group under normalize_then_sum
      -> keep the B groups whose kept rewards vary most     (B, m)   (all P = B without over-sampling)
      -> GRPOTrainer._generate_and_score_completions on the B*m kept rows only
         (padding, images, old/reference log-probs, TRL's metrics), with `_generate` and
         `_calculate_rewards` answered from what was already computed above; each kept row carries its prepared
         prompt and gets its own environment instance back, not reset again
      -> advantages = pods_rl.group_advantages(kept rewards) # recomputed on the kept subset (normalize_then_sum:
                                                             # TRL's own, computed on the kept rows)
      -> loss / backward / optimizer step on B*m rows        # phase "update"

Nothing is computed for the n - m discarded rollouts after selection: no log-probs, no loss, no backward.
Evaluation samples ``num_generations_eval`` completions per prompt, m when unset (what GRPO with m costs).
Batch sizes (``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``steps_per_generation``,
``generation_batch_size``) all count *kept* rollouts, so a PODS run and a GRPO run with n = m have the
same update cost; only the generation batch is n/m (times oversample_prompts) larger.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from accelerate.utils import gather
from trl.trainer.utils import nanstd

from pods_rl.adaptive import downsample_ragged, group_is_mixed, plan_round
from pods_rl.downsample import group_advantages, rule_takes_features
from pods_rl.rollouts import images_in_messages, tool_turns
from pods_rl.trainer_config import TRL_RANGE  # importing it checks the TRL version first

logger = logging.getLogger("pods_rl.trainer")


class PODSStep:
    """The PODS step, mixed into ``PODSTrainer`` (``class PODSTrainer(PODSStep, GRPOTrainer)``): ``super()`` here is
    GRPOTrainer. It reads the trainer's attributes (``num_generations``, ``downsample_to``, ``args``, ...)."""

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
            process_slice = slice(self.accelerator.process_index * len(inputs),
                                  (self.accelerator.process_index + 1) * len(inputs))
            local_rewards_per_func = rewards_per_func[process_slice].cpu()  # (B*n, F)
            rewards = self._selection_rewards(local_rewards_per_func.view(num_sampled, n, -1))  # (P, n)
            # A rollout no reward function could score is treated as an average one for selection only;
            # TRL then gives it advantage 0.
            group_mean = torch.nan_to_num(torch.nanmean(rewards, dim=1, keepdim=True), nan=0.0)
            rewards_for_selection = torch.where(torch.isnan(rewards), group_mean, rewards)
            tiebreak, features = self._selection_inputs(generated, local_rewards_per_func, num_sampled, n)
            kept = downsample_ragged(rewards_for_selection, counts, m, self.downsample_rule, tiebreak=tiebreak,
                                     generator=self._selection_generator, features=features)  # (P, m)
            groups = self._select_groups(rewards_for_selection.gather(1, kept), num_groups)  # (B,) ascending
            kept_rows = (kept[groups] + n * groups.unsqueeze(1)).flatten().tolist()  # (B*m,)
            kept_generated = _select_generated(generated, kept_rows, len(inputs))
            kept_rewards_per_func = gather(local_rewards_per_func[kept_rows].to(rewards_per_func.device))

        # Everything below (log-probs, metrics, the loss) sees only the kept rows, each with the prompt it was
        # generated from (its environment's observation and its images included).
        self._pods_stash = {"generated": _with_dataset_images(kept_generated, prompts, kept_rows),
                            "rewards_per_func": kept_rewards_per_func}
        self.num_generations = m  # TRL groups the kept rewards by num_generations
        try:
            with self._kept_environments(kept_rows):
                output = super()._generate_and_score_completions(_kept_inputs(inputs, prompts, kept_rows))
        finally:
            self.num_generations = n
            self._pods_stash = None

        kept_rewards = (kept_rewards_per_func * self.reward_weights.to(kept_rewards_per_func.device)).nansum(1)
        kept_rewards[torch.isnan(kept_rewards_per_func).all(dim=1)] = float("nan")
        if self.multi_objective_aggregation == "sum_then_normalize":
            # Advantages on the kept subset with the library function (same numbers as TRL's, tested).
            # normalize_then_sum keeps TRL's own: computed on the kept rows as GRPO with m would compute them.
            advantages = group_advantages(kept_rewards.view(-1, m), eps=1e-4, scale=self.scale_rewards)  # (G, m)
            local = slice(self.accelerator.process_index * num_groups * m,
                          (self.accelerator.process_index + 1) * num_groups * m)
            output["advantages"] = advantages.flatten()[local].to(output["advantages"].device)
        self._log_selection_metrics(rewards_per_func, kept_rewards.view(-1, m), n)
        return output

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
            generated = self._generate(prompts)  # (P*n) rollouts
            _write_extra_fields(inputs, generated[5])  # rollout_func extras are reward inputs (as in TRL)
            rewards_per_func = self._calculate_rewards(inputs, prompts, generated[3], generated[1])  # (N, F)
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
                self._pods_in_rounds = True
                try:
                    generated = self._generate(round_prompts)
                    _write_extra_fields(round_inputs, generated[5])
                    round_per_func = self._calculate_rewards(round_inputs, round_prompts, generated[3], generated[1])
                finally:
                    self.num_generations = n
                    self._pods_in_rounds = False
                with self._phase("selection"):
                    local = round_per_func[rank * round_rows: rank * round_rows + local_rows].cpu()  # (local_rows, F)
                    if local_per_func is None:
                        local_per_func = torch.full((P * n, local.shape[1]), float("nan"), dtype=local.dtype)
                    local_per_func[round_slots] = local
                    if self._adaptive_reward_index is None:  # the total that selection uses, NaN where unscored
                        summed = (local.double() * weights).nansum(dim=1)
                        summed = summed.masked_fill(torch.isnan(local).all(dim=1), float("nan"))
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
            _write_extra_fields(inputs, generated[5])
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
        ``_PromptsPrepared``: TRL draws each row's environment from its pool and resets it (its observation joins
        the prompt), builds the per-rollout tool dicts and puts the dataset's images into the messages, exactly as
        it would for GRPO. Nothing is generated or scored here.
        """
        self._pods_capture = True
        try:
            super()._generate_and_score_completions(inputs)
        except _PromptsPrepared as prepared:
            return prepared.prompts
        finally:
            self._pods_capture = False
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

    def _selection_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """(P, n, F) local rewards per function -> (P, n): what selection ranks the n rollouts of a prompt on.

        ``sum_then_normalize`` (TRL's default): the weighted sum of the functions' rewards, the reward GRPO's
        advantages normalize. ``normalize_then_sum``: each function's rewards standardized over the prompt's n
        rollouts (TRL's formula: nan-aware mean and std, + 1e-4), then weighted and summed, so that a function
        counts by its weight, not by its scale. NaN where no function scored the rollout.
        """
        weights = self.reward_weights.cpu().to(rewards_per_func.dtype)  # (F,)
        if self.multi_objective_aggregation == "normalize_then_sum":
            mean = torch.nanmean(rewards_per_func, dim=1, keepdim=True)  # (P, 1, F)
            std = nanstd(rewards_per_func, dim=1, keepdim=True)  # (P, 1, F)
            rewards = (((rewards_per_func - mean) / (std + 1e-4)) * weights).nansum(dim=2)  # (P, n)
        else:
            rewards = (rewards_per_func * weights).nansum(dim=2)  # (P, n)
        return rewards.masked_fill(torch.isnan(rewards_per_func).all(dim=2), float("nan"))

    def _select_groups(self, kept_rewards: torch.Tensor, num_groups: int) -> torch.Tensor:
        """The ``num_groups`` of the P sampled groups (rows of ``kept_rewards`` (P, m)) that reach the update.

        Without over-sampling (P == B) all of them. Otherwise the groups whose kept rewards have the largest
        variance, groups whose kept rewards are all equal (zero advantage: nothing to learn) last, ties by
        sampling order. Logs prompts sampled, zero-variance groups and the kept groups' variance (global).
        """
        num_sampled = kept_rewards.shape[0]
        variance = kept_rewards.double().var(dim=1, unbiased=False)  # (P,)
        zero = (kept_rewards == kept_rewards[:, :1]).all(dim=1)  # (P,) exact: no rounding noise
        score = torch.where(zero, torch.full_like(variance, -1.0), variance)
        if num_sampled == num_groups:
            groups = torch.arange(num_sampled)
        else:
            groups = torch.sort(score, descending=True, stable=True).indices[:num_groups].sort().values  # (B,)
        selected = torch.zeros(num_sampled, dtype=torch.bool)
        selected[groups] = True
        stats = gather(torch.stack([variance, zero.double(), selected.double()], dim=1).to(self.accelerator.device))
        variance, zero, selected = stats[:, 0], stats[:, 1].bool(), stats[:, 2].bool()  # (P * processes,) each
        metrics = self._metrics["train"]
        metrics["pods/prompts_sampled"].append(float(stats.shape[0]))
        metrics["pods/groups_zero_std"].append(zero.sum().item())
        metrics["pods/groups_zero_std_kept"].append((zero & selected).sum().item())
        metrics["pods/kept_groups_var_mean"].append(variance[selected].mean().item())
        return groups

    def _selection_inputs(self, generated, local_rewards_per_func, num_groups: int, n: int):
        """The tiebreak (B, n) of ``downsample_tiebreak`` and, for rules that take them, the rollout features:
        ``lengths`` (B, n) tokens the model generated (tool results excluded), ``rewards_per_func`` (B, n, F),
        ``truncated`` (B, n) bool, ``tool_calls`` (B, n) and ``turns`` (B, n) model turns of a multi-turn rollout
        (0 and 1 without tools)."""
        tiebreak_mode = self.args.downsample_tiebreak
        takes_features = rule_takes_features(self.downsample_rule)
        if tiebreak_mode == "index" and not takes_features:
            return None, None
        completion_ids, tool_mask = generated[1], generated[2]
        counts = [sum(mask) for mask in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        lengths = torch.tensor(counts, dtype=torch.long).view(num_groups, n)  # (B, n)
        tiebreak = {"index": None, "shorter": lengths, "longer": -lengths}[tiebreak_mode]
        if not takes_features:
            return tiebreak, None
        # The stop tokens TRL itself counts for clipped_ratio: TRL >= 1.13 keeps the generation config's EOS ids too
        # (eos_token_ids); 1.12 knows only the tokenizer's.
        eos_ids = getattr(self, "eos_token_ids", None) or [self._tokenizer.eos_token_id]
        eos_and_pad = {*eos_ids, self._tokenizer.pad_token_id}
        truncated = torch.tensor([len(ids) > 0 and ids[-1] not in eos_and_pad for ids in completion_ids])
        features = {
            "lengths": lengths,
            "rewards_per_func": local_rewards_per_func.view(num_groups, n, -1),  # (B, n, F)
            "truncated": truncated.view(num_groups, n),  # (B, n): hit max_completion_length (as TRL's clipped_ratio)
        }
        calls, turns = tool_turns(tool_mask, len(completion_ids))
        features["tool_calls"] = torch.tensor(calls, dtype=torch.long).view(num_groups, n)  # (B, n)
        features["turns"] = torch.tensor(turns, dtype=torch.long).view(num_groups, n)  # (B, n)
        return tiebreak, features

    def _log_selection_metrics(self, rewards_per_func, kept_rewards, n):
        """Reward statistics over all n sampled and over the m kept rollouts (global over processes)."""
        all_rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(1)
        all_rewards[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")
        all_rewards = all_rewards.view(-1, n)  # (G, n)
        metrics = self._metrics["train"]
        metrics["pods/reward_all_mean"].append(torch.nanmean(all_rewards).item())
        metrics["pods/reward_all_std"].append(nanstd(all_rewards).item())
        metrics["pods/reward_kept_mean"].append(torch.nanmean(kept_rewards).item())
        metrics["pods/reward_kept_std"].append(nanstd(kept_rewards).item())
        zero_all, zero_kept = _all_equal(all_rewards), _all_equal(kept_rewards)  # (G,) each
        metrics["pods/frac_zero_std_all"].append(zero_all.float().mean().item())
        metrics["pods/frac_zero_std_kept"].append(zero_kept.float().mean().item())


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


def _all_equal(rewards: torch.Tensor) -> torch.Tensor:
    """(G, k) rewards -> (G,) bool: every non-NaN reward of the group is the same value, exactly.

    A tolerance on the std would miss many such groups: the float32 std of 16 copies of 0.8 is 6e-8, not 0.
    """
    top = torch.where(torch.isnan(rewards), float("-inf"), rewards).amax(dim=1)
    bottom = torch.where(torch.isnan(rewards), float("inf"), rewards).amin(dim=1)
    return top <= bottom


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


def _arrange_rounds(outputs: list[tuple], slots: list[list[int]], num_prompts: int, n: int) -> tuple:
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

    return tuple(merge([output[i] for output in outputs]) for i in range(len(outputs[0])))


def _select_generated(generated: tuple, rows: list[int], num_rows: int) -> tuple:
    """Keep ``rows`` of every per-rollout entry of ``GRPOTrainer._generate``'s output tuple."""

    def pick(value):
        if isinstance(value, list) and len(value) == num_rows:
            return [value[i] for i in rows]
        if isinstance(value, dict):
            return {k: pick(v) for k, v in value.items()}
        return value  # None, or a per-batch scalar

    return tuple(pick(value) for value in generated)


class _PromptsPrepared(BaseException):  # noqa: N818 - a signal, not an error; BaseException passes any `except Exception`
    """Raised by ``PODSTrainer._generate`` while TRL prepares the prompts (see ``_rollout_prompts``)."""

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


def _with_dataset_images(generated: tuple, prompts: list, rows: list[int]) -> tuple:
    """``_generate``'s tuple for the kept rows, with the dataset's images where it has none ([6] is None after a
    ``rollout_func``: TRL then uses the dataset's, which ``_kept_inputs`` takes off the rows)."""
    if generated[6] is not None:
        return generated
    images = [images_in_messages(prompts[i]) for i in rows]
    if not any(images):
        return generated
    return (*generated[:6], images, *generated[7:])
