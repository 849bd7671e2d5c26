"""`pods train` end to end on a tiny model: the run directory, refusing to clobber a run, and resuming after a
SIGKILL with a consistent metrics log and no half-written checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pods_rl import runlog
from pods_rl.train import main as train_main
from pods_rl.train import parse_args, parse_task_args


def _pods(*args):
    return [sys.executable, "-m", "pods_rl.cli", "train", *args]


def test_recipe_parsing_and_overrides():
    # The paper recipes target a GPU (bf16); --bf16 false lets them build here.
    run, config, model = parse_args(["--config", "gsm8k/pods", "--learning_rate", "1e-5", "--bf16", "false"])
    assert (config.num_generations, config.downsample_to, config.downsample_rule) == (64, 16, "max_variance")
    assert config.learning_rate == 1e-5 and config.beta == 0.0
    assert model.use_peft and model.lora_r == 64 and model.model_name_or_path == "Qwen/Qwen2.5-3B-Instruct"
    assert run.task == "gsm8k"
    run, config, _ = parse_args(["--config", "gsm8k/grpo", "--bf16", "false"])
    assert config.num_generations == config.downsample_to == 16 and not config.is_pods
    assert config.use_vllm and config.max_train_seconds == 10800
    _, config, _ = parse_args(["--config", "math/pods", "--bf16", "false"])
    assert (config.num_generations, config.downsample_to) == (32, 16)
    _, config, _ = parse_args([])  # the embedded default
    assert config.is_pods and config.use_cpu
    assert parse_task_args("data_dir=x/y,size=3") == {"data_dir": "x/y", "size": 3}


def test_bad_recipe_and_flags_give_one_line_errors(capsys):
    assert train_main(["--config", "no/such/recipe"]) == 2
    assert "packaged recipes" in capsys.readouterr().err
    assert train_main(["--config", "cpu/smoke", "--downsample_to", "99"]) == 2
    assert "larger than num_generations" in capsys.readouterr().err
    with pytest.raises(ValueError, match="key=value"):
        parse_task_args("oops")


def test_train_end_to_end_writes_run_dir(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    code = train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir),
                       "--output_dir", str(run_dir), "--max_steps", "2"])
    assert code == 0
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "accuracy_vs_time.png"):
        assert (run_dir / name).is_file(), name
    assert runlog.read_clock(run_dir / "final")["step"] == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    rows = runlog.read_metrics(run_dir)
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all(r["time/generation"] > 0 and "time/update" in r for r in train_rows)
    # A second run into the same directory is refused, and nothing there changes.
    before = (run_dir / "metrics.jsonl").read_text()
    assert train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir),
                       "--output_dir", str(run_dir)]) == 2
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_sigkill_then_resume(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    max_steps = 40  # long enough that the kill lands mid-run on a fast machine
    args = ["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(run_dir),
            "--max_steps", str(max_steps), "--save_every_seconds", "0.5", "--eval_before_after", "false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(_pods(*args), env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            done = runlog.list_checkpoints(run_dir)
            if done and runlog.read_clock(done[-1])["step"] >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, (f"training ended (code {proc.returncode}) before it could be killed:\n"
                                     + (tmp_path / "first.log").read_text()[-3000:])
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
        log.close()
    killed_rows = [r["step"] for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert killed_rows and max(killed_rows) < max_steps
    # A checkpoint cut off while saving: a directory without pods_clock.json.
    half = run_dir / f"checkpoint-{max(killed_rows) + 1}"
    half.mkdir(exist_ok=True)
    (half / "model.safetensors").write_bytes(b"partial")

    result = subprocess.run(_pods(*args, "--resume_from_checkpoint", "true"), env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [r["step"] for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert steps == list(range(1, max_steps + 1)), steps  # no duplicated and no missing steps
    seconds = [r["train_seconds"] for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert seconds == sorted(seconds)  # the training clock carried over from the checkpoint
    leftovers = [p for p in runlog.list_checkpoints(run_dir, complete_only=False) if runlog.read_clock(p) is None]
    assert leftovers == []  # no half-written checkpoint is left where trainer or eval would pick it up
    assert (run_dir / f"{half.name}.incomplete" / "model.safetensors").exists()  # moved aside, not deleted
    assert runlog.read_clock(run_dir / "final")["step"] == max_steps
