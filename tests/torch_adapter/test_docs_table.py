"""docs/models.md shows the torch model types x methods table these tests run (regenerate it with
`python -m tests.torch_adapter.table --write` when the set of model types or refusals changes)."""
from tests.torch_adapter.table import DOC, table


def test_the_docs_table_is_the_generated_one():
    assert table() in DOC.read_text(), "docs/models.md is stale: python -m tests.torch_adapter.table --write"
