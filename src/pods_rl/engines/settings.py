"""Every engine's spelling of the shared settings, and the checks they share, in one table each.

A setting the plain code knows by one name (``SelectionSettings``' ``m``) is spelled differently per engine:
PODSConfig's fields (``trl``), the worker's ``pods_*`` keywords (``trl_async``), verl's ``sampler_kwargs``; errors
name the user's spelling. A new setting is one row of ``SPELLINGS``; what an engine offers planners, its ``OFFERS``.
"""

from __future__ import annotations

from pods_rl.budget.planners.base import NEEDS, needs_of

ENGINES = ("trl", "trl_async", "verl")

# (group, setting) -> its spelling in (trl, trl_async, verl); None where that engine has no such setting.
# Groups: "selection" (SelectionSettings.validated's names), "adaptive" (AdaptiveSettings.validated's names),
# "budget" (the ``names`` of pods_rl.budget's checks: the planners, their settings, the ledger's).
SPELLINGS: dict[tuple[str, str], tuple[str | None, str | None, str | None]] = {
    ("selection", "m"): ("downsample_to (m)", "pods_m", "sampler_kwargs.m"),
    ("selection", "rule"): ("downsample_rule", "pods_rule", "sampler_kwargs.rule"),
    ("selection", "tiebreak"): ("downsample_tiebreak", "pods_tiebreak", "sampler_kwargs.tiebreak"),
    ("selection", "oversample_prompts"): ("oversample_prompts", None, "sampler_kwargs.oversample_prompts"),
    ("selection", "register"): ("pods_rl.register_rule",
                                "pods_rl.register_rule in a module named by pods_rule_module",
                                "pods_rl.register_rule in a module named by sampler_kwargs.rule_module"),
    ("adaptive", "pilot"): ("pilot_generations", "pods_pilot", None),
    ("adaptive", "n"): ("num_generations", "num_generations", None),
    ("adaptive", "m"): ("downsample_to", "pods_m", None),
    ("adaptive", "rule"): ("adaptive_rule", "pods_adaptive_rule", None),
    ("adaptive", "round_size"): ("adaptive_round_size", "pods_round_size", None),
    ("adaptive", "budget"): ("adaptive_budget", "pods_adaptive_budget", None),
    ("adaptive", "reward"): ("adaptive_reward", "pods_adaptive_reward", None),
    ("budget", "prompt_planner"): ("prompt_planner", "pods_prompt_planner", "sampler_kwargs.prompt_planner"),
    ("budget", "rollout_planner"): ("rollout_planner", "pods_rollout_planner", "sampler_kwargs.rollout_planner"),
    ("budget", "prompt_planner_args"): ("prompt_planner_args", "pods_prompt_planner_args",
                                        "sampler_kwargs.prompt_planner_args"),
    ("budget", "rollout_planner_args"): ("rollout_planner_args", "pods_rollout_planner_args",
                                         "sampler_kwargs.rollout_planner_args"),
    ("budget", "m"): ("downsample_to", "pods_m", "sampler_kwargs.m"),
    # verl: rollout.n is the budget per prompt; the most one prompt gets is Knapsack-RL's max_n
    ("budget", "n"): ("num_generations", "num_generations", "sampler_kwargs.rollout_planner_args.max_n"),
    ("budget", "pilot"): ("pilot_generations", "pods_pilot", None),
    ("budget", "oversample_prompts"): ("oversample_prompts", None, None),
    ("budget", "success_threshold"): ("ledger_success_threshold", "pods_ledger_success_threshold",
                                      "sampler_kwargs.ledger_success_threshold"),
    ("budget", "adaptive_budget"): ("adaptive_budget", "pods_adaptive_budget", "actor_rollout_ref.rollout.n"),
    # a planner's inputs beside its prompts ("calibration"): PODSTrainer's own keywords, the worker's; none on verl
    ("budget", "calibration_dataset"): ("calibration_dataset", "pods_calibration_dataset", None),
    ("budget", "answer_extractor"): ("answer_extractor", "pods_answer_extractor", None),
}

