"""A training run: a parsed recipe -> task, model, PODSTrainer -> a run directory (build, fit, summary).

``build`` checks everything it cheaply can, loads the data and the model, prepares (or resumes) the run directory
and builds the trainer and its clock; ``fit`` trains, saves ``final/``, evaluates and writes summary.json. `pods
train` is the two in a row; `pods cost` builds the same trainer to time it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path

from pods_rl import ranks, runlog
from pods_rl.errors import CommandFailed
from pods_rl.evaluation import evaluate_model
from pods_rl.figures import plot_accuracy_vs_time
from pods_rl.models import (
    check_model_path,
    check_remote_code,
    default_model_path,
    load_config,
    load_for_training,
)
from pods_rl.recipes import (
    RunArguments,
    check_enough_prompts,
    check_splits,
    parse_task_args,
    resolved_config,
    validate,
    wants_eval,
)
from pods_rl.runlog import check_output_dir, config_changes
from pods_rl.tasks import get_task

logger = logging.getLogger(__name__)
# What an in-training evaluation logs (as eval/<key>) from pods_rl.evaluation's record.
EVAL_KEYS = ("accuracy", "accuracy_stderr", "format_accuracy", "both_accuracy", "pass_at_k", "mean_completion_tokens",
             "eval_seconds")


def default_run_dir(run: RunArguments, config) -> Path:
    """``runs/<task>-<method>-<timestamp>``; the method names its planners (``...-n32m8-auto``) and pilot."""
    method = (f"pods-{config.downsample_rule}-n{config.num_generations}m{config.downsample_to}" if config.is_pods
              else f"grpo-n{config.num_generations}")
    if getattr(config, "is_adaptive", False):
        method += f"-pilot{config.pilot_generations}"  # adaptive rollouts: a different method, a different name
    for planner in (getattr(config, "prompt_planner", None), getattr(config, "rollout_planner", None)):
        method += f"-{planner}" if planner else ""  # so is a planner's (auto's n is not every prompt's)
    task = run.task.replace(":", "-").replace("/", "-")
    return Path("runs") / f"{task}-{method}-seed{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunFailed(CommandFailed):
    """An expected failure (disk full, aborted...) whose message already says what happened and what to do."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def train(run: RunArguments, config, model_args) -> dict:
    """Train per the parsed configuration; returns a summary dict (run_dir, accuracy before/after, seconds)."""
    return fit(*build(run, config, model_args))


