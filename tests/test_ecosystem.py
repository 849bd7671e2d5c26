"""Fitting the ecosystem: the supported TRL range, the model card, logging backends, launch configs."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import pods_rl
from pods_rl.engines.trl import config as trainer_config
from pods_rl.engines.trl import trainer as pods_trainer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "trl_version, supported",
    [("1.11.0", False), ("1.12.0", True), ("1.14.2", True), ("1.16.0", True), ("1.16.1.dev0", True),
     ("1.17.0.dev0", False), ("1.17.0", False), ("0.29.1", False), ("2.0.0", False)],
)
def test_trl_version_check(trl_version, supported):
    if supported:
        trainer_config.require_supported_trl(trl_version)
    else:
        with pytest.raises(ImportError, match=rf"supports trl>=1\.12,<1\.17 .* trl {trl_version} is installed"):
            trainer_config.require_supported_trl(trl_version)


def test_trl_range_is_pyproject_pin():
    # The import-time check and pip's resolver must agree on what is supported.
    assert f'"trl{trainer_config.TRL_RANGE}"' in (ROOT / "pyproject.toml").read_text()


def _card_trainer(tmp_path, model_dir, name_or_path, dataset=None, reward_funcs=None, **overrides):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.config._name_or_path = name_or_path  # as if loaded from there
    args = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                max_completion_length=8, num_generations=8, downsample_to=4, per_device_train_batch_size=4)
    args.update(overrides)
    if dataset is None:
        dataset = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(8)]})
    reward_funcs = reward_funcs or [lambda completions, **kw: [0.0] * len(completions)]
    return pods_trainer.PODSTrainer(model=model, reward_funcs=reward_funcs,
                                    args=pods_trainer.PODSConfig(**args), train_dataset=dataset,
                                    processing_class=AutoTokenizer.from_pretrained(model_dir))


def _front_matter(card: str) -> dict:
    return yaml.safe_load(card.split("---")[1])


def test_model_card_names_pods_rule_n_m_base_model_and_cites_the_paper(tmp_path, tiny_model_dir):
    trainer = _card_trainer(tmp_path, tiny_model_dir, "Qwen/Qwen2.5-0.5B-Instruct", downsample_rule="max_reward")
    trainer.create_model_card(model_name="my-run")  # what TRL calls at every checkpoint
    card = (tmp_path / "out" / "README.md").read_text()
    meta = _front_matter(card)
    # TRL's conventions: the hub metadata, its tags plus ours, and its sections.
    assert meta["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct" and meta["model_name"] == "my-run"
    assert {"generated_from_trainer", "trl", "grpo", "pods"} <= set(meta["tags"])
    for section in ("# Model Card for my-run", "## Quick start", "## Training procedure", "### Framework versions",
                    "## Citations"):
        assert section in card, section
    assert ("fine-tuned version of [Qwen/Qwen2.5-0.5B-Instruct]"
            "(https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct)" in card)
    assert "[None]" not in card and '"None"' not in card
    # PODS, the rule, n and m.
    assert "GRPO-PODS" in card and "n = 8 completions were sampled" in card and "kept m = 4" in card
    assert "`max_reward` rule" in card
    assert "(`downsample_tiebreak`) | `index` |" in card and "oversample_prompts" not in card
    assert "| completions sampled per prompt, n (`num_generations`) | 8 |" in card
    assert "| completions kept per prompt for the update, m (`downsample_to`) | 4 |" in card
    # PODS cited beside GRPO and TRL.
    assert "https://huggingface.co/papers/2504.13818" in card and "https://huggingface.co/papers/2402.03300" in card
    citations = card[card.index("## Citations"):]
    assert citations.index("@article{xu2025pods") < citations.index("shao2024deepseekmath") < citations.index(
        "vonwerra2020trl")
    assert "Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement Learning" in citations
    assert "Yixuan Even Xu and Yash Savani and Fei Fang and J. Zico Kolter" in citations
    assert re.search(r"- pods-rl: \S+", card) and re.search(r"- TRL: 1\.1\d", card)


def test_model_card_of_a_planner_run_says_n_is_the_most_a_prompt_got(tmp_path, tiny_model_dir):
    trainer = _card_trainer(tmp_path, tiny_model_dir, "Qwen/Qwen2.5-0.5B-Instruct", rollout_planner="auto")
    trainer.create_model_card(model_name="auto-run")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "between m = 4 and n = 8 completions (as many as the `auto` rollout planner chose)" in card
    assert "| the most completions sampled per prompt, n (`num_generations`) | 8 |" in card
    assert "| completions per prompt chosen by (`rollout_planner`) | `auto` |" in card
    assert "n = 8 completions were sampled" not in card and "prompt_planner" not in card


def test_model_card_of_a_local_base_model_and_of_plain_grpo(tmp_path, tiny_model_dir):
    trainer = _card_trainer(tmp_path, tiny_model_dir, str(tiny_model_dir), downsample_to=8,
                            per_device_train_batch_size=8)
    final = tmp_path / "final"
    trainer.save_model(str(final))  # a model saved on its own gets its card too
    card = (final / "README.md").read_text()
    assert "base_model" not in _front_matter(card)  # the hub field takes hub ids only, as in TRL
    assert f"`{tiny_model_dir.name}` (a local model, `{tiny_model_dir}`)" in card
    assert f'model="{final}"' in card  # the quick start loads the saved directory
    assert "without down-sampling: all n = m = 8 completions" in card and "2504.13818" in card


def _quick_start(card: str) -> str:
    """The card's quick start code (between its ```python fence and the next fence)."""
    section = card[card.index("## Quick start"):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_model_card_example_is_a_prompt_of_the_runs_own_task(tmp_path, tiny_model_dir):
    """#41 item 6: a run on `arithmetic` shows its own first training prompt (its chat messages, as the model saw
    them), not GSM8K's Natalia question; the quick start is runnable Python whose prompt is exactly that row's."""
    import ast

    from pods_rl.tasks import get_task

    task = get_task("arithmetic")
    dataset = task.load("train", limit=8)
    trainer = _card_trainer(tmp_path, tiny_model_dir, str(tiny_model_dir), dataset=dataset,
                            reward_funcs=task.reward_funcs())
    trainer.create_model_card(model_name="arith-run")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Natalia" not in card and "clips" not in card
    first = dataset[0]["prompt"]
    assert isinstance(first, list) and first[-1]["content"] == dataset[0]["question"]
    assert dataset[0]["question"] in card and task.system_prompt in card
    code = _quick_start(card)
    ast.parse(code)  # the quick start is still valid Python
    assignment = next(node for node in ast.parse(code).body
                      if isinstance(node, ast.Assign) and node.targets[0].id == "prompt")
    assert ast.literal_eval(assignment.value) == first
    assert "max_new_tokens=8," in code  # the run's max_completion_length


def test_model_card_example_falls_back_to_a_generic_prompt():
    from datasets import Dataset

    generic = pods_trainer.GENERIC_CARD_PROMPT
    for dataset in (None, Dataset.from_dict({"prompt": []}), Dataset.from_dict({"question": ["1+1"]}), [{}]):
        assert pods_trainer.card_example_prompt(dataset) == repr(generic), dataset
    plain = Dataset.from_dict({"prompt": ["Use <answer></answer>.\nUser: 3+4\nAssistant:", "x"]})
    assert pods_trainer.card_example_prompt(plain) == repr("Use <answer></answer>.\nUser: 3+4\nAssistant:")
    assert pods_trainer.card_example_prompt(iter([{"prompt": "2*3="}])) == "'2*3='"  # an iterable dataset


def test_model_card_without_pods_rl_metadata(tmp_path, tiny_model_dir, monkeypatch):
    """A tree run from src/ that was never installed has no pods-rl metadata: its first checkpoint's card is still
    written, with pods-rl's version as "0+unknown" (what pods_rl.__version__ says there too)."""
    from importlib import metadata

    from pods_rl.machine import pods_rl_version

    real = metadata.distribution

    def without_pods_rl(name):
        if name.replace("_", "-").lower() == "pods-rl":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    trainer = _card_trainer(tmp_path, tiny_model_dir, str(tiny_model_dir))
    # Under metadata.version (which every `from importlib.metadata import version` calls): no pods-rl anywhere.
    monkeypatch.setattr(metadata, "distribution", without_pods_rl)
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("pods-rl")
    assert pods_rl_version() == "0+unknown"
    trainer.create_model_card(model_name="no-metadata")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "- pods-rl: 0+unknown" in card and re.search(r"- TRL: 1\.1\d", card)


def test_pods_train_is_quiet_and_reports_to_tensorboard(tmp_path, tiny_model_dir):
    """A default `pods train` (the tiny recipe's progress bar and evaluation lines) with every deprecation
    warning shown (-W default) prints none; `report_to: tensorboard` gets the pods/* and time/* scalars."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-m", "pods_rl.commands.cli", "train",
         "--model_name_or_path", str(tiny_model_dir),
         "--output_dir", str(run_dir), "--max_steps", "2", "--logging_steps", "1", "--report_to", "tensorboard",
         "--eval_num_problems", "8", "--eval_batch_size", "16", "--per_device_train_batch_size", "16",
         "--torch_threads", "1"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = re.findall(r"\w*(?:FutureWarning|DeprecationWarning): .*", proc.stderr)
    assert not warned, warned
    assert "training time:" in proc.stderr  # the tqdm bar
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in r]
    lines = [line for line in proc.stdout.splitlines() if "held-out accuracy" in line and line.startswith("step")]
    assert len(evals) >= 2 and len(lines) == len(evals)  # one line per evaluation

    events = sorted(run_dir.rglob("events.out.tfevents.*"))
    assert events, list(run_dir.rglob("*"))
    scalars = set()
    for path in events:
        acc = EventAccumulator(str(path))
        acc.Reload()
        scalars |= set(acc.Tags()["scalars"])
    # the embedded recipe's auto: its choices, the rollouts sampled, TRL's own zero-std share (a step at m is
    # GRPOTrainer's) and the phase times
    assert {"train/pods/auto_n_mean", "train/pods/rollouts_sampled", "train/frac_reward_zero_std", "train/time/step",
            "train/time/generation", "train/time/update"} <= scalars, sorted(scalars)
    assert "GRPO-PODS" in (run_dir / "final" / "README.md").read_text()


def test_shipped_accelerate_configs_parse_as_accelerate_launch_reads_them():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType

    from pods_rl.commands.launch import ACCELERATE_DIR, accelerate_config, accelerate_configs

    expected = {"ddp": (DistributedType.MULTI_GPU, None), "fsdp": (DistributedType.FSDP, None),
                "zero2": (DistributedType.DEEPSPEED, 2), "zero3": (DistributedType.DEEPSPEED, 3)}
    assert accelerate_configs() == sorted(expected)
    # Shipped as package data, beside the recipes.
    assert ACCELERATE_DIR.parent.parent == Path(pods_rl.__file__).parent
    assert '"pods_rl.recipes" = ["**/*.yaml"' in (ROOT / "pyproject.toml").read_text()
    launch_flags = {action.dest for action in launch_command_parser()._actions}
    for name, (distributed_type, zero_stage) in expected.items():
        path = accelerate_config(name)
        raw = yaml.safe_load(path.read_text())
        config = load_config_from_file(str(path))  # accelerate's own reader: unknown top-level keys raise
        assert config.distributed_type == distributed_type, name
        assert (config.num_machines, config.num_processes, config.mixed_precision) == (1, 8, "bf16"), name
        assert config.machine_rank == 0 and not config.use_cpu, name
        # `accelerate launch` turns each key of these sections into its flag of the same name.
        for section in ("deepspeed_config", "fsdp_config"):
            unknown = set(raw.get(section) or {}) - launch_flags
            assert not unknown, (name, section, unknown)
        if zero_stage is not None:
            assert config.deepspeed_config["zero_stage"] == zero_stage
        if name == "fsdp":
            assert config.fsdp_config["fsdp_version"] == 2
            assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"


def test_accelerate_config_command_and_recipe_names(capsys):
    from pods_rl.commands import cli
    from pods_rl.commands.launch import accelerate_config
    from pods_rl.recipes import resolve_recipe

    assert cli.main(["accelerate-config", "zero2"]) == 0
    assert capsys.readouterr().out.strip() == str(accelerate_config("zero2"))
    assert cli.main(["accelerate-config", "zero4"]) == 2
    assert "shipped: ddp, fsdp, zero2, zero3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="an accelerate launch config, not a recipe"):
        resolve_recipe("accelerate/zero2")
    with pytest.raises(ValueError, match="packaged recipes") as err:
        resolve_recipe("no/such")
    assert "accelerate" not in str(err.value)


def test_wandb_offline_gets_pods_and_time_scalars(tmp_path, tiny_model_dir, monkeypatch):
    """`report_to: wandb` hands PODS's and the phase clock's scalars to W&B (what pods-rl owns: the keys reach
    ``Run.log``), and the offline run file records them wherever W&B wrote history into it."""
    import warnings

    wandb = pytest.importorskip("wandb")
    from wandb.sdk.wandb_run import Run

    monkeypatch.delenv("WANDB_DISABLED", raising=False)  # conftest's default for every other test
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_PROJECT": "pods-rl-test"}.items():
        monkeypatch.setenv(key, value)
    handed, log = set(), Run.log

    def recording_log(self, data, *args, **kwargs):
        handed.update(data)
        return log(self, data, *args, **kwargs)

    monkeypatch.setattr(Run, "log", recording_log)
    trainer = _card_trainer(tmp_path, tiny_model_dir, str(tiny_model_dir), report_to="wandb", max_steps=2,
                            logging_steps=1)
    try:
        trainer.train()
    finally:
        wandb.finish()
    wanted = {"train/pods/frac_zero_std_all", "train/pods/reward_kept_mean", "train/time/step",
              "train/time/generation", "train/time/update"}
    assert wanted <= handed, sorted(handed)

    runs = list(tmp_path.rglob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list(tmp_path.rglob("*"))
    keys = _wandb_history_keys(runs[0])
    if keys:
        assert wanted <= keys, sorted(keys)
    else:
        # Seen in 4 runs of one session (wandb 0.31): an offline file without any history record although Run.log
        # was called; offline runs missing their metrics are reported upstream (wandb/wandb#5561).
        warnings.warn(f"W&B wrote no history records to {runs[0].name} (an upstream offline-mode fault)",
                      stacklevel=1)


def _wandb_history_keys(path: Path) -> set[str]:
    """The keys logged to an offline W&B run: its ``.wandb`` file is a LevelDB-style log (a 7-byte file header,
    32 KiB blocks of chunks: crc32, length, type FULL/FIRST/MIDDLE/LAST) of ``Record`` protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, buf, keys = path.read_bytes(), 7, 32768, b"", set()
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            if record.HasField("history"):
                keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
    return keys
