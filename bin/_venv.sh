# Sourced by the scripts in bin/: create (or refresh) .venv with everything
# the project needs, from PyPI, on a fresh machine. Reinstalls only when
# pyproject.toml changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test,lint,bench,docs]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
