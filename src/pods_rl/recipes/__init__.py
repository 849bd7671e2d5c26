"""Recipes: a YAML file (packaged or the user's) plus flag overrides -> validated (RunArguments, PODSConfig,
trl.ModelConfig), TRL style. The one place that parses and checks what `pods train` and `pods cost` are asked.

    parse_args(argv)          recipe + flags -> (RunArguments, PODSConfig, ModelConfig); a bad recipe or flag is
                              one ValueError line (file:line for YAML, the nearest known spelling for a typo)
    train_help(recipe)        `pods train --help`: --config, then every flag with its field's own default and the
                              recipe's value where it differs: ``(default: None; the embedded recipe: 300)``
    validate / check_splits   the checks that need no model (and, for the splits, the task)
    resolved_config(...)      the flat ``{field: value}`` written to the run's config.yaml

Task options have one parser, ``pods_rl.tasks.parse_task_args`` (re-exported here): ``--task_args a=1,b=x``,
repeatable ``--task-arg a=1`` and a YAML mapping in the recipe all mean the same.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import enum
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pods_rl.errors import one_line_parser_errors
from pods_rl.tasks import parse_task_args  # noqa: F401  (re-exported: the one task-args parser)

RECIPES_DIR = Path(__file__).parent  # the YAML files sit beside this module
DEFAULT_RECIPE = "tiny"


@dataclass
class RunArguments:
    """What to train on and how to evaluate while training (everything that is not TRL's)."""

    task: str = field(default="arithmetic", metadata={"help": "Task name from pods_rl.tasks (gsm8k, math, "
                      "arithmetic, jsonl:PATH, reasoning_gym:NAME, ...)."})
    task_args: str | None = field(default=None, metadata={"help": "Task options as key=value pairs separated by "
                                  "commas, e.g. 'data_dir=../shared/data/gsm8k,prompt_style=instruct'."})
    train_split: str = field(default="train")
    train_limit: int | None = field(default=None, metadata={"help": "Use only the first N training problems."})
    eval_split: str = field(default="test")
    eval_num_problems: int = field(default=200, metadata={"help": "Held-out problems per evaluation."})
    eval_k: int = field(default=5, metadata={"help": "Samples per problem in evaluation (paper: 5)."})
    eval_temperature: float = field(default=0.9, metadata={"help": "Sampling temperature in evaluation (paper: "
                                    "0.9)."})
    eval_max_new_tokens: int | None = field(default=None, metadata={"help": "The longest completion in evaluation, "
                                            "in tokens. None: max_completion_length."})
    eval_batch_size: int = field(default=64)
    eval_every_seconds: float | None = field(default=None, metadata={"help": "Evaluate on the held-out split "
                                             "every this many seconds of training time (and at start and end)."})
    eval_every_steps: int | None = field(default=None, metadata={"help": "Evaluate on the held-out split every "
                                         "this many optimizer steps (and at start and end); combines with "
                                         "eval_every_seconds."})
    eval_before_after: bool = field(default=True, metadata={"help": "Evaluate before and after training and print "
                                    "both."})
    accept_config_changes: bool = field(default=False, metadata={"help": "On resume, accept settings that differ "
                                        "from the run's config.yaml (the old one is kept as "
                                        "config.until-step-N.yaml)."})
    torch_threads: int | None = field(default=None, metadata={"help": "CPU threads for torch (None: torch's "
                                      "choice). For tiny models 1 is as fast and immune to oversubscription when "
                                      "other processes share the cores."})
    stop_grace_seconds: float = field(default=30.0, metadata={"help": "After SIGTERM / Ctrl-C, the seconds until the "
                                      "process must be gone (Kubernetes' default grace is 30; on SLURM, the lead time "
                                      "of --signal). The step in progress gets what remains after an estimate of the "
                                      "checkpoint save; if it is still running then (a slow reward function, "
                                      "generation, an evaluation), it is abandoned and the last complete step saved."})
    run_figure: bool = field(default=True, metadata={"help": "Draw accuracy_vs_time.png/.pdf into the run "
                             "directory at the end (pods study draws its own and skips it)."})
    allow_data_change: bool = field(default=False, metadata={"help": "On resume, continue although the training "
                                    "data differs from what the run recorded in data.json (the change is recorded "
                                    "there); without it such a resume is refused."})
    max_row_bytes: int | None = field(default=None, metadata={"help": "Refuse a data row (a JSONL line, or a "
                                      "question / answer) longer than this many bytes, while loading, before the "
                                      "model loads. None: the task's limit (512 KiB: about 128k tokens of text)."})


TASK_ARG_FLAGS = ("--task-arg", "--task_arg")  # repeatable key=value, the spelling `pods eval` has always had


def merge_task_arg_flags(argv: list[str]) -> list[str]:
    """Fold every ``--task-arg KEY=VALUE`` into one ``--task_args`` value (after any given ``--task_args``), so that
    `pods train`, `pods cost` and `pods eval` accept the same spellings. Like any flag, the result replaces the
    recipe's ``task_args`` as a whole."""
    rest, pairs, i = [], [], 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in TASK_ARG_FLAGS:
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ValueError(f"{name} needs KEY=VALUE, e.g. {name} data_dir=data/gsm8k")
                i += 1
                value = argv[i]
            pairs.append(value)
        else:
            rest.append(argv[i])
        i += 1
    if not pairs:
        return rest
    given = None
    for j, item in enumerate(rest):
        name, eq, value = item.partition("=")
        if name in ("--task_args", "--task-args"):
            if eq:
                given, rest[j:j + 1] = value, []
            elif j + 1 < len(rest):
                given, rest[j:j + 2] = rest[j + 1], []
            break
    return [*rest, "--task_args", ",".join([*([given] if given else []), *pairs])]


def resolve_recipe(name_or_path: str) -> Path:
    """A recipe path, or the name of a packaged recipe (``tiny``, ``gsm8k/pods``...)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = RECIPES_DIR / (name_or_path if name_or_path.endswith(".yaml") else name_or_path + ".yaml")
    if packaged.parent.name == "accelerate" and packaged.parent.parent == RECIPES_DIR:
        raise ValueError(f"{name_or_path!r} is an accelerate launch config, not a recipe: accelerate launch "
                         f"--config_file $(pods accelerate-config {packaged.stem}) "
                         "-m pods_rl.commands.cli train --config ...")
    if packaged.is_file():
        return packaged
    raise ValueError(f"Recipe {name_or_path!r} is neither a file nor a packaged recipe; packaged recipes: "
                     f"{packaged_recipes()}.")


def packaged_recipes() -> list[str]:
    """The names ``--config`` takes for the recipes shipped in the package (``tiny``, ``gsm8k/pods``, ...)."""
    return sorted(str(p.relative_to(RECIPES_DIR).with_suffix("")) for p in RECIPES_DIR.rglob("*.yaml")
                  if p.parent.name != "accelerate")


def parse_args(argv: list[str] | None = None):
    """Parse a recipe plus flag overrides into (RunArguments, PODSConfig, trl.ModelConfig). With ``-h`` / ``--help``
    it prints the help of `pods train` (``train_help``) and raises ``SystemExit(0)``, as argparse does."""
    argv = merge_task_arg_flags(list(argv or []))
    recipe = None
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("--config needs a recipe path or name, e.g. --config tiny")
        recipe = argv[i + 1]
        argv[i + 1] = str(resolve_recipe(argv[i + 1]))
    else:
        argv = ["--config", str(resolve_recipe(DEFAULT_RECIPE)), *argv]
    check_recipe_yaml(argv[argv.index("--config") + 1])
    if any(arg in HELP_FLAGS for arg in argv):
        print(train_help(recipe))
        raise SystemExit(0)
    parser = build_parser()
    with warnings.catch_warnings():
        # TRL's defaults set a field transformers renamed; the warning is not the user's to act on.
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        try:
            return parser.parse_args_and_config(args=argv)
        except ValueError as err:
            if "arguments are not used" not in str(err):
                raise
            try:  # HfArgumentParser ends the message with the list of what it could not use
                leftover = ast.literal_eval(str(err)[str(err).index("["):])
            except (ValueError, SyntaxError):
                leftover = argv
            raise ValueError(unknown_flags_message(parser, leftover)) from None


HELP_FLAGS = ("-h", "--help")
# What `pods train` does with a library field left at None, where the library's help does not say it.
NONE_MEANS = {
    "model_name_or_path": "the shipped tiny model (pods_rl/assets/tiny, rebuilt by `pods build-tiny`)",
    "output_dir": "runs/<task>-<method>-seed<seed>-<date>-<time>",
}
CONFIG_HELP = ("The recipe: the name of a packaged recipe ({names}) or the path of a YAML file of `field: value` "
               "lines (any flag below; `env:` sets environment variables). Flags override its values. (default: "
               "tiny, the embedded recipe: the shipped tiny model on the arithmetic task, on CPU)")


def build_parser():
    """The `pods train` parser: TRL's parser of (RunArguments, PODSConfig, trl.ModelConfig), with ``--config`` (read
    by ``TrlParser.parse_args_and_config``) listed first, and one-line errors."""
    # Lazy: TRL (which pods_rl.engines.trl.parser imports) takes seconds to import; the checks above need it not.
    from pods_rl.engines.trl.parser import train_parser

    parser = train_parser(RunArguments, prog="pods train",
                          description="RL training with GRPO-PODS: a recipe (--config) plus flags that override it. "
                          "Each flag's (default: ...) is its field's own; where the recipe sets another value, that "
                          "is named too: (default: None; the embedded recipe: 300).")
    config = parser.add_argument("--config", metavar="RECIPE", default=argparse.SUPPRESS,
                                 help=CONFIG_HELP.format(names=", ".join(packaged_recipes())).replace("%", "%%"))
    for actions in (parser._actions, parser._optionals._group_actions):  # first after -h, in usage and in the list
        actions.remove(config)
        actions.insert(1, config)
    one_line_parser_errors(parser)
    return parser


def train_help(recipe: str | None = None) -> str:
    """The help of `pods train`: every flag with its field's default and, where ``recipe`` (a ``--config`` value;
    None: the embedded one) sets another value, that value too: ``(default: None; the embedded recipe: 300)``."""
    path = resolve_recipe(recipe or DEFAULT_RECIPE)
    check_recipe_yaml(path)
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    label = f"the recipe {recipe}" if recipe else "the embedded recipe"
    parser = build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "config"):
            action.help = flag_help(action, values, label).replace("%", "%%")
            action.default = argparse.SUPPRESS  # the text above says it; argparse would append its own
    return parser.format_help()


def flag_help(action, recipe: dict, label: str) -> str:
    """One flag's help text (an argparse action of the `pods train` parser) ending in its default, and the value
    ``recipe`` sets for it when that differs (``label`` names the recipe)."""
    text = " ".join((action.help or "").replace("%%", "%").split())  # argparse's escape undone; redone by the caller
    if action.nargs == 0 and action.const is False:  # HfArgumentParser's --no_X for a field X that defaults to true
        return f"Set {action.dest} to false (the same as --{action.dest} false)."
    default = action.default
    if default is None:  # a field's own words for what None means: "Default: X" would contradict "(default: None)"
        text = text.replace("Default: ", "None: ").replace("(default: ", "(None: ")
        if action.dest in NONE_MEANS:
            text += f" None: {NONE_MEANS[action.dest]}."
    note = f"default: {shown(default)}"
    if action.dest in recipe and shown(recipe[action.dest]) != shown(default):
        note += f"; {label}: {shown(recipe[action.dest])}"
    return f"{text} ({note})".strip()


def shown(value) -> str:
    """A default or recipe value as the help prints it (an Enum by its value, as it is written on the command line)."""
    value = getattr(value, "value", value) if isinstance(value, enum.Enum) else value
    if isinstance(value, (list, tuple)):
        return " ".join(shown(v) for v in value) if value else "[]"
    return str(value)


def unknown_flags_message(parser, leftover: list[str]) -> str:
    """One line naming the flags `pods train` does not know, with the nearest known spelling of each."""
    known = [o for action in parser._actions for o in action.option_strings]
    unknown = [a.split("=")[0] for a in leftover if a.startswith("-") and a.split("=")[0] not in known]
    asynchronous = [flag for flag in unknown if flag.lstrip("-") in async_only_settings()]
    if asynchronous:
        return (f"{', '.join(asynchronous)}: `pods train` runs the synchronous trainer and has no asynchronous mode "
                "(TRL's AsyncGRPOTrainer settings); asynchronous PODS runs from Python: AsyncGRPOTrainer with "
                "rollout_worker=pods_rl.engines.trl_async.worker.pods_rollout_worker(...) (docs: guides/async.md)")
    hints = []
    for flag in unknown:
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        hints.append(f"{flag} (did you mean {close[0]}?)" if close else flag)
    if not hints:
        return f"unexpected arguments {leftover} (flags take the form --name value; see `pods train --help`)"
    return f"unknown flag{'s' if len(hints) != 1 else ''} {', '.join(hints)} (see `pods train --help`)"


def async_only_settings() -> set[str]:
    """The settings `pods train` refuses as the asynchronous trainer's (``pods_rl.engines.trl_async.settings``)."""
    from pods_rl.engines.trl_async.settings import async_only_settings as of_the_engine

    return of_the_engine()


