"""`python -m specfill ...`: the same command line as the `specfill` script."""

import sys

from specfill.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
