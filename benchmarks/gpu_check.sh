#!/usr/bin/env bash
# One-shot check on a machine with one NVIDIA GPU and no network (e.g. the device machine).
#
#   bash benchmarks/gpu_check.sh --dry                 # plans only: runs on any machine (CI does)
#   bash benchmarks/gpu_check.sh --wheels DIR [--out DIR]
#
# Real mode: builds both backend envs from carried wheels over the machine's own torch
# (--system-site-packages, DIR/<backend>/*.whl installed with --no-index --no-deps: the
# frameworks declare dependencies their trainer path never imports; see
# ../shared/device-wheels/README.md), then runs tiny-llama on CUDA bf16 and the one-GPU
# Llama2-7B scenarios for both backends, prints one table (TGS, TFLOPs, MFU, peak
# allocated/reserved, start-up) and writes every run as JSON into --out.
# The machine has no network: FBENCH_DATA must name a carried folder holding
# alpaca_en_demo.json and alpaca_zh_demo.json, and fbench's host dependencies (pydantic,
# typer, pluggy, rich, pyyaml, matplotlib, tokenizers) must be importable there (FBENCH names
# the fbench command to use, default .venv/bin/fbench).
set -euo pipefail
cd "$(dirname "$0")/.."
FBENCH=${FBENCH:-.venv/bin/fbench}
SCENARIOS=(tiny_cuda llama2_7b_8k_1gpu llama2_7b_32k_1gpu llama2_7b_8k_1gpu_zero3)
BACKENDS=(xtuner llamafactory)
dry=0 wheels="" out="gpu_check"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) dry=1 ;;
    --wheels) wheels=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --dry, --wheels DIR, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done
scenario_args=()
for s in "${SCENARIOS[@]}"; do scenario_args+=(--scenario "$s"); done
backends=$(IFS=,; echo "${BACKENDS[*]}")

if [ "$dry" = 1 ]; then
  exec "$FBENCH" compare "${scenario_args[@]}" --backends "$backends" --launcher local --dry-run
fi

[ -n "$wheels" ] || { echo "gpu_check.sh: real mode needs --wheels DIR (DIR/xtuner, DIR/llamafactory)" >&2; exit 2; }
[ -n "${FBENCH_DATA:-}" ] || { echo "gpu_check.sh: set FBENCH_DATA to a folder holding alpaca_en_demo.json and alpaca_zh_demo.json (no network here)" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "gpu_check.sh: no nvidia-smi: this is not a GPU machine (use --dry)" >&2; exit 1; }
mkdir -p "$out"
for b in "${BACKENDS[@]}"; do
  [ -d "$wheels/$b" ] || { echo "gpu_check.sh: no wheels for $b in $wheels/$b" >&2; exit 1; }
  # The carried wheels are the requirements: exactly those, over the machine's torch.
  req="$out/requirements-$b.txt"
  ls "$(cd "$wheels/$b" && pwd)"/*.whl > "$req"
  "$FBENCH" env create "$b" --flavour cuda --system-site-packages --no-index --find-links "$wheels/$b" \
    --no-deps --requirements "$req"
done
"$FBENCH" env list
"$FBENCH" compare "${scenario_args[@]}" --backends "$backends" --db "$out/results.sqlite" --out "$out" || true
"$FBENCH" results export json --db "$out/results.sqlite" > "$out/runs.json"
echo "runs written to $out/runs.json"
