# Sourced by the scripts in bin/: create (or refresh) a virtualenv with
# everything the project needs, from PyPI, on a fresh machine. Reinstalls only
# when pyproject.toml (or the pin) changed since the last install.
#
# VENV (default .venv) names the virtualenv; SCRAPY_PIN (e.g. "scrapy==2.18.*")
# installs that Scrapy instead of the newest one, for bin/test-oldest-scrapy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
venv="${VENV:-.venv}"
pin="${SCRAPY_PIN:-}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.installed-$( (cat pyproject.toml; echo "$pin") | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # shellcheck disable=SC2086 # an empty pin adds no argument
  "$venv/bin/python" -m pip install --quiet -e ".[test,lint,bench,docs]" $pin
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
export PATH="$root/$venv/bin:$PATH"
