"""The plan of a `pods study`: the methods (GRPO, PODS n -> m, controls, adaptive variants), their run names, and
``Plan``: everything the study runs, resolved from the command line and the recipe and checked before anything runs.
One idea, what runs, kept apart from how the stages run it (``pods_rl.commands.study``)."""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pods_rl.commands.study_priced import without_flag
from pods_rl.commands.study_runner import visible_gpus

RULE_CODES = {"mv": "max_variance", "random": "random", "maxreward": "max_reward"}
# Flags the study sets per run; in the recipe flags they would be silently overridden, so they are refused.
# `pods train` flags the study sets for each run, refused in its recipe (with the study's flag to use instead).
# Those that mean what a study flag means are that flag's other spelling (--max_steps is --updates, --downsample_to
# --m, --eval_k --eval-k, --eval_num_problems --eval-problems, --eval_every_steps --eval-every, --pilot_generations
# --pilot, --save_every_seconds --checkpoint-every), so never reach the recipe.
STUDY_FLAGS = {"--num_generations": "--n / --m", "--downsample_rule": "--methods", "--seed": "--seeds",
               "--output_dir": "--out", "--per_device_train_batch_size": "--prompts-per-step",
               "--resume_from_checkpoint": "(resuming is automatic)",
               "--rollout_planner": "--variant NAME='--rollout_planner auto' and a method pods-mv-n32m8-NAME"}
SMOKE = dict(m=4, n=[8], prompts_per_step=2, seeds=2, updates=2, eval_every=2, eval_problems=8, eval_k=2,
             cost_steps=1, cost_warmup=1, bootstrap=200,
             recipe=["--max_completion_length", "12", "--eval_batch_size", "64"])


@dataclass(frozen=True)
class Method:
    """n rollouts sampled per prompt, m kept by ``rule`` (n == m: GRPO); ``extra``: more `pods train` flags."""

    name: str
    n: int
    m: int
    rule: str = "max_variance"
    extra: tuple[str, ...] = ()

    @property
    def is_grpo(self) -> bool:
        """True for the GRPO baseline (n = m, no variant flags)."""
        return self.n == self.m and not self.extra

    @property
    def label(self) -> str:
        """Human label for figures: ``GRPO (n=16)``, ``PODS max_variance (n=64→m=16)`` [+ `` +variant``, also on
        GRPO: ``GRPO (n=16) +greso``]."""
        text = f"GRPO (n={self.n})" if self.n == self.m else f"PODS {self.rule} (n={self.n}→m={self.m})"
        suffix = self.name.split(f"n{self.n}m{self.m}", 1)[-1] if not self.is_grpo else ""
        return text + (f" +{suffix.lstrip('-')}" if suffix else "")


def grpo_name(m: int) -> str:
    """The run name of GRPO with m rollouts per prompt: ``grpo-n{m}``."""
    return f"grpo-n{m}"


def pods_name(n: int, m: int, rule: str = "max_variance") -> str:
    """The run name of PODS n -> m with ``rule``: ``pods-{rule code}-n{n}m{m}``, e.g. ``pods-mv-n64m16``."""
    code = next((c for c, r in RULE_CODES.items() if r == rule), rule)
    return f"pods-{code}-n{n}m{m}"


def parse_method(name: str, variants: dict[str, tuple[str, ...]] | None = None) -> Method:
    """``grpo-n16`` or ``pods-<mv|random|maxreward>-n64m16[-<variant>]`` -> Method (a variant's flags come from
    ``variants``, declared with ``--variant NAME=FLAGS``)."""
    variants = variants or {}
    grpo = re.fullmatch(r"grpo-n(\d+)", name)
    if grpo:
        return Method(name, int(grpo.group(1)), int(grpo.group(1)))
    pods = re.fullmatch(r"pods-([a-z_]+)-n(\d+)m(\d+)(?:-([A-Za-z0-9_.]+))?", name)
    if not pods:
        raise ValueError(f"unknown method {name!r}: write grpo-n<M> or pods-<{'|'.join(RULE_CODES)}>-n<N>m<M>"
                         "[-<variant>], e.g. pods-mv-n64m16")
    code, n, m, variant = pods.group(1), int(pods.group(2)), int(pods.group(3)), pods.group(4)
    rule = RULE_CODES.get(code, code)
    if n < m:
        raise ValueError(f"method {name!r}: n={n} is smaller than m={m}; PODS keeps m of the n sampled")
    if variant is not None and variant not in variants:
        raise ValueError(f"method {name!r} names variant {variant!r}: declare it with --variant "
                         f"{variant}='--flag value ...'")
    return Method(name, n, m, rule, variants.get(variant, ()) if variant else ())


