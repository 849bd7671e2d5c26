"""GRPO-PODS on top of TRL: generate n rollouts per prompt, keep m, update on the m.

This is the only module of pods-rl that knows TRL's internals (``TRL_RANGE``; CI tests both ends).

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

Our TRL surface (kept as small as it can be; ``tests/test_trl_surface.py`` pins each item on both ends of
``TRL_RANGE``, so that a TRL release that changes one fails in CI naming it, not in a user's run):

  overridden GRPOTrainer methods
    _generate_and_score_completions(inputs)   the PODS step above; calls TRL's own on the kept rows. TRL dropped
                                              its GFPO and replay-buffer trainers when their overrides of this
                                              method drifted from GRPO's: ours keeps TRL's body and only narrows
                                              its input, answering the two calls below from what was computed.
    _generate(prompts) -> 8-tuple             timed ("generation"); answered from the stash inside the inner call;
                                              raises _PromptsPrepared(prompts) inside _rollout_prompts' call.
                                              We read [1] completion_ids, [2] tool_mask, [3] completions,
                                              [5] extra_fields, and keep rows of every per-rollout list.
    _calculate_rewards(inputs, prompts, completions, completion_ids_list) -> (N, F)
                                              timed ("scoring"); answered from the stash inside the inner call.
    get_train_dataloader() / _get_train_sampler(dataset=None)
                                              n rollouts per prompt while batch sizes count the m kept: TRL's
                                              RepeatSampler / repeat_iterable_dataset with our prompt count, and
                                              transformers' Trainer._get_dataloader(dataset, description,
                                              batch_size, sampler_fn, is_training).
    create_model_card / save_model(output_dir, _internal_call)   the PODS model card (TRL's conventions)
    evaluate(eval_dataset, ignore_keys, metric_key_prefix)   checks the eval batch holds whole groups first
  GRPOTrainer._generate_and_score_completions' order   environments (self._environment_pool, a cursor per name,
                           reset), tool dicts and images are prepared before `self._generate(prompts)`; rows read
                           their prompt from x["prompt"] (x.get with environments)
  TRL helpers we call      trl.trainer.utils: RepeatSampler(data_source, mini_repeat_count, batch_size,
                           repeat_count, shuffle, seed), repeat_iterable_dataset(dataset, mini_repeat_count,
                           batch_size, repeat_count), nanstd(tensor); get_config_model_id,
                           get_comet_experiment_url, get_trackio_space_url (model card)
  GRPOTrainer attributes we read   num_generations (set to m around the inner call: TRL groups by it),
                           num_iterations, shuffle_dataset, reward_weights, scale_rewards, _metrics["train"],
                           num_generations_eval (set to m unless configured), multi_objective_aggregation,
                           environments, _batch_environments, _environment_pool (swapped for the kept rows' own
                           instances around the inner call),
                           _tokenizer, environment_factories, tools, eos_token_ids (TRL >= 1.13; 1.12: the
                           tokenizer's), _paper, _tag_names; vllm_generation (TRL's VLLMGeneration, built in
                           GRPOTrainer.__init__ inside our CPU workaround; release_vllm_engine drops its .llm)
  GRPOConfig               subclassed (PODSConfig); __post_init__ runs with num_generations = m and its
                           "divisible by num_generations" and "used for evaluation" errors are reworded (the eval
                           check then counts num_generations_eval or m); fields read: num_generations,
                           num_generations_eval, per_device_eval_batch_size,
                           generation_batch_size, steps_per_generation, per_device_train_batch_size,
                           num_iterations, multi_objective_aggregation, scale_rewards, reward_weights, seed,
                           beta, loss_type, learning_rate, hub_model_id, output_dir, use_vllm, vllm_mode, use_cpu
"""

from __future__ import annotations

import gc
import logging
import math
import os
import textwrap
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from packaging.specifiers import SpecifierSet

# The TRL versions whose GRPOTrainer internals this module was tested against (pyproject.toml's pin; a test
# keeps the two equal). The internals used here (`_generate`'s 8-tuple, `_calculate_rewards`,
# `_generate_and_score_completions`, `get_train_dataloader`, `_get_train_sampler`) kept their shape in it.
TRL_RANGE = ">=1.12,<1.17"


