"""``PODSConfig``: ``trl.GRPOConfig`` plus the PODS knobs, and the TRL versions pods-rl supports.

The engine's first module to import TRL, so the version check runs here, before any TRL internal is touched.
``__post_init__`` validates before any model loads, each error one line naming its fix.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from importlib.metadata import version

from packaging.specifiers import SpecifierSet

# The TRL versions whose GRPOTrainer internals this module was tested against (pyproject.toml's pin; a test
# keeps the two equal). The internals used here (`_generate`'s 8-tuple, `_calculate_rewards`,
# `_generate_and_score_completions`, `get_train_dataloader`, `_get_train_sampler`) kept their shape in it.
TRL_RANGE = ">=1.12,<1.17"


def require_supported_trl(trl_version: str) -> None:
    """Refuse a TRL outside ``TRL_RANGE`` before touching its internals: one clear message, not an AttributeError
    in the middle of a training step."""
    if not SpecifierSet(TRL_RANGE).contains(trl_version, prereleases=True):
        if os.environ.get("PODS_RL_TRY_TRL") == trl_version:  # .ci/trl-next.sh tries the next TRL on purpose
            logging.getLogger(__name__).warning("pods_rl.trainer: trying trl %s, outside trl%s (PODS_RL_TRY_TRL)",
                                                trl_version, TRL_RANGE)
            return
        raise ImportError(
            f"pods-rl's TRL engine (PODSTrainer) supports trl{TRL_RANGE} (it subclasses GRPOTrainer and relies on its "
            "internals), "
            f"but trl {trl_version} is installed. Install a supported version: pip install \"trl{TRL_RANGE}\"."
        )



def quiet_checkpointing_deprecations() -> None:
    """Hide transformers' FutureWarnings for the ``gradient_checkpointing*`` model methods, which TRL (1.12-1.16)
    calls around every generation: TRL's code, not the user's to act on; narrowly, by message and module."""
    warnings.filterwarnings("ignore",
                            message=r"`(is_)?gradient_checkpointing(_enable|_disable|_kwargs)?` is deprecated",
                            category=FutureWarning, module=r"transformers\.")


require_supported_trl(version("trl"))  # before the imports below, which reach into TRL's internals

from trl import GRPOConfig, get_peft_config

from pods_rl.adaptive import AdaptiveSettings
from pods_rl.advantages import ADVANTAGE_BASELINES
from pods_rl.engines.settings import PILOT_COMMIT_REASONS, check_planners, spelled
from pods_rl.reward_guard import DEFAULT_REWARD_TIMEOUT_S, MAX_TIMEOUTS_IN_A_ROW
from pods_rl.selection import TIEBREAKS, SelectionSettings, sampled_prompts

# How PODSConfig's users spell the selection settings (SelectionSettings' errors name them so).
CONFIG_NAMES = spelled("trl", "selection")
# The losses that padding rows (an "answer_rounds" planner's) drop out of exactly: their normalizer counts tokens
# through the completion mask. The per-sequence ones would be diluted by them (the planner's released code agrees).
PADDED_LOSS_TYPES = ("dapo", "bnpo", "cispo", "vespo")
PLANNER_OFF = ("none", "null", "")  # a planner field's spellings of "no planner" (YAML's null is None already)


@dataclass
class PODSConfig(GRPOConfig):
    """``trl.GRPOConfig`` plus the PODS knobs; parses from YAML and flags like any TRL config.

    ``num_generations`` is n, rollouts sampled per prompt; all batch sizes count the m kept rollouts."""

    downsample_to: int | None = field(
        default=None,
        metadata={"help": "m: rollouts per prompt kept for the policy update (PODS). Default: num_generations "
                  "(keep all n, which is plain GRPO)."},
    )
    downsample_rule: str = field(
        default="max_variance",
        metadata={"help": "Down-sampling rule, a name from pods_rl.available_rules(): max_variance, "
                  "max_reward, random, or one you registered."},
    )
    downsample_tiebreak: str = field(
        default="index",
        metadata={"help": "Which rollouts a rule keeps among equal rewards (max_variance, max_reward and rules "
                  "that take features): index (lower index first), shorter or longer (by completion tokens). "
                  "The kept reward values do not change.", "choices": list(TIEBREAKS)},
    )
    oversample_prompts: float = field(
        default=1.0,
        metadata={"help": "Sample this many times more prompts per generation round (a number >= 1). After scoring "
                  "and within-group selection, keep the groups whose kept rewards have the largest variance "
                  "(zero-variance groups last), as many as the update batch needs: dynamic sampling (DAPO) on top "
                  "of PODS. The update batch and its cost do not change; generation and scoring grow."},
    )
    pilot_generations: int | None = field(
        default=None,
        metadata={"help": "Adaptive rollouts: k, the rollouts of each prompt's first round. Prompts the adaptive rule "
                  "keeps open (e.g. still all-equal) get more rounds, up to num_generations (n); each prompt ends with "
                  "m..n rollouts and is down-sampled to m. None or 0: n rollouts for every prompt in one round "
                  "(PODS)."},
    )
    adaptive_rule: str = field(
        default="until_mixed",
        metadata={"help": "Which prompts get another round (with pilot_generations): until_mixed (fewer than m "
                  "rollouts, or all rewards equal and fewer than n), budgeted (adaptive_budget rollouts per prompt "
                  "on average, spent on all-equal prompts, fewest rollouts first) or a rule registered with "
                  "pods_rl.register_adaptive_rule."},
    )
    adaptive_round_size: int | None = field(
        default=None,
        metadata={"help": "Rollouts an open prompt gets per round after the pilot (default: pilot_generations)."},
    )
    adaptive_reward: str | None = field(
        default=None,
        metadata={"help": "Which reward decides whether a prompt's rollouts are mixed (with pilot_generations): the "
                  "name of one reward function (e.g. correctness_reward), or None for the weighted total that "
                  "selection uses. With shaped rewards (format bonuses) the total is almost never all-equal, so "
                  "until_mixed stops every prompt after its pilot; name the task's correctness reward instead."},
    )
    adaptive_budget: float | None = field(
        default=None,
        metadata={"help": "For adaptive_rule=budgeted: rollouts per prompt per step on average (a number in "
                  "[max(pilot_generations, downsample_to), num_generations])."},
    )
    prompt_planner: str | None = field(
        default=None,
        metadata={"help": "Which of a step's candidate prompts get rollouts, from what the run has seen of each (a "
                  "planner of pods_rl.budget.planners): greso (skip prompts whose recent groups were all-equal, "
                  "re-admitting some; GRESO) or pilot_commit (pilot every candidate with n_explore rollouts, commit "
                  "B of those whose pilot was mixed to n_commit more, in the same step; Pilot-Commit). Needs "
                  "oversample_prompts > 1: the candidates that replace the skipped prompts. none: no planner (turns a "
                  "recipe's planner off)."},
    )
    prompt_planner_args: dict | str | None = field(
        default=None,
        metadata={"help": "The prompt planner's settings by the paper's names, as a dict or JSON (e.g. "
                  "'{\"target_zero_variance\": 0.25}'; docs: Rollout budgets)."},
    )
    rollout_planner: str | None = field(
        default=None,
        metadata={"help": "How many rollouts each sampled prompt gets (a planner of pods_rl.budget.planners): knapsack "
                  "(Knapsack-RL: a budget of adaptive_budget rollouts per prompt on average, default num_generations, "
                  "spent where groups are likeliest mixed; each prompt gets downsample_to .. num_generations, then "
                  "PODS keeps m), auto (the counts with the most expected learning signal per measured second: m "
                  "where its cost and gain models predict that sampling does not pay, more where they predict it "
                  "does; docs: PODS that picks its own n) or cgrpo (C-GRPO: rounds up budget_grid until a prompt's "
                  "conformal prediction set is a singleton, num_generations = max(budget_grid); PODSTrainer needs "
                  "calibration_dataset= and answer_extractor=). none: no planner, every prompt gets num_generations "
                  "(turns a recipe's planner off)."},
    )
    rollout_planner_args: dict | str | None = field(
        default=None,
        metadata={"help": "The rollout planner's settings by the paper's names, as a dict or JSON."},
    )
    advantage_baseline: str = field(
        default="kept",
        metadata={"help": "What a group's advantage baseline (its mean, and its std with scale_rewards=group) is "
                  "computed from: kept (the m kept rollouts, TRL's own: GRPO with m, as the PODS paper does) or "
                  "sampled (every rollout sampled for the prompt this step: Reinforce-Ada's all-samples baseline, "
                  "whose recipe pairs it with scale_rewards=none). sampled needs multi_objective_aggregation="
                  "sum_then_normalize and scale_rewards group or none."},
    )
    ledger_success_threshold: float = field(
        default=0.5,
        metadata={"help": "With a planner: a rollout succeeds when its deciding reward (adaptive_reward's, or the "
                  "total) is above this; the ledger counts successes per prompt."},
    )
    save_every_seconds: float | None = field(
        default=None,
        metadata={"help": "Save a checkpoint every this many seconds of training time (excludes checkpointing "
                  "and evaluation). None: use TRL's step-based save_strategy only."},
    )
    max_train_seconds: float | None = field(
        default=None,
        metadata={"help": "Stop (and save) once this many seconds of training time have elapsed."},
    )
    reward_timeout_s: float | None = field(
        default=DEFAULT_REWARD_TIMEOUT_S,
        metadata={"help": "Time budget in seconds of one call of one reward function (a batch of completions). A "
                  "call past it is interrupted and its completions are not scored that step (None); "
                  f"{MAX_TIMEOUTS_IN_A_ROW} in a row stop the run. 0 or None: no budget. Enforced when training "
                  "runs in the main thread of a POSIX process."},
    )

    def __post_init__(self):
        n = self.num_generations
        if self.downsample_to is None:
            self.downsample_to = n
        m = self.downsample_to
        if n is not None and not isinstance(m, bool) and isinstance(m, int) and m > n:
            raise ValueError(
                f"downsample_to (m={m}) is larger than num_generations (n={n}): PODS keeps m of the n rollouts "
                f"sampled per prompt, so m <= n. Raise num_generations or lower downsample_to."
            )
        # m, the rule, its tiebreak and over-sampling: checked once, where every engine checks them.
        SelectionSettings.validated(m, self.downsample_rule, self.downsample_tiebreak, self.oversample_prompts,
                                    names=CONFIG_NAMES)
        self._check_adaptive(n, m)
        self._check_planners_and_limits()
        # TRL checks that the generation batch holds whole groups of `num_generations`. Under PODS the batch
        # sizes count kept rollouts, so the same check must be made against m: run TRL's validation with m.
        self.num_generations = m
        if getattr(self, "activation_checkpointing", False) is None and self.gradient_checkpointing is not None:
            # transformers 5.2x renamed gradient_checkpointing (which TRL's config sets) to activation_checkpointing
            # and warns once per config that still sets the old name: pass the value on under the new one, as it would.
            self.activation_checkpointing = self.gradient_checkpointing
        try:
            super().__post_init__()
        except ValueError as err:
            if "used for evaluation" in str(err):
                raise ValueError(eval_batch_problem(self.per_device_eval_batch_size, self.world_size,
                                                     self.num_generations_eval, m)) from None
            if "divisible by num_generations" not in str(err):
                raise
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size}, counted in kept rollouts) is not a multiple "
                f"of downsample_to (m={m}): the update batch must hold whole groups of m kept rollouts. Make "
                f"per_device_train_batch_size * num_processes * steps_per_generation a multiple of {m}."
            ) from None
        finally:
            self.num_generations = n
        self._check_advantage_baseline()
        local_kept = self.per_device_train_batch_size * self.steps_per_generation
        if local_kept % m != 0:
            raise ValueError(
                f"per_device_train_batch_size * steps_per_generation = {self.per_device_train_batch_size} * "
                f"{self.steps_per_generation} = {local_kept} kept rollouts per process and generation round is "
                f"not a multiple of downsample_to (m={m}). Each process must hold whole groups so that selection "
                f"never splits a group: make per_device_train_batch_size * steps_per_generation a multiple of {m}."
            )

    def _check_planners_and_limits(self) -> None:
        """Validate the planners and their settings (JSON strings parsed), time limits, reward weights and timeout."""
        for name in ("prompt_planner", "rollout_planner"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().lower() in PLANNER_OFF:
                setattr(self, name, None)  # off, so that a flag can turn a recipe's planner off
        for name in ("prompt_planner_args", "rollout_planner_args"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    setattr(self, name, json.loads(value) if value.strip() else None)
                except ValueError as err:
                    raise ValueError(f"{name} must be a dict or a JSON object, got {value!r} ({err})") from None
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be a dict or a JSON object, got {getattr(self, name)!r}")
        from pods_rl.budget.planners import available_planners  # (the planners: plain tensor code)
        from pods_rl.budget.planners.base import needs_of
        from pods_rl.budget.rollout_budget import check_planner_settings

        check_planners("trl", {"which_prompts": self.prompt_planner, "how_many": self.rollout_planner},
                       available_planners)
        check_planner_settings(self, names=spelled("trl", "budget"), reasons=PILOT_COMMIT_REASONS["trl"])
        if "answer_rounds" in needs_of(self.rollout_planner) and self.loss_type not in PADDED_LOSS_TYPES:
            raise ValueError(f"rollout_planner={self.rollout_planner!r} pads prompts that stop early with masked "
                             "rows, which only the token-normalized losses exclude exactly: set loss_type to one of "
                             f"{list(PADDED_LOSS_TYPES)} (got {self.loss_type!r})")
        for name in ("save_every_seconds", "max_train_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")
        weights = self.reward_weights
        if weights is not None and len(weights) and all(float(w) == 0 for w in weights):
            raise ValueError(f"reward_weights are all 0 ({list(weights)}): every reward would be 0 and nothing would "
                             "be learned; give at least one reward function a weight.")
        timeout = self.reward_timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or math.isnan(timeout) or timeout < 0):
            raise ValueError(f"reward_timeout_s must be a number of seconds >= 0 (0: no budget), got {timeout!r}.")

    def _check_advantage_baseline(self) -> None:
        """advantage_baseline: kept, or sampled where its baseline is defined (one line each otherwise)."""
        if self.advantage_baseline not in ADVANTAGE_BASELINES:
            raise ValueError(f"advantage_baseline must be one of {list(ADVANTAGE_BASELINES)}, got "
                             f"{self.advantage_baseline!r}.")
        if self.advantage_baseline == "kept":
            return
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("advantage_baseline=sampled takes each prompt's mean of the summed rewards: set "
                             "multi_objective_aggregation=sum_then_normalize, or advantage_baseline=kept.")
        if self.scale_rewards not in ("group", "none"):
            raise ValueError(f"advantage_baseline=sampled scales by each prompt's own std (scale_rewards=group) or "
                             f"not at all (none); got scale_rewards={self.scale_rewards!r}.")

    def _check_adaptive(self, n: int | None, m: int) -> None:
        """Validate the adaptive-rollout knobs (pilot_generations, adaptive_*), each error naming its fix."""
        k = self.pilot_generations
        if k == 0 and not isinstance(k, bool):
            self.pilot_generations = k = None  # 0: off, so that a flag can turn a recipe's pilot off
        if k is None:
            return
        AdaptiveSettings.validated(k, n, m, self.adaptive_rule, self.adaptive_round_size, self.adaptive_budget,
                                   names=spelled("trl", "adaptive"))

    @property
    def selection_settings(self) -> SelectionSettings:
        """The selection settings (m, rule, tiebreak, over-sampling), as ``pods_rl.selection.select`` takes them."""
        return SelectionSettings(m=self.downsample_to, rule=self.downsample_rule, tiebreak=self.downsample_tiebreak,
                                 oversample_prompts=float(self.oversample_prompts), names=CONFIG_NAMES)

    @property
    def is_adaptive(self) -> bool:
        """True when rollouts are sampled in rounds (pilot_generations set)."""
        return self.pilot_generations is not None

    @property
    def eval_generations(self) -> int:
        """Completions per prompt in evaluation: ``num_generations_eval``, else m (what GRPO with m costs)."""
        return self.num_generations_eval or self.downsample_to

    @property
    def is_pods(self) -> bool:
        """True when rollouts are down-sampled (m < n)."""
        return self.downsample_to < self.num_generations

    @property
    def selects(self) -> bool:
        """True when the trainer selects rollouts or groups (m < n, prompt over-sampling, or a planner)."""
        return self.is_pods or self.oversample_prompts > 1 or self.has_planner

    @property
    def has_planner(self) -> bool:
        """True when a rollout-budget planner decides which prompts get rollouts, or how many."""
        return self.prompt_planner is not None or self.rollout_planner is not None

    def sampled_prompts_per_process(self) -> int:
        """Prompts sampled per process and generation round: kept groups times ``oversample_prompts``, rounded up."""
        kept_groups = self.per_device_train_batch_size * self.steps_per_generation // self.downsample_to
        return sampled_prompts(kept_groups, self.oversample_prompts)


def eval_batch_problem(per_device_eval_batch_size: int, num_processes: int, num_generations_eval: int | None,
                        m: int) -> str:
    """The one-line refusal of an evaluation batch that cannot hold whole groups."""
    k = num_generations_eval or m
    which = "num_generations_eval" if num_generations_eval else "downsample_to, m, since num_generations_eval is unset"
    return (f"per_device_eval_batch_size ({per_device_eval_batch_size}) * processes ({num_processes}) is not a "
            f"multiple of the completions evaluation samples per prompt ({k}: {which}): make "
            f"per_device_eval_batch_size a multiple of {k}, or set num_generations_eval to a divisor of it.")


def peft_config(model_args):
    """The PEFT (LoRA) config of TRL's ``ModelConfig`` flags (``use_peft``, ``lora_r``, ...), None without
    ``use_peft``: TRL's ``get_peft_config``, for ``pods train`` (only the engines import TRL)."""
    return get_peft_config(model_args)
