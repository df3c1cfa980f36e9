#!/bin/sh
# Installs the locked dependencies into .venv: `install.sh runtime` (what `make run` needs) or
# `install.sh dev` (tests, lint, benchmarks too). Called by make; safe to run twice at once (two
# make targets on a fresh clone): one waits for the other under a lock, then finds it done.
# The lock files (requirements/*.txt, with hashes) are made by `make lock`.
set -eu
kind=$1
venv=.venv
stamp="$venv/.installed-$kind-$(cat pyproject.toml "requirements/$kind.txt" | cksum | cut -d' ' -f1)"
[ -f "$stamp" ] && exit 0
mkdir -p "$venv"
exec 9>"$venv.lock"
if ! flock -n 9; then
    echo "make: another make is installing dependencies into $venv; waiting for it (a minute on a fresh clone)" >&2
    flock 9
fi
[ -f "$stamp" ] && exit 0  # made while this one waited
if [ ! -x "$venv/bin/python" ]; then
    echo "make: creating $venv" >&2
    "${PYTHON:-python3}" -m venv "$venv"
fi
size="about 60 MB"
[ "$kind" = runtime ] && size="about 400 MB, most of it the Claude Code CLI inside claude-agent-sdk"
[ "$kind" = dev ] && size="about 750 MB: the runtime (the Claude Code CLI is most of it), tests and lint"
echo "make: installing the $kind dependencies into $venv from requirements/$kind.txt ($size; a minute on a fresh clone)" >&2
"$venv/bin/python" -m pip install --disable-pip-version-check --no-color --progress-bar off \
    --require-hashes -r "requirements/$kind.txt"
"$venv/bin/python" -m pip install --disable-pip-version-check --no-color --progress-bar off --quiet \
    --no-deps -e .
rm -f "$venv/.installed-$kind-"*
touch "$stamp"
echo "make: $kind dependencies installed" >&2
