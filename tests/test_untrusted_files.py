"""Untrusted files (issue 34, item 2): a model's own Python code runs only with `--trust_remote_code true` (passed
to every load, never a terminal prompt, a refusal naming the flag), and a checkpoint file that is not weights-only
is never loaded: the error names the file and the last intact checkpoint, never the advice to load it unsafely."""

from __future__ import annotations

import builtins
import json
import pickle
import shutil
import sys
from pathlib import Path

import pytest

EVIL_CODE = """\
import pathlib
pathlib.Path({marker!r}).write_text("ran")  # what a hostile model folder would do: anything, on import
from transformers import Qwen2Config, Qwen2ForCausalLM


class EvilConfig(Qwen2Config):
    model_type = "evil_qwen2"


class EvilForCausalLM(Qwen2ForCausalLM):
    config_class = EvilConfig
"""


@pytest.fixture
def evil_model(tmp_path, tiny_model_dir, monkeypatch):
    """(a model folder whose config.json maps to its own evil.py, the marker file evil.py writes on import).
    transformers copies such code into HF_MODULES_CACHE before importing it: a folder of this test's own."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # transformers appends that cache to sys.path
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "evil-model"))
    marker = tmp_path / "EXECUTED"
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil_qwen2", auto_map={"AutoConfig": "evil.EvilConfig",
                                                     "AutoModelForCausalLM": "evil.EvilForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


@pytest.fixture
def no_prompt(monkeypatch):
    """transformers asks "Do you wish to run the custom code? [y/N]" when trust_remote_code is None: record it."""
    asked = []

    def prompt(*args, **kwargs):
        asked.append(args)
        raise AssertionError("prompted on the terminal")

    monkeypatch.setattr(builtins, "input", prompt)
    return asked


REFUSAL = ("ships its own Python code (evil.py, named by auto_map in its config.json), which pods-rl runs only "
           "with --trust_remote_code true: pass it if you trust where the model comes from")


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_model_with_its_own_code_is_refused_in_one_line_naming_the_flag(command, evil_model, no_prompt, tmp_path,
                                                                         capsys):
    from pods_rl.commands.cli import main as pods

    folder, marker = evil_model
    argv = (["train", "--config", "cpu/smoke", "--model_name_or_path", str(folder), "--output_dir",
             str(tmp_path / "run")] if command == "train" else
            ["eval", str(folder), "--task", "arithmetic", "--limit", "2", "--k", "1", "--backend", "hf"])
    assert pods(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"pods {command}: error: model {folder} {REFUSAL}"), lines
    assert not marker.exists() and not no_prompt
    assert not (tmp_path / "run").exists()


def test_every_loader_passes_false_explicitly_so_nothing_runs_and_nothing_asks(evil_model, no_prompt, monkeypatch):
    """Past the early check (switched off here), the loaders themselves refuse: trust_remote_code=False, not None."""
    from trl import ModelConfig

    from pods_rl import models

    folder, marker = evil_model
    monkeypatch.setattr(models, "check_remote_code", lambda *args, **kwargs: None)
    for load in (lambda: models.load_model_and_tokenizer(folder, device="cpu"),
                 lambda: models.load_for_training(ModelConfig(model_name_or_path=str(folder)))):
        with pytest.raises(ValueError, match="which pods-rl runs only with --trust_remote_code true") as err:
            load()
        assert "\n" not in str(err.value)
    assert not marker.exists() and not no_prompt


def test_with_the_flag_the_models_own_code_runs(evil_model, no_prompt):
    from trl import ModelConfig

    from pods_rl import models

    folder, marker = evil_model
    model, _ = models.load_for_training(ModelConfig(model_name_or_path=str(folder)), trust_remote_code=True)
    assert marker.read_text() == "ran" and type(model).__name__ == "EvilForCausalLM" and not no_prompt


@pytest.mark.slow
def test_pods_train_passes_the_flag_on_to_the_loader(evil_model, no_prompt, tmp_path, capsys):
    """`--trust_remote_code true` was accepted and then ignored: the loader never got it."""
    from pods_rl.commands.train import main as train_main

    folder, marker = evil_model
    assert train_main(["--config", "cpu/smoke", "--model_name_or_path", str(folder), "--output_dir",
                       str(tmp_path / "run"), "--eval_before_after", "false", "--max_steps", "1",
                       "--trust_remote_code", "true"]) == 0
    assert marker.exists() and not no_prompt
    assert (tmp_path / "run" / "final" / "pods_clock.json").is_file()


class _RunsCode:
    """Pickles to a call of exec: what a hostile checkpoint file holds."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _torch_pickle(path: Path, marker: Path) -> None:
    import torch

    torch.save({"state": _RunsCode(marker)}, path)


