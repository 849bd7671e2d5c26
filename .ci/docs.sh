#!/usr/bin/env bash
# CI: build the documentation site with warnings as errors (a broken link, a missing page, a docstring griffe cannot
# parse fails). Its own virtual environment with the pinned doc tools only: the API reference is read statically,
# so neither torch nor pods-rl's dependencies are installed. Bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-docs
. .venv-docs/bin/activate
python -m pip install -q --upgrade pip
# The pinned doc tools, read from pyproject.toml's `docs` extra (installing the extra itself would pull in torch).
python -c "import tomllib" 2>/dev/null || python -m pip install -q tomli   # tomllib is Python 3.11+
python - <<'PY' > .venv-docs/docs-requirements.txt
try:
    import tomllib
except ImportError:
    import tomli as tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))
PY
timeout 900 python -m pip install -q -r .venv-docs/docs-requirements.txt
# Offline: nothing in the build fetches from the network (no plugin that downloads; search runs in the browser).
DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 timeout 600 mkdocs build --strict --site-dir .venv-docs/site
deactivate
