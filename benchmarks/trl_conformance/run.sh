#!/usr/bin/env bash
# Run TRL's tests/test_grpo_trainer.py with trl.GRPOTrainer/GRPOConfig swapped per SWAP (see conftest.py).
#
#   TRL_GIT_DIR=/path/to/huggingface/trl/.git benchmarks/trl_conformance/run.sh SWAP [OUTFILE] [-- PYTEST ARGS...]
#
# SWAP: grpo | pods_eq | pods_lt. OUTFILE (optional): where the pytest output is written (also printed).
# PYTEST ARGS after `--` replace the default selection (`-k` of selected_tests.txt), e.g. a node id:
#   run.sh grpo out.txt -- "tests/test_grpo_trainer.py::TestGRPOTrainer::test_init_minimal"
#
# Environment (defaults):
#   TRL_GIT_DIR  required: a git dir of huggingface/trl; its HEAD's tests/ and scripts/generate_zen_dataset.py are
#                used (never committed here). The `fetch` tool's snapshot (the git directory it names);
#                or `git clone https://github.com/huggingface/trl && TRL_GIT_DIR=trl/.git`.
#   WORKDIR      ${TMPDIR:-/tmp}/pods_trl_conformance: the stand-ins (built once by build_standins.py), the copied tests,
#                the swapping conftest and a snapshot of src/ are put there; pytest runs from it.
#   PYTHON       <repo>/.venv/bin/python
#   TIMEOUT      180 (pytest-timeout, seconds per test)
#   SELECTION    benchmarks/trl_conformance/selected_tests.txt (test names, one a line, joined into `-k`)
#   SNAPSHOT_SRC 1: copy the repository's src/ into WORKDIR at start and import pods_rl from that copy, so edits
#                made to src/ while the suite runs do not mix into it (0: import the installed pods_rl).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
SWAP="${1:?usage: run.sh grpo|pods_eq|pods_lt [OUTFILE] [-- PYTEST ARGS]}"
shift
OUTFILE=""
if [[ $# -gt 0 && "$1" != "--" ]]; then OUTFILE="$(realpath -m "$1")"; shift; fi
if [[ $# -gt 0 && "$1" == "--" ]]; then shift; fi
: "${TRL_GIT_DIR:?set TRL_GIT_DIR to a git dir of huggingface/trl (see README.md)}"
WORKDIR="${WORKDIR:-${TMPDIR:-/tmp}/pods_trl_conformance}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
TIMEOUT="${TIMEOUT:-180}"
SELECTION="${SELECTION:-$HERE/selected_tests.txt}"
SNAPSHOT_SRC="${SNAPSHOT_SRC:-1}"
export SWAP HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

mkdir -p "$WORKDIR"
if [[ ! -f "$WORKDIR/trl-internal-testing/BUILT_BY.json" ]]; then
    "$PYTHON" "$HERE/build_standins.py" "$WORKDIR" --trl-snapshot "$TRL_GIT_DIR"
fi
rm -rf "$WORKDIR/tests"
git --git-dir="$TRL_GIT_DIR" archive HEAD tests | tar -x -C "$WORKDIR"
cp "$HERE/conftest.py" "$WORKDIR/conftest.py"
printf '[pytest]\naddopts = -p no:cacheprovider\n' > "$WORKDIR/pytest.ini"

if [[ "$SNAPSHOT_SRC" == 1 ]]; then
    rm -rf "$WORKDIR/src_snapshot"
    mkdir -p "$WORKDIR/src_snapshot"
    cp -r "$REPO/src/pods_rl" "$WORKDIR/src_snapshot/pods_rl"
    export PYTHONPATH="$WORKDIR/src_snapshot${PYTHONPATH:+:$PYTHONPATH}"
fi

if [[ $# -eq 0 ]]; then
    KEXPR="$(grep -v '^\s*$' "$SELECTION" | paste -sd'|' | sed 's/|/ or /g')"
    set -- tests/test_grpo_trainer.py -k "$KEXPR"
fi

{
    echo "# SWAP=$SWAP  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# repo HEAD $(git -C "$REPO" rev-parse HEAD); uncommitted src changes: $(git -C "$REPO" status --short src | wc -l) paths, git diff HEAD -- src sha256 $(git -C "$REPO" diff HEAD -- src | sha256sum | cut -c1-16)$([[ "$SNAPSHOT_SRC" == 1 ]] && echo ' (copied to WORKDIR/src_snapshot at start)')"
    echo "# trl tests from $TRL_GIT_DIR at $(git --git-dir="$TRL_GIT_DIR" rev-parse HEAD)"
    echo "# $("$PYTHON" -c 'import platform,torch,trl,transformers,datasets,peft,accelerate; print(f"python {platform.python_version()} torch {torch.__version__} trl {trl.__version__} transformers {transformers.__version__} datasets {datasets.__version__} peft {peft.__version__} accelerate {accelerate.__version__}")')"
} | tee ${OUTFILE:+"$OUTFILE"}

cd "$WORKDIR"
set +e
"$PYTHON" -m pytest -q -rfEs --timeout "$TIMEOUT" "$@" 2>&1 | tee ${OUTFILE:+-a "$OUTFILE"}
rc=${PIPESTATUS[0]}
echo "EXIT $rc" | tee ${OUTFILE:+-a "$OUTFILE"}
exit "$rc"
