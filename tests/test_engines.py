"""The shipped `pods accelerate-config` files, launched as users launch them, on 2 CPU ranks: only the process
count and precision overridden. DDP is tests/test_multiprocess_clock.py; DeepSpeed ZeRO-2 and ZeRO-3 are the
DeepSpeed lane (tests/deepspeed, an environment of its own). Here: FSDP, which accelerate does not run on CPU (its
MULTI_CPU mode launches the ranks as DDP): `pods train` says so in one line, and the run ends as any run does.
FSDP2's own sharded tensors are tested on CPU in tests/test_divergence.py (torch's ``fully_shard`` over gloo)."""

import pytest

from pods_rl.commands.launch import accelerate_config
from tests import multiproc


@pytest.mark.slow
def test_fsdp_config_on_cpu_says_what_runs_and_the_run_ends_with_everything(tmp_path, tiny_model_dir, capsys):
    run_dir = tmp_path / "run"
    command = multiproc.pods_train_command(run_dir, tiny_model_dir, "--max_train_seconds", "8",
                                           config_file=accelerate_config("fsdp"))
    proc = multiproc.start(command, multiproc.launch_env())
    out, err = multiproc.end(proc, timeout=300)
    assert proc.returncode == 0, err[-4000:]
    notes = [line for line in out.splitlines() if "accelerate has no FSDP on CPU" in line]
    assert len(notes) == 1, out[-3000:]  # once (rank 0), before anything loads
    multiproc.check_finished(run_dir, 8)
    multiproc.check_pods_eval(run_dir)
