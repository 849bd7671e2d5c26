"""Every bad input a new user is likely to type gets one line on stderr naming the problem and its fix, the right
exit code, no traceback and no usage dump, and fails before any model loads (seconds, not minutes). One table,
all sub-commands; ``--debug`` brings the traceback back."""

import pytest

from pods_rl.commands.cli import main as pods

# (argv with {tmp} for the test's folder, expected exit code, a substring of the one line). Files named here are
# made by the `bad_inputs` fixture.
SMOKE = "train --config cpu/smoke --output_dir {tmp}/run"
CASES = [
    # recipes and flag syntax
    ("train --config {tmp}/bad.yaml", 2, "{tmp}/bad.yaml:3: YAML syntax error"),
    ("train --config {tmp}/indent.yaml", 2, "{tmp}/indent.yaml:2: YAML syntax error"),
    ("train --config {tmp}/latin1.yaml", 2, "not UTF-8 text"),
    ("train --config no/such/recipe", 2, "is neither a file nor a packaged recipe"),
    ("train --config", 2, "--config needs a recipe path or name"),
    (SMOKE + " --downsample_to 2.5", 2, "argument --downsample_to/--downsample-to: invalid int value: '2.5'"),
    (SMOKE + " --learning_rate abc", 2, "invalid float value: 'abc' (see `pods train --help`)"),
    (SMOKE + " --learnin_rate 1e-3", 2, "unknown flag --learnin_rate (did you mean --learning_rate?)"),
    (SMOKE + " stray", 2, "unexpected arguments ['stray']"),
    # TRL's asynchronous trainer's settings: pods train has no asynchronous mode, and says where it is
    (SMOKE + " --max_staleness 2", 2, "--max_staleness: `pods train` runs the synchronous trainer and has no "
     "asynchronous mode"),
    (SMOKE + " --async true", 2, "asynchronous PODS runs from Python: AsyncGRPOTrainer with rollout_worker="
     "pods_rl.engines.trl_async.worker.pods_rollout_worker(...)"),
    # values that cannot train
    (SMOKE + " --learning_rate 0", 2, "--learning_rate must be > 0, got 0.0"),
    (SMOKE + " --learning_rate -1", 2, "--learning_rate must be > 0, got -1.0"),
    (SMOKE + " --per_device_train_batch_size 0", 2, "--per_device_train_batch_size must be > 0, got 0"),
    (SMOKE + " --eval_k 0", 2, "--eval_k must be > 0, got 0"),
    (SMOKE + " --eval_num_problems -3", 2, "--eval_num_problems must be > 0, got -3"),
    (SMOKE + " --torch_threads 0", 2, "--torch_threads must be > 0, got 0"),
    (SMOKE + " --downsample_to 99", 2, "downsample_to (m=99) is larger than num_generations (n=8)"),
    (SMOKE + " --downsample_rule bogus", 2, "unknown down-sampling rule 'bogus' (downsample_rule)"),
    (SMOKE + " --use_vllm true", 2, "use_vllm is true but vLLM is not installed"),  # tests/vllm: with vLLM
    # tasks and their data
    (SMOKE + " --task nosuchtask", 2, "unknown task 'nosuchtask'; available tasks:"),
    (SMOKE + " --eval_split bogus", 2, "unknown --eval_split 'bogus' for task 'arithmetic'; choose one of"),
    (SMOKE + " --train_split bogus", 2, "unknown --train_split 'bogus' for task 'arithmetic'"),
    (SMOKE + " --task jsonl:{tmp}/one.jsonl", 2, "is a single file (split 'train' only) but evaluation needs split "
     "'test': pass --eval_split train, or --eval_before_after false"),
    (SMOKE + " --task jsonl:{tmp}/latin1 --eval_before_after false", 2,
     "{tmp}/latin1/train.jsonl:2 is not UTF-8 (byte 0xe9 at column 18)"),
    (SMOKE + " --task jsonl:{tmp}/nosuch.jsonl", 2, "is neither a file nor a directory"),
    ("train --config {tmp}/task_args_list.yaml --output_dir {tmp}/run", 2, "task_args must be key=value pairs"),
    (SMOKE + " --task_args train_size=abc", 2, "train_size='abc' must be int, got str"),
    (SMOKE + " --task-args train_size=abc", 2, "train_size='abc' must be int, got str"),
    (SMOKE + " --task-arg train_size=abc", 2, "train_size='abc' must be int, got str"),
    (SMOKE + " --task_arg oops", 2, "task argument 'oops' is not key=value"),
    (SMOKE + " --task-arg", 2, "--task-arg needs KEY=VALUE"),
    (SMOKE + " --task_args bogus=3", 2, "task 'arithmetic' got an unknown argument"),
    # the model
    (SMOKE + " --model_name_or_path {tmp}/no/such/dir", 2, "--model_name_or_path {tmp}/no/such/dir: no such directory"),
    (SMOKE + " --model_name_or_path {tmp}/empty", 2, "--model_name_or_path {tmp}/empty "
     "holds no model (no config.json)"),
    (SMOKE + " --model_name_or_path nobody/not-cached", 2, "is not in the local hub cache and HF_HUB_OFFLINE=1"),
    # the run directory
    ("train --config cpu/smoke --output_dir {tmp}/a_file", 2, "--output_dir {tmp}/a_file is a file"),
    ("train --config cpu/smoke --output_dir {tmp}/a_file/run", 2, "lies under {tmp}/a_file, which is a file"),
    ("train --config cpu/smoke --output_dir /proc/pods-run", 2, "cannot create anything in /proc"),
    ("train --config cpu/smoke --resume_from_checkpoint true", 2, "pass --output_dir RUN_DIR"),
    ("train --config cpu/smoke --resume_from_checkpoint {tmp}/old/checkpoint-5", 2, "pass --output_dir {tmp}/old"),
    ("train --config cpu/smoke --output_dir {tmp}/nosuchrun --resume_from_checkpoint true", 2,
     "the run directory {tmp}/nosuchrun does not exist"),
    # pods eval
    ("eval {tmp}/runs/typo --task arithmetic", 2, "{tmp}/runs/typo: no such directory"),
    ("eval typo --task arithmetic", 2, "typo: no such local directory, and hub model 'typo' is not in the local hub"),
    ("eval {tmp}/empty --task arithmetic", 2, "is neither a run directory"),
    ("eval {tmp}/empty --task arithmetic --k 0", 2, "--k must be >= 1, got 0"),
    ("eval {tmp}/empty --task arithmetic --k x", 2, "argument --k: invalid int value: 'x' (see `pods eval --help`)"),
    ("eval {tmp}/empty", 2, "the following arguments are required: --task"),
    ("eval {tmp}/empty --task arithmetic --task_args oops", 2, "task argument 'oops' is not key=value"),
    ("eval {model} --task arithmetic --split bogus", 2, "task 'arithmetic' has no split 'bogus'"),
    ("eval {model} --task nosuch", 2, "unknown task 'nosuch'"),
    # the other sub-commands
    ("plot {tmp}/nosuch", 2, "run directory {tmp}/nosuch does not exist"),
    ("plot {tmp}/empty --x bogus", 2, "argument --x: invalid choice: 'bogus'"),
    ("compare {tmp}/empty --bootstrap x", 2, "argument --bootstrap: invalid int value: 'x'"),
    ("cost --config cpu/smoke --n x", 2, "--n must be a positive integer, got 'x'"),
    ("cost --config cpu/smoke --learning_rate -1", 2, "--learning_rate must be > 0"),
    ("build-tiny --steps x", 2, "argument --steps: invalid int value: 'x'"),
    ("bogus", 2, "unknown command 'bogus'"),
]


