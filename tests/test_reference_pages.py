"""The generated reference pages (#63): docs/reference/config.md from PODSConfig's and `pods train`'s field
metadata, docs/reference/compatibility.md from pyproject.toml, the Makefile and the CI lanes. Each committed page is
what its generator gives now, so a field or a pin changed without the page fails here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.test_docs_build import load

ROOT = Path(__file__).resolve().parent.parent


def test_the_config_reference_is_generated_from_the_fields():
    from trl import GRPOConfig

    from pods_rl import PODSConfig
    from pods_rl.recipes import RunArguments

    generator = load("gen_config_ref")
    committed = generator.PAGE.read_text(encoding="utf-8")
    assert committed == generator.render(), (
        "docs/reference/config.md is out of date: python docs/_scripts/gen_config_ref.py"
    )
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = [f for f in dataclasses.fields(PODSConfig) if f.name not in trl_fields]
    assert len(own) >= 15
    for field in [*own, *dataclasses.fields(RunArguments)]:
        assert f"### `{field.name}`" in committed, f"docs/reference/config.md lacks {field.name}"
        help_text = " ".join(field.metadata.get("help", "").split())
        assert help_text in committed, field.name
    # TRL's fields are linked, not copied
    assert generator.TRL_GRPO_CONFIG in committed
    assert not any(f"### `{name}`" in committed for name in trl_fields)


def test_the_compatibility_table_is_generated_from_the_lanes():
    generator = load("gen_compat")
    committed = generator.PAGE.read_text(encoding="utf-8")
    assert committed == generator.render(), (
        "docs/reference/compatibility.md is out of date: python docs/_scripts/gen_compat.py"
    )
    for lane in ("verl", "deepspeed", "vllm", "gpu-image"):
        assert f".ci/lane-{lane}.sh" in committed and (ROOT / ".ci" / f"lane-{lane}.sh").is_file()
    for lane in sorted(p.name for p in (ROOT / ".ci").glob("lane-*.sh")):
        assert f".ci/{lane}" in committed, f"a CI lane the compatibility page does not list: {lane}"
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert "reference/config.md" in mkdocs and "reference/compatibility.md" in mkdocs
