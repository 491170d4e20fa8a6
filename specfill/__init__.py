"""specfill: faster time-to-first-token for long prompts on one device.

The sub-packages live in the repository's top-level folders (see pyproject.toml):
  specfill.core         the spec: configs, stage interfaces, NumPy reference (NumPy only)
  specfill.backends     mlx (Metal kernels) and torch_cuda (Triton kernels)
  specfill.conformance  the suite every backend must pass
  specfill.cli          the `specfill` command
"""
__version__ = "0.1.0"
