"""The wheels the GPU image lacks for the preset (benchmarks/gpu/h100.py), and why each one: ``wheels.lock.json``.

The GPU machine reaches no package index, so what the preset imports and the image lacks travels from here as
wheels (``fetch_wheels.sh`` downloads them into ``.whl/``). Only those: a carried copy of a package the image has
would come first on ``PYTHONPATH`` and replace the image's own (its CUDA torch, its transformers). Which ones is
computed, not guessed: pip resolves pods-rl's base dependencies (pyproject.toml) for CPython 3.12 manylinux x86_64
beside the image's packages at their versions (metadata only), and the lock records every distribution of that
closure with its version, its requirements (no extras) and its status:

- ``carried``: the image lacks it and pods-rl needs it (through packages the image lacks: TRL, datasets,
  math-verify and what they need that the image does not have);
- ``image``: the image has it (``IMAGE_PACKAGES``, the list the device's notes give; ``h100.py answer`` imports
  every one the preset needs and writes their versions);
- ``not needed: <why>``: pulled in only by an image package (the image brings what its own packages need) or by
  an extra.

    python benchmarks/gpu/wheels.py lock         # resolve again (pip, metadata only) and rewrite wheels.lock.json
    python benchmarks/gpu/wheels.py list         # the carried pins, one a line (fetch_wheels.sh downloads these)
    python benchmarks/gpu/wheels.py check DIR    # the wheels in DIR are exactly the carried pins, and their own
                                                 # metadata asks for nothing outside the lock
    python benchmarks/gpu/wheels.py constraints  # the image's known versions and the carried pins, as pip
                                                 # constraints (the CI lane .ci/lane-gpu-image.sh installs these)

Needs only the standard library and ``packaging`` (which pip vendors, and every environment of the project has).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LOCK = HERE / "wheels.lock.json"
PYTHON = "3.12"  # the image's Python: the carried wheels are for CPython 3.12, manylinux x86_64
# The image's packages (the device notes' list, read on a machine running the image, 2026-11-17).
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())
# The image's versions where one was read there (a session's pip list, 2026-11); peft and pyarrow: the versions
# the preset was last checked against (the first call's versions.json gives the image's real ones).
IMAGE_VERSIONS = {"torch": "2.11.0", "transformers": "5.17.0", "accelerate": "1.15.0", "huggingface-hub": "1.33.0",
                  "safetensors": "0.8.0", "tokenizers": "0.23.2", "numpy": "2.5.2", "triton": "3.6.0",
                  "peft": "0.21.2", "pyarrow": "21.0.0"}
# Pins for what pods-rl needs that the resolution would otherwise pick newer than the image allows.
CARRIED_PINS = {
    "trl": "1.16.0",       # the top of TRL_RANGE (CI tests both ends)
    "datasets": "4.8.5",   # 5.x asks pyarrow>=24, newer than the image's
}


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``PyYAML`` -> ``pyyaml``,
    ``typing_extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requires_dist: list[str] | None, environment: dict | None = None) -> list[str]:
    """The distributions ``requires_dist`` (Requires-Dist lines) asks for without extras, markers evaluated on Linux
    x86_64 CPython ``PYTHON`` (or ``environment``), sorted and deduplicated."""
    from packaging.requirements import Requirement

    env = environment or {"python_version": PYTHON, "python_full_version": f"{PYTHON}.0", "sys_platform": "linux",
                          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                          "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    names = set()
    for line in requires_dist or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            names.add(canonical(req.name))
    return sorted(names)


def base_dependencies() -> list[str]:
    """pods-rl's base dependencies, as pyproject.toml lists them (read with a regex: no tomllib on Python 3.10)."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)
    return re.findall(r'^\s*"([^"]+)"', block, re.M)


def closure(roots: list[str], packages: dict, through_image: bool = True) -> set[str]:
    """Every distribution reached from ``roots`` through the lock's requirements (extras not followed); with
    ``through_image=False`` the requirements of the image's packages are not followed (the image brings them)."""
    todo, seen = list(roots), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            if through_image or name not in IMAGE_PACKAGES:
                todo += packages.get(name, {}).get("requires", [])
    return seen


def statuses(roots: list[str], packages: dict) -> dict[str, str]:
    """{name: status} for every package of the resolution (see the module docstring)."""
    needed = closure(roots, packages, through_image=False)
    reached = closure(roots, packages)
    result = {}
    for name in packages:
        if name in IMAGE_PACKAGES:
            result[name] = "image"
        elif name in needed:
            result[name] = "carried"
        elif name in reached:
            result[name] = "not needed: required only by the image's own packages (the image brings what they need)"
        else:
            result[name] = "not needed: reached only through an extra (e.g. datasets' fsspec[http])"
    return result


