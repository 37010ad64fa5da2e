#!/usr/bin/env bash
# Set up fbench on a fresh machine: the host venv (no torch), then each backend's own env.
# Idempotent: a second run reuses what is there and only re-creates what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# The bundled backends are plugin distributions of their own, installed like a third-party one.
.venv/bin/python -m pip install -q --disable-pip-version-check -e backends/xtuner -e backends/llamafactory \
    -e backends/torch
# One virtual environment per backend (xtuner pins transformers 4.48, llamafactory needs >=4.55;
# torch, the plain-PyTorch reference, has only torch + transformers).
.venv/bin/fbench env create
