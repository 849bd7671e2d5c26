"""`pods train`: a recipe (YAML + flag overrides, TRL style) -> model, task, PODSTrainer -> a run directory.

    pods train                                   # the embedded default: tiny model, arithmetic task, CPU
    pods train --config gsm8k/pods               # a packaged recipe by name (src/pods_rl/recipes/...)
    pods train --config my.yaml --learning_rate 1e-5 --downsample_to 8
    pods train --config my.yaml --output_dir runs/x --resume_from_checkpoint true

Flags are the fields of ``RunArguments`` (below), ``pods_rl.PODSConfig`` (= ``trl.GRPOConfig`` + PODS) and
``trl.ModelConfig`` (model, dtype, LoRA).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pods_rl.cli import CommandFailed, one_line_parser_errors

RECIPES_DIR = Path(__file__).parent / "recipes"
DEFAULT_RECIPE = "tiny"

logger = logging.getLogger("pods_rl.train")
# What an in-training evaluation logs (as eval/<key>) from pods_rl.evaluate's record.
EVAL_KEYS = ("accuracy", "accuracy_stderr", "format_accuracy", "both_accuracy", "pass_at_k", "mean_completion_tokens",
             "eval_seconds")


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
    eval_max_new_tokens: int | None = field(default=None, metadata={"help": "Default: max_completion_length."})
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
    torch_threads: int | None = field(default=None, metadata={"help": "CPU threads for torch (default: torch's "
                                      "choice). For tiny models 1 is as fast and immune to oversubscription when "
                                      "other processes share the cores."})


def parse_task_args(text: str | None) -> dict:
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}`` (see ``pods_rl.tasks.parse_task_args``)."""
    from pods_rl.tasks import parse_task_args as parse

    return parse(text)


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
                         f"--config_file $(pods accelerate-config {packaged.stem}) -m pods_rl.cli train --config ...")
    if packaged.is_file():
        return packaged
    names = sorted(str(p.relative_to(RECIPES_DIR).with_suffix("")) for p in RECIPES_DIR.rglob("*.yaml")
                   if p.parent.name != "accelerate")
    raise ValueError(f"Recipe {name_or_path!r} is neither a file nor a packaged recipe; packaged recipes: {names}.")


def parse_args(argv: list[str] | None = None):
    """Parse a recipe plus flag overrides into (RunArguments, PODSConfig, trl.ModelConfig)."""
    from trl import ModelConfig, TrlParser

    from pods_rl.trainer import PODSConfig

    argv = merge_task_arg_flags(list(argv or []))
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("--config needs a recipe path or name, e.g. --config tiny")
        argv[i + 1] = str(resolve_recipe(argv[i + 1]))
    else:
        argv = ["--config", str(resolve_recipe(DEFAULT_RECIPE)), *argv]
    check_recipe_yaml(argv[argv.index("--config") + 1])
    parser = TrlParser((RunArguments, PODSConfig, ModelConfig), prog="pods train")
    one_line_parser_errors(parser)
    import warnings

    with warnings.catch_warnings():
        # TRL's defaults set a field transformers renamed; the warning is not the user's to act on.
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        try:
            return parser.parse_args_and_config(args=argv)
        except ValueError as err:
            if "arguments are not used" not in str(err):
                raise
            import ast

            try:  # HfArgumentParser ends the message with the list of what it could not use
                leftover = ast.literal_eval(str(err)[str(err).index("["):])
            except (ValueError, SyntaxError):
                leftover = argv
            raise ValueError(unknown_flags_message(parser, leftover)) from None


def unknown_flags_message(parser, leftover: list[str]) -> str:
    """One line naming the flags `pods train` does not know, with the nearest known spelling of each."""
    import difflib

    known = [o for action in parser._actions for o in action.option_strings]
    unknown = [a.split("=")[0] for a in leftover if a.startswith("-") and a.split("=")[0] not in known]
    hints = []
    for flag in unknown:
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        hints.append(f"{flag} (did you mean {close[0]}?)" if close else flag)
    if not hints:
        return f"unexpected arguments {leftover} (flags take the form --name value; see `pods train --help`)"
    return f"unknown flag{'s' if len(hints) != 1 else ''} {', '.join(hints)} (see `pods train --help`)"


