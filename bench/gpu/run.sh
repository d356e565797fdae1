#!/usr/bin/env bash
# Every GPU check in one call of at most 8 minutes: install the carried wheels (.wheels/, made here by
# bench/gpu/wheels.sh) into a folder on PYTHONPATH, then bench/gpu/run.py runs pytest -m gpu, the memory totals,
# throughput against the plain script, packing (on / off / plain, Liger on and off, flex and flash kernels) and
# DeepSpeed ZeRO-2/3 +- offload, each step with its own time limit.
# Results: bench/results/gpu/ (summary.md, one .md per check, logs/); also copied into $OUT when it is set.
#
#   bash bench/gpu/run.sh               # on the GPU machine (carry .wheels with the working tree)
#   bash bench/gpu/run.sh --cpu         # here: the tiny CPU modes of every step (minutes)
#   bash bench/gpu/run.sh --dry-run     # here: every step's command parses; the summary is written
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
START=$(date +%s)
TOTAL=${FT_GPU_TOTAL_S:-470}  # the whole call; the caller's limit is 480 s (8 minutes)
# This checkout's virtual environment where there is one (here), else the machine's Python (the GPU machine).
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
SITE=${FT_GPU_SITE:-${TMPDIR:-/tmp}/finetune-gpu-site}

if compgen -G ".wheels/*.whl" > /dev/null; then
    mapfile -t NEED < <("$PY" bench/gpu/wheels.py pick .wheels)
    if [ "${#NEED[@]}" -gt 0 ]; then
        echo "installing ${#NEED[@]} carried wheels into $SITE"
        "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "${NEED[@]}" \
            || echo "wheel install failed: the checks run with what the machine has"
    fi
    export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

LEFT=$(( TOTAL - ($(date +%s) - START) - 10 ))  # 10 s for the copy-back
# The runner stops starting steps at its deadline; `timeout` is the net if a step's own limit fails.
timeout -k 5 $(( LEFT + 5 )) "$PY" bench/gpu/run.py --deadline "$LEFT" "$@"
CODE=$?

RESULTS=bench/results/gpu
prev=""
for arg in "$@"; do
    [ "$arg" = "--cpu" ] && RESULTS=bench/results/gpu-cpu
    [ "$prev" = "--results" ] && RESULTS=$arg
    prev=$arg
done
if [ -n "${OUT:-}" ] && [ -d "$RESULTS" ]; then
    mkdir -p "$OUT" && cp -r "$RESULTS" "$OUT/" && echo "results copied to $OUT/$(basename "$RESULTS")"
fi
echo "gpu checks done in $(( $(date +%s) - START ))s (exit $CODE)"
exit $CODE
