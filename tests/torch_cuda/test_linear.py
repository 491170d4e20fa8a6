"""backends/torch_cuda/model.py (Linear): the weight-left product for few rows on the CPU.

Tolerance: the two orders sum the same products differently; fp32 rounding over 256 terms of
unit-scale values stays below 1e-4 absolute (measured ~1e-6), so 1e-4 catches any wrong product.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from specfill.backends.torch_cuda.model import WEIGHT_LEFT_MAX_ROWS, Linear, few_row_products


def layer(bias: bool) -> Linear:
    torch.manual_seed(0)
    return Linear(256, 96, bias=bias)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 256), (2, 256), (1, 5, 256), (4, 16, 256), (1, 65, 256), (300, 256)])
def test_equals_nn_linear(shape, bias):
    lin = layer(bias)
    x = torch.randn(*shape)
    with few_row_products():
        out = lin(x)
    assert out.shape == (*shape[:-1], 96) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, lin.weight, lin.bias), rtol=0, atol=1e-4)


def ops_called(lin: Linear, rows: int, few: bool = True) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if few:
            with few_row_products():
                lin(torch.randn(1, rows, 256))
        else:
            lin(torch.randn(1, rows, 256))
    return {event.key for event in prof.key_averages()}


def test_few_rows_take_the_weight_left_product():
    lin = layer(False)
    assert "aten::linear" in ops_called(lin, 1)  # one row: nn.Linear's GEMV is as fast
    assert "aten::linear" not in ops_called(lin, 5)  # a verify round's k + 1 rows
    assert "aten::linear" not in ops_called(lin, WEIGHT_LEFT_MAX_ROWS)
    assert "aten::linear" in ops_called(lin, WEIGHT_LEFT_MAX_ROWS + 1)  # prefill chunks
    assert "aten::linear" in ops_called(lin, 5, few=False)  # outside a verify step: one order always


def test_state_dict_is_nn_linears():
    assert set(layer(True).state_dict()) == {"weight", "bias"}


def test_torch_ops_verify_scope_is_the_few_row_products():
    from specfill.backends.torch_cuda.ops import TorchOps

    lin, x = layer(False), torch.randn(1, 5, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with TorchOps(torch.device("cpu"), torch.float32).verify_scope():
            lin(x)
    assert "aten::linear" not in {event.key for event in prof.key_averages()}
