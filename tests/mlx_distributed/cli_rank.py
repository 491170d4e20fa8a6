"""`specfill ARGS` on one rank under mlx.launch (mlx.launch runs a script, not `-m specfill`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from specfill.cli.main import main

sys.exit(main(sys.argv[1:]))