def build(run: RunArguments, config, model_args, stop=None):
    """Check what can be checked cheaply, load task, model and tokenizer, prepare the run directory and build
    the trainer; nothing is written before all checks pass. Returns (trainer, clock, eval_fn).

    The run directory is locked first (``runlog.hold_run_dir``) and released by ``fit``. ``stop``: the
    ``runlog.GracefulStop`` whose handlers are installed (a new one otherwise)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("pods_rl").setLevel(logging.INFO)
    validate(run, config, model_args)
    output_dir_given = bool(config.output_dir) and config.output_dir != "trainer_output"
    if not output_dir_given:
        config.output_dir = str(default_run_dir(run, config))
    run_dir = Path(config.output_dir)
    check_output_dir(run_dir)
    resume = config.resume_from_checkpoint not in (None, False, "false", "False", "")
    if resume:  # before the directory is made: resuming a run that is not there is an error
        runlog.plan_resume(run_dir, config.resume_from_checkpoint, output_dir_given)

    # One owner per run directory, from before anything is read for real (resume plan) or loaded until the process
    # ends. Under a multi-process launcher only the first process takes it (and changes the run directory).
    main_process = os.environ.get("RANK", "0") == "0"
    created = main_process and not run_dir.exists()
    lock = None
    if main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            lock = runlog.hold_run_dir(run_dir)
        except BaseException:
            # Never more than an empty directory: two starts can both have seen it missing, and the other one,
            # which holds it, may be writing into it.
            if created:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()
            raise
    try:
        trainer, clock, eval_fn = _build_locked(run, config, model_args, stop, run_dir, resume, output_dir_given,
                                                main_process)
    except BaseException:
        if lock is not None:
            lock.release()  # removes its file too
        if created:  # a failed start leaves no run directory behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    clock.run_lock = lock  # released by fit at its end (and by the operating system if the process dies)
    return trainer, clock, eval_fn


def _build_locked(run, config, model_args, stop, run_dir: Path, resume: bool, output_dir_given: bool,
                  main_process: bool):
    """``build`` once the run directory is ours, stage by stage: what the run directory allows, the data, the
    model's checks, the resume plan (nothing written yet), the model, the run's records, the trainer."""
    explicit = _check_run_dir(run_dir, config, resume, output_dir_given)
    task, train_dataset, data, trainer_inputs = _load_data(run, config)
    _check_model(config, model_args)
    flat, changes, data_change = _plan_resume(run, config, model_args, run_dir, resume, data)
    if resume:  # a corrupt file in the checkpoint to resume is named now, not deep inside a loader
        runlog.check_resume_checkpoint(run_dir, explicit)
    if run.torch_threads:
        import torch

        torch.set_num_threads(run.torch_threads)
    model, tokenizer = load_for_training(model_args, trust_remote_code=bool(config.trust_remote_code))
    train_seconds = _record_run(run_dir, config, flat, resume, explicit, main_process, data, data_change, changes)
    return _build_trainer(run, config, model_args, task, train_dataset, model, tokenizer, stop, run_dir,
                          train_seconds, changes, trainer_inputs)


def _check_run_dir(run_dir: Path, config, resume: bool, output_dir_given: bool):
    """The run directory: ours (not another program's), and a run to resume or none. Returns the checkpoint named
    by ``--resume_from_checkpoint PATH`` (None for ``true`` or a new run)."""
    runlog.check_not_foreign(run_dir)
    explicit = runlog.plan_resume(run_dir, config.resume_from_checkpoint, output_dir_given) if resume else None
    if not resume and runlog.holds_a_run(run_dir):
        raise ValueError(f"{run_dir} already holds a run; pass --resume_from_checkpoint true to continue it, or "
                         f"choose another --output_dir (nothing was overwritten).")
    return explicit


def _load_data(run: RunArguments, config):
    """The task, its training split (rows bounded while they load), the data's fingerprint and the trainer's inputs
    of a planner's (``_planner_inputs``); a broken or missing held-out split fails here too, before the model loads."""
    task = get_task(run.task, **parse_task_args(run.task_args))
    if run.max_row_bytes is not None:
        task.max_row_bytes = run.max_row_bytes
    check_splits(run, task)
    train_dataset = task.load(run.train_split, limit=run.train_limit)
    check_enough_prompts(config, len(train_dataset), f"split {run.train_split!r} of task {run.task!r}")
    data = runlog.data_fingerprint(train_dataset, {"task": run.task, "task_args": run.task_args,
                                                   "split": run.train_split, "limit": run.train_limit})
    if wants_eval(run):
        held_out = len(task.load(run.eval_split, limit=run.eval_num_problems))
        if held_out < run.eval_num_problems:
            print(f"pods train: note: split {run.eval_split!r} of task {run.task!r} has {held_out} problems, so each "
                  f"evaluation uses {held_out}, not the {run.eval_num_problems} of --eval_num_problems")
    if config.reward_weights is None:
        config.reward_weights = list(task.reward_weights)
    return task, train_dataset, data, _planner_inputs(run, config, task, train_dataset)


def _planner_inputs(run: RunArguments, config, task, train_dataset) -> dict:
    """A "calibration" planner's ``calibration_dataset`` (rows of ``calibration_split``, default the evaluation split
    past the problems evaluation uses; the task's answer extractor), checked once before the model loads; else {}."""
    from pods_rl.budget.planners import make_planner, needs_of
    from pods_rl.budget.rollout_budget import check_calibration_inputs

    if "calibration" not in needs_of(config.rollout_planner):
        return {}

    extractor = task.answer_extractor()
    if extractor is None:
        raise ValueError(f"--rollout_planner {config.rollout_planner} compares the final answers of a prompt's "
                         f"completions, but task {run.task!r} has no answer extractor (its answers do not compare "
                         "as strings): choose another planner, or a task whose answer_extractor() returns one")
    settings = make_planner(config.rollout_planner, **(config.rollout_planner_args or {})).settings
    split = settings.calibration_split or run.eval_split
    if split not in task.splits:
        raise ValueError(f"task {run.task!r} has no split {split!r} to calibrate C-GRPO on; set calibration_split in "
                         f"--rollout_planner_args to one of {list(task.splits)}")
    skip = run.eval_num_problems if split == run.eval_split else 0  # the problems an evaluation uses stay unseen
    wanted = settings.num_calibration_samples
    held_out = task.load(split, limit=None if wanted is None else skip + wanted)
    end = len(held_out)
    if end <= skip:
        raise ValueError(f"split {split!r} of task {run.task!r} has no rows past the {skip} evaluation problems to "
                         "calibrate C-GRPO on: lower --eval_num_problems, or set calibration_split in "
                         "--rollout_planner_args")
    checked = check_calibration_inputs(settings, held_out.select(range(skip, end)), extractor, train_dataset)
    return {"calibration_dataset": checked}  # a CalibrationSet: PODSTrainer checks its rows no more


def _check_model(config, model_args) -> None:
    """The model is there, runs no code of its own unless allowed, and fits the engine asked for; before it loads."""
    import torch

    model_args.model_name_or_path = default_model_path(model_args.model_name_or_path)
    check_model_path(model_args.model_name_or_path, model_args.model_revision)
    # A model's own code runs only with --trust_remote_code true (a GRPOConfig field: TRL passes it to the reference
    # model and vLLM; pods passes it to every load of its own), and is refused in one line before anything loads.
    trust = bool(config.trust_remote_code)
    check_remote_code(model_args.model_name_or_path, trust, model_args.model_revision)
    on_cpu = config.use_cpu or not torch.cuda.is_available()
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and on_cpu and os.environ.get("RANK", "0") == "0":
        # accelerate turns FSDP on only for GPU-like devices: on CPU its MULTI_CPU mode is plain DDP, silently.
        print("pods train: note: accelerate has no FSDP on CPU: these ranks run as DDP (each holds the whole model, "
              "checkpoints in DDP's format); on GPUs the same config shards the model with FSDP2", flush=True)
    if config.use_vllm and on_cpu:
        from pods_rl.engines.vllm.cpu import check_cpu_model

        check_cpu_model(load_config(model_args.model_name_or_path, model_args.model_revision, trust))


def _plan_resume(run: RunArguments, config, model_args, run_dir: Path, resume: bool, data: dict):
    """The resolved config and what a resume changes: settings (refused unless accepted) and rows
    (refused unless allowed or explained). Returns (flat config, changes, data change or None)."""
    flat = resolved_config(run, config, model_args)
    changes = {}
    if resume and (run_dir / runlog.CONFIG_FILE).is_file():
        changes = config_changes(runlog.load_run_config(run_dir), flat)
        if changes and not run.accept_config_changes:
            listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
            raise ValueError(f"this resume changes training settings of {run_dir}: {listed}; pass "
                             "--accept_config_changes true to continue with them, or drop those flags to continue "
                             "as the run started")
    data_change = None
    if resume:
        data_change = runlog.check_data_change(run_dir, data, run.allow_data_change,
                                               explained=any(k in changes for k in runlog.DATA_FIELDS))
    return flat, changes, data_change


def _record_run(run_dir: Path, config, flat: dict, resume: bool, explicit, main_process: bool, data: dict,
                data_change, changes: dict) -> float:
    """Now that every check passed: the checkpoint to resume (``config.resume_from_checkpoint``), config.yaml and
    data.json (rank 0). Returns the training seconds already spent."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resume_checkpoint, train_seconds = None, 0.0
    if resume:
        resume_checkpoint, train_seconds = runlog.prepare_resume(run_dir, checkpoint=explicit, modify=main_process)
        if resume_checkpoint is None:
            logger.warning("no complete checkpoint in %s: starting from scratch", run_dir)
        config.resume_from_checkpoint = str(resume_checkpoint) if resume_checkpoint else None
    # config.yaml describes what runs. A changed config keeps the previous one beside it, named after the step
    # from which the new one applies.
    flat["resume_from_checkpoint"] = config.resume_from_checkpoint
    step = runlog.save_config(run_dir, flat, resume, resume_checkpoint) if main_process else None
    if main_process:  # what the run trains on (data.json), and from which step a resume changed it
        data_step = runlog.read_clock(resume_checkpoint)["step"] if resume_checkpoint else 0
        runlog.record_data(run_dir, data, data_step, data_change)
        if data_change is not None:
            logger.warning("training data changed from step %d on (%s rows -> %s rows; allowed by %s): recorded in "
                           "%s", data_step, data_change["rows_from"], data_change["rows_to"],
                           data_change["allowed_by"], runlog.DATA_FILE)
    if step is not None and changes:
        logger.warning("training settings changed from step %d on: %s (previous config kept as "
                       "config.until-step-%d.yaml)", step, ", ".join(changes), step)
    return train_seconds


def _build_trainer(run: RunArguments, config, model_args, task, train_dataset, model, tokenizer, stop,
                   run_dir: Path, train_seconds: float, changes: dict, trainer_inputs: dict | None = None):
    """The clock (evaluations, time-based saves and stop), the stop on signals, the divergence guard and the
    trainer (``trainer_inputs``: its keywords of a planner's inputs). Returns (trainer, clock, eval_fn)."""
    from transformers.trainer_callback import PrinterCallback

    from pods_rl.engines.trl.config import peft_config
    from pods_rl.engines.trl.trainer import PODSTrainer

    # Lazy, as TRL: pods_rl.engines.trl.trainer imports it (seconds). Looked up at each call, where tests replace
    # PODSTrainer.
    from pods_rl.runlog.divergence import DivergenceGuard  # imports transformers, as the line above

    eval_fn = _make_eval_fn(run, config, task, tokenizer) if wants_eval(run) else None
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
    stop = stop or runlog.GracefulStop()
    stop.grace_seconds = run.stop_grace_seconds
    callbacks = [clock, stop]
    if changes:  # the optimizer state in the checkpoint carries the old hyper-parameters: apply the new ones
        callbacks.append(runlog.ApplyOptimizerSettings())
    callbacks.append(DivergenceGuard())  # last: its on_log sees the row the clock wrote; its checks precede saves
    trainer = PODSTrainer(model=model, reward_funcs=task.reward_funcs(), args=config, train_dataset=train_dataset,
                          processing_class=tokenizer, peft_config=peft_config(model_args), callbacks=callbacks,
                          **(trainer_inputs or {}))
    clock.is_main_process = trainer.accelerator.is_main_process
    clock.run_figure = run.run_figure  # read by fit
    if clock.progress:
        trainer.remove_callback(PrinterCallback)  # metrics go to metrics.jsonl and report_to, not the terminal
    return trainer, clock, eval_fn


def fit(trainer, clock, eval_fn) -> dict:
    """Train, save ``final/``, evaluate at the end if needed, write summary.json and the figure; then release the
    run directory's lock (``build`` took it)."""
    try:
        return _fit(trainer, clock, eval_fn)
    finally:
        lock = getattr(clock, "run_lock", None)
        if lock is not None:
            lock.release()


# Long because train, save and the turning of each failure into its one line share the run's state.
def _fit(trainer, clock, eval_fn) -> dict:
    from pods_rl.reward_guard import RewardFunctionError
    from pods_rl.runlog.divergence import as_divergence, check_finite_weights, divergence_line

    config, run_dir, tokenizer = trainer.args, clock.run_dir, trainer.processing_class
    stop = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, runlog.GracefulStop)), None)
    stop = stop or runlog.GracefulStop()
    stop.run_dir = run_dir
    resuming_from = config.resume_from_checkpoint
    saving = None
    # Each rank's record (pid, host), for the ranks left to name one that dies (pods_rl.ranks).
    ranks.register(run_dir, trainer.accelerator.process_index, trainer.accelerator.num_processes)
    ranks.bound_collectives(config.ddp_timeout)
    try:
        with stop.handling_signals():  # SIGTERM / SIGINT: finish the step, save, stop; a second one aborts
            try:
                trainer.train(resume_from_checkpoint=resuming_from)
            except runlog.StopNow:
                return _abandoned(trainer, clock, stop)
            if stop.signal_name is not None:
                stop.finish()
                return _stopped(trainer, clock, stop.signal_name)
        if trainer.state.global_step == 0:
            raise RunFailed(f"training took no step (max_steps {config.max_steps}, num_train_epochs "
                            f"{config.num_train_epochs:g}): nothing was trained, so no final/ was written in "
                            f"{run_dir}; "
                            "raise --max_steps or --num_train_epochs", exit_code=2)
        final_dir, saving = run_dir / "final", "final/"
        check_finite_weights(trainer.model, trainer.state.global_step)  # never a non-finite final/
        trainer.save_model(str(final_dir))
        if trainer.accelerator.is_main_process:
            tokenizer.save_pretrained(final_dir)
            runlog.write_clock(final_dir, trainer.state.global_step, clock.train_seconds)
    except (RunFailed, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - turned into the one line that says what to do, or re-raised
        message = runlog.disk_full_message(err, run_dir, trainer.state.global_step, saving)
        if message is not None:
            raise RunFailed(message) from err
        complete = runlog.list_checkpoints(run_dir)
        if trainer.accelerator.num_processes > 1 and ranks.peer_lost_error(err):
            # Another rank died or hung: the launcher is about to SIGTERM this one; say which and how first.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            raise RunFailed(ranks.lost_rank_line(run_dir, trainer.accelerator.process_index, err,
                                                 str(complete[-1]) if complete else None,
                                                 getattr(config, "ddp_timeout", None))) from err
        resume = f"resume with --output_dir {run_dir} --resume_from_checkpoint true"
        diverged = as_divergence(err, trainer.state.global_step)
        if diverged is not None:
            raise RunFailed(divergence_line(trainer, diverged, run_dir, complete[-1] if complete else None)) from err
        if isinstance(err, RewardFunctionError):
            kept = (f"{run_dir} keeps its complete checkpoints (the last: {complete[-1].name}); fix it, then {resume}"
                    if complete else "no checkpoint was saved yet: fix it and run again")
            raise RewardFunctionError(f"{err}; {kept}") from err
        if isinstance(err, runlog.CheckpointUnreadable):  # raised by the trainer's loaders while resuming
            unread = err.checkpoint or Path(resuming_from)
            earlier = runlog.intact_before(run_dir, unread)
            way_on = (f"resume from the last intact one: --resume_from_checkpoint {earlier}" if earlier else
                      "no earlier checkpoint is intact: restore it, or start a new run in another --output_dir")
            named = runlog.load_problems(unread)  # which file, when reading its tensors shows it
            if named:
                raise ValueError(f"{unread}/{named[0][0]} {named[0][1]}; {way_on}") from err
            raise ValueError(f"{err}; {way_on}") from err
        raise
    if trainer.accelerator.is_main_process:
        runlog.remove_incomplete(run_dir, trainer.state.global_step)  # final/ covers earlier leftovers
    if eval_fn is not None and clock.last_eval_step != trainer.state.global_step:
        # Training ended before a scheduled evaluation. Decided on what every rank knows (not on metrics.jsonl,
        # which rank 0 may not have written yet): an evaluation runs on every rank or on none.
        clock.evaluate(trainer.model, trainer.state.global_step)
    rows = [r for r in runlog.read_metrics(run_dir) if "eval/accuracy" in r]
    summary = {"run_dir": str(run_dir)}
    if rows:
        summary["accuracy_before"] = rows[0]["eval/accuracy"]
        summary["accuracy_after"] = rows[-1]["eval/accuracy"]
    summary.update(train_seconds=round(clock.train_seconds, 1), steps=trainer.state.global_step)

    if trainer.accelerator.is_main_process:
        _finish(run_dir, summary, figure=getattr(clock, "run_figure", True), auto=_auto_choices(trainer, run_dir))
    return summary


