"""Root conftest for running TRL's tests/test_grpo_trainer.py with PODSTrainer swapped in for GRPOTrainer.

run.sh copies this file to the root of the work directory (beside the copied `tests/` package of the TRL snapshot),
so pytest loads it before TRL's tests/conftest.py and before `from trl import GRPOConfig, GRPOTrainer` runs in the
test module. The environment variable SWAP picks what that import gets:

    SWAP=grpo     trl's own GRPOTrainer / GRPOConfig (the baseline)
    SWAP=pods_eq  PODSTrainer / PODSConfig with downsample_to unset: m = n (PODS keeps every rollout)
    SWAP=pods_lt  PODSTrainer / a PODSConfig whose __post_init__ doubles the test's num_generations (TRL's default
                  8 when the test sets none) and sets downsample_to to the test's value: n = 2m, m < n. PODS batch
                  sizes count kept rollouts, so every batch-size relation the test set up still holds for m.
                  A test that sets downsample_to itself is left as it is.

Only the names the test module imports from `trl` are swapped (`trl.GRPOTrainer`, `trl.GRPOConfig`); TRL's
internals (trl.trainer.grpo_trainer) are untouched, so patches a test applies there reach PODSTrainer through
inheritance exactly as they reach GRPOTrainer.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from dataclasses import dataclass

import trl

trl_import_utils = importlib.import_module("trl.import_utils")  # trl is lazy: no trl.import_utils attribute

SHIMMED: list[str] = []


def _missing_availability_check(name: str):
    """The snapshot's tests/testing_utils.py may import `is_<pkg>_available` helpers that the installed TRL does not
    have (e.g. is_joblib_available, absent from trl 1.16): answer them with find_spec(<pkg>), recorded in SHIMMED
    and in the report header. Any other missing name still raises, as it would without this shim."""
    match = re.fullmatch(r"is_(\w+)_available", name)
    if match is None:
        raise AttributeError(f"module 'trl.import_utils' has no attribute {name!r}")
    SHIMMED.append(name)
    return lambda: importlib.util.find_spec(match.group(1)) is not None


trl_import_utils.__getattr__ = _missing_availability_check  # PEP 562: consulted only for names the module lacks

SWAP = os.environ.get("SWAP", "")
CHOICES = ("grpo", "pods_eq", "pods_lt")
if SWAP not in CHOICES:
    raise RuntimeError(f"set SWAP to one of {CHOICES} (got {SWAP!r}); see benchmarks/trl_conformance/README.md")

_ORIGINAL = (trl.GRPOTrainer, trl.GRPOConfig)

if SWAP == "grpo":
    Trainer, Config = _ORIGINAL
else:
    from pods_rl import PODSConfig, PODSTrainer

    Trainer = PODSTrainer
    if SWAP == "pods_eq":
        Config = PODSConfig
    else:

        @dataclass
        class PODSConfigMLessThanN(PODSConfig):
            """PODSConfig with n doubled and m = the test's num_generations (pods_lt)."""

            def __post_init__(self):
                if self.downsample_to is None and self.num_generations is not None:
                    self.downsample_to = self.num_generations
                    self.num_generations = 2 * self.num_generations
                super().__post_init__()

        Config = PODSConfigMLessThanN

    # trl is a lazy module: an attribute set on it shadows its lazy lookup, so `from trl import GRPOTrainer`
    # (run when pytest imports the test module, after this conftest) gets the swapped class.
    trl.GRPOTrainer = Trainer
    trl.GRPOConfig = Config


def pytest_report_header(config):
    lines = [f"SWAP={SWAP}: trl.GRPOTrainer -> {Trainer.__module__}.{Trainer.__qualname__}, "
             f"trl.GRPOConfig -> {Config.__module__}.{Config.__qualname__}",
             f"trl {trl.__version__} at {os.path.dirname(trl.__file__)}"]
    if SWAP != "grpo":  # the baseline run does not import pods_rl at all
        import pods_rl

        lines.append(f"pods_rl {pods_rl.__version__} at {os.path.dirname(pods_rl.__file__)}")
    return lines


def pytest_terminal_summary(terminalreporter):
    if SHIMMED:
        terminalreporter.write_line(f"shimmed in trl.import_utils (absent from trl {trl.__version__}, answered with "
                                    f"importlib.util.find_spec): {', '.join(sorted(set(SHIMMED)))}")
