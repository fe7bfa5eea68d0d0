#!/usr/bin/env bash
# Build the documentation (guides and API reference) into build/docs with every Sphinx
# warning an error, after checking that every public name has a docstring
# (scripts/check_docstrings.py). Needs the docs extra: pip install -e ".[docs]".
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${VIRTUAL_ENV:-}" && -x .venv/bin/python ]]; then
    export PATH="$PWD/.venv/bin:$PATH"
fi
if ! command -v sphinx-build >/dev/null; then
    echo "docs.sh: 'sphinx-build' is not installed in this environment;" \
         "install the docs extra: pip install -e '.[docs]'" >&2
    exit 2
fi
status=0
python scripts/check_docstrings.py || status=1
sphinx-build -W --keep-going -q -b html docs build/docs || status=1
exit "$status"