def check_recipe_yaml(path: str | Path) -> None:
    """Raise a one-line ValueError (``file:line``) if the recipe is not a YAML mapping."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); "
                         "save the recipe as UTF-8") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ValueError(f"{where}: YAML syntax error ({err.problem or err.context}); fix that line of the "
                         "recipe") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from None
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe is a mapping of `field: value` lines, got a YAML {type(data).__name__}")


def validate(run: RunArguments, config, model_args) -> None:
    """Check the settings that need no task or model; a ValueError names the flag and its fix."""
    positive = {
        "learning_rate": config.learning_rate,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "generation_batch_size": getattr(config, "generation_batch_size", None),
        "num_generations": config.num_generations,
        "eval_batch_size": run.eval_batch_size,
        "eval_k": run.eval_k,
        "eval_num_problems": run.eval_num_problems,
        "eval_every_seconds": run.eval_every_seconds,
        "eval_every_steps": getattr(run, "eval_every_steps", None),
        "train_limit": run.train_limit,
        "max_row_bytes": getattr(run, "max_row_bytes", None),
        "torch_threads": run.torch_threads,
        "save_every_seconds": config.save_every_seconds,
        "max_train_seconds": config.max_train_seconds,
        "stop_grace_seconds": getattr(run, "stop_grace_seconds", None),
        # Sampling: at 0 every completion of a prompt would be the same (no variance, nothing to learn).
        "temperature": getattr(config, "temperature", None),
    }
    for name, value in positive.items():
        if value is not None and not value > 0:
            raise ValueError(f"--{name} must be > 0, got {value}")
    from pods_rl.reward_guard import MAX_ABS_REWARD  # the reward-scale bound: weights scale every reward

    for weight in config.reward_weights or ():
        if not abs(float(weight)) <= MAX_ABS_REWARD:  # also NaN
            weights = ' '.join(f'{float(w):g}' for w in config.reward_weights)
            raise ValueError(f"--reward_weights {weights}: a weight of "
                             f"{float(weight):g} is beyond the reward bound of {MAX_ABS_REWARD:g} (a scale that makes "
                             "training diverge; group normalisation makes the scale irrelevant): use weights like 1.0")
    if (config.max_steps is None or config.max_steps <= 0) and not config.num_train_epochs > 0:
        raise ValueError(f"--num_train_epochs must be > 0 when --max_steps is not set, got {config.num_train_epochs}: "
                         "training would take no step")
    if isinstance(run.task_args, dict):  # a YAML mapping in the recipe: the same options, written as a mapping
        run.task_args = ",".join(f"{key}={json.dumps(value)}" for key, value in run.task_args.items())
    if run.task_args is not None and not isinstance(run.task_args, str):
        raise ValueError(f"task_args must be key=value pairs such as 'data_dir=data/gsm8k,prompt_style=instruct' "
                         f"(or a mapping in the recipe), got a {type(run.task_args).__name__}: {run.task_args!r}")
    if config.use_vllm:  # vLLM missing, outside TRL's range, server mode on CPU...: one line before any model loads
        import torch  # only to ask whether training will run on CPU

        from pods_rl.engines.vllm.cpu import check_vllm_settings

        check_vllm_settings(config.use_vllm, config.vllm_mode, on_cpu=config.use_cpu or not torch.cuda.is_available())


def wants_eval(run: RunArguments) -> bool:
    """Whether training evaluates on the held-out split at all."""
    return bool(run.eval_every_seconds or getattr(run, "eval_every_steps", None) or run.eval_before_after)


def check_splits(run: RunArguments, task) -> None:
    """The train split, and the eval split when training evaluates, must exist in the task."""
    splits = list(getattr(task, "splits", ()))
    if run.train_split not in splits:
        raise ValueError(f"unknown --train_split {run.train_split!r} for task {run.task!r}; choose one of {splits}")
    if wants_eval(run) and run.eval_split not in splits:
        if splits == ["train"]:
            raise ValueError(f"task {run.task!r} is a single file (split 'train' only) but evaluation needs split "
                             f"{run.eval_split!r}: pass --eval_split train, or --eval_before_after false (and no "
                             "eval_every_*), or point the task at a directory with train.jsonl and test.jsonl")
        raise ValueError(f"unknown --eval_split {run.eval_split!r} for task {run.task!r}; choose one of {splits}")


def check_enough_prompts(config, num_prompts: int, what: str, world_size: int | None = None) -> None:
    """One generation round must find its prompts in the training split, or training takes 0 steps (and would
    write final/ as if it had finished). ``what`` names the split for the message."""
    world_size = world_size or int(os.environ.get("WORLD_SIZE", "1"))
    per_process = config.sampled_prompts_per_process()
    needed = per_process * world_size
    if num_prompts >= needed:
        return
    kept = config.per_device_train_batch_size * config.steps_per_generation
    how = (f"per_device_train_batch_size {config.per_device_train_batch_size} x steps_per_generation "
           f"{config.steps_per_generation} = {kept} kept rollouts / m={config.downsample_to}")
    if config.oversample_prompts > 1:
        how += f", x oversample_prompts {config.oversample_prompts:g}"
    if world_size > 1:
        how += f", x {world_size} processes"
    raise ValueError(f"{what} has {num_prompts} prompts but one generation round needs {needed} ({how}): training "
                     "would take 0 steps. Use more problems (--train_limit, the task's size or data), or a smaller "
                     "per_device_train_batch_size / gradient_accumulation_steps")


def _to_yaml_dict(obj) -> dict:
    if hasattr(obj, "to_dict"):
        data = obj.to_dict()
    else:
        data = dataclasses.asdict(obj)
    return {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool, list, type(None)))}


def resolved_config(run: RunArguments, config, model_args) -> dict:
    """The flat ``{field: value}`` written to config.yaml (plain YAML values only)."""
    return {**_to_yaml_dict(config), **_to_yaml_dict(model_args), **_to_yaml_dict(run)}
