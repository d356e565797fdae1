"""`python -m finetune ...`"""

import sys

from finetune.cli import main

if __name__ == "__main__":
    sys.exit(main())
