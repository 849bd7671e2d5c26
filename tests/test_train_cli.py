"""`pods train` end to end on a tiny model: the run directory, refusing to clobber a run, one-line errors checked
before the model loads, resuming exactly what was asked (explicit checkpoint, changed settings, finished run),
a graceful stop on SIGTERM, and resuming after a SIGKILL with a consistent metrics log and no half-written
checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from pods_rl import runlog
from pods_rl.commands.train import main as train_main
from pods_rl.recipes import parse_args, parse_task_args


def _pods(*args):
    return [sys.executable, "-m", "pods_rl.commands.cli", "train", *args]


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
    _, config, _ = parse_args(["--config", "gsm8k/auto", "--bf16", "false"])
    assert (config.num_generations, config.downsample_to, config.rollout_planner) == (64, 16, "auto")
    _, config, _ = parse_args([])  # the embedded default
    assert config.is_pods and config.use_cpu
    assert parse_task_args("data_dir=x/y,size=3") == {"data_dir": "x/y", "size": 3}


def test_the_embedded_default_is_auto_and_a_flag_turns_it_off(tmp_path):
    """`pods train`'s default planner is auto (each prompt m = 8 .. n = 32 rollouts); `--rollout_planner none` gives
    the fixed n, and GRPO with n = m; PODSConfig's own default stays no planner (it keeps what its user sets)."""
    from pods_rl.engines.trl.config import PODSConfig

    _, config, _ = parse_args([])
    assert (config.rollout_planner, config.num_generations, config.downsample_to) == ("auto", 32, 8)
    assert config.has_planner
    assert PODSConfig(output_dir=str(tmp_path), use_cpu=True).rollout_planner is None
    for spelling in ("none", "None", "null"):
        _, fixed, _ = parse_args(["--rollout_planner", spelling])
        assert fixed.rollout_planner is None and not fixed.has_planner, spelling
        assert (fixed.num_generations, fixed.downsample_to) == (32, 8) and fixed.is_pods
    _, grpo, _ = parse_args(["--rollout_planner", "none", "--num_generations", "8"])
    assert not grpo.is_pods and not grpo.selects
    # n = m under the default's auto leaves it nothing to choose: one line naming both ways out
    with pytest.raises(ValueError, match=r"raise num_generations above downsample_to, or turn the planner off "
                                         r"\(rollout_planner unset; `pods train`: --rollout_planner none\)"):
        parse_args(["--num_generations", "8"])


def test_bad_recipe_and_flags_give_one_line_errors(capsys):
    assert train_main(["--config", "no/such/recipe"]) == 2
    assert "packaged recipes" in capsys.readouterr().err
    assert train_main(["--config", "cpu/smoke", "--downsample_to", "99"]) == 2
    assert "larger than num_generations" in capsys.readouterr().err
    with pytest.raises(ValueError, match="key=value"):
        parse_task_args("oops")


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if "pods train: " in line or "Traceback" in line]
    assert len(err) == 1, err
    return err[0][err[0].index("pods train: "):]  # a progress bar may precede it on the same line


def test_failed_start_leaves_no_run_dir_and_debug_shows_the_traceback(tmp_path, tiny_model_dir, capsys, monkeypatch):
    def broken_trainer(*args, **kwargs):
        raise RuntimeError("trainer exploded")

    monkeypatch.setattr("pods_rl.engines.trl.trainer.PODSTrainer", broken_trainer)
    argv = ["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(tmp_path / "r")]
    assert train_main(argv) == 1
    assert "RuntimeError: trainer exploded (--debug shows the full traceback)" in _one_error_line(capsys)
    assert not (tmp_path / "r").exists()
    with pytest.raises(RuntimeError, match="exploded"):
        train_main([*argv, "--debug"])


def test_a_held_out_split_smaller_than_asked_is_named_before_loading(tmp_path, tiny_model_dir, capsys, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for split, size in (("train", 6), ("test", 3)):
        rows = [json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) for i in range(size)]
        (data / f"{split}.jsonl").write_text("\n".join(rows) + "\n")

    def broken_trainer(*args, **kwargs):
        raise RuntimeError("trainer exploded")

    monkeypatch.setattr("pods_rl.engines.trl.trainer.PODSTrainer", broken_trainer)
    argv = ["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(tmp_path / "r"),
            "--task", f"jsonl:{data}", "--eval_num_problems", "10"]
    assert train_main(argv) == 1
    out = capsys.readouterr().out
    assert "split 'test' of task 'jsonl:" in out
    assert "has 3 problems, so each evaluation uses 3, not the 10 of --eval_num_problems" in out


def test_disk_full_while_saving_is_one_line(tmp_path, tiny_model_dir, capsys, monkeypatch):
    from pods_rl.engines.trl.trainer import PODSTrainer

    def full(self, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(PODSTrainer, "_save_checkpoint", full)
    run_dir = tmp_path / "r"
    assert train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir",
                       str(run_dir), "--max_steps", "1", "--save_steps", "1", "--save_strategy", "steps",
                       "--eval_before_after", "false"]) == 1
    line = _one_error_line(capsys)
    assert f"disk full while saving checkpoint-1 in {run_dir} (step 1): nothing complete was lost" in line
    assert f"resume with --output_dir {run_dir} --resume_from_checkpoint true" in line
    assert runlog.disk_full_message(OSError(28, "No space left on device"), run_dir, 5) is not None
    assert runlog.disk_full_message(RuntimeError("CUDA out of memory"), run_dir, 5) is None


