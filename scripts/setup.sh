#!/usr/bin/env bash
# Set up fbench on a fresh machine: the host venv (no torch), then each backend's own env.
# Idempotent: a second run reuses what is there and only re-creates what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# The bundled backends are plugin distributions of their own, installed like a third-party one.
.venv/bin/python -m pip install -q --disable-pip-version-check -e backends/xtuner -e backends/llamafactory \
    -e backends/torch -e backends/trl \
    -e backends/swift
# One virtual environment per backend (xtuner pins transformers 4.48, llamafactory needs >=4.55;
# torch, the plain-PyTorch reference, has only torch + transformers), made side by side: each
# is one single-threaded pip, so together they use the machine's cores. Every line they print
# starts with the backend's name.
# A script's background jobs ignore Ctrl-C: it is passed on as SIGTERM, which `fbench env
# create` answers like Ctrl-C (the half-built env goes, an earlier one stays).
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM
for name in $(.venv/bin/python -c "from framework_bench.plugins import registry; print(*registry.backends())"); do
    .venv/bin/fbench env create "$name" &
    pids+=("$!")
done
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
exit "$failed"