def check_recipe_yaml(path: str | Path) -> None:
    """Raise a one-line ValueError (``file:line``) if the recipe is not a YAML mapping."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save the recipe as UTF-8") from None
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
        "torch_threads": run.torch_threads,
        "save_every_seconds": config.save_every_seconds,
        "max_train_seconds": config.max_train_seconds,
    }
    for name, value in positive.items():
        if value is not None and not value > 0:
            raise ValueError(f"--{name} must be > 0, got {value}")
    if isinstance(run.task_args, dict):  # a YAML mapping in the recipe: the same options, written as a mapping
        run.task_args = ",".join(f"{key}={json.dumps(value)}" for key, value in run.task_args.items())
    if run.task_args is not None and not isinstance(run.task_args, str):
        raise ValueError(f"task_args must be key=value pairs such as 'data_dir=data/gsm8k,prompt_style=instruct' "
                         f"(or a mapping in the recipe), got a {type(run.task_args).__name__}: {run.task_args!r}")


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


def hub_offline() -> bool:
    """Whether the Hugging Face hub is switched off (``HF_HUB_OFFLINE``)."""
    import os

    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a local path rather than a hub id (``org/name``)."""
    return (Path(name).expanduser().exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1
            or "\\" in name or ("/" in name and Path(name.split("/")[0]).is_dir()))


def check_model_path(name: str, revision: str | None = None, what: str = "--model_name_or_path") -> None:
    """Fail in one line, before anything loads, for a model that cannot be loaded: a local path that does not
    exist or holds no model, a hub id that is not cached while offline, or not on a hub that cannot be reached
    (a hub id is probed once, without the download's retries). ``what`` names the flag in the message."""
    path, label = Path(name).expanduser(), f"{what} {name}".strip()
    if looks_local(name):
        if not path.exists():
            raise ValueError(f"{label}: no such directory; pass a saved model directory or a "
                             "hub id like Qwen/Qwen2.5-3B-Instruct")
        if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            raise ValueError(f"{label} holds no model (no config.json); pass a directory "
                             "written by save_pretrained (e.g. a run's final/) or a hub id")
        return
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str):
        return  # cached: loads without the network
    if hub_offline():
        raise ValueError(f"{label}: no such local directory, and hub model {name!r} is not in the local hub "
                         f"cache and HF_HUB_OFFLINE=1: download it with network (hf download {name}) or pass a local "
                         "model directory")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(name, revision=revision, timeout=10)
    except GatedRepoError:
        raise ValueError(f"model {name!r} is gated on the hub: accept its terms on huggingface.co and log in "
                         "(hf auth login), or pass a local model directory") from None
    except RevisionNotFoundError:
        raise ValueError(f"model {name!r} has no revision {revision!r} on the hub") from None
    except RepositoryNotFoundError:
        raise ValueError(f"{label}: no such local directory, and no model {name!r} on the hub (or it is "
                         "private: log in with hf auth login)") from None
    except Exception as err:  # noqa: BLE001 - connection refused, DNS, timeout, proxy: all mean "no hub"
        raise ValueError(f"{label}: no such local directory, and cannot reach the Hugging Face hub to get it "
                         f"({type(err).__name__}: "
                         f"{str(err).strip()[:120]}); when offline, set HF_HUB_OFFLINE=1 and use a cached model, "
                         "or pass a local model directory") from None


def check_output_dir(run_dir: Path) -> None:
    """``run_dir`` must be a directory (or creatable as one) in a writable place."""
    import os

    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--output_dir {run_dir} is a file; pass a directory path")
    ancestor = run_dir.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"--output_dir {run_dir} lies under {ancestor}, which is a file; pass another path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"--output_dir {run_dir}: {ancestor} is not writable; pass a path in a writable place")
    # os.access trusts permission bits; a read-only mount or a pseudo file system (/proc) only shows when one tries.
    # An empty directory made and removed at once leaves nothing behind.
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pods-write-test-", dir=ancestor))
    except OSError as err:
        raise ValueError(f"--output_dir {run_dir}: cannot create anything in {ancestor} ({err.strerror}); pass a "
                         "path in a writable place") from None


def default_run_dir(run: RunArguments, config) -> Path:
    """``runs/<task>-<method>-<timestamp>``."""
    method = (f"pods-{config.downsample_rule}-n{config.num_generations}m{config.downsample_to}" if config.is_pods
              else f"grpo-n{config.num_generations}")
    task = run.task.replace(":", "-").replace("/", "-")
    return Path("runs") / f"{task}-{method}-seed{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def _to_yaml_dict(obj) -> dict:
    if hasattr(obj, "to_dict"):
        data = obj.to_dict()
    else:
        data = dataclasses.asdict(obj)
    return {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool, list, type(None)))}


