#!/usr/bin/env bash
# The Debian packages some tests drive for real: chromium (the browser tests) and slurm-wlm + munge (a two-node Slurm
# cluster started by tests/test_slurm.py). Installed with apt where this runs as root and they are missing; otherwise
# one line says which tests will skip. Never fails: the tests say themselves why they skip.
set -uo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v sbatch >/dev/null 2>&1 || missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || missing+=(munge)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} with apt-get (browser and Slurm tests)"
  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1; then
    exit 0
  fi
  echo "warning: could not install ${missing[*]}; the tests that need them will be skipped (pytest lists why)"
else
  echo "note: ${missing[*]} not installed (needs root: sudo apt-get install ${missing[*]});" \
    "the browser / Slurm tests will be skipped (pytest lists why)"
fi
exit 0
