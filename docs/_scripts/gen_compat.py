"""Write docs/reference/compatibility.md: what each CI lane tests, with which versions, read from the files that
decide them (pyproject.toml, the Makefile, .ci/run, .ci/lane-*.sh, the GPU image's constraints).

    python docs/_scripts/gen_compat.py          # rewrite the page
    python docs/_scripts/gen_compat.py --check  # exit 1 when the committed page differs from what it gives

The standard library only (the GPU image's pins come from `python benchmarks/gpu/wheels.py constraints`, which
needs `packaging`, as every environment of the project has). tests/test_reference_pages.py regenerates the page
and fails when it differs from the committed one, so a pin changed in a lane changes this page in the same commit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # generated_page, beside this script
from generated_page import write_or_check  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "compatibility.md"


def read(relative: str) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


def one(pattern: str, text: str, where: str) -> str:
    found = re.findall(pattern, text, flags=re.M)
    if len(found) != 1:
        raise SystemExit(f"gen_compat: expected one match of {pattern!r} in {where}, found {found!r}")
    return found[0]


def dependency(name: str, text: str) -> str:
    """``trl>=1.12,<1.17`` for ``trl``: the requirement as pyproject.toml's ``dependencies`` write it."""
    block = one(r"^dependencies = \[\n((?:.*\n)*?)\]", text, "pyproject.toml")
    return one(rf'"({re.escape(name)}(?:\[[^\]]*\])?[<>=!~][^"]*)"', block, "pyproject.toml's dependencies")


def extra(name: str, text: str) -> list[str]:
    """An optional-dependencies extra's requirements."""
    found = re.findall(rf"^{re.escape(name)} = \[(.*?)\]$", text, flags=re.M | re.S)
    if len(found) != 1:
        raise SystemExit(f"gen_compat: expected one extra {name!r} in pyproject.toml, found {len(found)}")
    return re.findall(r'"([^"]+)"', found[0])


def code(items) -> str:
    return ", ".join(f"`{item}`" for item in items)


def gpu_image_pins() -> dict[str, str]:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "wheels.py"), "constraints"],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.strip().split("==", 1) for line in out.splitlines() if "==" in line)


