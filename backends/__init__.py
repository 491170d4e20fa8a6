"""Backends: `mlx` (MLX + Metal kernels) and `torch_cuda` (PyTorch + Triton kernels).

Each exposes load(path, dtype=None, device=None) -> (model, tokenizer) and the same module names.
"""