def _require_supported_trl(trl_version: str) -> None:
    """Refuse a TRL outside ``TRL_RANGE`` before touching its internals: one clear message, not an AttributeError
    in the middle of a training step."""
    if not SpecifierSet(TRL_RANGE).contains(trl_version, prereleases=True):
        if os.environ.get("PODS_RL_TRY_TRL") == trl_version:  # .ci/trl-next.sh tries the next TRL on purpose
            logging.getLogger(__name__).warning("pods_rl.trainer: trying trl %s, outside trl%s (PODS_RL_TRY_TRL)",
                                                trl_version, TRL_RANGE)
            return
        raise ImportError(
            f"pods_rl.trainer supports trl{TRL_RANGE} (it subclasses GRPOTrainer and relies on its internals), "
            f"but trl {trl_version} is installed. Install a supported version: pip install \"trl{TRL_RANGE}\"."
        )


_require_supported_trl(version("trl"))  # before the imports below, which reach into TRL's internals

import torch
from accelerate.utils import gather
from transformers import AutoConfig, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler, nanstd, repeat_iterable_dataset

from pods_rl import tiny
from pods_rl.adaptive import available_adaptive_rules, downsample_ragged, group_is_mixed, plan_round
from pods_rl.downsample import available_rules, group_advantages, rule_takes_features
from pods_rl.reward_guard import (
    DEFAULT_REWARD_TIMEOUT_S,
    MAX_TIMEOUTS_IN_A_ROW,
    guard_reward_funcs,
    reward_weights_of,
)
from pods_rl.rollouts import images_in_messages, tool_turns

logger = logging.getLogger(__name__)

PHASES = ("generation", "scoring", "selection", "update")
_TIEBREAKS = ("index", "shorter", "longer")
_BUILTIN_RULES = ("max_variance", "max_reward", "random")