class RunFinished(Exception):
    """Resuming a run that already finished: nothing to do (not an error)."""


class RunFailed(CommandFailed):
    """An expected failure (disk full, aborted...) whose message already says what happened and what to do."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# Settings that do not change what is trained: budgets, saving, logging, evaluation, threads. A resume may change
# them freely; any other difference from config.yaml needs --accept_config_changes.
NOT_TRAINING_FIELDS = frozenset({
    "output_dir", "resume_from_checkpoint", "accept_config_changes", "overwrite_output_dir", "max_steps",
    "num_train_epochs", "max_train_seconds", "save_every_seconds", "save_steps", "save_strategy", "save_total_limit",
    "save_only_model", "logging_dir", "logging_steps", "logging_strategy", "logging_first_step", "report_to",
    "run_name", "disable_tqdm", "log_completions", "num_completions_to_print", "log_level", "push_to_hub",
    "hub_model_id", "hub_strategy", "hub_private_repo", "dataloader_num_workers", "torch_threads", "eval_split",
    "eval_num_problems", "eval_k", "eval_temperature", "eval_max_new_tokens", "eval_batch_size",
    "eval_every_seconds", "eval_every_steps", "eval_before_after",
})


def main(argv: list[str] | None = None) -> int:
    """Run ``pods train``; returns the exit code (0 done or already finished, 2 bad input, 1 failed,
    128 + signal number when stopped by a signal, 130 when aborted). ``--debug``: a traceback, not one line."""
    from pods_rl.cli import run_guarded

    return run_guarded("pods train", _main, argv)


def quiet_library_warnings() -> None:
    """Hide the library deprecation warnings a `pods train` user cannot act on; narrowly, by message and module.

    TRL (1.12-1.16) reads ``model.is_gradient_checkpointing`` and calls ``gradient_checkpointing_disable/enable``
    around every generation, and its configs set the ``gradient_checkpointing`` field: transformers deprecates
    these names for ``activation_checkpointing*`` with a FutureWarning each (TRL's code, not ours or the user's).
    """
    import warnings

    warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing(_enable|_disable|_kwargs)?` is deprecated",
                            category=FutureWarning, module=r"transformers\.")


def _main(argv: list[str]) -> int:
    from pods_rl.runlog import GracefulStop

    quiet_library_warnings()
    config, stop = None, GracefulStop()
    try:
        run, config, model_args = parse_args(argv)
        # From here a signal aborts at once (and a run directory made by this start is removed) until training
        # begins; then it finishes the step and saves.
        with stop.handling_signals():
            trainer, clock, eval_fn = build(run, config, model_args, stop=stop)
            summary = fit(trainer, clock, eval_fn)
    except RunFinished as done:  # not an error: nothing to do
        print(f"pods train: {done}")
        return 0
    except KeyboardInterrupt as err:  # a second SIGINT / SIGTERM, or Ctrl-C before training started
        run_dir = config.output_dir if config is not None and config.output_dir else "RUN_DIR"
        raise RunFailed(f"aborted; {run_dir} keeps its complete checkpoints (resume with --output_dir {run_dir} "
                        "--resume_from_checkpoint true)", exit_code=130) from err
    return summary.get("exit_code", 0)


def train(run: RunArguments, config, model_args) -> dict:
    """Train per the parsed configuration; returns a summary dict (run_dir, accuracy before/after, seconds)."""
    return fit(*build(run, config, model_args))


def resolved_config(run: RunArguments, config, model_args) -> dict:
    """The flat ``{field: value}`` written to config.yaml (plain YAML values only)."""
    return {**_to_yaml_dict(config), **_to_yaml_dict(model_args), **_to_yaml_dict(run)}


def config_changes(old: dict, new: dict) -> dict:
    """``{field: (old, new)}`` for the training fields whose values differ (fields new in this version skipped)."""
    return {key: (old[key], new.get(key)) for key in sorted(old)
            if key not in NOT_TRAINING_FIELDS and key in new and old[key] != new[key]}


def plan_resume(run: RunArguments, config, output_dir_given: bool) -> Path | None:
    """Check a resume request before anything loads; returns the explicit checkpoint asked for, if any."""
    from pods_rl import runlog

    value = config.resume_from_checkpoint
    explicit = None if str(value).lower() == "true" else Path(value)
    if not output_dir_given:
        hint = f" {explicit.parent}" if explicit is not None else " RUN_DIR"
        raise ValueError(f"--resume_from_checkpoint needs the run directory to continue: pass --output_dir{hint}")
    run_dir = Path(config.output_dir)
    if explicit is not None and not explicit.exists() and (run_dir / explicit).is_dir():
        explicit = run_dir / explicit  # a checkpoint named relative to the run directory (checkpoint-20)
    if not run_dir.is_dir():
        raise ValueError(f"--resume_from_checkpoint is set but the run directory {run_dir} does not exist; drop "
                         "--resume_from_checkpoint to start a new run there")
    if explicit is not None:
        complete = [p.name for p in runlog.list_checkpoints(run_dir)]
        if (not explicit.is_dir() or explicit.resolve().parent != run_dir.resolve()
                or not runlog.is_checkpoint_name(explicit.name)):
            raise ValueError(f"--resume_from_checkpoint {explicit} is not a checkpoint directory of --output_dir "
                             f"{run_dir}; complete checkpoints there: {complete}")
        if runlog.read_clock(explicit) is None:
            raise ValueError(f"--resume_from_checkpoint {explicit} is incomplete (no {runlog.CLOCK_FILE}); "
                             f"choose a complete one: {complete}")
        return explicit
    finished = runlog.read_clock(run_dir / "final")
    if finished is not None:
        last = runlog.list_checkpoints(run_dir)
        raise RunFinished(
            f"{run_dir} already finished (final/ at step {finished['step']}, "
            f"{float(finished['train_seconds']):.0f} s of training); nothing was changed. To train on, resume from "
            f"an explicit checkpoint (--resume_from_checkpoint {last[-1] if last else run_dir / 'checkpoint-N'} "
            "with a larger budget) or start a new run from --model_name_or_path " + str(run_dir / "final"))
    return None


def build(run: RunArguments, config, model_args, stop=None):
    """Check everything that can be checked cheaply, load task, model and tokenizer, prepare the run directory
    (resume) and build the trainer and its clock. Nothing is written before all checks pass. ``stop``: the
    ``runlog.GracefulStop`` whose signal handlers are installed (a new one otherwise; ``fit`` installs it)."""
    import shutil

    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import get_peft_config

    from pods_rl import runlog
    from pods_rl.tasks import get_task
    from pods_rl.trainer import PODSTrainer

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("pods_rl").setLevel(logging.INFO)
    validate(run, config, model_args)
    output_dir_given = bool(config.output_dir) and config.output_dir != "trainer_output"
    if not output_dir_given:
        config.output_dir = str(default_run_dir(run, config))
    run_dir = Path(config.output_dir)
    check_output_dir(run_dir)

    resume = config.resume_from_checkpoint not in (None, False, "false", "False", "")
    explicit = plan_resume(run, config, output_dir_given) if resume else None
    if not resume and (runlog.list_checkpoints(run_dir, complete_only=False)
                       or (run_dir / runlog.METRICS_FILE).exists()):
        raise ValueError(f"{run_dir} already holds a run; pass --resume_from_checkpoint true to continue it, or "
                         f"choose another --output_dir (nothing was overwritten).")

    task = get_task(run.task, **parse_task_args(run.task_args))
    check_splits(run, task)
    train_dataset = task.load(run.train_split, limit=run.train_limit)
    if wants_eval(run):  # a broken or missing held-out split fails now, not after the model loaded
        held_out = len(task.load(run.eval_split, limit=run.eval_num_problems))
        if held_out < run.eval_num_problems:
            print(f"pods train: note: split {run.eval_split!r} of task {run.task!r} has {held_out} problems, so each "
                  f"evaluation uses {held_out}, not the {run.eval_num_problems} of --eval_num_problems")
    if config.reward_weights is None:
        config.reward_weights = list(task.reward_weights)
    if not model_args.model_name_or_path:
        from pods_rl.tiny import model_path as tiny_model_path

        model_args.model_name_or_path = str(tiny_model_path())
    model_path = model_args.model_name_or_path
    check_model_path(model_path, model_args.model_revision)

    config_file = run_dir / "config.yaml"
    flat = resolved_config(run, config, model_args)
    changes = {}
    if resume and config_file.is_file():
        changes = config_changes(yaml.safe_load(config_file.read_text()) or {}, flat)
        if changes and not run.accept_config_changes:
            listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
            raise ValueError(f"this resume changes training settings of {run_dir}: {listed}; pass "
                             "--accept_config_changes true to continue with them, or drop those flags to continue "
                             "as the run started")

    if run.torch_threads:
        torch.set_num_threads(run.torch_threads)
    dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
        model = AutoModelForCausalLM.from_pretrained(model_path, revision=model_args.model_revision, dtype=dtype)
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        hint = "" if hub_offline() or looks_local(model_path) else (
            "; without network, set HF_HUB_OFFLINE=1 and use a cached model or a local directory")
        raise ValueError(f"could not load model {model_path!r}: {first}{hint}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    # Under a multi-process launcher every process runs this; only the first one changes the run directory.
    main_process = os.environ.get("RANK", "0") == "0"
    created = main_process and not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        resume_checkpoint, train_seconds = None, 0.0
        if resume:
            resume_checkpoint, train_seconds = runlog.prepare_resume(run_dir, checkpoint=explicit,
                                                                     modify=main_process)
            if resume_checkpoint is None:
                logger.warning("no complete checkpoint in %s: starting from scratch", run_dir)
            config.resume_from_checkpoint = str(resume_checkpoint) if resume_checkpoint else None
        # config.yaml describes what runs: written only now that every check passed. A changed config keeps the
        # previous one beside it, named after the step from which the new one applies.
        flat["resume_from_checkpoint"] = config.resume_from_checkpoint
        if main_process and config_file.is_file() and resume:
            old = yaml.safe_load(config_file.read_text()) or {}
            if {k: v for k, v in old.items() if k != "resume_from_checkpoint"} != {
                    k: v for k, v in flat.items() if k != "resume_from_checkpoint"}:
                step = runlog.read_clock(resume_checkpoint)["step"] if resume_checkpoint else 0
                os.replace(config_file, _free_name(run_dir / f"config.until-step-{step}.yaml"))
                if changes:
                    logger.warning("training settings changed from step %d on: %s (previous config kept as "
                                   "config.until-step-%d.yaml)", step, ", ".join(changes), step)
        if main_process and (not config_file.is_file() or not resume):
            config_file.write_text(yaml.safe_dump(flat, sort_keys=True))

        eval_fn = None
        if wants_eval(run):
            eval_fn = _make_eval_fn(run, config, task, tokenizer)
        clock = runlog.TrainingClock(
            run_dir,
            save_every_seconds=config.save_every_seconds,
            max_train_seconds=config.max_train_seconds,
            eval_fn=eval_fn,  # before the first step, every eval_every_seconds, after the last
            eval_every_seconds=run.eval_every_seconds,
            eval_every_steps=run.eval_every_steps,
            train_seconds=train_seconds,
            progress=config.max_train_seconds is not None and not config.disable_tqdm,
        )
        if clock.progress:  # the clock's bar (training seconds) replaces the Trainer's (steps of max_steps)
            config.disable_tqdm = True
        callbacks = [clock, stop or runlog.GracefulStop()]
        if changes:  # the optimizer state in the checkpoint carries the old hyper-parameters: apply the new ones
            callbacks.append(runlog.ApplyOptimizerSettings())
        trainer = PODSTrainer(
            model=model,
            reward_funcs=task.reward_funcs(),
            args=config,
            train_dataset=train_dataset,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            callbacks=callbacks,
        )
    except BaseException:
        if created:  # a failed start leaves no empty run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    clock.is_main_process = trainer.accelerator.is_main_process
    if clock.progress:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # metrics go to metrics.jsonl and report_to, not the terminal
    return trainer, clock, eval_fn


def _free_name(path: Path) -> Path:
    """``path``, or ``path`` with ``-2``, ``-3``... before the suffix if it is taken."""
    candidate, i = path, 2
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{i}{path.suffix}")
        i += 1
    return candidate


def fit(trainer, clock, eval_fn) -> dict:
    """Train, save ``final/``, evaluate at the end if needed, write summary.json and the figure."""
    from pods_rl import runlog

    config, run_dir, tokenizer = trainer.args, clock.run_dir, trainer.processing_class
    stop = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, runlog.GracefulStop)), None)
    stop = stop or runlog.GracefulStop()
    saving = None
    try:
        with stop.handling_signals():  # SIGTERM / SIGINT: finish the step, save, stop; a second one aborts
            trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
        if stop.signal_name is not None:
            return _stopped(trainer, clock, stop.signal_name)
        final_dir, saving = run_dir / "final", "final/"
        trainer.save_model(str(final_dir))
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(final_dir)
            runlog.write_json_atomic(final_dir / runlog.CLOCK_FILE,
                                     {"step": trainer.state.global_step, "train_seconds": clock.train_seconds})
    except (OSError, RuntimeError) as err:
        message = runlog.disk_full_message(err, run_dir, trainer.state.global_step, saving)
        if message is None:
            raise
        raise RunFailed(message) from err
    if trainer.accelerator.is_main_process:
        runlog.remove_incomplete(run_dir, trainer.state.global_step)  # final/ covers earlier leftovers
    rows = [r for r in runlog.read_metrics(run_dir) if "eval/accuracy" in r]
    if eval_fn is not None and (not rows or rows[-1]["step"] != trainer.state.global_step):
        clock.evaluate(trainer.model, trainer.state.global_step)  # training ended before a scheduled eval
        rows = [r for r in runlog.read_metrics(run_dir) if "eval/accuracy" in r]
    summary = {"run_dir": str(run_dir)}
    if rows:
        summary["accuracy_before"] = rows[0]["eval/accuracy"]
        summary["accuracy_after"] = rows[-1]["eval/accuracy"]
    summary.update(train_seconds=round(clock.train_seconds, 1), steps=trainer.state.global_step)

    if trainer.accelerator.is_main_process:
        _finish(run_dir, summary)
    return summary


def _stopped(trainer, clock, signal_name: str) -> dict:
    """After a graceful stop: summary.json (no final/, no final evaluation) and one line on how to resume."""
    import signal

    from pods_rl import runlog

    run_dir, step = clock.run_dir, trainer.state.global_step
    checkpoint = run_dir / f"checkpoint-{step}"
    saved = runlog.read_clock(checkpoint) is not None
    summary = {"run_dir": str(run_dir), "stopped_by": signal_name, "train_seconds": round(clock.train_seconds, 1),
               "steps": step, "checkpoint": str(checkpoint) if saved else None,
               "exit_code": 128 + int(getattr(signal, signal_name))}
    if trainer.accelerator.is_main_process:
        runlog.write_json_atomic(run_dir / "summary.json", summary)
        where = f"saved {checkpoint} (step {step}, {clock.train_seconds:.0f} s of training)" if saved else (
            "no checkpoint could be saved")
        print(f"pods train: stopped by {signal_name}: {where}; resume with the same command plus "
              f"--output_dir {run_dir} --resume_from_checkpoint true")
    return summary


def _make_eval_fn(run: RunArguments, config, task, tokenizer):
    """``eval_fn(model) -> {"accuracy", ...}`` on ``run.eval_num_problems`` held-out problems."""
    from pods_rl.evaluate import evaluate_model

    max_new_tokens = run.eval_max_new_tokens or config.max_completion_length

    def eval_fn(model):
        result = evaluate_model(model, task, split=run.eval_split, k=run.eval_k,
                                temperature=run.eval_temperature, max_new_tokens=max_new_tokens,
                                limit=run.eval_num_problems, batch_size=run.eval_batch_size,
                                seed=config.seed, tokenizer=tokenizer)
        return {key: result[key] for key in EVAL_KEYS if key in result}

    return eval_fn


def _finish(run_dir: Path, summary: dict) -> None:
    """Write summary.json and a figure of accuracy vs training time; print the result."""
    from pods_rl import runlog

    runlog.write_json_atomic(run_dir / "summary.json", summary)
    try:
        from pods_rl.plots import plot_accuracy_vs_time

        plot_accuracy_vs_time([run_dir], run_dir)
    except Exception as err:  # a figure must never cost the run
        logger.warning("could not draw the accuracy figure: %s", err)
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    print(f"\nrun directory: {run_dir}")
    print(f"training time: {summary['train_seconds']:.1f} s over {summary['steps']} steps")
    if before is not None and after is not None:
        print(f"held-out accuracy: before {100 * before:.1f}%  after {100 * after:.1f}%  "
              f"({100 * (after - before):+.1f} points)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
