#!/usr/bin/env bash
# Runs Pants for this repo with the given arguments, from any directory: tools/pants/run.sh test packages/roll-protocol::
#
# Pants 2.17.1, the newest on PyPI, runs only on Python 3.7-3.9, and it downloads the pex CLI from github.com, which
# CI cannot reach. So, once and under the git-ignored tools/.cache/, this script
#   1. creates a venv with pantsbuild.pants from a Python 3.9 ($ROLL_PANTS_PYTHON, else PATH, else pyenv);
#   2. builds the pex CLI from its PyPI release to the file that [pex-cli] in pants.toml points at;
# and on every run it
#   3. hands pip's find-links folders (where the CPU torch wheel lies) and CA bundle to Pants, since pants.toml hides
#      pip's machine-wide config from pex.
# Bootstrap output goes to tools/.cache/pants-bootstrap.log and is shown only if a step fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="$ROOT/tools/.cache"
PANTS_REQ="pantsbuild.pants==2.17.1"
# Must match [pex-cli] version (and url_template) in pants.toml.
PEX_VERSION="2.1.137"
VENV="$CACHE/pants-venv"
PEX_CLI="$CACHE/pex-cli/pex-v$PEX_VERSION"
LOG="$CACHE/pants-bootstrap.log"

die() {
  printf 'tools/pants/run.sh: %s\n' "$*" >&2
  exit 1
}

# Prints the real interpreter behind $1 if it is a CPython 3.9 (pyenv shims exist for versions that are not active,
# so every candidate is run, not just looked up).
real_python39() {
  "$1" -c 'import sys; assert sys.version_info[:2] == (3, 9); print(sys.executable)' 2>/dev/null
}

find_python39() {
  if [[ -n "${ROLL_PANTS_PYTHON:-}" ]]; then
    real_python39 "$ROLL_PANTS_PYTHON" || die "ROLL_PANTS_PYTHON=$ROLL_PANTS_PYTHON is not a Python 3.9"
    return 0
  fi
  local cand
  if cand="$(command -v python3.9)" && real_python39 "$cand"; then
    return 0
  fi
  local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
  if command -v pyenv >/dev/null 2>&1; then
    pyenv_root="$(pyenv root)"
  fi
  # Newest 3.9.x first.
  while read -r cand; do
    [[ -n "$cand" ]] && real_python39 "$cand" && return 0
  done < <(ls -d "$pyenv_root"/versions/3.9*/bin/python3.9 2>/dev/null | sort -V -r)
  die "Pants 2.17 needs Python 3.9, found none (not python3.9 on PATH, nor under $pyenv_root/versions).
Install one (e.g. \`pyenv install 3.9\`) or point ROLL_PANTS_PYTHON at one."
}

# Runs a bootstrap step with its output in $LOG, shown only if the step fails.
quietly() {
  if ! "$@" >>"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2
    die "bootstrap step failed: $* (full log: $LOG)"
  fi
}

bootstrap_venv() {
  local stamp="$VENV/.roll-stamp"
  # The venv is rebuilt if the pin changed or its interpreter is gone.
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$PANTS_REQ" ]] && "$VENV/bin/python" -c '' 2>/dev/null; then
    return 0
  fi
  local python
  python="$(find_python39)"
  rm -rf "$VENV"
  : >"$LOG"
  quietly "$python" -m venv "$VENV"
  quietly "$VENV/bin/python" -m pip install --disable-pip-version-check "$PANTS_REQ"
  echo "$PANTS_REQ" >"$stamp"
}

# $1: the CA bundle to trust, or empty.
build_pex_cli() {
  [[ -f "$PEX_CLI" ]] && return 0
  # pantsbuild.pants depends on this same pex release, so the venv already has the tool that builds it.
  local args=("pex==$PEX_VERSION" -c pex -o "$PEX_CLI.tmp" --python-shebang '/usr/bin/env python3')
  [[ -n "$1" ]] && args+=(--cert "$1")
  mkdir -p "$(dirname "$PEX_CLI")"
  : >"$LOG"
  quietly "$VENV/bin/pex" "${args[@]}"
  # Moved into place only once complete, so an interrupted build never leaves a partial file behind.
  mv "$PEX_CLI.tmp" "$PEX_CLI"
}

# Prints, from pip's configuration (config files and PIP_* variables), the lines
#   find_links=<the find-links entries as a Pants list of URLs>
#   cert=<the CA bundle pip trusts>
# each only when pip has such a setting.
pip_settings() {
  "$VENV/bin/python" - <<'PY'
import ast
import pathlib
import subprocess
import sys

out = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
).stdout
links, cert = [], None
for line in out.splitlines():
    key, sep, value = line.partition("=")
    name = key.rpartition(".")[2]
    if not sep or name not in ("find-links", "cert"):
        continue
    value = ast.literal_eval(value)
    if name == "cert":
        if pathlib.Path(value).expanduser().is_file():
            cert = str(pathlib.Path(value).expanduser().resolve())
        continue
    for entry in value.split():
        if "://" in entry:
            url = entry
        elif pathlib.Path(entry).expanduser().exists():
            url = pathlib.Path(entry).expanduser().resolve().as_uri()
        else:
            continue
        if url not in links:
            links.append(url)
if links:
    print(f"find_links={links!r}")
if cert:
    print(f"cert={cert}")
PY
}

mkdir -p "$CACHE"
# Concurrent first runs would otherwise build the same venv at once.
exec 9>"$CACHE/pants-bootstrap.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
bootstrap_venv
find_links="" cert=""
while IFS= read -r setting; do
  case "$setting" in
    find_links=*) find_links="${setting#find_links=}" ;;
    cert=*) cert="${setting#cert=}" ;;
  esac
done < <(pip_settings)
build_pex_cli "$cert"
exec 9>&-

# Pants hides pip's config from pex (see [subprocess-environment] in pants.toml), so what the resolves need from it is
# passed as Pants options: the find-links folders (the CPU torch wheel lies there) and the CA bundle (needed behind a
# TLS-inspecting proxy). A setting already in the environment wins.
if [[ -n "$find_links" ]]; then
  export PANTS_PYTHON_REPOS_FIND_LINKS="${PANTS_PYTHON_REPOS_FIND_LINKS:-$find_links}"
fi
if [[ -n "$cert" ]]; then
  export PANTS_CA_CERTS_PATH="${PANTS_CA_CERTS_PATH:-$cert}"
fi

# The scie launcher that Pants recommends instead of a pip-installed Pants downloads from github.com; silence the nag.
export NO_SCIE_WARNING=1
cd "$ROOT"
exec "$VENV/bin/pants" "$@"
