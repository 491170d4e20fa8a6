"""specfill: faster time-to-first-token for long prompts on one device.

    from specfill import load, generate, stream_generate
    model, tokenizer = load("model.gguf", backend="mlx")   # or backend="cuda"
    text = generate(model, tokenizer, prompt, max_tokens=64, method="h2o")

The sub-packages live in the repository's top-level folders (see pyproject.toml):
  specfill.core         the spec: configs, stage interfaces, NumPy reference (NumPy only)
  specfill.backends     mlx (Metal kernels) and torch_cuda (Triton kernels)
  specfill.conformance  the suite every backend must pass
  specfill.cli          the `specfill` command
"""

from .api import GenerationResponse, generate, load, stream_generate

__version__ = "0.1.0"
__all__ = ["GenerationResponse", "generate", "load", "stream_generate"]
