#!/usr/bin/env bash
# CI: build the documentation site with warnings as errors (a broken link, a missing page, a docstring griffe cannot
# parse fails), as a user does: `make docs`. Its own virtual environment (.venv-docs) with the pinned doc tools only:
# the API reference is read statically, so neither torch nor pods-rl's dependencies are installed. The one download
# besides the doc tools is mermaid.min.js, pinned and checked by its hash (docs/_scripts/mermaid_offline.py), so that
# the built site draws its diagrams offline. Bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
timeout 1500 make docs SITE_DIR=.venv-docs/site
# The built site's own checks (tests/test_docs_site.py: search from disk, relative 404 links, wrapping code), now that
# .venv-docs holds the doc tools (in `make test` above they had nothing to build with).
# Its browser checks (search from disk, the 404 page served at any depth) need Chromium: Debian's, installed here if
# absent, and required (PODS_REQUIRE_CHROMIUM=1: a missing browser fails instead of skipping).
if ! command -v chromium >/dev/null; then
    timeout 300 apt-get update -qq && timeout 600 apt-get install -y -qq chromium >/dev/null
fi
PODS_REQUIRE_CHROMIUM=1 timeout 600 .venv/bin/python -m pytest -q tests/test_docs_site.py -p no:cacheprovider