def default_methods(m: int, ns: list[int], controls: list[int]) -> list[Method]:
    """GRPO n = m, PODS max_variance n -> m for each n, the random control for each n of ``controls``."""
    return [Method(grpo_name(m), m, m), *(Method(pods_name(n, m), n, m) for n in ns),
            *(Method(pods_name(n, m, "random"), n, m, "random") for n in controls)]


@dataclass
class Plan:
    """Everything a study runs, resolved from the command line and the recipe (written to ``OUT/plan.json``)."""

    out: Path
    recipe_argv: list[str]
    methods: list[Method]
    baseline: str
    m: int
    prompts_per_step: int
    seeds: int
    updates: int
    eval_every: int
    eval_problems: int
    eval_k: int
    lr: float | None  # None: the sweep decides
    lrs: list[float] = field(default_factory=list)
    sweep_seeds: int = 2
    sweep_updates: int | None = None
    cost_n: list[int] = field(default_factory=list)
    cost_pilot: int | None = None  # pods cost also measures adaptive rollouts with this pilot
    cost_steps: int = 5
    cost_warmup: int = 1
    checkpoint_every: float = 120.0
    logging_steps: int = 5
    device: str = "cpu"  # "cpu" or "cuda": where the recipe trains
    jobs: int = 1
    threads: int | None = None  # torch threads per run on CPU
    drop_weights: bool = False
    in_process: bool = False  # runs (and the cost) in this process, one after another
    bootstrap: int = 2000  # bootstrap replicates of each CI
    first_seed: int = 0  # the runs' seeds are first_seed, ..., first_seed + seeds - 1

    def settings(self) -> dict:
        """What must not change between invocations on the same ``out`` (seeds and methods may grow)."""
        recipe = without_flag(self.recipe_argv, "--learning_rate")  # the learning rate: a setting of its own
        settings = {"recipe_argv": recipe, "m": self.m, "prompts_per_step": self.prompts_per_step,
                    "updates": self.updates, "eval_every": self.eval_every, "eval_problems": self.eval_problems,
                    "eval_k": self.eval_k}
        if self.lrs:
            settings["sweep_updates"] = self.sweep_updates or self.updates
        return settings


