"""Every GGUF quantization type the MLX backend reads equals gguf-py's dequantization.

A tiny qwen3 GGUF (hidden 256 so 256-wide K / IQ blocks fit a row) holds every matrix in the type
under test as RANDOM block bytes (any bit pattern is a valid block once its fp16 scales are
finite), so the check covers every code and scale a real file can hold. Exact-affine types must
come back as MLX quantized triples, the rest as float; every tensor is compared with
`gguf.quants.dequantize`. Tolerance: float32 rounding only (the triple holds the reference's
float32 scale and bias; see backends/mlx/gguf_checkpoint.SPOT_CHECK_RTOL).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest

from specfill.backends.mlx import gguf_blocks
from specfill.backends.mlx.weights import load_checkpoint
from specfill.core.errors import ModelLoadError, SpecfillWarning
from specfill.core.models import expected_tensor_shapes
from tests.fixtures.checkpoints import tiny_model_args, tiny_weights, write_gguf_file

T = gguf.GGMLQuantizationType
EXACT = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K")
AS_FLOAT = (
    "Q2_K",
    "Q3_K",
    "Q6_K",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ1_S",
    "IQ1_M",
    "IQ4_NL",
    "IQ4_XS",
    "TQ1_0",
    "TQ2_0",
    "BF16",
    "F16",
)
RTOL = 2.0**-20  # of each 32-wide group's largest |value| (see gguf_checkpoint.SPOT_CHECK_RTOL)


def close_per_group(got: np.ndarray, expected: np.ndarray) -> bool:
    rows = expected.reshape(-1, expected.shape[-1])
    err = np.abs(got.reshape(rows.shape) - rows).reshape(rows.shape[0], -1, 32)
    return bool((err <= RTOL * np.abs(rows).reshape(err.shape).max(-1, keepdims=True)).all())


def random_blocks(qtype: T, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Random bytes of `shape` in `qtype`, with bit 6 of every odd byte cleared: every fp16 field
    sits at an even offset, so its exponent stays < 16 (|scale| < 2) and finite."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (shape[0], shape[1] // block * size), dtype=np.uint8)
    data[:, 1::2] &= 0xBF
    return data


def write_model(tmp_path: Path, quant: str, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """The GGUF and, per HF name of each matrix, its reference dequantization."""
    args = dataclasses.replace(
        tiny_model_args("qwen3"), hidden_size=256, intermediate_size=256, num_hidden_layers=1, head_dim=64
    )
    rng = np.random.default_rng(seed)
    qtype = T[quant]
    raw = {
        name: (random_blocks(qtype, shape, rng), qtype)
        for name, shape in expected_tensor_shapes(args).items()
        if len(shape) == 2
    }
    path = write_gguf_file(tmp_path / f"q-{quant}.gguf", args, tiny_weights(args, seed=seed), raw=raw)
    ref = {name: gguf.quants.dequantize(blocks, qtype).astype(np.float32) for name, (blocks, _) in raw.items()}
    return path, ref


def held_as_float(checkpoint, name: str) -> np.ndarray:
    module = name[: -len(".weight")]
    if module in checkpoint.quantized:
        spec = checkpoint.quantized[module]
        w = mx.dequantize(
            checkpoint.weights[name],
            checkpoint.weights[f"{module}.scales"],
            checkpoint.weights[f"{module}.biases"],
            group_size=spec.group_size,
            bits=spec.bits,
        )
        return np.array(w.astype(mx.float32))
    return np.array(checkpoint.weights[name].astype(mx.float32))


@pytest.mark.parametrize("quant", EXACT + AS_FLOAT)
def test_every_tensor_equals_gguf_reference(tmp_path, quant):
    path, ref = write_model(tmp_path, quant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint = load_checkpoint(path)
    said = [str(w.message) for w in caught if issubclass(w.category, SpecfillWarning)]
    # said once, naming the type, where a quantized type is held as float (more memory than the file)
    assert len(said) == (quant in AS_FLOAT and quant not in ("BF16", "F16")), said
    assert all(quant in message for message in said), said
    for name, expected in ref.items():
        module = name[: -len(".weight")]
        assert (module in checkpoint.quantized) == (quant in EXACT), name
        assert close_per_group(held_as_float(checkpoint, name), expected), (quant, name)


def test_exact_types_keep_their_bits(tmp_path):
    for quant, bits in (("Q4_K", 4), ("Q5_0", 5), ("Q8_0", 8)):
        checkpoint = load_checkpoint(write_model(tmp_path, quant)[0])
        assert {spec.bits for spec in checkpoint.quantized.values()} == {bits}
        assert {spec.group_size for spec in checkpoint.quantized.values()} == {32}


@pytest.mark.parametrize("bits", (2, 3, 4, 5, 6, 8))
def test_pack_codes_is_mlx_layout(bits):
    """Our packing of known codes equals mx.quantize's for the same codes (MLX stores them as
    max - q with a negative scale, so quantize a ramp whose codes we know)."""
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 2**bits, (4, 64)).astype(np.uint8)
    codes[:, [0, 32]], codes[:, [1, 33]] = 0, 2**bits - 1  # each group spans the full range
    packed, _, _ = mx.quantize(mx.array(codes.astype(np.float32)), group_size=32, bits=bits)
    assert np.array_equal(gguf_blocks.pack_codes(2**bits - 1 - codes, bits), np.array(packed))


def test_spot_check_refuses_a_wrong_decoder(tmp_path, monkeypatch):
    """A decoder off by one code step in one place is caught at load, naming the type."""
    path, _ = write_model(tmp_path, "Q4_K")
    real = gguf_blocks._DECODERS[12]

    def off_by_one(blocks):
        codes, scales, biases = real(blocks)
        codes = codes.copy()
        codes[0, 0] ^= 1
        return codes, scales, biases

    monkeypatch.setitem(gguf_blocks._DECODERS, 12, off_by_one)
    with pytest.raises(ModelLoadError, match="Q4_K tensor .* off by"):
        load_checkpoint(path)


def test_type_gguf_cannot_read_is_one_error(tmp_path):
    args = dataclasses.replace(
        tiny_model_args("qwen3"), hidden_size=256, intermediate_size=256, num_hidden_layers=1, head_dim=64
    )
    shape = expected_tensor_shapes(args)["model.layers.0.mlp.up_proj.weight"]
    blocks = random_blocks(T.Q8_1, shape, np.random.default_rng(0))
    path = write_gguf_file(
        tmp_path / "q8_1.gguf", args, tiny_weights(args), raw={"model.layers.0.mlp.up_proj.weight": (blocks, T.Q8_1)}
    )
    with pytest.raises(ModelLoadError, match="Q8_1"):
        load_checkpoint(path)


QWEN = Path(os.environ.get("SPECFILL_CACHE", Path.home() / ".cache/specfill")) / "models"
SAMPLED_ROWS = 4096  # gguf's NumPy dequantization of the whole embedding took most of the test's minute


@pytest.mark.slow
@pytest.mark.parametrize("size", ("0.5b", "1.5b"))
def test_real_q4_k_m_file(size):
    """The real Qwen2.5-Coder Q4_K_M files (fetch_qwen_coder_pair.sh; not in CI): every tensor of
    the first and the last block and every tensor outside the blocks, which holds each GGML type
    and each tensor kind the file has (the blocks in between repeat them; dequantizing all of
    them with gguf's NumPy code took 3 of the suite's minutes), a big matrix's first and last rows."""
    path = QWEN / f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not fetched (evaluation-only file)")
    reader = gguf.GGUFReader(str(path))
    with pytest.warns(SpecfillWarning, match="Q6_K"):
        checkpoint = load_checkpoint(path)
    from specfill.core.io.weights import gguf_to_hf_name

    last = max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk."))
    chosen = [t for t in reader.tensors if not t.name.startswith("blk.") or t.name.split(".")[1] in ("0", str(last))]
    assert {t.tensor_type for t in chosen} == {t.tensor_type for t in reader.tensors}
    for tensor in chosen:
        name = gguf_to_hf_name(tensor.name, "qwen2")
        rows = len(tensor.data)  # a big matrix (the 152K-row embedding): its first and last SAMPLED_ROWS rows
        pick = np.r_[:SAMPLED_ROWS, rows - SAMPLED_ROWS : rows] if rows > 2 * SAMPLED_ROWS else np.arange(rows)
        expected = gguf.quants.dequantize(tensor.data[pick], tensor.tensor_type).astype(np.float32)
        assert close_per_group(held_as_float(checkpoint, name)[pick], expected), name
