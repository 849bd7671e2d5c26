"""Reinforce-Ada (Xiong et al. 2025; code: github.com/RLHFlow/Reinforce-Ada, its verl version's
``RayPPOTrainer._generate_multi_round_adaptive_downsampling`` and ``compute_grpo_outcome_advantage``).

Rounds of ``round_repeat`` rollouts, at most ``max_rounds``, until a prompt has m // 2 positives and m - m // 2
negatives (``balanced``) or one positive (``positive_focused``), positive = reward > ``positive_threshold``; it
keeps m, balanced; the baseline uses all its rollouts (``global_stat_est``). Shapes as ``pods_rl.adaptive``:
rewards (P, n), n = max_rounds x round_repeat, NaN past a prompt's count or unscored; counts (P,).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pods_rl.budget.ledger import PromptLedger
from pods_rl.budget.planners.base import (
    Plan,
    Planner,
    as_ids,
    check_choice,
    check_int,
    check_number,
    make_plan,
    register_planner,
)

__all__ = ["ReinforceAda", "ReinforceAdaSettings"]

_OWNER = "Reinforce-Ada"
CHOICES = ("balanced", "positive_focused")


@dataclass(frozen=True)
class ReinforceAdaSettings:
    """Reinforce-Ada's knobs, named and defaulted as in the released code (``AlgoConfig``, ``run_reinforce_ada.sh``);
    ``final_keep_per_prompt`` is m (the code's ``rollout.n``)."""

    reinforce_ada_choice: str = "balanced"
    positive_threshold: float = 0.7
    max_rounds: int = 4
    round_repeat: int = 8
    final_keep_per_prompt: int = 4
    global_stat_est: bool = True
    norm_adv_by_std_in_grpo: bool = False
    epsilon: float = 1e-6

    def __post_init__(self):
        check_choice(_OWNER, "reinforce_ada_choice", self.reinforce_ada_choice, CHOICES)
        check_number(_OWNER, "positive_threshold", self.positive_threshold, float("-inf"), float("inf"))
        check_int(_OWNER, "max_rounds", self.max_rounds, 1)
        check_int(_OWNER, "round_repeat", self.round_repeat, 1)
        check_int(_OWNER, "final_keep_per_prompt", self.final_keep_per_prompt, 1)
        check_number(_OWNER, "epsilon", self.epsilon, 0.0, 1.0)
        for name in ("global_stat_est", "norm_adv_by_std_in_grpo"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{_OWNER} {name} must be True or False, got {getattr(self, name)!r}")

    @property
    def cap(self) -> int:
        """The most rollouts a prompt can get: max_rounds x round_repeat."""
        return self.max_rounds * self.round_repeat


@register_planner("reinforce_ada")
class ReinforceAda(Planner):
    """Reinforce-Ada, stateless. Per step: ``plan``, ``plan_round`` until all zeros, ``keep``, ``advantages``."""

    kind = "how_many"
    Settings = ReinforceAdaSettings
    needs = frozenset({"reward_rounds"})  # an engine samples its rounds (plan_round)

    def __init__(self, settings: ReinforceAdaSettings | None = None):
        self.settings = settings or ReinforceAdaSettings()

    def _check(self, rewards, counts):
        rewards = torch.as_tensor(rewards).detach().cpu()
        counts = torch.as_tensor(counts).cpu().long()
        n = rewards.shape[1] if rewards.dim() == 2 else -1
        if rewards.dim() != 2 or counts.shape != (rewards.shape[0],) or bool(((counts < 0) | (counts > n)).any()):
            raise ValueError(f"rewards must be (P, n) and counts (P,) in [0, n], got {tuple(rewards.shape)} and "
                             f"{counts.tolist()}")
        valid = (torch.arange(n) < counts.unsqueeze(1)) & ~torch.isnan(rewards.double())
        positive = valid & (rewards.double() > self.settings.positive_threshold)
        return rewards, counts, positive, valid & ~positive

    def finished(self, rewards, counts) -> torch.Tensor:
        """(P,) bool: the prompt met its exit rule (rewards (P, n) padded, counts (P,))."""
        _, _, positive, negative = self._check(rewards, counts)
        m = self.settings.final_keep_per_prompt
        if self.settings.reinforce_ada_choice == "balanced":
            return (positive.sum(1) >= m // 2) & (negative.sum(1) >= m - m // 2)
        return positive.sum(1) >= 1

    def plan(self, ids, ledger: PromptLedger, *, n: int | None = None,
             generator: torch.Generator | None = None) -> Plan:
        """The first round: ``round_repeat`` rollouts per candidate (0 if evicted); ``n``, if given, must be the cap."""
        if n is not None and n != self.settings.cap:
            raise ValueError(f"{_OWNER} samples up to max_rounds x round_repeat = {self.settings.cap} rollouts per "
                             f"prompt, got n={n}; set num_generations to {self.settings.cap}")
        ids = as_ids(ids)
        evicted = ledger.stats(ids).evicted
        return make_plan(ids, torch.where(evicted, 0, self.settings.round_repeat), evicted=evicted)

    def plan_round(self, rewards, counts) -> torch.Tensor:
        """(P,) int64 next-round rollouts: ``round_repeat`` per unfinished prompt under max_rounds, else 0."""
        rewards, counts, _, _ = self._check(rewards, counts)
        s = self.settings
        open_ = ~self.finished(rewards, counts) & (counts // s.round_repeat < s.max_rounds)
        return torch.where(open_, s.round_repeat, 0)

    def keep(self, rewards, counts) -> torch.Tensor:
        """(P, m) int64 kept rollouts, ascending, -1 padding a prompt with fewer than m scored rollouts: the first
        min(m // 2, #pos) positives, then negatives up to m, topped up from the side that has more."""
        rewards, counts, positive, negative = self._check(rewards, counts)
        m = self.settings.final_keep_per_prompt
        kept = torch.full((len(counts), m), -1, dtype=torch.long)
        for p in range(len(counts)):
            pos, neg = torch.nonzero(positive[p]).flatten(), torch.nonzero(negative[p]).flatten()
            take_pos = min(m // 2, len(pos))
            take_neg = min(m - take_pos, len(neg))
            short = m - take_pos - take_neg
            if short > 0 and len(pos) > take_pos:
                take_pos += min(len(pos) - take_pos, short)
            elif short > 0 and len(neg) > take_neg:
                take_neg += min(len(neg) - take_neg, short)
            chosen = torch.cat([pos[:take_pos], neg[:take_neg]]).sort().values
            kept[p, : len(chosen)] = chosen
        return kept

    def advantages(self, rewards, counts, kept) -> torch.Tensor:
        """(P, m) float32 advantages of the kept rollouts (NaN where ``kept`` is -1): baseline from all scored
        rollouts (``global_stat_est``) or the kept ones, in float32 and the code's row order so sums round alike."""
        rewards, counts, positive, negative = self._check(rewards, counts)
        kept = torch.as_tensor(kept).long()
        s = self.settings
        scores = torch.where(kept >= 0, rewards.float().gather(1, kept.clamp(min=0)), float("nan"))  # (P, m)
        out = torch.full_like(scores, float("nan"))
        for p in range(len(counts)):
            # The kept columns in the code's row order: positives first (its pos[:k] + neg[:k]), stable in index.
            columns = torch.nonzero(kept[p] >= 0).flatten()
            kept_positive = positive[p][kept[p][columns]]
            columns = torch.cat([columns[kept_positive], columns[~kept_positive]])
            row = scores[p][columns]
            if s.global_stat_est:
                mean, std = _global_stats(int(positive[p].sum()), int(negative[p].sum()), s.epsilon)
            else:
                mean, std = (row.mean(), row.std()) if len(row) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
            advantage = (row - mean) / (std + s.epsilon) if s.norm_adv_by_std_in_grpo else row - mean
            out[p, columns] = advantage
        return out

    def round_metrics(self, rewards, counts) -> dict[str, float]:
        """``pods/*`` metrics of a finished step: prompts that met the exit rule, rollouts per prompt."""
        _, counts, _, _ = self._check(rewards, counts)
        done = self.finished(rewards, counts)
        return {"pods/prompts_finished": float(done.sum()), "pods/prompts_unfinished": float((~done).sum()),
                "pods/rollouts_per_prompt_mean": counts.double().mean().item() if len(counts) else float("nan"),
                "pods/rollouts_sampled": float(counts.sum())}

    def as_adaptive_rule(self):
        """``plan_round`` as a ``pods_rl.adaptive`` rule (the run's n, round size and m must match the settings)."""
        s = self.settings

        def reinforce_ada_rule(rewards, counts, m, n, round_size, budget=None):
            if (m, n, round_size) != (s.final_keep_per_prompt, s.cap, s.round_repeat) or m > s.round_repeat:
                raise ValueError(f"{_OWNER} as an adaptive rule needs downsample_to (m) = final_keep_per_prompt = "
                                 f"{s.final_keep_per_prompt} <= round_repeat, pilot_generations = "
                                 f"adaptive_round_size = round_repeat = {s.round_repeat} and num_generations = "
                                 f"{s.cap}; got m={m}, round_size={round_size}, n={n}")
            return self.plan_round(rewards, counts)

        return reinforce_ada_rule

    def as_downsample_rule(self):
        """``keep`` as a ``pods_rl.downsample`` rule ``fn(rewards, m, generator)`` (m = ``final_keep_per_prompt``)."""

        def reinforce_ada_keep(rewards, m, generator=None):
            if m != self.settings.final_keep_per_prompt:
                raise ValueError(f"{_OWNER} keeps final_keep_per_prompt = {self.settings.final_keep_per_prompt} "
                                 f"rollouts per prompt; set downsample_to to it (got m={m})")
            return self.keep(rewards, torch.full((rewards.shape[0],), rewards.shape[1]))

        return reinforce_ada_keep

    def state_dict(self) -> dict:
        """Nothing: the rounds of a step keep no state between steps."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""


def _global_stats(positives: int, negatives: int, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The code's baseline: mean and clamped std of ``positives`` ones and ``negatives`` zeros, (0, 1) if <= 1."""
    if positives + negatives <= 1:
        return torch.tensor(0.0), torch.tensor(1.0)
    sample = torch.cat([torch.ones(positives), torch.zeros(negatives)])
    return sample.mean(), torch.clamp(sample.std(), min=epsilon)


# Reinforce-Ada by name in pods-rl's adaptive rounds (PODSTrainer, `pods train`): the adaptive rule and the keep rule
# "reinforce_ada", with the released defaults and the sizes read off the run (round_repeat = the round size, max_rounds
# = n // it, final_keep_per_prompt = m). Its all-samples baseline there is PODSConfig's advantage_baseline="sampled"
# (pods_rl.advantages.sampled_baseline_advantages; docs/concepts/rollout-budgets.md).
def _reinforce_ada_rounds(rewards, counts, m, n, round_size, budget=None):
    if n % round_size or m > round_size:
        raise ValueError(f"{_OWNER} runs whole rounds of adaptive_round_size = pilot_generations rollouts up to "
                         f"num_generations: make n={n} a multiple of the round size {round_size}, and downsample_to "
                         f"(m={m}) at most the round size")
    settings = ReinforceAdaSettings(max_rounds=n // round_size, round_repeat=round_size, final_keep_per_prompt=m)
    return ReinforceAda(settings).plan_round(rewards, counts)


def _reinforce_ada_keep(rewards, m, generator=None):
    settings = ReinforceAdaSettings(max_rounds=1, round_repeat=max(m, rewards.shape[1]), final_keep_per_prompt=m)
    return ReinforceAda(settings).keep(rewards, torch.full((rewards.shape[0],), rewards.shape[1]))


def _register_named_rules() -> None:
    from pods_rl.adaptive import register_adaptive_rule
    from pods_rl.downsample import register_rule

    register_adaptive_rule("reinforce_ada", _reinforce_ada_rounds, overwrite=True)
    register_rule("reinforce_ada", _reinforce_ada_keep, overwrite=True)


_register_named_rules()
