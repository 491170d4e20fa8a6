"""docs/models.md shows each backend's architectures x methods table these tests run (regenerate it
with `python -m tests.adapters.mlx_table --write` / `tests.adapters.torch_table` when the set of
architectures or refusals changes)."""


def test_the_docs_table_is_the_generated_one(backend):
    table = backend.table
    assert table.table() in table.DOC.read_text(), f"docs/models.md is stale: python -m {table.__name__} --write"
