#!/usr/bin/env bash
# A one-node Slurm for the tests that submit to a real one (tests/slurm_cluster.py starts and stops
# it): Debian's slurm-wlm and munge, installed only where missing. Idempotent; says nothing unless
# the install fails.
set -euo pipefail
missing=0
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || missing=1
done
[ "$missing" -eq 0 ] && exit 0
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { "${as_root[@]}" apt-get update -qq \
       && DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends slurm-wlm munge
     } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-slurm.sh: apt-get could not install slurm-wlm and munge" >&2
  exit 1
fi