def test_train_end_to_end_writes_run_dir(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    code = train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir),
                       "--output_dir", str(run_dir), "--max_steps", "2", "--save_strategy", "steps",
                       "--save_steps", "1"])
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


def test_resume_does_what_was_asked(tmp_path, tiny_model_dir, capsys):
    run_dir = tmp_path / "run"
    args = ["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(run_dir),
            "--save_strategy", "steps", "--save_steps", "1", "--eval_before_after", "false"]
    assert train_main([*args, "--max_steps", "3"]) == 0
    capsys.readouterr()
    # A finished run: says so, changes nothing.
    files = sorted(p.name for p in run_dir.iterdir())
    assert train_main([*args, "--max_steps", "3", "--resume_from_checkpoint", "true"]) == 0
    assert "already finished (final/ at step 3" in capsys.readouterr().out
    assert sorted(p.name for p in run_dir.iterdir()) == files
    # An explicit earlier checkpoint with a changed learning rate: refused in one line, naming the field...
    resume = [*args, "--max_steps", "4", "--resume_from_checkpoint", str(run_dir / "checkpoint-1"),
              "--learning_rate", "0.05"]
    assert train_main(resume) == 2
    line = _one_error_line(capsys)
    assert "learning_rate 0.001 -> 0.05; pass --accept_config_changes true" in line
    assert sorted(p.name for p in run_dir.iterdir()) == files
    # ... and accepted with the flag: resumes from checkpoint-1 (not 3), with the new rate, recorded.
    assert train_main([*resume, "--accept_config_changes", "true"]) == 0
    names = {p.name for p in run_dir.iterdir()}
    # Set aside, not in the run directory itself: TRL's save_total_limit rotation never reaches them there.
    assert {p.name for p in (run_dir / runlog.SET_ASIDE_DIR).iterdir()} == {
        "checkpoint-2.rolled_back", "checkpoint-3.rolled_back", "final.rolled_back"}
    assert {"checkpoint-2", "checkpoint-3", "checkpoint-4", "final", "config.until-step-1.yaml"} <= names
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["learning_rate"] == 0.05
    assert yaml.safe_load((run_dir / "config.until-step-1.yaml").read_text())["learning_rate"] == 0.001
    rows = [r for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["learning_rate"] == pytest.approx(1e-3)
    assert rows[1]["learning_rate"] == pytest.approx(0.05 * (1 - 1 / 4))  # the new rate, linear decay over 4
    rolled_back = [json.loads(line) for line in (run_dir / "metrics.rolled_back.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rolled_back if "loss" in r] == [2, 3]
    assert runlog.read_clock(run_dir / "final")["step"] == 4


def test_prepare_resume_with_leftovers(tmp_path):
    # An earlier checkpoint-2.incomplete must not make the next move fail ("Directory not empty").
    run_dir = tmp_path
    for name, complete in (("checkpoint-1", True), ("checkpoint-2", False), ("checkpoint-2.incomplete", False)):
        (run_dir / name).mkdir()
        (run_dir / name / "model.safetensors").write_text("x")
        if complete:
            runlog.write_json_atomic(run_dir / name / runlog.CLOCK_FILE, {"step": 1, "train_seconds": 2.5})
    last, seconds = runlog.prepare_resume(run_dir)
    assert (last.name, seconds) == ("checkpoint-1", 2.5)
    assert {p.name for p in run_dir.iterdir()} == {"checkpoint-1", "checkpoint-2.incomplete",
                                                   "checkpoint-2.incomplete-2"}
    (run_dir / "checkpoint-5.incomplete").mkdir()
    removed = runlog.remove_incomplete(run_dir, 3)
    assert sorted(p.name for p in removed) == ["checkpoint-2.incomplete", "checkpoint-2.incomplete-2"]
    assert {p.name for p in run_dir.iterdir()} == {"checkpoint-1", "checkpoint-5.incomplete"}


def test_signal_handling_first_notes_second_aborts():
    stop = runlog.GracefulStop()
    with stop.handling_signals():
        # Before training (model loading): nothing to finish, so abort at once.
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        stop.on_train_begin(None, None, None)
        os.kill(os.getpid(), signal.SIGTERM)  # noted, training goes on
        assert stop.signal_name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)  # at once again: the same request delivered twice, not an abort

        class Control:
            should_save = should_training_stop = False

        control = stop.on_step_end(None, None, Control())
        assert control.should_save and control.should_training_stop
        with pytest.raises(KeyboardInterrupt):  # the second one does not wait
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_rank_leaving_with_an_error_ignores_the_launchers_sigterm(monkeypatch, world_size):
    """Several ranks: a collective fails when a peer dies, and the launcher's SIGTERM follows at once; between the
    block's exit and the rank's line it must not kill the rank (it did: no line, exit -15). One process: restored."""
    monkeypatch.setenv("WORLD_SIZE", world_size)
    stop = runlog.GracefulStop()
    try:
        with pytest.raises(RuntimeError), stop.handling_signals():
            raise RuntimeError("[gloo] Connection closed by peer")
        expected = signal.SIG_IGN if world_size == "2" else signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is expected
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C still interrupts
        with stop.handling_signals():
            pass
        assert signal.getsignal(signal.SIGTERM) is expected  # a clean exit restores what was there
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_signal_while_starting_aborts_and_leaves_no_run_dir(tmp_path, tiny_model_dir, capsys, monkeypatch):
    def signalled_trainer(*args, **kwargs):  # the run directory exists by now
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not abort")

    monkeypatch.setattr("pods_rl.engines.trl.trainer.PODSTrainer", signalled_trainer)
    run_dir = tmp_path / "r"
    argv = ["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(run_dir)]
    assert train_main(argv) == 130
    assert f"aborted; {run_dir} keeps its complete checkpoints" in _one_error_line(capsys)
    assert not run_dir.exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_stops_gracefully_and_resumes(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    args = ["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(run_dir),
            "--max_steps", "200", "--eval_before_after", "false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_pods(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The signal must land while training runs: before the handlers are installed (imports), SIGTERM's
        # default action ends the process at once. A loaded machine can take minutes to get there.
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and not [
                r for r in runlog.read_metrics(run_dir) if "loss" in r]:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert [r for r in runlog.read_metrics(run_dir) if "loss" in r], "no training step within 600 s"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    step = summary["steps"]
    assert summary["stopped_by"] == "SIGTERM" and 1 <= step < 200
    assert runlog.read_clock(run_dir / f"checkpoint-{step}") == {"step": step, "train_seconds": pytest.approx(
        summary["train_seconds"], abs=0.1)}
    assert not (run_dir / "final").exists()
    assert (f"stopped by SIGTERM: saved {run_dir / f'checkpoint-{step}'}" in out
            and f"--output_dir {run_dir} --resume_from_checkpoint true" in out)
    # The resume goes on from that checkpoint (here for one more step).
    assert train_main([*args, "--max_steps", str(step + 1), "--resume_from_checkpoint", "true"]) == 0
    assert runlog.read_clock(run_dir / "final")["step"] == step + 1
    assert [r["step"] for r in runlog.read_metrics(run_dir) if "loss" in r] == list(range(1, step + 2))


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
    # The killed job's lock file is still there, naming it, but the lock died with it: the resume below runs.
    assert runlog.lock.read_holder(run_dir / runlog.LOCK_FILE)["pid"] == proc.pid
    # A checkpoint cut off while saving: a directory without pods_clock.json.
    half = run_dir / f"checkpoint-{max(killed_rows) + 1}"
    half.mkdir(exist_ok=True)
    (half / "model.safetensors").write_bytes(b"partial")
    (run_dir / f"{half.name}.incomplete").mkdir()  # a leftover from an earlier crash: must not break the move

    result = subprocess.run(_pods(*args, "--resume_from_checkpoint", "true"), env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [r["step"] for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert steps == list(range(1, max_steps + 1)), steps  # no duplicated and no missing steps
    seconds = [r["train_seconds"] for r in runlog.read_metrics(run_dir) if "loss" in r]
    assert seconds == sorted(seconds)  # the training clock carried over from the checkpoint
    leftovers = [p for p in runlog.list_checkpoints(run_dir, complete_only=False) if runlog.read_clock(p) is None]
    assert leftovers == []  # no half-written checkpoint is left where trainer or eval would pick it up
    # Moved aside, then removed once a later checkpoint was complete, and the log says so.
    assert not (run_dir / f"{half.name}.incomplete").exists()
    assert f"removed the incomplete leftover {half.name}.incomplete" in result.stderr
    assert runlog.read_clock(run_dir / "final")["step"] == max_steps


def test_pods_train_takes_its_peft_config_from_the_trl_engine():
    """`pods train` builds the LoRA config through pods_rl.engines.trl (only the engines import TRL)."""
    from trl import ModelConfig

    from pods_rl.engines.trl.config import peft_config

    assert peft_config(ModelConfig(use_peft=False)) is None
    lora = peft_config(ModelConfig(use_peft=True, lora_r=8, lora_alpha=16))
    assert (lora.r, lora.lora_alpha) == (8, 16)
