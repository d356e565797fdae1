"""`python -m finetune ...`"""

import sys

from finetune.process_env import apply_defaults

apply_defaults()  # before torch is imported

from finetune.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