def resolve() -> dict:
    """Resolve the closure with pip for CPython ``PYTHON`` (``--dry-run --report``: metadata only, nothing
    installed) into the lock's form."""
    wanted = [*(f"{n}=={v}" for n, v in IMAGE_VERSIONS.items()), *(f"{n}=={v}" for n, v in CARRIED_PINS.items()),
              *base_dependencies()]
    platforms = ["--platform=manylinux2014_x86_64", "--platform=manylinux1_x86_64",
                 *(f"--platform=manylinux_2_{n}_x86_64" for n in range(5, 41))]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--python-version", PYTHON, "--implementation", "cp", "--only-binary=:all:", *platforms,
                           "--report", "-", *wanted], capture_output=True, text=True)
    if done.returncode:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise SystemExit(f"wheels.py lock: pip could not resolve: {' '.join(errors[-2:]) or done.stderr[-300:]}")
    report = done.stdout
    packages = {}
    for item in json.loads(report)["install"]:
        meta = item["metadata"]
        packages[canonical(meta["name"])] = {"version": meta["version"],
                                             "requires": requirement_names(meta.get("requires_dist"))}
    roots = sorted({canonical(re.match(r"[A-Za-z0-9_.-]+", d).group(0)) for d in base_dependencies()})
    for name, status in statuses(roots, packages).items():
        packages[name]["status"] = status
    return {"python": PYTHON, "roots": roots, "packages": dict(sorted(packages.items()))}


def load() -> dict:
    """The lock (wheels.lock.json)."""
    return json.loads(LOCK.read_text())


def carried(lock: dict | None = None) -> dict[str, str]:
    """{distribution: version} of the wheels that go to the machine."""
    lock = lock or load()
    return {name: p["version"] for name, p in lock["packages"].items() if p["status"] == "carried"}


def lock_problems(lock: dict | None = None) -> list[str]:
    """What makes the lock wrong: a requirement in the closure of pods-rl's base dependencies that the lock does not
    hold, a status other than what ``statuses`` gives, or a carried package the image has."""
    lock = lock or load()
    packages = lock["packages"]
    problems = [f"{name}: required but not in the lock" for name in sorted(closure(lock["roots"], packages))
                if name not in packages]
    known = {name: p for name, p in packages.items()}
    for name, status in statuses(lock["roots"], known).items():
        if packages[name]["status"] != status:
            problems.append(f"{name}: status {packages[name]['status']!r}, expected {status!r}")
    return problems


def wheel_problems(wheel_dir: Path, lock: dict | None = None) -> list[str]:
    """How the wheels in ``wheel_dir`` differ from the lock: a carried pin without its wheel, a wheel at another
    version or not carried, and a requirement in a wheel's own METADATA that the lock does not hold."""
    lock = lock or load()
    want = carried(lock)
    problems, found = [], {}
    for path in sorted(Path(wheel_dir).glob("*.whl")):
        with zipfile.ZipFile(path) as wheel:
            meta_name = next(n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            text = wheel.read(meta_name).decode("utf-8", "replace")
        headers = text.split("\n\n", 1)[0].splitlines()
        name = canonical(next(h.split(":", 1)[1].strip() for h in headers if h.startswith("Name:")))
        version = next(h.split(":", 1)[1].strip() for h in headers if h.startswith("Version:"))
        found[name] = version
        if want.get(name) != version:
            problems.append(f"{path.name}: {name} {version}, but the lock carries {want.get(name, 'no such wheel')}")
        requires = [h.split(":", 1)[1].strip() for h in headers if h.startswith("Requires-Dist:")]
        for dep in requirement_names(requires):
            if dep not in lock["packages"]:
                problems.append(f"{path.name}: requires {dep}, which is not in the lock")
    problems += [f"{name}=={version}: no wheel" for name, version in want.items() if name not in found]
    return problems


def constraints(lock: dict | None = None) -> list[str]:
    """pip constraints for an environment with the image's versions: ``IMAGE_VERSIONS`` (numpy and triton left to
    pip: the image's numpy needs Python 3.12, triton follows torch) and the carried pins."""
    pins = {n: v for n, v in IMAGE_VERSIONS.items() if n not in ("numpy", "triton")}
    return [f"{n}=={v}" for n, v in {**pins, **carried(lock)}.items()]


def main(argv: list[str] | None = None) -> int:
    """``lock``, ``list``, ``check DIR`` or ``constraints`` (see the module docstring); exit code 1 when ``lock`` or
    ``check`` finds a problem, 2 on a wrong command line."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lock"]:
        lock = resolve()
        LOCK.write_text(json.dumps(lock, indent=1) + "\n")
        print(f"wrote {LOCK}: {len(carried(lock))} carried of {len(lock['packages'])}")
        return 1 if lock_problems(lock) else 0
    if argv[:1] == ["list"]:
        print("\n".join(f"{n}=={v}" for n, v in carried().items()))
        return 0
    if argv[:1] == ["constraints"]:
        print("\n".join(constraints()))
        return 0
    if argv[:1] == ["check"] and len(argv) == 2:
        problems = lock_problems() + wheel_problems(Path(argv[1]))
        print("\n".join(problems) or f"{argv[1]}: the {len(carried())} carried wheels, complete")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