def render() -> str:
    pyproject, makefile, run = read("pyproject.toml"), read("Makefile"), read(".ci/run")
    python = one(r'^requires-python = "([^"]+)"', pyproject, "pyproject.toml")
    torch_default = one(r"^TORCH_SPEC \?= (\S+)", makefile, "Makefile")
    base = {name: dependency(name, pyproject) for name in ("torch", "trl", "transformers", "accelerate", "peft")}
    oldest_trl = one(r'pip install -q "(trl==[0-9][^"]*)"', run, ".ci/run")
    lanes = {lane: read(f".ci/lane-{lane}.sh") for lane in ("verl", "deepspeed", "vllm", "gpu-image")}
    lane_torch = {lane: one(r'pip install -q "(torch==[^"]+)"', text, f".ci/lane-{lane}.sh")
                  for lane, text in lanes.items() if lane != "gpu-image"}
    vllm_trl = one(r'pip install -q "(trl==[^"]+)"', lanes["vllm"], ".ci/lane-vllm.sh")
    source = "\n".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "src" / "pods_rl").rglob("*.py")))
    trl_range = one(r'^TRL_RANGE = "([^"]+)"', source, "src/pods_rl")  # wherever the modules live
    verl_range = one(r'^VERL_RANGE = "([^"]+)"', source, "src/pods_rl")
    image = gpu_image_pins()
    image_shown = [f"{name}=={image[name]}" for name in ("torch", "transformers", "accelerate", "trl", "peft",
                                                         "datasets") if name in image]
    rows = [
        ("main: `make test` (`.ci/run`)", "the whole suite, CPU, 1-2 ranks (gloo)",
         f"`{torch_default}` (CPU build)", f"`{base['trl']}`: the newest pip resolves",
         f"`{base['transformers']}`: the newest pip resolves", code([base["accelerate"], base["peft"]])),
        ("oldest TRL (`.ci/run`)", "the tests that touch TRL's internals, again", f"`{torch_default}` (CPU build)",
         f"`{oldest_trl}`", "as main", "`aiohttp` (TRL 1.12's asynchronous trainer imports it)"),
        ("release (`.ci/wheel-check.sh`)", "the wheel and sdist built, the wheel installed alone, `pods train` run",
         f"`{torch_default}`", "as main", "as main", "nothing of the source tree"),
        ("verl (`.ci/lane-verl.sh`)", "`tests/verl/`: verl's trainer, Ray, TransferQueue on CPU",
         f"`{lane_torch['verl']}`", "as main (verl's pins permitting)", "verl's range",
         code(extra("verl", pyproject))),
        ("DeepSpeed (`.ci/lane-deepspeed.sh`)",
         "`tests/deepspeed/`: the `zero2` and `zero3` launch configs on 2 CPU ranks",
         f"`{lane_torch['deepspeed']}`", "as main", "as main", code(extra("deepspeed", pyproject))),
        ("vLLM (`.ci/lane-vllm.sh`)", "`tests/vllm/`: vLLM's CPU build in `PODSTrainer`, `pods train` and a "
         "`vllm serve` server with the asynchronous worker; the one-line refusals again on the older TRL",
         f"`{lane_torch['vllm']}`",
         code([r for r in extra("vllm-cpu", pyproject) if r.startswith("trl")]) + f" (then `{vllm_trl}`)",
         "what vLLM's CPU build accepts", code([r for r in extra("vllm-cpu", pyproject) if not r.startswith("trl")])),
        ("GPU image (`.ci/lane-gpu-image.sh`)", "the GPU preset's dry run and the trainer tests, on CPU, with the "
         "GPU image's versions", f"`torch=={image.get('torch', '?')}`", f"`trl=={image.get('trl', '?')}`",
         f"`transformers=={image.get('transformers', '?')}`",
         code([p for p in image_shown if not p.startswith(("torch==", "trl==", "transformers=="))])),
        ("docs (`.ci/docs.sh`)", "`make docs`: `mkdocs build --strict`, no torch", "none", "none", "none",
         code(extra("docs", pyproject)[:2]) + ", ... (the `docs` extra)"),
        ("next TRL (`.ci/trl-next.sh`)", "`tests/test_trl_surface.py`, `tests/test_dropin.py` on the newest TRL past "
         "the supported range; never fails CI, says what broke", f"`{torch_default}`",
         f"the index's newest, if past `{trl_range}`", "as main", ""),
    ]
    lines = [
        "# Compatibility",
        "",
        "<!-- Generated by docs/_scripts/gen_compat.py from pyproject.toml, the Makefile and .ci/; do not edit by "
        "hand. tests/test_reference_pages.py fails when this page and those files differ. -->",
        "",
        f"pods-rl needs Python `{python}` and {code(base[n] for n in ('torch', 'trl', 'transformers'))}. It "
        f"refuses at start a TRL outside `{trl_range}` (`TRL_RANGE`), a verl outside `{verl_range}` "
        "(`VERL_RANGE`) and a vLLM outside the range the installed TRL supports. What each CI lane installs "
        "and runs, each lane in an environment of its own on a 2-core CPU machine with no GPU (`.ci/run` runs "
        "them in this order):",
        "",
        "| lane | what it runs | torch | TRL | transformers | also |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    lines += [
        "",
        "A range means the newest version inside it that pip resolves on the day CI runs. The versions each "
        "measured result ran on are in its JSON (`machine`: torch, transformers, TRL) and in its page's header "
        "([Results](../results/index.md)). Nothing above ran on a GPU; what has run on one: "
        "[On a GPU](../guides/gpu.md).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(PAGE, render(), "gen_compat.py", argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
