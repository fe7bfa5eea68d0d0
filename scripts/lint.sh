#!/usr/bin/env bash
# Every pre-commit hook over the whole tree (.pre-commit-config.yaml): ruff lint, ruff
# format check, strict mypy, import-linter's contracts and scripts/private_reaches.py over
# src/ (no package uses another's `_` names); exits non-zero when any hook fails. The
# hooks run the tools of the active environment; this checkout's .venv is used when no
# environment is active.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${VIRTUAL_ENV:-}" && -x .venv/bin/python ]]; then
    export PATH="$PWD/.venv/bin:$PATH"
fi
for tool in pre-commit ruff mypy lint-imports; do
    if ! command -v "$tool" >/dev/null; then
        echo "lint.sh: '$tool' is not installed in this environment;" \
             "install the test extra: pip install -e '.[test]'" >&2
        exit 2
    fi
done
exec pre-commit run --all-files "$@"
