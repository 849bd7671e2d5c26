"""Pack a study's runs into one archive, unpack it, or check it, without pods-rl installed (the standard library
only): ``src/pods_rl/runlog/packed.py`` loaded by its path.

    python benchmarks/pack_runs.py pack benchmarks/results/cpu-2core-amd-epyc/evidence/strong   # -> .../runs.tar.xz
    python benchmarks/pack_runs.py pack STUDY --remove      # ... and delete the packed files (weights stay)
    python benchmarks/pack_runs.py unpack STUDY             # back into STUDY/{study,sweep,runs}/ (or --to DIR)
    python benchmarks/pack_runs.py check STUDY...           # unpacking and packing again gives the same bytes

`pods study --stage report` reads a study's archive as it reads its run folders; see
benchmarks/results/cpu-2core-amd-epyc/README.md.
"""

import importlib.util
import sys
from pathlib import Path

PACKED = Path(__file__).resolve().parent.parent / "src" / "pods_rl" / "runlog" / "packed.py"


def load():
    """The module ``pods_rl.runlog.packed``, from its file (no package import: no torch, no install needed)."""
    spec = importlib.util.spec_from_file_location("pods_runs_packed", PACKED)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and the like look their module up by name
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(load().main())
