#!/usr/bin/env bash
# Each test file of a directory alone, one after another, N times (issue 47): a test that
# passes beside its siblings but fails alone (or in one order, or under load) leans on
# something another test left or on timing. Run by hand, not in CI.
#   scripts/test-alone.sh DIR [N]     N: rounds, default 3
# Serial (no xdist workers), the checkout's .venv; every failure's test id at the end, and
# exit 1 if any failed.
set -uo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 DIR [N]" >&2; exit 2; }
DIR=$1
N=${2:-3}
case "$N" in ''|*[!0-9]*) echo "$0: N must be a number: $N" >&2; exit 2;; esac
cd "$(dirname "$0")/.."
[ -d "$DIR" ] || { echo "$0: no such directory: $DIR" >&2; exit 2; }
PY=.venv/bin/python
[ -x "$PY" ] || { echo "$0: no $PY (bash scripts/setup.sh makes it)" >&2; exit 2; }
# as scripts/test.sh: OpenMPI refuses to run as root unless told
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# this checkout's code first, even where .venv is another checkout's (its editable install)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mapfile -t FILES < <(find "$DIR" -name 'test_*.py' -type f | sort)
[ ${#FILES[@]} -gt 0 ] || { echo "$0: no test_*.py under $DIR" >&2; exit 2; }
LOGS=$(mktemp -d)
failed=()
runs=0
for round in $(seq 1 "$N"); do
  for f in "${FILES[@]}"; do
    runs=$((runs + 1))
    log="$LOGS/$round-$(echo "$f" | tr / _).log"
    # -n 0: no xdist workers (tests/conftest.py reads xdist's options, so it stays loaded)
    "$PY" -m pytest -q -p no:cacheprovider -n 0 -rfE "$f" >"$log" 2>&1
    rc=$?
    echo "round $round/$N  $f: $(tail -n 1 "$log")"
    if [ "$rc" -ne 0 ]; then
      ids=$(grep -E '^(FAILED|ERROR) ' "$log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//')
      [ -n "$ids" ] || ids="$f (pytest exit $rc)"
      while IFS= read -r id; do failed+=("round $round: $id  (log: $log)"); done <<<"$ids"
    fi
  done
done
echo
if [ ${#failed[@]} -eq 0 ]; then
  echo "test-alone: $runs file runs over $N rounds, no failure"
  rm -rf "$LOGS"
  exit 0
fi
echo "test-alone: ${#failed[@]} failure(s) in $runs file runs over $N rounds:"
printf '  %s\n' "${failed[@]}"
exit 1
