"""A tensor's layout family, as the attention probe keys and reproduces it: which dims are padded past
their compact stride and how the storage offset aligns, whatever the sizes (a view of a fused projection,
a cache's filled slots of a larger capacity). A kernel can mishandle an alignment, so a call in another
family is probed apart (attention_choice)."""

from __future__ import annotations

import torch

# A layout family: (the dims from the innermost out, each one's padding class, the storage offset's class).
Layout = tuple[tuple[int, ...], tuple[int, ...], int]
ALIGN = 8  # elements: 16 bytes of bf16 / fp16, the alignment vector loads and TMA descriptors ask of a stride


def _padding(elements: int) -> int:
    """A dim's elements past its compact stride as the probe reproduces them: 0, or ALIGN x 8 plus the
    same remainder modulo ALIGN (the alignment is what a kernel can mishandle, not the amount; a cache's
    padding, its unfilled slots, shrinks every step and must not make every step a new family)."""
    return 0 if elements == 0 else ALIGN * 8 + elements % ALIGN


def layout(t: torch.Tensor) -> Layout:
    """t's layout family, whatever its sizes, e.g. q [1, Hq, T, D] as a view of a fused [1, T, (Hq + Hkv)
    x D] projection: ((3, 1, 2, 0), (0, 0, 64, 0), 0), its tokens padded; a cache's filled slots [1, Hkv,
    S, D] of a larger capacity: ((3, 2, 1, 0), (0, 0, 64, 0), 0), its heads padded. Dims of size 1 count
    as outermost and compact; overlapping strides (a broadcast) as contiguous."""
    shape, stride = tuple(t.shape), t.stride()  # read once: an eager decode asks every layer
    sized = sorted((d for d in range(len(shape)) if shape[d] > 1), key=lambda d: (stride[d], d))
    order = (*sized, *(d for d in range(len(shape) - 1, -1, -1) if shape[d] <= 1))
    padding, span = [], 1
    for d in order:
        past = stride[d] - span if shape[d] > 1 else 0
        if past < 0:
            return tuple(range(len(shape) - 1, -1, -1)), (0,) * len(shape), 0
        padding.append(_padding(past))
        span = (span + past) * shape[d]
    return order, tuple(padding), t.storage_offset() % ALIGN


def laid_out(family: Layout | None, shape: tuple[int, ...], gen: torch.Generator, dtype, device) -> torch.Tensor:
    """Unit-normal values of `shape` in the layout `family` (None: contiguous), every element of the
    storage random (padding included: a kernel reading past a row reads noise, not zeros)."""
    if family is None:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    order, padding, offset = family
    strides, span = [0] * len(shape), 1
    for d, past in zip(order, padding):
        strides[d] = span + past
        span = strides[d] * shape[d]
    flat = torch.randn(offset + span, generator=gen, device=device, dtype=torch.float32).to(dtype)
    return flat.as_strided(shape, strides, offset)


def label_layouts(layouts: tuple[Layout, ...] | None) -> str:
    """' (q dim 2 padded; k dim 1 padded; v ...)' for chosen()'s key where a layout is not contiguous,
    '' where none is."""
    if not layouts or all(not any(padding) and not offset for _, padding, offset in layouts):
        return ""
    parts = []
    for name, (order, padding, offset) in zip("qkv", layouts):
        said = [f"dim {d} padded" for d, past in zip(order, padding) if past] + ([f"offset {offset}"] if offset else [])
        parts.append(f"{name} {', '.join(said) if said else 'compact'}")
    return f" ({'; '.join(parts)})"
