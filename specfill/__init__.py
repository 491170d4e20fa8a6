"""specfill: faster time-to-first-token for long prompts on one device.

    from specfill import load, generate, stream_generate
    model, tokenizer = load("model.gguf", backend="mlx")   # or backend="cuda"
    text = generate(model, tokenizer, prompt, max_tokens=64, method="h2o")

    import specfill
    session = specfill.open("model.gguf", speculator="self:8")   # backend, device: the platform's
    text = session.generate(prompt, max_tokens=64, method="specprefill")

The sub-packages live in the repository's top-level folders (see pyproject.toml):
  specfill.core         the spec: configs, stage interfaces, NumPy reference (NumPy only)
  specfill.backends     mlx (Metal kernels) and torch_cuda (Triton kernels)
  specfill.conformance  the suite every backend must pass
  specfill.cli          the `specfill` command
"""

from .api import GenerationResponse, Session, generate, load, stream_generate
from .api import open as open  # specfill.open: a Session (the redundant alias re-exports it)

__version__ = "0.1.0"
# `open` stays out of the star-import: `from specfill import *` must not hide the builtin open
__all__ = ["GenerationResponse", "Session", "generate", "load", "stream_generate"]
