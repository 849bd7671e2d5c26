# Two commands on a fresh machine with Python 3.10+ and pip:
#
#     make train      the embedded default: `pods train` (more arguments: make train ARGS="--max_train_seconds 60")
#     make test       the test suite: `python -m pytest -q -n auto`, one worker per core up to TEST_WORKERS (4), a
#                     test file per worker at a time (a part of it: make test ARGS="tests/test_downsample.py")
#
# Each creates or reuses the project's virtual environment .venv and, when pyproject.toml (or the torch choice) changed
# since the last install, installs torch and the project with its dev extras into it, then runs.
#
#     make docs       the documentation site, into site/ (SITE_DIR=...), in an environment of its own without torch;
#                     the first build also downloads Mermaid (the diagrams' script, about 3 MB) once from the npm registry
#
# torch: on a machine without CUDA, the CPU build of TORCH_SPEC from TORCH_INDEX (PyTorch's CPU index); with CUDA
# (nvidia-smi works) or on macOS, PyPI's default build. Choose another with e.g.
#     make test TORCH_SPEC="torch==2.13.0" TORCH_INDEX=https://download.pytorch.org/whl/cu128
# A matching torch wheel that pip already has at hand (its find-links, e.g. a CI cache) is used first, without
# asking an index for torch (its dependencies then come from pip's usual index).
# PYTHON picks the interpreter that creates .venv; VENV another folder.
#
# Managing your own environment instead: pip install "torch==2.13.0" -e ".[dev]" (see the README).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
ifeq ($(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda)$(filter Darwin,$(shell uname -s)),)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
else
TORCH_INDEX ?=
endif
ARGS ?=
TEST_WORKERS ?= 4

BIN := $(VENV)/bin
STAMP := $(VENV)/.pods-installed

.PHONY: train test install pack-runs unpack-runs docs
train: install
	$(BIN)/pods train $(ARGS)

test: install
	$(BIN)/python -m pytest -q -n auto --maxprocesses $(TEST_WORKERS) --dist loadfile $(ARGS)

# The stamp holds what was installed: pyproject.toml's hash and the torch choice. Anything else -> install again.
install:
	@set -e; \
	if [ ! -x "$(BIN)/python" ]; then \
		echo "make: creating $(VENV) with $(PYTHON)"; \
		$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10) and "pods-rl needs Python 3.10+, this is " + sys.version.split()[0] + "; choose another with make PYTHON=python3.11")'; \
		$(PYTHON) -m venv "$(VENV)"; \
	fi; \
	key="$$($(BIN)/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())') $(TORCH_SPEC) $(TORCH_INDEX)"; \
	if [ -f "$(STAMP)" ] && [ "$$(cat "$(STAMP)")" = "$$key" ]; then exit 0; fi; \
	echo "make: installing $(TORCH_SPEC) and pods-rl[dev] into $(VENV)"; \
	$(BIN)/python -m pip install -q --upgrade pip; \
	if $(BIN)/python -m pip install -q --no-index --no-deps "$(TORCH_SPEC)" 2>/dev/null; then \
		$(BIN)/python -m pip install -q "$(TORCH_SPEC)"; \
	else \
		$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)); \
	fi; \
	$(BIN)/python -m pip install -q -e ".[dev]"; \
	echo "$$key" > "$(STAMP)"

# A study's raw runs, committed packed as STUDY/runs.tar.xz (benchmarks/results/cpu-2core-amd-epyc/README.md); no
# install needed (the standard library's tarfile and lzma):
#     make pack-runs STUDY=benchmarks/results/cpu-2core-amd-epyc/evidence/strong   (ARGS=--remove: then delete them)
#     make unpack-runs STUDY=benchmarks/results/cpu-2core-amd-epyc/evidence/strong
pack-runs unpack-runs:
	@test -n "$(STUDY)" || { echo "make: name the study's folder: make $@ STUDY=benchmarks/results/<machine>/<study>"; exit 2; }
	$(PYTHON) benchmarks/pack_runs.py $(@:-runs=) $(STUDY) $(ARGS)

# The documentation site, without torch: the pinned doc tools of pyproject.toml's `docs` extra in .venv-docs (installing
# the extra itself would install pods-rl's dependencies, torch among them: the API pages are read statically instead),
# then a strict build. Two banners about MkDocs 2.0 are silenced: mkdocs-material's (NO_MKDOCS_2_WARNING, read in
# material/templates/__init__.py) and properdocs' (DISABLE_MKDOCS_2_WARNING=true, properdocs/replacement_warning.py;
# mkdocs-gen-files and mkdocs-literate-nav import it).
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.docs-installed
SITE_DIR ?= site
docs:
	@set -e; \
	if [ ! -x "$(DOCS_VENV)/bin/python" ]; then $(PYTHON) -m venv "$(DOCS_VENV)"; fi; \
	$(DOCS_VENV)/bin/python docs/_scripts/docs_requirements.py > "$(DOCS_VENV)/docs-requirements.txt"; \
	if ! cmp -s "$(DOCS_VENV)/docs-requirements.txt" "$(DOCS_STAMP)"; then \
		echo "make: installing the doc tools into $(DOCS_VENV):" $$(cat "$(DOCS_VENV)/docs-requirements.txt"); \
		$(DOCS_VENV)/bin/python -m pip install -q --upgrade pip; \
		$(DOCS_VENV)/bin/python -m pip install -q -r "$(DOCS_VENV)/docs-requirements.txt"; \
		cp "$(DOCS_VENV)/docs-requirements.txt" "$(DOCS_STAMP)"; \
	fi; \
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(DOCS_VENV)/bin/mkdocs build --strict --site-dir "$(SITE_DIR)"; \
	echo "make: the site is in $(SITE_DIR)/: open $(SITE_DIR)/index.html (it reads from disk, search included)"
