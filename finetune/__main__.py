"""`python -m finetune ...`"""

import os
import sys

# Training shares 2-core machines with the web server and other jobs: spinning OpenMP threads then slow every step
# many-fold (bench/results/cpu-threads.md). Set before torch is imported; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from finetune.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
