"""Torch backend tests run on one thread: the machine is shared and the models are tiny."""

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    torch.set_num_threads(1)