def _auto_choices(trainer, run_dir: Path) -> dict | None:
    """What ``rollout_planner="auto"`` chose in this run and would choose at the H200's costs (``auto_summary``);
    None for a run without auto's rows. Never costs the run: a failure is a warning."""
    from pods_rl.auto_summary import H200_COSTS_MS, auto_choices, auto_line, would_choose

    try:
        config, budget = trainer.args, getattr(trainer, "_budget", None)
        m, n = config.downsample_to, config.num_generations
        rows = runlog.read_metrics(run_dir)
        choices = auto_choices(rows, m=m)
        if choices is None:
            return None
        batch = next((int(r["pods/plan_prompts"]) for r in reversed(rows) if r.get("pods/plan_prompts")), 0)
        at_h200 = None if budget is None else would_choose(budget.ledger, m=m, n=n, prompts_per_step=batch,
                                                           costs_ms=H200_COSTS_MS)
        return {**choices, "at_h200_n_mean": at_h200, "line": auto_line(choices, m=m, n=n, at_h200=at_h200)}
    except Exception as err:  # noqa: BLE001 - a summary line must never cost the run
        logger.warning("could not summarize auto's choices: %s", err)
        return None


def _abandoned(trainer, clock, stop) -> dict:
    """A stop whose step outlived its grace (``runlog.StopNow``): save the last complete step when one
    process holds all the state, then summary.json and one line saying what happened."""
    run_dir, step, abandoned = clock.run_dir, trainer.state.global_step, stop.abandoned
    checkpoint = run_dir / f"checkpoint-{step}"
    single = trainer.accelerator.num_processes == 1 and not getattr(trainer, "is_deepspeed_enabled", False)
    note = (f"pods train: {stop.signal_name}: the step in progress (step {step + 1}) did not end within "
            f"{abandoned.waited:.0f} s (it was in {abandoned.where}): abandoned")
    if runlog.read_clock(checkpoint) is None and step > 0 and single:
        print(f"{note}; saving {checkpoint.name} from the last complete step", flush=True)
        from pods_rl.runlog.divergence import check_finite_weights

        check_finite_weights(trainer.model, step)  # checked at its step already; a save must never be the first
        with stop.saving():
            trainer._save_checkpoint(trainer.model, trial=None)
            trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
    elif runlog.read_clock(checkpoint) is None:
        why = "no step was complete" if step == 0 else "several processes hold the state"
        print(f"{note}; no checkpoint saved ({why})", flush=True)
    else:
        print(f"{note}; {checkpoint.name} already holds the last complete step", flush=True)
    stop.finish()
    summary = _stopped(trainer, clock, stop.signal_name)
    summary["abandoned_step_in"] = abandoned.where
    if trainer.accelerator.is_main_process:
        runlog.write_summary(run_dir, summary)
    return summary


