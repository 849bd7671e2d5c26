"""The asynchronous guide's CPU example runs as written (docs/guides/async.md, "Run it on a CPU: a complete example").

The page's server command starts vLLM's CPU build (on a free port instead of 8000, so that the test never meets
another server), then the page's script is saved as a file and run with ``python``, as a reader does: it must train
its steps against that server, sync its weights to it, and print the reward line the page shows. Only the port is
changed; nothing else of either block. That the blocks hold what a reader needs (imports, the ``__main__`` guard, the
model path, the response template, ``max_inflight_tasks``) is checked in the main suite
(tests/test_docs_snippets.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl.experimental.async_grpo")
pytest.importorskip("aiohttp")
pytest.importorskip("vllm")

from tests.vllm.server import free_port, serving  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "async.md"
SECTION = "## Run it on a CPU: a complete example"


def example_blocks() -> tuple[str, str]:
    """(the server command, the script) of the guide's complete CPU example."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    fences = re.findall(r"^```(\w*)\n(.*?)^```", section, flags=re.M | re.S)
    languages = [language for language, _ in fences]
    assert languages[:2] == ["bash", "python"], f"the example should be a server command, then a script: {languages}"
    return fences[0][1], fences[1][1]


def test_the_cpu_example_trains_against_the_server_it_starts(tmp_path):
    server_command, script = example_blocks()
    port = free_port()
    server_command = re.sub(r"--port \d+", f"--port {port}", server_command)
    script = re.sub(r'SERVER = "http://127\.0\.0\.1:\d+"', f'SERVER = "http://127.0.0.1:{port}"', script)
    (tmp_path / "async_pods_cpu.py").write_text(script)
    # `python` in the page's commands is this environment's interpreter, as in an activated virtual environment
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    log_path = tmp_path / "server.log"
    with serving(["bash", "-c", server_command], f"http://127.0.0.1:{port}", log_path, env, cwd=tmp_path):
        result = subprocess.run([sys.executable, "async_pods_cpu.py"], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # 10 steps, the weights synced to the server after each (and once cold, before the first)
    assert "trained 10 steps; weights synced to the server 11 times" in output, output[-3000:]
    printed = re.search(r"mean reward of all 16 rollouts per prompt, every 5 steps: ([\d.]+(?: -> [\d.]+)*)", output)
    assert printed, output[-3000:]
    rewards = [float(r) for r in printed.group(1).split(" -> ")]
    assert len(rewards) == 2 and all(0 <= r <= 1 for r in rewards), rewards  # logged every 5 steps