def _plain_pickle(path: Path, marker: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump({"state": _RunsCode(marker)}, f)


@pytest.mark.parametrize("file", ["rng_state.pth", "optimizer.pt", "scheduler.pt"])
@pytest.mark.parametrize("write", [_torch_pickle, _plain_pickle], ids=["torch.save", "pickle.dump"])
def test_a_pickled_checkpoint_file_is_never_loaded_and_is_named_with_the_way_on(file, write, tmp_path, two_step_run,
                                                                                tiny_model_dir, capsys):
    from pods_rl.commands.train import main as train_main

    run_dir = Path(shutil.copytree(two_step_run, tmp_path / "run"))
    shutil.rmtree(run_dir / "final")
    marker = tmp_path / "EXECUTED"
    write(run_dir / "checkpoint-2" / file, marker)
    code = train_main(["--config", "cpu/smoke", "--model_name_or_path", str(tiny_model_dir), "--output_dir",
                       str(run_dir), "--eval_before_after", "false", "--max_steps", "3",
                       "--resume_from_checkpoint", "true"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "pods train: error" in line]
    assert code == 2 and len(lines) == 1, err[-2000:]
    what = ("holds pickled Python objects (", "exec), not only tensors") if write is _torch_pickle else (
        "is not a weights-only torch file (damaged, or a pickle of Python objects)", "")
    start, end = f"pods train: error: {run_dir}/checkpoint-2/{file} {what[0]}", (
        f"{what[1]}: refused unread, since loading it could run code; resume from the last intact one: "
        f"--resume_from_checkpoint {run_dir}/checkpoint-1 (nothing was changed)")
    assert lines[0].startswith(start) and lines[0].endswith(end), lines[0]
    assert "weights_only=False" not in err and "weights_only` set to `False" not in err
    assert not marker.exists()


def test_the_command_line_never_repeats_torchs_advice_to_load_unsafely():
    from pods_rl.errors import error_line

    advice = pickle.UnpicklingError("Weights only load failed. In PyTorch 2.6, we changed the default value of the "
                                    "`weights_only` argument in `torch.load` from `False` to `True`. Re-running "
                                    "`torch.load` with `weights_only` set to `False` will likely succeed")
    line, code = error_line("pods eval", advice)
    assert "False" not in line and "refused unread, since loading it could run code" in line and code == 1


def test_pods_eval_passes_the_flag_on_too(evil_model, no_prompt, tmp_path, capsys):
    from pods_rl.commands.cli import main as pods

    folder, marker = evil_model
    out = tmp_path / "eval.json"
    assert pods(["eval", str(folder), "--task", "arithmetic", "--limit", "2", "--k", "1", "--max-new-tokens", "4",
                 "--backend", "hf", "--out", str(out), "--trust_remote_code", "true"]) == 0
    assert marker.exists() and not no_prompt and json.loads(out.read_text())[0]["k"] == 1


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_model_whose_weights_file_is_a_pickle_is_named_and_never_run(command, tiny_model_dir, tmp_path, capsys):
    """A model folder with pytorch_model.bin (no safetensors) that unpickles to code: transformers loads it
    weights-only (nothing runs); the line names the file instead of quoting torch's advice."""
    from pods_rl.commands.cli import main as pods

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "pickled-model"))
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "EXECUTED"
    _torch_pickle(folder / "pytorch_model.bin", marker)
    argv = (["train", "--config", "cpu/smoke", "--model_name_or_path", str(folder), "--output_dir",
             str(tmp_path / "run"), "--eval_before_after", "false"] if command == "train" else
            ["eval", str(folder), "--task", "arithmetic", "--limit", "2", "--k", "1", "--backend", "hf"])
    assert pods(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if f"pods {command}: error" in line]
    assert len(lines) == 1 and lines[0].startswith(f"pods {command}: error: {folder}/pytorch_model.bin holds pickled "
                                                   "Python objects ("), err[-2000:]
    assert lines[0].endswith("use the model's .safetensors weights, or a copy from a source you trust")
    assert not marker.exists() and "weights_only=False" not in err