def _stopped(trainer, clock, signal_name: str) -> dict:
    """After a graceful stop: summary.json (no final/, no final evaluation) and one line on how to resume."""
    run_dir, step = clock.run_dir, trainer.state.global_step
    checkpoint = run_dir / f"checkpoint-{step}"
    saved = runlog.read_clock(checkpoint) is not None
    summary = {"run_dir": str(run_dir), "stopped_by": signal_name, "train_seconds": round(clock.train_seconds, 1),
               "steps": step, "checkpoint": str(checkpoint) if saved else None,
               "exit_code": 128 + int(getattr(signal, signal_name))}
    if trainer.accelerator.is_main_process:
        runlog.write_summary(run_dir, summary)
        where = f"saved {checkpoint} (step {step}, {clock.train_seconds:.0f} s of training)" if saved else (
            "no checkpoint could be saved")
        print(f"pods train: stopped by {signal_name}: {where}; resume with the same command plus "
              f"--output_dir {run_dir} --resume_from_checkpoint true")
    return summary


def _make_eval_fn(run: RunArguments, config, task, tokenizer):
    """``eval_fn(model) -> {"accuracy", ...}`` on ``run.eval_num_problems`` held-out problems."""
    max_new_tokens = run.eval_max_new_tokens or config.max_completion_length

    def eval_fn(model):
        result = evaluate_model(model, task, split=run.eval_split, k=run.eval_k,
                                temperature=run.eval_temperature, max_new_tokens=max_new_tokens,
                                limit=run.eval_num_problems, batch_size=run.eval_batch_size,
                                seed=config.seed, tokenizer=tokenizer)
        return {key: result[key] for key in EVAL_KEYS if key in result}

    return eval_fn


def _finish(run_dir: Path, summary: dict, figure: bool = True, auto: dict | None = None) -> None:
    """Write summary.json and (if ``figure``) the accuracy-vs-time figure; print the result, and last the line of
    what auto chose (``auto``, for a run with ``rollout_planner="auto"``)."""
    if auto is not None:
        summary["auto"] = auto
    runlog.write_summary(run_dir, summary)
    try:
        if figure:
            plot_accuracy_vs_time([run_dir], run_dir, title=f"{run_dir.name}: held-out accuracy while training")
    except Exception as err:  # a figure must never cost the run
        logger.warning("could not draw the accuracy figure: %s", err)
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    print(f"\nrun directory: {run_dir}")
    print(f"training time: {summary['train_seconds']:.1f} s over {summary['steps']} steps")
    if before is not None and after is not None:
        print(f"held-out accuracy: before {100 * before:.1f}%  after {100 * after:.1f}%  "
              f"({100 * (after - before):+.1f} points)")
    if auto is not None:
        print(auto["line"])