@pytest.fixture
def bad_inputs(tmp_path, monkeypatch):
    """The files the table names, and a world in which loading a model or calling the hub fails the test."""
    import huggingface_hub
    import transformers

    (tmp_path / "bad.yaml").write_text("task: arithmetic\nnum_generations: [8\n")
    (tmp_path / "indent.yaml").write_text("task: arithmetic\n  learning_rate: 1\n")
    (tmp_path / "latin1.yaml").write_bytes("task: caf\xe9\n".encode("latin-1"))
    (tmp_path / "task_args_list.yaml").write_text("task: arithmetic\ntask_args: [train_size, 3]\n"
                                                  "use_cpu: true\nbf16: false\n")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "old" / "checkpoint-5").mkdir(parents=True)
    (tmp_path / "one.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    (tmp_path / "latin1").mkdir()
    (tmp_path / "latin1" / "train.jsonl").write_bytes(b'{"question": "1+1", "answer": "2"}\n'
                                                      b'{"question": "caf\xe9", "answer": "2"}\n')
    (tmp_path / "latin1" / "test.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded (or the hub called) before the bad input was found")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", forbidden)
    return tmp_path


@pytest.mark.parametrize("argv, code, expected", CASES, ids=[c[0].replace("{tmp}/", "") for c in CASES])
def test_bad_input_gets_one_line(argv, code, expected, bad_inputs, capsys):
    from pods_rl.tiny import model_path

    fill = {"tmp": str(bad_inputs), "model": str(model_path())}
    assert pods(argv.format(**fill).split()) == code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, lines  # one line: no traceback, no usage, no progress bar
    command = "pods" if argv == "bogus" else f"pods {argv.split()[0]}"
    assert lines[0].startswith(f"{command}: ") and expected.format(**fill) in lines[0], lines[0]
    assert out == ""
    assert not (bad_inputs / "run").exists()  # a failed start leaves no run directory behind


def test_output_dir_not_writable(tmp_path, capsys, monkeypatch):
    # As root a chmod does not stop writes; os.access is what the check asks first.
    monkeypatch.setattr("os.access", lambda path, mode: False)
    assert pods(["train", "--config", "cpu/smoke", "--output_dir", str(tmp_path / "run")]) == 2
    assert f"{tmp_path}/run: {tmp_path} is not writable; pass a path in a writable place" in capsys.readouterr().err


def test_unreachable_hub_fails_fast_with_the_offline_hint(tmp_path, capsys, monkeypatch):
    import time

    import huggingface_hub.constants

    # A hub at a closed local port: connection refused at once, as on a machine without network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    start = time.monotonic()
    for argv in (["eval", "nobody/model", "--task", "arithmetic"],
                 ["train", "--config", "cpu/smoke", "--output_dir", str(tmp_path / "r"), "--model_name_or_path",
                  "nobody/model"]):
        assert pods(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "cannot reach the Hugging Face hub" in lines[0], lines
        assert "set HF_HUB_OFFLINE=1 and use a cached model, or pass a local model directory" in lines[0]
    assert time.monotonic() - start < 20
    assert not (tmp_path / "r").exists()


def test_debug_shows_the_traceback(tmp_path, capsys):
    with pytest.raises(ValueError, match="no such directory"):
        pods(["eval", str(tmp_path / "nothing"), "--task", "arithmetic", "--debug"])
    with pytest.raises(ValueError, match="must be > 0"):
        pods(["train", "--config", "cpu/smoke", "--learning_rate", "0", "--debug"])


def test_task_arg_spellings_mean_the_same_everywhere(tmp_path):
    from pods_rl.commands.evaluate import build_parser, parse_task_args
    from pods_rl.recipes import merge_task_arg_flags, parse_args, validate

    want = {"train_size": 40, "ops": "+,-", "digits": 2}
    for argv in (["--task_args", "train_size=40,ops=+,-,digits=2"],
                 ["--task-args=train_size=40,ops=+,-", "--task-arg", "digits=2"],
                 ["--task-arg", "train_size=40", "--task_arg=ops=+,-", "--task-arg", "digits=2"]):
        run, _, _ = parse_args(["--config", "cpu/smoke", *argv])
        assert parse_task_args([run.task_args]) == want, argv
        eval_args = build_parser().parse_args(["model", "--task", "arithmetic", *argv])
        assert parse_task_args(eval_args.task_arg) == want, argv
    assert merge_task_arg_flags(["--x", "1"]) == ["--x", "1"]  # untouched without --task-arg
    # A mapping in the recipe gives the same options.
    recipe = tmp_path / "mapping.yaml"
    recipe.write_text("task: arithmetic\nuse_cpu: true\nbf16: false\n"
                      "task_args: {train_size: 40, ops: '+,-', digits: 2}\n")
    run, config, model_args = parse_args(["--config", str(recipe)])
    validate(run, config, model_args)
    assert parse_task_args([run.task_args]) == want


def test_resume_requests_are_checked_before_loading(bad_inputs, capsys):
    import yaml

    from pods_rl import runlog

    run_dir = bad_inputs / "prev"
    for step in (1, 2):
        (run_dir / f"checkpoint-{step}").mkdir(parents=True)
        runlog.write_json_atomic(run_dir / f"checkpoint-{step}" / runlog.CLOCK_FILE,
                                 {"step": step, "train_seconds": 1.0})
    (run_dir / "checkpoint-3").mkdir()  # killed while saving: no clock
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"learning_rate": 1e-3, "num_generations": 8, "eval_k": 2}))
    before = sorted(p.name for p in run_dir.iterdir())
    resume = ["train", "--config", "cpu/smoke", "--output_dir", str(run_dir), "--resume_from_checkpoint"]
    cases = [
        # a changed training setting: refused, naming the field and the flag (eval_k may change freely)
        ([*resume, "checkpoint-1", "--learning_rate", "0.05", "--eval_k", "4"],
         "changes training settings of {run}: learning_rate 0.001 -> 0.05; pass --accept_config_changes true"),
        ([*resume, "true", "--num_generations", "16", "--downsample_to", "8"],
         "num_generations 8 -> 16"),
        ([*resume, str(run_dir / "checkpoint-3")], "{run}/checkpoint-3 is incomplete (no pods_clock.json); "
         "choose a complete one: ['checkpoint-1', 'checkpoint-2']"),
        ([*resume, str(bad_inputs / "old" / "checkpoint-5")], "is not a checkpoint directory of --output_dir {run}"),
    ]
    for argv, expected in cases:
        assert pods(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and expected.format(run=run_dir) in lines[0], lines
    assert sorted(p.name for p in run_dir.iterdir()) == before  # a refused resume changes nothing


def test_the_error_line_is_one_write_with_its_newline(monkeypatch):
    """Ranks share the launcher's stderr, unbuffered (PYTHONUNBUFFERED): the line and its newline in one write, so
    that no other process's log line can land inside it (seen: torch's "Sending process ... SIGTERM" inside the
    printed resume command, which then did not parse)."""
    import io
    import sys

    from pods_rl.errors import CommandFailed, run_guarded

    class Unbuffered(io.StringIO):
        def __init__(self):
            super().__init__()
            self.writes = []

        def write(self, text):
            self.writes.append(text)
            return super().write(text)

    err = Unbuffered()
    monkeypatch.setattr(sys, "stderr", err)

    def body(argv):
        raise CommandFailed("rank 1 (pid 7) was killed; resume with: pods train --output_dir run")

    assert run_guarded("pods train", body, []) == 1
    assert err.writes == ["pods train: error: rank 1 (pid 7) was killed; resume with: pods train --output_dir run\n"]
