"""Environment defaults every training process gets, set before torch is imported (the CLI entry and the app)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def apply_defaults(env: MutableMapping[str, str] = os.environ) -> None:
    """Passive OpenMP threads and CUDA's expandable segments, unless the user set either."""
    # Training shares 2-core machines with the web server and other jobs: spinning OpenMP threads then slow every step
    # many-fold (bench/results/cpu-threads.md).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # On a GPU the caching allocator reserved 9-24% above the live tensors' peak (docs/memory.md); expandable segments
    # are meant to cut that fragmentation. Set before torch initialises CUDA, unless the user configured the allocator
    # (either name torch reads). The memory estimate keeps its measured slack until bench/gpu/run.sh measures the
    # difference.
    if not (env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF")):
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
