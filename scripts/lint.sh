#!/usr/bin/env bash
# The static checks CI runs before the tests; each takes a few seconds, and any finding fails.
#   ruff check     pyflakes, pycodestyle's errors, bugbear (pyproject.toml [tool.ruff.lint])
#   mypy           supervisor/ and the console script as Python 3.10 reads them, and the conductor's
#                  test fakes against supervisor/ports.py ([tool.mypy])
#   vermin         nothing needs a Python newer than 3.10, as requires-python claims (CI has 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
"$BIN/ruff" check --quiet supervisor tests bench examples scripts _supervise_entry.py
"$BIN/mypy" --no-error-summary
"$BIN/vermin" --quiet --no-tips --violations --target=3.10- supervisor _supervise_entry.py
echo "lint: ruff, mypy, vermin: no findings"
