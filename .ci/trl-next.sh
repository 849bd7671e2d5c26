#!/usr/bin/env bash
# CI, informational (never fails the build): meet the next TRL before users do.
#
# When the package index has a TRL newer than TRL_RANGE's upper bound (src/pods_rl/engines/trl/config.py), install it in a
# throwaway environment and run the TRL surface pins (tests/test_trl_surface.py) and the drop-in conformance suite
# (tests/test_dropin.py) against it, then say plainly whether it breaks pods-rl and which surface items moved.
# Users stay protected by the pin either way, so this step always exits 0.
#   TRL_NEXT_VERSION=1.17.0   try this version instead of the index's newest (also one inside the range)
#   TRL_NEXT_TIMEOUT=1500     seconds for the whole step: install and tests (default 1500)
set -uo pipefail
cd "$(dirname "$0")/.."
say() { echo "trl-next: $*"; }
budget=${TRL_NEXT_TIMEOUT:-1500}
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }

PY=.venv/bin/python; [ -x "$PY" ] || PY=python3  # the project environment has packaging
upper=$("$PY" -c '
import re
from packaging.specifiers import SpecifierSet
text = open("src/pods_rl/engines/trl/config.py").read()
spec = SpecifierSet(re.search(r"^TRL_RANGE = \"([^\"]+)\"", text, re.M).group(1))
print(next(s.version for s in spec if s.operator == "<"))' 2>/dev/null)
if [ -z "$upper" ]; then say "could not read TRL_RANGE's upper bound from src/pods_rl/engines/trl/config.py; skipped."; exit 0; fi

newest=$(timeout 120 python3 -m pip index versions trl 2>/dev/null | sed -nE 's/^trl \(([^)]+)\).*/\1/p' | head -1)
candidate=${TRL_NEXT_VERSION:-$newest}
if [ -z "$candidate" ]; then say "could not ask the package index for TRL's versions; skipped."; exit 0; fi
if [ -z "${TRL_NEXT_VERSION:-}" ] && "$PY" -c "import sys; from packaging.version import Version as V; sys.exit(V('$candidate') >= V('$upper'))"; then
  say "the index's newest TRL is $candidate, inside the supported range (<$upper): nothing to try."
  exit 0
fi

say "trying TRL $candidate (supported: <$upper) in a throwaway environment (budget ${budget} s)"
env_dir=$(mktemp -d /tmp/pods-trl-next.XXXXXX)
trap 'rm -rf "$env_dir"' EXIT
log="$env_dir/pytest.log"
install() {  # each command bounded by what is left of the budget
  timeout "$(left)" "$@" >> "$env_dir/install.log" 2>&1
}
if ! { install python3 -m venv "$env_dir/venv" &&
       install "$env_dir/venv/bin/python" -m pip install -q --upgrade pip &&
       install "$env_dir/venv/bin/python" -m pip install -q "torch==2.13.0" &&
       install "$env_dir/venv/bin/python" -m pip install -q -e ".[dev]" &&
       install "$env_dir/venv/bin/python" -m pip install -q "trl==$candidate"; }; then  # past the pin on purpose
  say "could not install TRL $candidate within the budget; nothing learned. Last lines of the install log:"
  tail -5 "$env_dir/install.log" | sed 's/^/trl-next:   /'
  exit 0
fi

got=$("$env_dir/venv/bin/python" -c "from importlib.metadata import version; print(version('trl'))")
PODS_RL_TRY_TRL=$got timeout "$(left)" "$env_dir/venv/bin/python" -m pytest -q -rf -p no:cacheprovider \
  tests/test_trl_surface.py tests/test_dropin.py > "$log" 2>&1
status=$?
summary=$(tail -1 "$log")
if [ $status -eq 0 ]; then
  say "TRL $got passes the TRL surface pins and the drop-in suite ($summary): widening TRL_RANGE past <$upper looks safe."
elif [ $status -eq 124 ]; then
  say "TRL $got: the tests did not finish within the budget (${budget} s); no verdict. Last lines:"
  tail -5 "$log" | sed 's/^/trl-next:   /'
else
  say "*** TRL $got BREAKS pods-rl ($summary). CI still passes: users are pinned to trl<$upper. ***"
  moved=$(grep -E '^FAILED tests/test_trl_surface.py' "$log")
  if [ -n "$moved" ]; then
    say "surface items that moved (tests/test_trl_surface.py; each message names the TRL method and what changed):"
    echo "$moved" | sed -E 's/^FAILED tests\/test_trl_surface.py::/trl-next:   /'
  else
    say "no pinned surface item moved; the breakage is in behaviour (the conformance suite):"
  fi
  grep -E '^FAILED tests/test_dropin.py' "$log" | sed -E 's/^FAILED tests\/test_dropin.py::/trl-next:   drop-in: /'
fi
exit 0
