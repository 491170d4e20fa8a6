"""Tests of the transformers adapter: tiny random-weight transformers models built from configs
written here. Skips the folder where torch or transformers is not installed; one thread (the
machine is shared and the models are tiny)."""
from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    import torch

    @pytest.fixture(autouse=True, scope="session")
    def _one_thread() -> None:
        torch.set_num_threads(1)