@dataclass
class PODSConfig(GRPOConfig):
    """``trl.GRPOConfig`` plus the PODS knobs. Parses from YAML and flags like any TRL config.

    ``num_generations`` keeps TRL's meaning: n, rollouts sampled per prompt. All batch sizes count the
    m kept rollouts (the update batch), e.g. ``per_device_train_batch_size=16`` with n=64 -> m=16 trains on
    one group of 16 kept rollouts per device and micro-step, sampled from 64.
    """

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
                  "The kept reward values do not change.", "choices": ["index", "shorter", "longer"]},
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
        if isinstance(m, bool) or not isinstance(m, int):
            raise ValueError(f"downsample_to (m) must be an integer, got {m!r}.")
        if n is not None and m > n:
            raise ValueError(
                f"downsample_to (m={m}) is larger than num_generations (n={n}): PODS keeps m of the n rollouts "
                f"sampled per prompt, so m <= n. Raise num_generations or lower downsample_to."
            )
        if m < 2:
            raise ValueError(
                f"downsample_to (m={m}) must be at least 2: group-normalized advantages of a single kept rollout "
                f"are always 0, so nothing would be learned."
            )
        if self.downsample_rule not in available_rules():
            raise ValueError(
                f"Unknown downsample_rule {self.downsample_rule!r}; available rules: {available_rules()} "
                f"(add your own with pods_rl.register_rule)."
            )
        if self.downsample_tiebreak not in _TIEBREAKS:
            raise ValueError(f"downsample_tiebreak must be one of {list(_TIEBREAKS)}, got {self.downsample_tiebreak!r}.")
        if (self.downsample_tiebreak != "index" and self.downsample_rule not in _BUILTIN_RULES
                and not rule_takes_features(self.downsample_rule)):
            raise ValueError(
                f"downsample_tiebreak={self.downsample_tiebreak!r} needs a rule that sees the rollouts, but rule "
                f"{self.downsample_rule!r} takes no features keyword (see pods_rl.register_rule); use "
                f"downsample_tiebreak=index or add `*, features` to the rule.")
        self._check_adaptive(n, m)
        o = self.oversample_prompts
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not 1 <= o < float("inf"):
            raise ValueError(f"oversample_prompts must be a number >= 1 (1: no over-sampling), got {o!r}.")
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
        # TRL checks that the generation batch holds whole groups of `num_generations`. Under PODS the batch
        # sizes count kept rollouts, so the same check must be made against m: run TRL's validation with m.
        self.num_generations = m
        try:
            super().__post_init__()
        except ValueError as err:
            if "used for evaluation" in str(err):
                raise ValueError(_eval_batch_problem(self.per_device_eval_batch_size, self.world_size,
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
        local_kept = self.per_device_train_batch_size * self.steps_per_generation
        if local_kept % m != 0:
            raise ValueError(
                f"per_device_train_batch_size * steps_per_generation = {self.per_device_train_batch_size} * "
                f"{self.steps_per_generation} = {local_kept} kept rollouts per process and generation round is "
                f"not a multiple of downsample_to (m={m}). Each process must hold whole groups so that selection "
                f"never splits a group: make per_device_train_batch_size * steps_per_generation a multiple of {m}."
            )

    def _check_adaptive(self, n: int | None, m: int) -> None:
        """Validate the adaptive-rollout knobs (pilot_generations, adaptive_*), each error naming its fix."""
        k = self.pilot_generations
        if k == 0 and not isinstance(k, bool):
            self.pilot_generations = k = None  # 0: off, so that a flag can turn a recipe's pilot off
        if k is None:
            return
        if isinstance(k, bool) or not isinstance(k, int) or n is None or not 1 <= k <= n:
            raise ValueError(f"pilot_generations (k) must be an integer in [1, num_generations={n}], got {k!r}.")
        if m == n:
            raise ValueError(f"pilot_generations needs downsample_to (m) < num_generations (n={n}): every prompt must "
                             "reach m rollouts anyway, so rounds would change nothing. Lower downsample_to or drop "
                             "pilot_generations.")
        if self.adaptive_rule not in available_adaptive_rules():
            raise ValueError(f"Unknown adaptive_rule {self.adaptive_rule!r}; available: {available_adaptive_rules()} "
                             "(add your own with pods_rl.register_adaptive_rule).")
        r = self.adaptive_round_size
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise ValueError(f"adaptive_round_size must be a positive integer (default: pilot_generations), got {r!r}.")
        budget = self.adaptive_budget
        if self.adaptive_rule == "budgeted":
            low = max(k, m)
            if (budget is None or isinstance(budget, bool) or not isinstance(budget, (int, float))
                    or not low <= budget <= n):
                raise ValueError(f"adaptive_rule=budgeted needs adaptive_budget, the mean rollouts per prompt per step, "
                                 f"in [max(pilot_generations, downsample_to)={low}, num_generations={n}]; got "
                                 f"{budget!r}.")
        elif budget is not None:
            raise ValueError(f"adaptive_budget is only read by adaptive_rule=budgeted (got adaptive_rule="
                             f"{self.adaptive_rule!r}); drop it or set adaptive_rule=budgeted.")

    @property
    def is_adaptive(self) -> bool:
        """True when rollouts are sampled in rounds (pilot_generations set)."""
        return self.pilot_generations is not None

    @property
    def eval_generations(self) -> int:
        """Completions sampled per prompt in evaluation: ``num_generations_eval`` if set, else m (downsample_to), so
        that evaluating costs what it costs GRPO with m rollouts."""
        return self.num_generations_eval or self.downsample_to

    @property
    def is_pods(self) -> bool:
        """True when rollouts are down-sampled (m < n)."""
        return self.downsample_to < self.num_generations

    @property
    def selects(self) -> bool:
        """True when the trainer selects rollouts or groups (m < n, or prompt over-sampling)."""
        return self.is_pods or self.oversample_prompts > 1

    def sampled_prompts_per_process(self) -> int:
        """Prompts sampled per process and generation round: kept groups times ``oversample_prompts``, rounded up."""
        kept_groups = self.per_device_train_batch_size * self.steps_per_generation // self.downsample_to
        return max(kept_groups, math.ceil(kept_groups * self.oversample_prompts - 1e-9))


def _eval_batch_problem(per_device_eval_batch_size: int, num_processes: int, num_generations_eval: int | None,
                        m: int) -> str:
    """The one-line refusal of an evaluation batch that cannot hold whole groups."""
    k = num_generations_eval or m
    which = "num_generations_eval" if num_generations_eval else "downsample_to, m, since num_generations_eval is unset"
    return (f"per_device_eval_batch_size ({per_device_eval_batch_size}) * processes ({num_processes}) is not a multiple "
            f"of the completions evaluation samples per prompt ({k}: {which}): make per_device_eval_batch_size a "
            f"multiple of {k}, or set num_generations_eval to a divisor of it.")


class _PhaseClock(TrainerCallback):
    """Wall-clock seconds of each phase of one optimizer step, pushed into TRL's metrics as ``time/<phase>``.

    ``update`` is the step's total minus generation, scoring and selection: the old/reference log-probs of
    the kept rows, forward, backward and the optimizer step. On CUDA the device is synchronized at each
    boundary so that asynchronous kernels are charged to the phase that launched them.
    """

    def __init__(self, trainer: PODSTrainer):
        self.trainer = trainer
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.step_start = None

    def _sync(self):
        if torch.cuda.is_available() and self.trainer.accelerator.device.type == "cuda":
            torch.cuda.synchronize()

    def _reset_peak_memory(self):
        if self.trainer.accelerator.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()

    @contextmanager
    def phase(self, name: str):
        """Charge the time spent inside the block to phase ``name``."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start
            if name in ("scoring", "selection"):  # what follows is the update: measure its peak memory alone
                self._reset_peak_memory()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._reset_peak_memory()
        self.step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.step_start is None:
            return
        self._sync()
        step_seconds = time.perf_counter() - self.step_start
        self.step_start = None
        self.seconds["update"] = max(
            0.0, step_seconds - sum(self.seconds[p] for p in ("generation", "scoring", "selection"))
        )
        metrics = self.trainer._metrics["train"]
        for name, seconds in self.seconds.items():
            metrics[f"time/{name}"].append(seconds)
        metrics["time/step"].append(step_seconds)
        self.last_step_seconds = step_seconds
        if self.trainer.accelerator.device.type == "cuda":
            metrics["memory/update_peak_gb"].append(torch.cuda.max_memory_allocated() / 2**30)


class PODSTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` that samples n rollouts per prompt and trains on m of them (``PODSConfig``).

    With ``downsample_to == num_generations`` it is exactly ``GRPOTrainer`` (plus phase timing).
    Takes the same arguments as ``GRPOTrainer``; ``args`` must be a ``PODSConfig``.
    """

    # Read by the overrides below; class-level so that a trainer built without __init__ (as TRL's own tests build
    # GRPOTrainers, with object.__new__) behaves as plain GRPO.
    _pods_stash = None  # (kept generation outputs, gathered kept rewards) during the inner TRL call
    _pods_capture = False  # True while TRL prepares the rollout prompts (see _rollout_prompts)
    _pods_in_rounds = False  # True inside an adaptive round's _generate / _calculate_rewards
    _adaptive_reward_index = None  # column of rewards_per_func that decides "mixed" (None: the total)
    _selects = False
    phase_clock = None
    _no_variance_rounds = 0
    _warned_no_variance = False

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if config is None:  # as GRPOTrainer: a default config named after the model (plain GRPO until m is set)
            from trl.trainer.utils import get_config_model_id

            model = kwargs.get("model", args[0] if args else None)
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            config = PODSConfig(f"{model_name.split('/')[-1]}-PODS")
            if "args" in kwargs or len(args) <= 2:
                kwargs["args"] = config
            else:
                args = (*args[:2], config, *args[3:])
        if not isinstance(config, PODSConfig):
            raise TypeError(f"PODSTrainer needs args=PODSConfig(...) (or None for the defaults), got "
                            f"{type(config).__name__}.")
        # Reward functions are user code: a time budget per call, checked return values, named errors.
        if "reward_funcs" in kwargs:
            reward_funcs = kwargs["reward_funcs"]
        else:
            reward_funcs = args[1] if len(args) > 1 else None
        if reward_funcs is not None:
            if config.reward_weights is None:
                # A task's functions carry its weights (Task.reward_funcs): the same objective as `pods train`.
                config.reward_weights = reward_weights_of(reward_funcs)
            reward_funcs = guard_reward_funcs(reward_funcs, config.reward_timeout_s)
            if "reward_funcs" in kwargs:
                kwargs["reward_funcs"] = reward_funcs
            else:
                args = (*args[:1], reward_funcs, *args[2:])
        self._pods_in_rounds = False  # True inside an adaptive round's _generate / _calculate_rewards
        self._no_variance_rounds = 0  # generation rounds in a row in which no group's rewards varied
        self._warned_no_variance = False
        engine_setup = nullcontext()
        if config.use_vllm:  # imported only then: the vLLM checks and the CPU build's workaround live there
            from pods_rl.integrations import vllm_cpu

            on_cpu = config.use_cpu or not torch.cuda.is_available()
            vllm_cpu.check_vllm_settings(config.use_vllm, config.vllm_mode, on_cpu=on_cpu)
            model = kwargs.get("model", args[0] if args else None)
            model_config = model.config if hasattr(model, "config") else AutoConfig.from_pretrained(
                model, trust_remote_code=bool(config.trust_remote_code))
            if on_cpu:
                vllm_cpu.check_cpu_model(model_config)
            if config.vllm_mode == "colocate":  # TRL builds the LLM in GRPOTrainer.__init__
                engine_setup = vllm_cpu.reloadable_cpu_weights()
        with engine_setup:
            super().__init__(*args, **kwargs)
        # Evaluation samples what a GRPO run with m samples (PODSConfig validated the eval batch in these terms).
        self.num_generations_eval = config.eval_generations
        self.downsample_to = config.downsample_to
        self.downsample_rule = config.downsample_rule
        self._adaptive_reward_index = None  # column of rewards_per_func that decides "mixed" (None: the total)
        if config.is_adaptive and (self.environment_factories is not None or self.tools):
            # TRL's tool loop addresses each row's environment and tools by its position in the batch; a round
            # generates for a subset of the rows, so the positions would point at other rollouts' environments.
            raise ValueError("pilot_generations (adaptive rollouts) does not support tools or environments yet: "
                             "drop pilot_generations to sample n rollouts per prompt in one round (PODS still "
                             "down-samples them to m).")
        if config.is_adaptive and config.adaptive_reward is not None:
            if config.adaptive_reward not in self.reward_func_names:
                raise ValueError(f"adaptive_reward {config.adaptive_reward!r} is not one of this run's reward functions "
                                 f"{self.reward_func_names}; name one of them, or drop it to use the total reward.")
            self._adaptive_reward_index = self.reward_func_names.index(config.adaptive_reward)
        self._selects = config.selects
        # Selection runs on CPU (a (B, n) tensor is tiny): a CPU generator makes `random` reproducible.
        self._selection_generator = torch.Generator().manual_seed(config.seed + self.accelerator.process_index)
        self.phase_clock = _PhaseClock(self)
        # First in line, so that its step ends before any callback that evaluates or saves at step end
        # (pods train's TrainingClock): those seconds are not part of the step.
        self.callback_handler.callbacks.insert(0, self.phase_clock)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """``Trainer.evaluate``, after checking (before any generation) that the evaluation batch holds whole groups
        of ``num_generations_eval`` completions (m unless set; TRL checks it only when ``eval_strategy`` is set)."""
        k, processes = self.num_generations_eval, self.accelerator.num_processes
        if (self.args.per_device_eval_batch_size * processes) % k != 0:
            raise ValueError(_eval_batch_problem(self.args.per_device_eval_batch_size, processes,
                                                 self.args.num_generations_eval, self.args.downsample_to))
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def release_vllm_engine(self) -> None:
        """Free this trainer's colocated vLLM engine (weights and KV cache) once it is done training.

        For a process that builds another trainer next (``pods cost``, tests): deleting the trainer does not free
        the engine, and vLLM sizes a new engine's KV cache from the memory left. The trainer cannot generate with
        vLLM afterwards."""
        generation = getattr(self, "vllm_generation", None)
        if generation is not None and getattr(generation, "llm", None) is not None:
            generation.llm = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # ---- batching: the dataloader yields n rollouts per prompt, the batch sizes count the m kept --------

    def _prompts_per_generation_round(self) -> int:
        # Global, whole groups: each process samples its kept groups times oversample_prompts.
        return self.args.sampled_prompts_per_process() * self.accelerator.num_processes

    def _get_train_sampler(self, dataset=None):
        if not self._selects:
            return super()._get_train_sampler(dataset)
        return RepeatSampler(
            data_source=self.train_dataset if dataset is None else dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self._prompts_per_generation_round(),
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    def get_train_dataloader(self):
        """TRL's dataloader, sized in sampled rows: per process and round, the kept groups x ``oversample_prompts`` prompts x n."""
        if not self._selects:
            return super().get_train_dataloader()
        from datasets import IterableDataset

        dataset = self.train_dataset
        if isinstance(dataset, IterableDataset):
            if self.shuffle_dataset:
                dataset = dataset.shuffle(seed=self.args.seed)
            dataset = repeat_iterable_dataset(
                dataset,
                mini_repeat_count=self.num_generations,
                batch_size=self._prompts_per_generation_round(),
                repeat_count=self.num_iterations * self.args.steps_per_generation,
            )
        # Per process and generation round: (kept rows / m) * oversample_prompts prompts x n rollouts each.
        return self._get_dataloader(
            dataset=dataset,
            description="Training",
            batch_size=self.args.sampled_prompts_per_process() * self.num_generations,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    # ---- the PODS step -------------------------------------------------------------------------------

    def _phase(self, name: str):
        """The phase clock's context for ``name`` (nothing to time on a trainer built without __init__)."""
        return nullcontext() if self.phase_clock is None else self.phase_clock.phase(name)

    def _generate(self, prompts: list):
        if self._pods_capture:
            raise _PromptsPrepared(prompts)
        if self._pods_stash is not None:
            return self._pods_stash["generated"]
        with self._phase("generation"):
            return super()._generate(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._pods_stash is not None:
            return self._pods_stash["rewards_per_func"]
        with self._phase("scoring"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training and not self._pods_in_rounds:  # (adaptive rounds note it once, on whole groups)
            self._note_reward_variance(rewards_per_func)  # (N, F), gathered over processes
        return rewards_per_func

    # Generation rounds in a row without any reward variance before the terminal hears of it (once per run).
    NO_VARIANCE_WARN_ROUNDS = 10

    def _note_reward_variance(self, rewards_per_func: torch.Tensor) -> None:
        """Count generation rounds in which every group's n rewards were all equal (all advantages 0: nothing is
        learned); after ``NO_VARIANCE_WARN_ROUNDS`` in a row, say so once with the likely cause."""
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        unscored = torch.isnan(rewards_per_func).all(dim=1)
        rewards = rewards.masked_fill(unscored, float("nan")).view(-1, self.num_generations).cpu()  # (G, n)
        if not bool(_all_equal(rewards).all()):
            self._no_variance_rounds = 0
            return
        self._no_variance_rounds += 1
        if (self._no_variance_rounds < self.NO_VARIANCE_WARN_ROUNDS or self._warned_no_variance
                or not self.accelerator.is_main_process):
            return
        self._warned_no_variance = True
        scored = rewards[~torch.isnan(rewards)]
        temperature = getattr(self.args, "temperature", 1.0)
        if scored.numel() == 0:
            cause = "no reward function scored any completion (all returned None)"
        elif temperature is not None and temperature < 0.5:
            cause = (f"near-greedy sampling (temperature {temperature:g}) makes the {self.num_generations} "
                     "completions of a prompt alike: raise --temperature (TRL's default is 1.0)")
        elif bool((scored == scored[0]).all()):
            cause = (f"every completion of every prompt scores {scored[0].item():g}: a reward function that returns "
                     "a constant, gold answers that no completion can match (check the task's data), or a task far "
                     "too easy or too hard for this model")
        else:
            cause = ("each prompt is either always solved or never solved by this model: use problems nearer its "
                     "level, or more completions per prompt (--num_generations)")
        logger.warning(
            "warning: no group of completions has had any reward variance for the last %d generation rounds "
            "(step %d; mean reward %.3g): every advantage is 0, so nothing is learned. Likely cause: %s.",
            self._no_variance_rounds, self.state.global_step,
            scored.mean().item() if scored.numel() else float("nan"), cause)

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
            self.num_generations = int(more.max()) if uniform else 1  # TRL's vLLM server dedups by it
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

    # ---- model card (TRL's conventions: same metadata, sections and badges; PODS, n, m and the rule added) ----

    _tag_names = ["trl", "grpo", "pods"]  # TRL adds these to the model's tags and to the card's metadata
    _name = "GRPO-PODS"
    _paper = {
        "title": "Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement Learning",
        "id": "2504.13818",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{xu2025pods,
                title        = {{Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement Learning}},
                author       = {Yixuan Even Xu and Yash Savani and Fei Fang and J. Zico Kolter},
                year         = 2025,
                eprint       = {arXiv:2504.13818},
            }"""),
    }

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None):
        """Write ``README.md`` in ``output_dir`` (as TRL does at every checkpoint): the PODS model card.

        It names the base model (a hub id as a link, a local directory by its path), PODS with its rule, n and
        m, and cites the PODS paper beside GRPO and TRL.
        """
        if self.is_world_process_zero():
            card = self._pods_model_card(model_name, dataset_name, tags, model_ref=self.args.output_dir)
            card.save(os.path.join(self.args.output_dir, "README.md"))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """``Trainer.save_model``; a model saved on its own (not inside a checkpoint) gets its model card too."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and output_dir is not None and self.is_world_process_zero():
            # TRL's naming (GRPOTrainer._save_checkpoint): the hub repository's name, else the run directory's
            hub = self.args.hub_model_id
            name = hub.split("/")[-1] if hub else Path(self.args.output_dir).name
            card = self._pods_model_card(model_name=name, model_ref=output_dir)
            card.save(os.path.join(output_dir, "README.md"))

    def _pods_model_card(self, model_name=None, dataset_name=None, tags=None, model_ref=None):
        """The ``huggingface_hub.ModelCard``, built as TRL's ``generate_model_card`` builds it, from our template.

        ``model_ref``: what the card's quick start loads when the model has no hub id (the saved directory)."""
        from huggingface_hub import ModelCard, ModelCardData
        from transformers import is_wandb_available
        from trl.trainer.utils import get_comet_experiment_url, get_config_model_id, get_trackio_space_url

        model_id = get_config_model_id(self.model.config)
        local = bool(model_id) and os.path.isdir(model_id)
        if not model_id:
            base_model_text = "a model with no recorded name"
        elif not local:
            base_model_text = f"[{model_id}](https://huggingface.co/{model_id})"
        elif Path(model_id).resolve() == tiny.ASSETS_DIR.resolve():
            base_model_text = "pods-rl's embedded tiny model (`pods_rl/assets/tiny`, built by `pods build-tiny`)"
        else:
            base_model_text = f"`{Path(model_id).name}` (a local model, `{model_id}`)"

        tags = set() if tags is None else {tags} if isinstance(tags, str) else set(tags)
        if hasattr(self.model.config, "unsloth_version"):
            tags.add("unsloth")
        if "JOB_ID" in os.environ:
            tags.add("hf_jobs")
        tags.update(self._tag_names)
        trackio_url = get_trackio_space_url()
        if trackio_url is not None:
            tags = {t for t in tags if not t.startswith("trackio:")} | {f"trackio:{trackio_url}"}
        wandb_url = None
        if is_wandb_available():
            import wandb

            wandb_url = wandb.run.url if wandb.run is not None else None

        args = self.args
        card_data = ModelCardData(
            base_model=None if local else model_id or None,  # hub metadata takes a hub id only
            datasets=dataset_name,
            library_name="transformers",
            licence="license",
            model_name=model_name,
            tags=["generated_from_trainer", *sorted(tags)],
        )
        grpo_paper = GRPOTrainer._paper
        return ModelCard.from_template(
            card_data,
            template_path=str(Path(__file__).parent / "templates" / "model_card.md"),
            base_model_text=base_model_text,
            model_name=model_name,
            hub_model_id=self.hub_model_id,
            model_ref=self.hub_model_id or model_ref or model_name,
            dataset_name=dataset_name,
            wandb_url=wandb_url,
            trackio_url=trackio_url,
            comet_url=get_comet_experiment_url(),
            is_pods=args.is_pods,
            n=args.num_generations,
            m=args.downsample_to,
            rule=args.downsample_rule,
            tiebreak=getattr(args, "downsample_tiebreak", "index"),
            oversample_prompts=getattr(args, "oversample_prompts", 1),
            per_device_train_batch_size=args.per_device_train_batch_size,
            learning_rate=args.learning_rate,
            beta=args.beta,
            loss_type=args.loss_type,
            paper_title=self._paper["title"],
            paper_id=self._paper["id"],
            grpo_paper_title=grpo_paper["title"],
            grpo_paper_id=grpo_paper["id"],
            pods_citation=self._paper["citation"],
            grpo_citation=grpo_paper["citation"],
            pods_rl_version=version("pods-rl"),  # = pods_rl.__version__ (pyproject.toml); no import upward
            trl_version=version("trl"),
            transformers_version=version("transformers"),
            pytorch_version=version("torch"),
            datasets_version=version("datasets"),
            tokenizers_version=version("tokenizers"),
        )


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
