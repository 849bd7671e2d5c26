"""Divergence (issue 34, item 1): a non-finite gradient, weight, logged quantity or reward stops the run in one
line naming the step, the quantity and the likely cause, before anything non-finite is written; the last
checkpoint (all of them are finite) is the way on, and a checkpoint an older version poisoned is refused."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from pods_rl.tasks import register_task
from pods_rl.tasks.arithmetic import ArithmeticTask


def _train_args(model_dir, run_dir, *extra):
    return ["--config", "cpu/smoke", "--model_name_or_path", str(model_dir), "--output_dir", str(run_dir),
            "--eval_before_after", "false", *map(str, extra)]


def _error_lines(text: str) -> list[str]:
    return [line[line.index("pods "):] for line in text.splitlines() if "pods train: error" in line
            or "Traceback" in line]


def _all_saved_weights_finite(run_dir: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    files = list(run_dir.rglob("*.safetensors"))
    return bool(files) and all(torch.isfinite(t).all() for f in files for t in load_file(f).values()
                               if t.is_floating_point())


@pytest.mark.slow
def test_an_absurd_learning_rate_stops_before_a_non_finite_checkpoint(tmp_path, tiny_model_dir, capsys):
    """Today's code saved checkpoint-2 with NaN weights and died at step 3 in torch's sampler."""
    from pods_rl import runlog
    from pods_rl.commands.train import main as train_main

    run_dir = tmp_path / "run"
    code = train_main(_train_args(tiny_model_dir, run_dir, "--learning_rate", "1e6", "--max_steps", 4,
                                  "--save_strategy", "steps", "--save_steps", 1))
    lines = _error_lines(capsys.readouterr().err)
    assert code == 1 and len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("pods train: error: training diverged at step "), line
    step = int(line.split("at step ")[1].split(":")[0])
    assert step >= 2 and "is not finite" in line
    assert "likely a learning rate too high (--learning_rate 1e+06: lower it" in line
    assert f"nothing of step {step} was saved" in line
    last = run_dir / f"checkpoint-{step - 1}"
    assert (f"the last finite checkpoint is {last}: resume from it with a lower learning rate (--output_dir {run_dir} "
            f"--resume_from_checkpoint {last} --learning_rate LR --accept_config_changes true)") in line
    assert [c.name for c in runlog.list_checkpoints(run_dir)][-1] == last.name
    assert not (run_dir / f"checkpoint-{step}").exists() and not (run_dir / "final").exists()
    assert _all_saved_weights_finite(run_dir)
    assert any(not math.isfinite(r.get("grad_norm", 0)) or not math.isfinite(r.get("loss", 0))
               for r in runlog.read_metrics(run_dir)) or "gradient" in line  # the evidence is kept


@dataclass
class ScaledRewardTask(ArithmeticTask):
    """Arithmetic whose one reward function returns ``value`` from step 2 on (0/1 correctness before)."""

    name: str = "scaled_reward"
    value: float = 0.0
    reward_weights: tuple = (1.0,)

    def reward_funcs(self):
        value = self.value

        def scaled_judge(prompts, completions, trainer_state=None, **kwargs):
            late = trainer_state is not None and trainer_state.global_step >= 1
            return [value if late else float(i % 2) for i in range(len(completions))]

        return [scaled_judge]


@pytest.mark.slow
@pytest.mark.parametrize("value, shown", [(1e30, "1e+30"), (float("inf"), "inf"), (-5e7, "-5e+07")])
def test_an_absurd_or_non_finite_reward_stops_naming_the_step_and_the_cause(value, shown, tmp_path, tiny_model_dir,
                                                                          capsys):
    from pods_rl import runlog
    from pods_rl.commands.train import main as train_main

    register_task("scaled_reward", lambda **kw: ScaledRewardTask(value=value, **kw))
    run_dir = tmp_path / "run"
    code = train_main(_train_args(tiny_model_dir, run_dir, "--task", "scaled_reward", "--max_steps", 3,
                                  "--save_strategy", "steps", "--save_steps", 1))
    lines = _error_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"pods train: error: reward function 'scaled_judge' returned {shown} for completion 0 at "
                           "step 2"), line
    cause = {"inf": "rewards must be finite"}.get(
        shown, "beyond the bound of 1e+06, a reward-scale bug that would make the training diverge; rescale it")
    assert cause in line
    assert line.endswith(f"{run_dir} keeps its complete checkpoints (the last: checkpoint-1); fix it, then resume with "
                         f"--output_dir {run_dir} --resume_from_checkpoint true")
    assert [c.name for c in runlog.list_checkpoints(run_dir)] == ["checkpoint-1"]
    assert _all_saved_weights_finite(run_dir)


@pytest.mark.slow
def test_a_nan_reward_is_not_scored_as_in_grpo_trainer(tmp_path, tiny_model_dir, caplog):
    """TRL reads NaN like None ("not scored"): the run trains on, with one note naming the function; the same
    script under GRPOTrainer trains on too. (Infinite and absurd rewards still stop it: the test above.)"""
    import logging

    from pods_rl import runlog
    from pods_rl.commands.train import main as train_main

    register_task("scaled_reward", lambda **kw: ScaledRewardTask(value=float("nan"), **kw))
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="pods_rl"):
        code = train_main(_train_args(tiny_model_dir, run_dir, "--task", "scaled_reward", "--max_steps", 3))
    assert code == 0
    notes = [r.getMessage() for r in caplog.records if "returned NaN for some completions" in r.getMessage()]
    assert len(notes) == 1 and "'scaled_judge'" in notes[0] and "read as not scored" in notes[0], notes
    assert runlog.read_clock(run_dir / "final")["step"] == 3
    assert _all_saved_weights_finite(run_dir)


@pytest.fixture
def forbid_loading(monkeypatch):
    import transformers

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the fault was found")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)


def _poison(weights_file: Path, value=float("nan")) -> str:
    """Write ``value`` into the first floating tensor of a safetensors file (as a diverged run saved it)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights_file)
    name = next(k for k, t in sorted(tensors.items()) if t.is_floating_point())
    tensors[name].view(-1)[0] = value
    save_file(tensors, weights_file, metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("value, kind", [(float("nan"), "NaN"), (float("-inf"), "an infinity")])
def test_a_resume_from_a_poisoned_checkpoint_is_refused_before_loading(value, kind, tmp_path, two_step_run,
                                                                        tiny_model_dir, forbid_loading, capsys):
    from pods_rl.commands.train import main as train_main

    run_dir = Path(shutil.copytree(two_step_run, tmp_path / "run"))
    shutil.rmtree(run_dir / "final")  # as a run an older version stopped after saving checkpoint-2
    name = _poison(run_dir / "checkpoint-2" / "model.safetensors", value)
    before = sorted(p.name for p in run_dir.rglob("*"))
    code = train_main(_train_args(tiny_model_dir, run_dir, "--max_steps", 4, "--resume_from_checkpoint", "true"))
    lines = _error_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"pods train: error: {run_dir}/checkpoint-2/model.safetensors holds non-finite weights ({kind} "
                        f"in {name}): the run had diverged when it was saved (a version before the divergence guard "
                        f"wrote it); resume from the last intact one: --resume_from_checkpoint {run_dir}/checkpoint-1 "
                        "with a lower --learning_rate (and --accept_config_changes true) (nothing was changed)")
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def test_the_guard_names_the_first_non_finite_gradient_weight_or_logged_quantity():
    import torch
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from pods_rl.runlog.divergence import DivergenceGuard, TrainingDiverged

    model = torch.nn.Module()
    model.a, model.b, model.frozen = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1), torch.nn.Linear(3, 3)
    model.half_precision = torch.nn.Linear(3, 3).to(torch.bfloat16)  # mixed dtypes on one device (no grad here)
    model.frozen.requires_grad_(False)
    model.frozen.weight.data.fill_(float("nan"))  # frozen: never changed by training, not the run's divergence
    args, state, control = TrainingArguments(output_dir="unused", report_to=[]), TrainerState(), TrainerControl()
    state.global_step = 6
    guard = DivergenceGuard()
    model.b(model.a(torch.ones(2, 3))).sum().backward()
    guard.on_pre_optimizer_step(args, state, control, model=model)  # finite: passes
    guard.on_optimizer_step(args, state, control, model=model)
    model.b.bias.grad[0] = float("inf")
    with pytest.raises(TrainingDiverged, match=r"^step 7: the gradient is not finite in b\.bias$"):
        guard.on_pre_optimizer_step(args, state, control, model=model)
    with torch.no_grad():
        model.a.weight[1, 2] = float("nan")
    with pytest.raises(TrainingDiverged, match=r"^step 7: a weight is not finite in a\.weight$"):
        guard.on_optimizer_step(args, state, control, model=model)
    guard.on_log(args, state, control, logs={"loss": 0.5, "rewards/judge/mean": float("nan"), "reward": 2000.0})
    with pytest.raises(TrainingDiverged, match=r"^step 6: the logged grad_norm is not finite \(nan\)$"):
        guard.on_log(args, state, control, logs={"loss": 0.5, "grad_norm": float("nan")})
    assert guard.last_logs["reward"] == 2000.0  # the cause named: the reward scale
    from pods_rl.runlog.divergence import likely_cause

    assert likely_cause(1e-5, guard.last_logs).startswith("the reward scale (the last logged rewards reached 2e+03")


