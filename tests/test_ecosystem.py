"""Fitting the ecosystem: the supported TRL range, the model card, logging backends, launch configs."""

from pathlib import Path

import pytest

from pods_rl import trainer as pods_trainer

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "trl_version, supported",
    [("1.11.0", False), ("1.12.0", True), ("1.14.2", True), ("1.16.0", True), ("1.16.1.dev0", True),
     ("1.17.0.dev0", False), ("1.17.0", False), ("0.29.1", False), ("2.0.0", False)],
)
def test_trl_version_check(trl_version, supported):
    if supported:
        pods_trainer._require_supported_trl(trl_version)
    else:
        with pytest.raises(ImportError, match=rf"supports trl>=1\.12,<1\.17 .* trl {trl_version} is installed"):
            pods_trainer._require_supported_trl(trl_version)


def test_trl_range_is_pyproject_pin():
    # The import-time check and pip's resolver must agree on what is supported.
    assert f'"trl{pods_trainer.TRL_RANGE}"' in (ROOT / "pyproject.toml").read_text()
