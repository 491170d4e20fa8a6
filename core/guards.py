"""Guards on what a loaded model computes: a model that loads but computes NaN or Inf must stop
with an error naming the likely cause, never print an end token and exit 0.

Backend-neutral: the caller reduces its logits to one bool in its own array library (one
device-to-host transfer, not the whole [T, vocab] array) and passes it here.
"""
from __future__ import annotations

from .errors import NonFiniteLogitsError
from .models import ModelArgs

HALF_DTYPES = ("float16", "fp16", "half", "bfloat16", "bf16")


def check_logits_finite(all_finite: bool, args: ModelArgs, *, where: str, dtype: str | None = None) -> None:
    """Raise NonFiniteLogitsError unless `all_finite` (every logit of `where`, e.g. "the first
    prefill", is finite). The message names the likely cause: half-precision overflow when the
    model runs in float16 / bfloat16, else the checkpoint's weights or numerics."""
    if all_finite:
        return
    if dtype is not None and str(dtype).lower() in HALF_DTYPES:
        cause = (f"the activations overflowed {dtype}: load the model with dtype float32 "
                 f"(--dtype float32)")
    else:
        cause = (f"the checkpoint's weights or numerics are broken (corrupt tensors or quantization "
                 f"scales, or an out-of-range setting: rms_norm_eps={args.rms_norm_eps:g}, "
                 f"rope_theta={args.rope_theta:g})")
    raise NonFiniteLogitsError(f"the model computed NaN or Inf logits in {where}: {cause}")