def _ints(flag: str, text: str | None, low: int = 1) -> list[int]:
    try:
        values = [int(item) for item in (text or "").split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if any(v < low for v in values):
        raise ValueError(f"{flag} values must be >= {low}, got {text!r}")
    return values


def _smoke(args: argparse.Namespace, recipe_argv: list[str]) -> list[str]:
    """``--smoke``: the seconds-long settings written into ``args``; returns the recipe's flags with its own."""
    # The embedded task generates 15000 training problems per run by default; a few hundred do here.
    sizes = ["--task_args", "train_size=256,test_size=16"] if "--config" not in recipe_argv else []
    for key in ("seeds", "updates", "eval_every", "eval_problems", "eval_k", "prompts_per_step", "cost_steps",
                "cost_warmup"):
        setattr(args, key, SMOKE[key])
    args.m, args.n = args.m or str(SMOKE["m"]), args.n or ",".join(map(str, SMOKE["n"]))
    args.checkpoint_every = 1e9
    # One process, one thread: on a small shared CPU more threads only wait for each other.
    args.in_process, args.bootstrap, args.jobs, args.threads = True, SMOKE["bootstrap"], 1, 1
    return [*SMOKE["recipe"], *sizes, *recipe_argv]


def _methods(args: argparse.Namespace, variants: dict, m: int, pilot: int | None) -> tuple[list, list[int], int]:
    """The methods to run: ``--methods`` as named, else GRPO, PODS at each ``--n``, the random controls and the
    adaptive variants of ``--pilot``. Returns (methods, the PODS n values, m)."""
    if args.methods:
        methods = [parse_method(name.strip(), variants) for name in args.methods.split(",") if name.strip()]
        if len({meth.m for meth in methods}) > 1:
            raise ValueError("--methods must all keep the same m (equal kept rollouts per update)")
        m = methods[0].m
        return methods, sorted({meth.n for meth in methods if meth.n != m}), m
    ns = _ints("--n", args.n) if args.n else [4 * m]
    if any(n <= m for n in ns):
        raise ValueError(f"--n values must exceed m={m} (n = m is GRPO, always included)")
    controls = [] if args.control == "none" else _ints("--control", args.control) if args.control else [max(ns)]
    methods = default_methods(m, ns, controls)
    if pilot is not None:
        if any(n < pilot for n in ns):
            raise ValueError(f"--pilot {pilot} is larger than n = {min(ns)}: the pilot round is part of the n")
        extra = variants[f"pilot{pilot}"]
        methods += [Method(f"{pods_name(n, m)}-pilot{pilot}", n, m, extra=extra) for n in ns]
        methods += [Method(f"{pods_name(n, m, 'random')}-pilot{pilot}", n, m, "random", extra) for n in controls]
    return methods, ns, m


# Long because it checks every flag in turn before anything runs; each check is a few lines.
def make_plan(args: argparse.Namespace, recipe_argv: list[str]) -> Plan:
    """Resolve the study flags against the recipe (parsed and checked here, before anything runs)."""
    from pods_rl.machine import machine_info
    from pods_rl.recipes import parse_args  # TRL's parser: seconds to import

    given = {a.split("=")[0].replace("-", "_"): a.split("=")[0] for a in recipe_argv if a.startswith("--")}
    for flag, instead in STUDY_FLAGS.items():
        if flag.replace("-", "_") in given:  # either spelling, as `pods train` takes both
            raise ValueError(f"{given[flag.replace('-', '_')]} is set by pods study for each run; "
                             f"use {instead} instead")
    if args.smoke:
        recipe_argv = _smoke(args, recipe_argv)
    _, config, _ = parse_args(list(recipe_argv))
    recipe_m = config.downsample_to or config.num_generations
    m = _ints("--m", args.m, low=2)[0] if args.m else recipe_m
    variants = {}
    for item in args.variant:
        name, sep, flags = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.]+", name):
            raise ValueError(f"--variant takes NAME='--flag value ...', got {item!r}")
        variants[name] = tuple(shlex.split(flags))
    pilot = _ints("--pilot", args.pilot)[0] if args.pilot else None
    if pilot is not None:
        variants.setdefault(f"pilot{pilot}", ("--pilot_generations", str(pilot)))
    methods, ns, m = _methods(args, variants, m, pilot)
    baseline = args.baseline or grpo_name(m)
    if baseline not in {meth.name for meth in methods}:
        raise ValueError(f"--baseline {baseline} is not among the methods {[meth.name for meth in methods]}")
    if args.first_seed < 0:
        raise ValueError(f"--first-seed must be >= 0, got {args.first_seed}")
    for flag, value in (("--seeds", args.seeds), ("--updates", args.updates), ("--eval-problems", args.eval_problems),
                        ("--eval-k", args.eval_k), ("--sweep-seeds", args.sweep_seeds),
                        ("--cost-steps", args.cost_steps)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    eval_every = args.eval_every or max(1, args.updates // 12)
    if not 1 <= eval_every <= args.updates:
        raise ValueError(f"--eval-every must be between 1 and --updates ({args.updates}), got {eval_every}")
    prompts = args.prompts_per_step or max(1, config.per_device_train_batch_size // recipe_m)
    lrs = [float(x) for x in args.lrs.split(",") if x.strip()] if args.lrs else []
    if lrs and any(a == "--learning_rate" or a.startswith("--learning_rate=") for a in recipe_argv):
        raise ValueError("give --lrs (sweep GRPO's learning rate) or --learning_rate, not both")
    if any(lr <= 0 for lr in lrs):
        raise ValueError(f"--lrs must be positive, got {args.lrs!r}")
    cost_n = [] if args.cost_n == "none" else sorted({m, *(_ints("--cost-n", args.cost_n) if args.cost_n else ns)})
    if any(n < m for n in cost_n):
        raise ValueError(f"--cost-n values must be >= m={m}")
    device = "cpu" if config.use_cpu else _cuda_or_cpu()
    cores = machine_info()["usable_cores"] or 1
    jobs = args.jobs or (cores if device == "cpu" else max(1, len(visible_gpus())))
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    threads = args.threads or (max(1, cores // jobs) if device == "cpu" else None)
    out = Path(args.out or ("pods_study_smoke" if args.smoke else "pods_study"))
    return Plan(out=out, recipe_argv=list(recipe_argv), methods=methods, baseline=baseline, m=m,
                prompts_per_step=prompts, seeds=args.seeds, updates=args.updates, eval_every=eval_every,
                eval_problems=args.eval_problems, eval_k=args.eval_k, lr=None if lrs else float(config.learning_rate),
                lrs=lrs, sweep_seeds=args.sweep_seeds, sweep_updates=args.sweep_updates, cost_n=cost_n,
                cost_pilot=pilot if cost_n and max(cost_n) > m else None,
                cost_steps=args.cost_steps, cost_warmup=args.cost_warmup, checkpoint_every=args.checkpoint_every,
                logging_steps=1 if args.smoke else 5, device=device, jobs=jobs, threads=threads,
                drop_weights=args.drop_weights, in_process=args.in_process, bootstrap=args.bootstrap,
                first_seed=args.first_seed)


def _cuda_or_cpu() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
