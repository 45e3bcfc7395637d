"""``python -m tileflash ...``: same as the ``tileflash`` console script."""

import sys

from tileflash.cli import main

if __name__ == "__main__":
    sys.exit(main())
