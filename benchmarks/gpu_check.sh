#!/usr/bin/env bash
# The one-GPU check, on a machine with no network (the device machine: python3 is Python 3.12
# with torch; no pydantic, deepspeed or flash-attn; benchmarks/device/h200-python312.txt).
#
#   bash benchmarks/gpu_check.sh --dry                       # plans + the estimate on one H200
#   bash benchmarks/gpu_check.sh --bundle DIR --out OUTDIR   # install from DIR, then run
#        [--budget SECONDS (420)] [--limit SECONDS] [--work DIR (/tmp/fbench-device)]
# --limit: the whole script's time limit (the device tool's 600 s a call): the runs' budget is
# cut to what the install leaves of it, less 20 s to write the files.
#
# DIR is made beforehand, where there is network: `fbench device bundle DIR --python 3.12`.
# Real mode installs fbench's missing host wheels into a venv layered over the machine's
# python3 and fbench with its backends editable from this checkout
# (framework_bench/device/install.py), builds every backend env over the machine's own torch
# from DIR (--no-index --no-deps), then runs `fbench device check` (framework_bench/device/check.py:
# the order, the budget, the files of OUTDIR). On a machine without a GPU it does the same with
# the cpu flavour and tiny_cpu: the rehearsal (tests/test_device_rehearsal.py).
# Real mode reads nothing of .venv, ../shared, the user's pip configuration or the network.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# PIP_FIND_LINKS and a config file's indexes or constraints are honoured even with --no-index.
for var in $(compgen -e); do
  case "$var" in PIP_*) unset "$var" ;; esac
done
export PIP_CONFIG_FILE=/dev/null
PY=${FBENCH_PYTHON:-python3}
dry=0 bundle="" out="" budget=420 limit="" work="${TMPDIR:-/tmp}/fbench-device"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) dry=1 ;;
    --bundle) bundle=$2; shift ;;
    --out) out=$2; shift ;;
    --budget) budget=$2; shift ;;
    --limit) limit=$2; shift ;;
    --work) work=$2; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --dry, or --bundle DIR --out DIR [--budget S] [--limit S] [--work DIR])" >&2; exit 2 ;;
  esac
  shift
done
BACKENDS=(torch xtuner llamafactory trl swift)
# QLoRA needs bitsandbytes, which the device machine lacks and the bundle cannot carry.
echo "gpu_check.sh: QLoRA is left out: bitsandbytes 0.45.0 (the version XTuner pins) is a 66 MiB wheel, over the" \
     "bundle's 56 MiB cap, and ships kernels up to CUDA 12.6 only (the device has CUDA 13)" >&2

if [ "$dry" = 1 ]; then
  # fbench's host as installed here: FBENCH names its command, else fbench on PATH, else the
  # checkout's own .venv/bin/fbench (what the README's commands run after scripts/setup.sh)
  if [ -n "${FBENCH:-}" ]; then fb=("$FBENCH")
  elif command -v fbench >/dev/null; then fb=(fbench)
  elif [ -x "$root/.venv/bin/fbench" ]; then fb=("$root/.venv/bin/fbench")
  else echo "gpu_check.sh: no fbench: run bash scripts/setup.sh (it makes .venv/bin/fbench), or set FBENCH" >&2; exit 2
  fi
  scenario_args=()
  for s in tiny_cuda llama2_7b_8k_1gpu llama2_7b_32k_1gpu llama2_7b_8k_1gpu_zero3; do scenario_args+=(--scenario "$s"); done
  "${fb[@]}" compare "${scenario_args[@]}" --backends "$(IFS=,; echo "${BACKENDS[*]}")" --launcher local --dry-run
  exec "${fb[@]}" device estimate --budget "$budget"
fi

[ -n "$bundle" ] && [ -n "$out" ] || { echo "gpu_check.sh: real mode needs --bundle DIR and --out DIR (or --dry)" >&2; exit 2; }
bundle=$(cd "$bundle" && pwd)
mkdir -p "$out" && out=$(cd "$out" && pwd)
started=$(date +%s)
host_python=$(PYTHONPATH="$root" "$PY" -m framework_bench.device.install --bundle "$bundle" --work "$work" | tail -n 1)
export FBENCH_HOME="$work/home" FBENCH_DATA="$bundle/data/alpaca-demo"
fb=("$(dirname "$host_python")/fbench")
extra=()
if command -v nvidia-smi >/dev/null; then
  flavour=cuda
  # ZeRO-3 through DeepSpeed, on the GPU only (the bundle's requirements-zero.txt).
  while read -r spec; do extra+=(--with "$spec"); done < "$bundle/requirements-zero.txt"
else
  flavour=cpu
fi
# The envs side by side, as scripts/setup.sh makes them (each is one single-threaded pip; every
# line they print starts with the backend's name). One backend's failed env must not stop the
# others: its runs are then stored as failed.
for b in "${BACKENDS[@]}"; do
  "${fb[@]}" env create "$b" --flavour "$flavour" --system-site-packages --no-index --find-links "$bundle/wheels" \
    --no-deps --requirements "$bundle/requirements-$b.txt" "${extra[@]}" || echo "gpu_check.sh: env create $b failed" >&2 &
done
wait
"${fb[@]}" env list
installed=$(( $(date +%s) - started ))
echo "install took $installed s"
if [ -n "$limit" ] && [ $(( limit - installed - 20 )) -lt "$budget" ]; then
  budget=$(( limit - installed - 20 ))
  echo "runs' budget cut to $budget s by --limit $limit"
fi
exec "${fb[@]}" device check --out "$out" --budget "$budget" --device "$flavour"
