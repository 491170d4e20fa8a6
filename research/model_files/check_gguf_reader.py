"""Per GGML type of a GGUF file: how far `mx.load` and specfill's MLX reader are from gguf-py.

    python research/model_files/check_gguf_reader.py FILE.gguf [--out results/models]

For every tensor, the worst |difference| per 32-wide group divided by that group's largest
|reference value| (gguf.quants.dequantize is the reference), and the share of 256-element blocks
off by more than 1% of the tensor's range. Writes gguf_reader_<stem>.json / .md. Evaluation only
(a real file takes minutes and GBs); the per-type tests are tests/mlx/test_gguf_quant_types.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np

from specfill.backends.mlx.weights import load_checkpoint  # noqa: E402
from specfill.core.io.weights import gguf_to_hf_name  # noqa: E402
from specfill.evaluation.machine import describe_machine, machine_line  # noqa: E402


def group_error(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(worst per-group relative error, share of 256-blocks off by > 1% of the tensor's range)."""
    rows = ref.reshape(-1, ref.shape[-1])
    diff = np.abs(got.reshape(rows.shape) - rows)
    scale = np.abs(rows).reshape(rows.shape[0], -1, 32).max(-1, keepdims=True)
    rel = float((diff.reshape(scale.shape[0], -1, 32) / np.maximum(scale, 1e-30)).max())
    blocks = diff.reshape(-1, 256).max(-1) if diff.size % 256 == 0 else diff.reshape(-1, 32).max(-1)
    return rel, float((blocks > 0.01 * np.abs(rows).max()).mean())


def dequantized(weights: dict, quantized: dict, name: str) -> np.ndarray:
    """A weight as float32, whether held as an MLX affine triple or plain."""
    module, _, part = name.rpartition(".")
    if module in quantized and part == "weight":
        bits = quantized[module]
        w = mx.dequantize(weights[name], weights[f"{module}.scales"], weights[f"{module}.biases"],
                          group_size=32, bits=bits)
        return np.array(w.astype(mx.float32))
    return np.array(weights[name].astype(mx.float32))


def mx_load_view(path: Path) -> dict | str:
    """mx.load's arrays (GGUF names; Q4_0/Q4_1/Q8_0 as affine triples), or why it failed."""
    try:
        return mx.load(str(path))
    except (RuntimeError, ValueError) as err:
        return f"mx.load failed: {err}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf_file", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    reader = gguf.GGUFReader(str(args.gguf_file))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    checkpoint = load_checkpoint(args.gguf_file)
    ours_bits = {m: s.bits for m, s in checkpoint.quantized.items()}
    theirs = mx_load_view(args.gguf_file)
    rows: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "specfill": [0.0, 0.0], "mx.load": [0.0, 0.0]})
    for i, tensor in enumerate(reader.tensors):
        print(f"\r{i + 1}/{len(reader.tensors)} {tensor.name:40s}", end="", file=sys.stderr, flush=True)
        ref = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        row = rows[tensor.tensor_type.name]
        row["tensors"] += 1
        hf = gguf_to_hf_name(tensor.name, arch)
        if hf in checkpoint.weights:
            got = dequantized(checkpoint.weights, ours_bits, hf)
            row["specfill"] = [max(a, b) for a, b in zip(row["specfill"], group_error(got, ref))]
        if not isinstance(theirs, str) and arch != "llama":  # llama's Q/K rows are permuted in the file
            got = _mx_load_tensor(theirs, tensor.name, ref.shape)
            row["mx.load"] = [max(a, b) for a, b in zip(row["mx.load"], group_error(got, ref))]
    print(file=sys.stderr)
    write(args, dict(rows), theirs if isinstance(theirs, str) else None)


def _mx_load_tensor(raw: dict, name: str, shape: tuple[int, ...]) -> np.ndarray:
    module, _, part = name.rpartition(".")
    if f"{module}.scales" in raw and part == "weight":
        bits = raw[name].shape[-1] * 32 // shape[-1]
        w = mx.dequantize(raw[name], raw[f"{module}.scales"], raw[f"{module}.biases"], group_size=32, bits=bits)
        return np.array(w.astype(mx.float32))
    return np.array(raw[name].astype(mx.float32))


def write(args: argparse.Namespace, rows: dict, mx_load_failure: str | None) -> None:
    stem = args.gguf_file.stem
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"file": args.gguf_file.name, "machine": describe_machine(), "mx_load_failure": mx_load_failure,
              "types": rows}
    (args.out / f"gguf_reader_{stem}.json").write_text(json.dumps(result, indent=2))
    lines = [f"# GGUF reader check: {args.gguf_file.name}", "", f"Machine: {machine_line(describe_machine())}", "",
             "Worst per-group relative error against gguf.quants.dequantize (|diff| / the 32-wide group's "
             "largest |value|; a group whose reference is all zeros makes any error huge) and share of 256-blocks off by > 1% of the tensor's range.", ""]
    if mx_load_failure:
        lines += [f"mx.load: {mx_load_failure}", ""]
    lines += ["| type | tensors | specfill MLX reader | blocks off | mx.load | blocks off |", "|---|---|---|---|---|---|"]
    for name, row in sorted(rows.items()):
        ours, theirs = row["specfill"], row["mx.load"]
        theirs_cells = "n/a | n/a" if mx_load_failure else f"{theirs[0]:.3g} | {theirs[1]:.1%}"
        lines.append(f"| {name} | {row['tensors']} | {ours[0]:.3g} | {ours[1]:.1%} | {theirs_cells} |")
    (args.out / f"gguf_reader_{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
