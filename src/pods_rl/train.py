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
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    torch_threads: int | None = field(default=None, metadata={"help": "CPU threads for torch (default: torch's "
                                      "choice). For tiny models 1 is as fast and immune to oversubscription when "
                                      "other processes share the cores."})


def parse_task_args(text: str | None) -> dict:
    """``"a=1,b=x"`` -> ``{"a": 1, "b": "x"}`` (values parsed as JSON when they parse, else kept as strings)."""
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"task_args item {item!r} is not key=value (e.g. task_args='data_dir=data/gsm8k').")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out


def resolve_recipe(name_or_path: str) -> Path:
    """A recipe path, or the name of a packaged recipe (``tiny``, ``gsm8k/pods``...)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = RECIPES_DIR / (name_or_path if name_or_path.endswith(".yaml") else name_or_path + ".yaml")
    if packaged.is_file():
        return packaged
    names = sorted(str(p.relative_to(RECIPES_DIR).with_suffix("")) for p in RECIPES_DIR.rglob("*.yaml"))
    raise ValueError(f"Recipe {name_or_path!r} is neither a file nor a packaged recipe; packaged recipes: {names}.")


def parse_args(argv: list[str] | None = None):
    """Parse a recipe plus flag overrides into (RunArguments, PODSConfig, trl.ModelConfig)."""
    from trl import ModelConfig, TrlParser

    from pods_rl.trainer import PODSConfig

    argv = list(argv or [])
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ValueError("--config needs a recipe path or name, e.g. --config tiny")
        argv[i + 1] = str(resolve_recipe(argv[i + 1]))
    else:
        argv = ["--config", str(resolve_recipe(DEFAULT_RECIPE)), *argv]
    parser = TrlParser((RunArguments, PODSConfig, ModelConfig))
    return parser.parse_args_and_config(args=argv)


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


def main(argv: list[str] | None = None) -> int:
    """Run ``pods train``; returns the exit code."""
    try:
        run, config, model_args = parse_args(argv)
        trainer, clock, eval_fn = build(run, config, model_args)
    except (ValueError, FileNotFoundError) as err:  # bad recipe, flags, task or paths: one clear line
        print(f"pods train: error: {err}", file=sys.stderr)
        return 2
    fit(trainer, clock, eval_fn)
    return 0


def train(run: RunArguments, config, model_args) -> dict:
    """Train per the parsed configuration; returns a summary dict (run_dir, accuracy before/after, seconds)."""
    return fit(*build(run, config, model_args))


def build(run: RunArguments, config, model_args):
    """Check the run directory, load task, model and tokenizer, and build the trainer and its clock."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import get_peft_config

    from pods_rl import runlog
    from pods_rl.tasks import get_task
    from pods_rl.trainer import PODSTrainer

    if run.torch_threads:
        torch.set_num_threads(run.torch_threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("pods_rl").setLevel(logging.INFO)
    if not config.output_dir or config.output_dir == "trainer_output":
        config.output_dir = str(default_run_dir(run, config))
    run_dir = Path(config.output_dir)

    resume_checkpoint, train_seconds = None, 0.0
    if config.resume_from_checkpoint not in (None, False, "false", "False", ""):
        if not run_dir.is_dir():
            raise ValueError(f"resume_from_checkpoint is set but the run directory {run_dir} does not exist.")
        resume_checkpoint, train_seconds = runlog.prepare_resume(run_dir)
        if resume_checkpoint is None:
            logger.warning("no complete checkpoint in %s: starting from scratch", run_dir)
        config.resume_from_checkpoint = str(resume_checkpoint) if resume_checkpoint else None
    elif runlog.list_checkpoints(run_dir, complete_only=False) or (run_dir / runlog.METRICS_FILE).exists():
        raise ValueError(f"{run_dir} already holds a run; pass --resume_from_checkpoint true to continue it, or "
                         f"choose another --output_dir (nothing was overwritten).")
    run_dir.mkdir(parents=True, exist_ok=True)

    task = get_task(run.task, **parse_task_args(run.task_args))
    train_dataset = task.load(run.train_split, limit=run.train_limit)
    if config.reward_weights is None:
        config.reward_weights = list(task.reward_weights)

    model_path = model_args.model_name_or_path
    if not model_path:
        from pods_rl.tiny import model_path as tiny_model_path

        model_path = str(tiny_model_path())
        model_args.model_name_or_path = model_path
    dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, revision=model_args.model_revision, dtype=dtype)

    config_file = run_dir / "config.yaml"
    resolved = {"run": _to_yaml_dict(run), "model": _to_yaml_dict(model_args), "training": _to_yaml_dict(config)}
    flat = {**resolved["training"], **resolved["model"], **resolved["run"]}
    if not config_file.exists():  # a resumed run keeps the config it started with
        config_file.write_text(yaml.safe_dump(flat, sort_keys=True))

    eval_fn = None
    if run.eval_every_seconds or run.eval_every_steps or run.eval_before_after:
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
    trainer = PODSTrainer(
        model=model,
        reward_funcs=task.reward_funcs(),
        args=config,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[clock],
    )
    clock.is_main_process = trainer.accelerator.is_main_process
    if clock.progress:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # metrics go to metrics.jsonl and report_to, not the terminal
    return trainer, clock, eval_fn


def fit(trainer, clock, eval_fn) -> dict:
    """Train, save ``final/``, evaluate at the end if needed, write summary.json and the figure."""
    from pods_rl import runlog

    config, run_dir, tokenizer = trainer.args, clock.run_dir, trainer.processing_class
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)

    final_dir = run_dir / "final"
    trainer.save_model(str(final_dir))
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(final_dir)
        runlog.write_json_atomic(final_dir / runlog.CLOCK_FILE,
                                 {"step": trainer.state.global_step, "train_seconds": clock.train_seconds})
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
