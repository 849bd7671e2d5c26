"""The wheels the GPU image lacks for the preset (benchmarks/gpu/h100.py), and why each one: ``wheels.lock.json``.

The GPU machine reaches no package index, so everything the preset imports and the image lacks travels from here
as wheels (``fetch_wheels.sh`` downloads them into ``.whl/``). Which ones is computed, not guessed: pip resolves
pods-rl's base dependencies (pyproject.toml) together with the image's own packages at the image's versions, and
the lock records every distribution of that closure with its version, its requirements (no extras; markers as on
Linux x86_64) and its status:

- ``carried``: a wheel goes to the machine;
- ``image``: the image has it (``IMAGE``, as last seen there; ``h100.py check`` imports it and says if not);
- ``not needed: <why>``: nothing the preset runs imports it (``NOT_NEEDED``).

The image does not bring its own packages' dependencies (seen there: torch without jinja2, accelerate without
psutil, and no xxhash or pandas for datasets), so the closure is followed through the image's packages too.

    python benchmarks/gpu/wheels.py lock       # resolve again (pip, metadata only) and rewrite wheels.lock.json
    python benchmarks/gpu/wheels.py list       # the carried pins, one a line (fetch_wheels.sh downloads these)
    python benchmarks/gpu/wheels.py check DIR  # the wheels in DIR are exactly the carried pins, and their own
                                               # metadata asks for nothing outside the lock

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
PYTHON = "3.12"  # the image's Python: the carried wheels are downloaded for CPython 3.12, manylinux x86_64
# The image's own packages, as last seen there (None: a version not recorded). torch is resolved as its CPU build
# of the version pods-rl's CI uses (the image's CUDA build of 2.11 pulls nvidia-* wheels that are not resolved here;
# only torch's own requirement names matter for the closure).
IMAGE = {"torch": "2.11.0", "transformers": "5.17.0", "accelerate": "1.15.0", "huggingface-hub": "1.33.0",
         "peft": "0.21.2", "pyarrow": "21.0.0", "numpy": None, "matplotlib": None, "sympy": None}
RESOLVE_TORCH = "torch==2.13.0"  # stands in for the image's torch in the resolution (see IMAGE)
# Pins for what pods-rl needs that the resolution would otherwise pick newer than the image allows.
CARRIED_PINS = {
    "trl": "1.16.0",       # the top of TRL_RANGE (CI tests both ends)
    "datasets": "4.8.5",   # 5.x asks pyarrow>=24, newer than the image's 21
}
NOT_NEEDED = {
    "networkx": "torch imports it for torch.compile's graph partitioner only; the preset runs eagerly",
    "setuptools": "torch imports it to build C++ extensions only",
    "hf-xet": "huggingface_hub's Xet transfers from the hub; the preset is offline (HF_HUB_OFFLINE=1)",
    "triton": "the image's CUDA build of torch brings its own",
}


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``PyYAML`` -> ``pyyaml``, ``typing_extensions`` -> ``typing-extensions``."""
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


def status_of(name: str) -> str:
    """``image``, ``not needed: <why>`` or ``carried`` for a distribution of the closure."""
    if name in IMAGE:
        return "image"
    if name in NOT_NEEDED:
        return f"not needed: {NOT_NEEDED[name]}"
    if name.startswith(("nvidia-", "cuda-")):
        return "not needed: the image's CUDA build of torch brings its own CUDA libraries"
    return "carried"


def base_dependencies() -> list[str]:
    """pods-rl's base dependencies, as pyproject.toml lists them (read with a regex: no tomllib on Python 3.10)."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.M | re.S).group(1)
    return re.findall(r'^\s*"([^"]+)"', block, re.M)


def resolve() -> dict:
    """Resolve the closure with pip (``--dry-run --report``: metadata only, nothing installed) into the lock's form."""
    wanted = [RESOLVE_TORCH, *(f"{n}=={v}" if v else n for n, v in IMAGE.items() if n != "torch"),
              *(f"{n}=={v}" for n, v in CARRIED_PINS.items()), *base_dependencies()]
    report = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                             "--report", "-", *wanted], check=True, capture_output=True, text=True).stdout
    packages = {}
    for item in json.loads(report)["install"]:
        meta = item["metadata"]
        name = canonical(meta["name"])
        packages[name] = {"version": meta["version"], "requires": requirement_names(meta.get("requires_dist")),
                          "status": status_of(name)}
    roots = sorted({canonical(re.match(r"[A-Za-z0-9_.-]+", d).group(0)) for d in base_dependencies()})
    reached = closure(roots, packages)
    for name, package in packages.items():
        if name not in reached:  # pip installs it for an extra (fsspec[http] -> aiohttp): nothing imports it here
            package["status"] = "not needed: reached only through an extra (e.g. datasets' fsspec[http])"
    return {"python": PYTHON, "roots": roots, "packages": dict(sorted(packages.items()))}


def closure(roots: list[str], packages: dict) -> set[str]:
    """Every distribution reached from ``roots`` through the lock's requirements (extras not followed)."""
    todo, seen = list(roots), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += packages.get(name, {}).get("requires", [])
    return seen


def load() -> dict:
    """The lock (wheels.lock.json)."""
    return json.loads(LOCK.read_text())


def carried(lock: dict | None = None) -> dict[str, str]:
    """{distribution: version} of the wheels that go to the machine."""
    lock = lock or load()
    return {name: p["version"] for name, p in lock["packages"].items() if p["status"] == "carried"}


def lock_problems(lock: dict | None = None) -> list[str]:
    """What makes the lock incomplete: a requirement of any package in the closure (from pods-rl's base
    dependencies) that the lock does not hold, or a status that is not one of the three."""
    lock = lock or load()
    packages = lock["packages"]
    problems = []
    for name in sorted(closure(lock["roots"], packages)):
        if name not in packages:
            problems.append(f"{name}: required but not in the lock")
        elif not (packages[name]["status"] in ("carried", "image") or packages[name]["status"].startswith(
                "not needed: ")):
            problems.append(f"{name}: unknown status {packages[name]['status']!r}")
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


def main(argv: list[str] | None = None) -> int:
    """``lock``, ``list`` or ``check DIR`` (see the module docstring); exit code 1 when ``check`` finds a problem."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lock"]:
        lock = resolve()
        LOCK.write_text(json.dumps(lock, indent=1) + "\n")
        print(f"wrote {LOCK}: {len(carried(lock))} carried of {len(lock['packages'])}")
        return 1 if lock_problems(lock) else 0
    if argv[:1] == ["list"]:
        print("\n".join(f"{n}=={v}" for n, v in carried().items()))
        return 0
    if argv[:1] == ["check"] and len(argv) == 2:
        problems = lock_problems() + wheel_problems(Path(argv[1]))
        print("\n".join(problems) or f"{argv[1]}: the {len(carried())} carried wheels, complete")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
