#!/usr/bin/env bash
# Download here (PyPI is reachable here, not on the GPU machine) the wheels the GPU machine lacks, for Python 3.12 on
# manylinux x86_64, into .wheels/ (git-ignored): carry that folder to the machine with the working tree (64 MiB in
# all). bench/gpu/run.sh installs from it. Versions: the ones this checkout's .venv runs (the tested ones).
#
#   bash bench/gpu/wheels.sh            # -> .wheels/*.whl, bitsandbytes shrunk to cpu + cuda130, total checked < 60 MiB
#                                       #    (with trl and requirements-gpu.txt's liger-kernel: about 29 MiB)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.wheels}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DEST"

version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

# The project's pinned packages, then what they need that the machine may lack (pick installs only what it lacks).
PINNED=(transformers peft datasets bitsandbytes trl)
DEPS=(tokenizers dill multiprocess xxhash hjson pydantic pydantic-core annotated-types typing-inspection
      typing-extensions msgpack einops py-cpuinfo)
SPECS=()
for name in "${PINNED[@]}" "${DEPS[@]}"; do SPECS+=("$name==$(version "$name")"); done
# GPU-only pins (not installed here: Triton cannot run on this CPU): their version from requirements-gpu.txt. Their
# triton comes with the machine's CUDA torch (run.sh's env step records whether it is there).
while read -r spec; do SPECS+=("$spec"); done < <(grep -E '^[A-Za-z0-9._-]+==' requirements-gpu.txt)

# pip takes --platform literally (manylinux_2_28 does not admit older manylinux wheels): name each glibc level the
# machine's manylinux_2_28 runs (bitsandbytes is tagged manylinux_2_24, most binary wheels manylinux_2_17).
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --dest "$DEST" "${SPECS[@]}"

# DeepSpeed is published as a source archive only: use the pure-Python wheel pip built when it was installed here,
# else build one (DS_BUILD_OPS=0: its C++/CUDA ops compile on first use, on the machine that uses them).
DS="deepspeed-$(version deepspeed)-py3-none-any.whl"
if [ ! -f "$DEST/$DS" ]; then
    cached=$(find "${PIP_CACHE_DIR:-$HOME/.cache/pip}" -name "$DS" 2>/dev/null | head -n 1 || true)
    if [ -n "$cached" ]; then
        cp "$cached" "$DEST/"
    else
        DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$DEST" \
            "deepspeed==$(version deepspeed)"
    fi
fi

"$PY" bench/gpu/wheels.py shrink-bnb "$DEST"
"$PY" bench/gpu/wheels.py check "$DEST" --limit-mib 60
ls -l "$DEST"
