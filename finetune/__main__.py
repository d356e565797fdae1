"""`python -m finetune ...`"""

import os
import sys

# Training shares 2-core machines with the web server and other jobs: spinning OpenMP threads then slow every step
# many-fold (bench/results/cpu-threads.md). Set before torch is imported; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# On a GPU the caching allocator reserved 9-24% above the live tensors' peak (issue 13); expandable segments are meant
# to cut that fragmentation. Set before torch initialises CUDA, unless the user configured the allocator (either name
# torch reads). The memory estimate keeps its measured slack until bench/gpu/run.sh measures the difference.
if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

from finetune.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
