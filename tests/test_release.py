"""The release: one version (pyproject.toml -> the installed package's metadata -> ``pods_rl.__version__`` and ``pods
--version``), a CHANGELOG entry for it, and the two commands of a fresh machine (``make train``, ``make test``).
The wheel itself is built, installed and run by .ci/wheel-check.sh."""

import re
import subprocess
from importlib import metadata
from pathlib import Path

from packaging.version import Version

import pods_rl
from pods_rl.commands import cli

ROOT = Path(__file__).resolve().parents[1]


def pyproject_version() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def test_the_version_is_the_installed_packages(capsys):
    assert pods_rl.__version__ == metadata.version("pods-rl")
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == pods_rl.__version__


def test_the_changelog_has_an_entry_for_the_version():
    version = pyproject_version()
    Version(version)  # a PEP 440 version, or InvalidVersion
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\](?: — (\S+))?", changelog, re.M)  # [(name, version or date)]
    assert headings and (headings[0] == ("Unreleased", version) or headings[0][0] == version), (version, headings[:2])
    released = [Version(name) for name, _ in headings if name != "Unreleased"]
    assert (released == sorted(released, reverse=True)
        and all(v < Version(version) for v in released if v != Version(version)))


def test_make_runs_the_two_commands_in_the_project_environment():
    def dry_run(target, *variables):
        result = subprocess.run(["make", "-n", target, *variables], cwd=ROOT, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    # The suite runs in one worker per core (pytest-xdist), at most TEST_WORKERS, a test file per worker at a time.
    test = dry_run("test", "ARGS=tests/test_release.py", "TEST_WORKERS=3")
    assert ".venv/bin/python -m pytest -q -n auto --maxprocesses 3 --dist loadfile tests/test_release.py" in test
    train = dry_run("train", "ARGS=--max_train_seconds 5", "TORCH_SPEC=torch==2.9.1", "TORCH_INDEX=https://example.org/t")
    assert ".venv/bin/pods train --max_train_seconds 5" in train
    # The install step (run only when the stamp differs) takes the torch the user chose.
    assert "torch==2.9.1" in train and "--extra-index-url https://example.org/t" in train and '-e ".[dev]"' in train