def test_sampling_on_overflowing_outputs_is_a_divergence_with_its_cause():
    """torch's sampler fails on NaN probabilities when finite but huge weights overflow the logits (a resumed
    checkpoint of an older version, a broken model): the same one line, naming the model when nothing was updated."""
    from pods_rl.runlog.divergence import as_divergence, divergence_message

    err = as_divergence(RuntimeError("probability tensor contains either `inf`, `nan` or element < 0"), 4)
    assert str(err) == "step 5: the model's output distribution is not finite in generation (sampling)"
    assert as_divergence(RuntimeError("CUDA out of memory"), 4) is None
    fresh = divergence_message(err, "runs/x", None, 1e-5, {}, updates=0)
    assert "likely the model as loaded" in fresh and "fix the model (or its --dtype) and start again" in fresh
    later = divergence_message(err, "runs/x", "runs/x/checkpoint-4", 1e-5, {"reward": 5e4}, updates=3)
    assert "likely the reward scale (the last logged rewards reached 5e+04" in later
    assert later.endswith("the last finite checkpoint is runs/x/checkpoint-4: resume from it with a lower learning "
                          "rate (--output_dir runs/x --resume_from_checkpoint runs/x/checkpoint-4 --learning_rate LR "
                          "--accept_config_changes true)")


def test_fsdp2_shards_are_checked_and_every_rank_stops_together(tmp_path, tiny_model_dir):
    """FSDP2 for real on CPU (torch's ``fully_shard`` over gloo, 2 ranks): parameters and gradients are DTensors;
    each rank checks its own shard, and a NaN in rank 1's shard alone stops both ranks at the same step."""
    import json
    import os
    import subprocess
    import sys

    from tests import multiproc

    script = Path(__file__).parent / "scripts" / "fsdp2_divergence.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(multiproc.free_port()), str(script), str(tiny_model_dir), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for record in (rank0, rank1):
        assert record["dtensor"] == "DTensor"
        assert record["finite_grads"] is None and record["finite_weights"] is None
    assert rank1["nan_found"] == rank1["nan_name"]
    assert rank0["nan_found"] == "a shard on another rank"
    assert rank1["raised"] == f"step 7: a weight is not finite in {rank1['nan_name']}"
    assert rank0["raised"] == "step 7: a weight is not finite in a shard on another rank"
