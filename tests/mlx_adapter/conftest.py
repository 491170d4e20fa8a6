"""Tests of the mlx-lm adapter: tiny random-weight mlx-lm models built from configs written here.
Skips the folder where mlx or mlx-lm is not installed."""
from __future__ import annotations

import importlib.util

if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
    collect_ignore_glob = ["test_*.py"]