# Why each engine refuses a Pilot-Commit setting (None: it runs it); pods_rl.budget's check_pilot_commit words the
# rest of the line, in the engine's spelling.
PILOT_COMMIT_REASONS: dict[str, dict[str, str | None]] = {
    "trl": {"buffer_max_off_steps": "PODSTrainer commits a prompt in the step that piloted it (TRL's step trains the "
                                    "rollouts it generated; none are kept for a later step)",
            "n_explore_effective": "PODSTrainer trains on every pilot rollout of a committed prompt",
            "environment": None},
    "trl_async": {"buffer_max_off_steps": "the asynchronous worker commits each pilot that passes as soon as it is "
                                          "scored (no pilot waits in a buffer)",
                  "n_explore_effective": "the worker trains on every pilot rollout of a committed prompt",
                  "environment": "the worker pilots a prompt in TRL's generate loop and samples its commit rollouts "
                                 "outside it, which draws and resets an environment per rollout"},
    "verl": {"buffer_max_off_steps": "PODS's agent loop worker commits each pilot that passes as soon as it is scored "
                                     "(no pilot waits in a buffer)",
             "n_explore_effective": "PODS's agent loop worker trains on every pilot rollout of a committed prompt",
             "environment": None},
}

# What each engine offers the planners (the needs of pods_rl.budget.planners.base.NEEDS): a planner runs on every
# engine that offers all it needs (Planner.needs), one check before any model loads (check_planners).
OFFERS: dict[str, frozenset[str]] = {
    "trl": frozenset({"costs", "pilot", "answer_rounds", "calibration"}),
    "trl_async": frozenset({"costs", "pilot", "answer_rounds", "calibration"}),
    # verl: Reinforce-Ada's rounds and Pilot-Commit's pilot and commit in the agent loop worker
    "verl": frozenset({"costs", "pilot", "reward_rounds"}),
}
PLANNER_FIELDS = {"which_prompts": "prompt_planner", "how_many": "rollout_planner"}  # the planner rows, by kind
REFUSALS = {
    "trl": ("PODSTrainer runs {supported} for this question (registered: {known}); the others are plain tensor code "
            "to call from your own loop (docs: Rollout budgets)"),
    "trl_async": ("the asynchronous worker runs {supported} for this question (registered: {known}); the others need "
                  "a step that sees a batch of prompts at once (PODSTrainer, or your own loop: docs, Rollout budgets)"),
    "verl": ("PODS's agent loop manager runs {supported} for this question on verl (registered: {known}); the others "
             "run in PODSTrainer (docs: PODS on verl, Rollout budgets)"),
}
TITLES = {"trl": "PODSTrainer", "trl_async": "the asynchronous worker", "verl": "PODS's agent loop manager on verl"}
# What an engine says instead of its plain refusal of a need it does not offer, by (engine, need).
HINTS = {("trl", "reward_rounds"): ("PODSTrainer runs Reinforce-Ada as its round rule, its keep and its baseline: "
                                    "pilot_generations=K, adaptive_rule='reinforce_ada', downsample_rule="
                                    "'reinforce_ada', advantage_baseline='sampled', scale_rewards='none'"),
         ("trl_async", "reward_rounds"): ("in the asynchronous worker Reinforce-Ada runs as its round rule, its keep "
                                          "and its baseline: pods_pilot=K, pods_adaptive_rule='reinforce_ada', "
                                          "pods_rule='reinforce_ada', pods_advantage_baseline='sampled'")}


def spelled(engine: str, group: str) -> dict[str, str]:
    """{setting: the engine's spelling} of one group (the ``names=`` the plain code's checks take)."""
    column = ENGINES.index(engine)
    return {setting: row[column] for (row_group, setting), row in SPELLINGS.items()
            if row_group == group and row[column] is not None}


def check_planners(engine: str, planners: dict[str, str | None], available) -> None:
    """Refuse in one line a planner of ``planners`` ({kind: name or None}) not of ``available(kind)`` or needing what
    ``engine`` does not offer (naming the need and the engines that offer it)."""
    for kind, name in planners.items():
        if name is None:
            continue
        field = spelled(engine, "budget")[PLANNER_FIELDS[kind]]
        if name not in available(kind):
            supported = [p for p in available(kind) if needs_of(p) <= OFFERS[engine]]
            refusal = REFUSALS[engine].format(supported=supported, known=available(kind))
            raise ValueError(f"{field}={name!r}: {refusal}")
        missing = sorted(needs_of(name) - OFFERS[engine])
        if missing:
            need = missing[0]
            offering = [TITLES[e] for e in ENGINES if need in OFFERS[e]] or ["no engine yet"]
            hint = HINTS.get((engine, need), f"{TITLES[engine]} does not offer what it needs")
            raise ValueError(f"{field}={name!r}: {hint} (it needs {need}: {NEEDS[need]}; offered by "
                             f"{', '.join(offering)})")
