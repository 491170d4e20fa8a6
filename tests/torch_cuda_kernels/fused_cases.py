"""The decoder's fused element-wise kernels (backends/torch_cuda/fused.py: RoPE, RMSNorm with its
residual add, SwiGLU's gating) against their torch formulas, through the model, and counted in a decode step.

Not collected by the main run (the name does not start with test_): test_torch_stages_kernels.py
runs it beside kernel_cases.py, under TRITON_INTERPRET=1 with CPU tensors when there is no GPU, on
CUDA otherwise (the GPU session's kernel step too).
"""

from __future__ import annotations

import pytest
import torch

from specfill.core import SpecfillWarning

from .torch_stages_support import DEVICE, DTYPES, assert_close, randn

torch.set_num_threads(1)


# (heads, tokens, head dim, fused-projection columns or None): a decode token's q and k heads together
# (8B-like 32 + 8 in miniature: 5 + 1 heads), a prefill step, a head dim whose half is no power of 2,
# more heads than one program takes
ROTARY = [(6, 1, 16, 8), (6, 37, 16, 8), (3, 9, 80, None), (20, 4, 16, 2)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,tokens,d,extra", ROTARY)
def test_rotary_kernel_is_the_formula_bitwise(heads, tokens, d, extra, dtype):
    """The rotary kernel (kernels/rope_triton.py) gives rope.apply_rope's formula bit for bit, on heads
    as the attention layer hands them over: a [1, H, T, D] view of a fused projection's columns
    (`extra` more heads' columns per token, the values'), or of a plain [1, T, H, D] tensor."""
    from specfill.backends.torch_cuda.kernels.rope_triton import rotary
    from specfill.backends.torch_cuda.rope import rotate_half

    columns = heads + (extra or 0)
    fused = randn(1, tokens, columns * d, dtype=dtype, device=DEVICE, seed=50, scale=3.0)
    x = fused[..., : heads * d].view(1, tokens, heads, d).transpose(1, 2)
    cos, sin = (randn(tokens, d, dtype=dtype, device=DEVICE, seed=seed) for seed in (51, 52))
    got = rotary(x, cos, sin)
    want = x * cos + rotate_half(x) * sin
    assert got.shape == want.shape and got.dtype == dtype
    assert [st for st, n in zip(got.stride(), got.shape) if n > 1] == [
        st for st, n in zip(want.stride(), got.shape) if n > 1
    ]
    assert torch.equal(got, want)


def test_the_model_runs_the_fused_kernels_when_kernels_are_forced(monkeypatch):
    """With kernels forced, every attention layer's RoPE is one launch (a Llama's q and k rotated with
    the cache writes: rotary_store; Qwen3's q and k apart after its per-head norms: rotary twice), every
    RMSNorm one rms_norm launch (with the residual add before it; Qwen3's q and k norms over the heads
    of the fused projection) and every MLP's gating one swiglu launch: the logits equal the formula
    path's bitwise with the rotations alone, within float32's tolerance with all three (the norms' sums
    of squares run in another order; the interpreter's SiLU takes NumPy's exp)."""
    from specfill.backends.torch_cuda import fused
    from specfill.backends.torch_cuda.kernels import dispatch
    from specfill.core.self_check import kernels_env
    from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

    fetch, launches = dispatch.triton_kernel, []

    def counting(name):
        kernel = fetch(name)
        return lambda *args: launches.append(name) or kernel(*args)

    ids = torch.tensor(prompt_ids(11), device=DEVICE)
    for arch, rotations in (("llama", 0), ("qwen3", 2)):
        model = make_tiny(arch).ours(device=DEVICE)
        layers = model.args.num_hidden_layers
        with kernels_env("off"):
            want = model(ids)
        monkeypatch.setattr(dispatch, "triton_kernel", counting)
        for norms in (False, True):
            launches.clear()
            with monkeypatch.context() as patch, kernels_env("on"):
                if not norms:
                    patch.setattr(fused, "norm_launchable", lambda x, weight: False)
                    patch.setattr(fused, "swiglu_launchable", lambda gate, up: False)
                got = model(ids)
            assert launches.count("rotary") == rotations * layers, (arch, launches)
            assert launches.count("rotary_store") == (0 if rotations else layers), (arch, launches)
            per_head = 2 * layers if arch == "qwen3" else 0  # its q and k norms, on the heads in place
            assert launches.count("rms_norm") == (2 * layers + 1 + per_head if norms else 0), (arch, launches)
            assert launches.count("swiglu") == (layers if norms else 0), (arch, launches)
            if norms:
                assert_close(got, want, torch.float32, f"{arch} logits")
            else:
                assert torch.equal(got, want), arch
        monkeypatch.setattr(dispatch, "triton_kernel", fetch)


# (query heads, KV heads, tokens, head dim, slots or None: the step's first slot): a decode token at a
# static step's slot, a verify step's slots out of order, a prefill step from slot 5, a head dim whose half
# is no power of 2, more heads than one program takes
ROTARY_STORE = [(5, 1, 1, 16, [7]), (4, 2, 3, 16, [9, 2, 5]), (6, 2, 37, 16, None), (3, 1, 4, 80, None),
                (20, 4, 2, 16, [0, 11])]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,tokens,d,slots", ROTARY_STORE)
def test_rotary_store_is_the_rotation_and_the_cache_writes_bitwise(heads, kv_heads, tokens, d, slots, dtype):
    """kernels/rope_triton.rotary_store: the query heads rope.apply_rope's formula bit for bit, in the layout
    the rotary kernel gives, and the caches exactly what index_copy_ of the rotated keys and the values
    leaves (every other slot untouched), on views as the attention layer hands them over (q and k heads of
    a fused projection, values its last columns; a layer of a stacked cache)."""
    from specfill.backends.torch_cuda.kernels.rope_triton import rotary_store
    from specfill.backends.torch_cuda.rope import rope_formula

    fused = randn(1, tokens, (heads + 2 * kv_heads) * d, dtype=dtype, device=DEVICE, seed=53, scale=3.0)
    qk = fused[..., : (heads + kv_heads) * d].view(1, tokens, heads + kv_heads, d).transpose(1, 2)
    v = fused[..., (heads + kv_heads) * d :].view(1, tokens, kv_heads, d).transpose(1, 2)
    cos, sin = (randn(tokens, d, dtype=dtype, device=DEVICE, seed=seed) for seed in (54, 55))
    capacity = 48
    stacked = [randn(2, 1, kv_heads, capacity, d, dtype=dtype, device=DEVICE, seed=seed) for seed in (56, 57)]
    k_cache, v_cache = (c[1] for c in stacked)
    at = torch.tensor(slots if slots is not None else list(range(5, 5 + tokens)), device=DEVICE)
    want_q, want_k = rope_formula(qk, cos, sin).split((heads, kv_heads), dim=1)
    want_caches = [c.clone().index_copy_(2, at, x) for c, x in zip((k_cache, v_cache), (want_k, v))]
    slot_tensor = None if slots is None else at
    got = rotary_store(qk, v, cos, sin, heads, k_cache, v_cache, slot_tensor, 5)
    assert got.shape == want_q.shape and got.dtype == dtype
    assert [st for st, n in zip(got.stride(), got.shape) if n > 1] == [
        st for st, n in zip(torch.empty(1, tokens, heads, d).transpose(1, 2).stride(), got.shape) if n > 1
    ]
    assert torch.equal(got, want_q)
    assert torch.equal(k_cache, want_caches[0]) and torch.equal(v_cache, want_caches[1])
    assert torch.equal(stacked[0][0], randn(2, 1, kv_heads, capacity, d, dtype=dtype, device=DEVICE, seed=56)[0])


def test_a_prefill_in_steps_stores_each_steps_keys_in_its_slots(monkeypatch):
    """The rotary-and-store kernel through the layer cache's next slots (rope.rotate_and_store with a start):
    a Llama prefilled in steps of 4 tokens, then decoding, with only the rotations' kernels forced, gives
    the formula path's logits and tokens bitwise."""
    from specfill.backends.torch_cuda import fused
    from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
    from specfill.core.self_check import kernels_env
    from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

    model = make_tiny("llama").ours(device=DEVICE, step=4)
    ids = prompt_ids(11)

    def run():
        logits = model(torch.tensor(ids, device=DEVICE))
        steps = model.generate_step(
            ids, max_tokens=4, sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod(),
            info=GenerationInfo(),
        )  # fmt: skip
        return logits, list(steps)

    with kernels_env("off"):
        want = run()
    monkeypatch.setattr(fused, "norm_launchable", lambda x, weight: False)
    monkeypatch.setattr(fused, "swiglu_launchable", lambda gate, up: False)
    with kernels_env("on"):
        got = run()
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_the_rotary_store_self_check_passes_the_kernel_and_refuses_a_wrong_one(monkeypatch):
    """fused.rotary_store_self_check passes the real kernel and refuses, with one warning, a kernel that
    writes the keys one slot off."""
    from specfill.backends.torch_cuda import fused
    from specfill.backends.torch_cuda.kernels import dispatch
    from specfill.backends.torch_cuda.rope import rope_formula
    from specfill.core.self_check import KERNEL_SELF_CHECK

    like = torch.zeros(1, 2, 3, 16, device=DEVICE)
    KERNEL_SELF_CHECK.reset()
    try:
        assert fused.rotary_store_self_check(like, rope_formula)
        KERNEL_SELF_CHECK.reset()
        fetch = dispatch.triton_kernel

        def off_by_one(name):
            return lambda qk, v, c, s, n, kc, vc, slots, start=0: fetch(name)(qk, v, c, s, n, kc, vc, slots + 1)

        monkeypatch.setattr(dispatch, "triton_kernel", off_by_one)
        with pytest.warns(SpecfillWarning, match="rotary store"):
            assert not fused.rotary_store_self_check(like, rope_formula)
    finally:
        KERNEL_SELF_CHECK.reset()


def test_the_rotary_self_check_passes_the_kernel_and_refuses_a_wrong_one(monkeypatch):
    """fused.rotary_self_check (what auto mode asks on a GPU before the first rotation of a dtype and head dim)
    passes the real kernel and refuses, with one warning, a kernel that rotates the wrong way."""
    from specfill.backends.torch_cuda import fused
    from specfill.backends.torch_cuda.kernels import dispatch
    from specfill.backends.torch_cuda.rope import rope_formula
    from specfill.core.self_check import KERNEL_SELF_CHECK

    like = torch.zeros(1, 2, 3, 16, device=DEVICE)
    KERNEL_SELF_CHECK.reset()
    try:
        assert fused.rotary_self_check(like, rope_formula)
        KERNEL_SELF_CHECK.reset()
        fetch = dispatch.triton_kernel
        monkeypatch.setattr(dispatch, "triton_kernel", lambda name: lambda x, c, s: fetch(name)(x, c, -s))
        with pytest.warns(SpecfillWarning, match="rotary embedding"):
            assert not fused.rotary_self_check(like, rope_formula)
    finally:
        KERNEL_SELF_CHECK.reset()


# (rows, width, residual): a decode token, a prefill step's rows, a width that is no power of 2
NORMS = [(1, 64, True), (9, 48, True), (5, 80, False)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_kernel_normalises_heads_in_place(dtype):
    """Per-head norms (Qwen3's q / k): [1, T, H, n] heads of a fused projection's columns, each head a row."""
    import torch.nn.functional as F

    from specfill.backends.torch_cuda.kernels.norm_triton import rms_norm

    fused = randn(1, 7, 5 * 24, dtype=dtype, device=DEVICE, seed=63, scale=2.0)
    heads = fused[..., : 3 * 24].view(1, 7, 3, 24)
    weight = randn(24, dtype=dtype, device=DEVICE, seed=64)
    h, got = rms_norm(heads, weight, 1e-6)
    assert h is heads and got.shape == (1, 7, 3, 24) and got.is_contiguous()
    assert_close(got, weight * F.rms_norm(heads, (24,), eps=1e-6), dtype, "per-head rms_norm")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,width,residual", NORMS)
def test_rms_norm_kernel_matches_the_formula(rows, width, residual, dtype):
    """The RMSNorm kernel (kernels/norm_triton.py): the residual sum bitwise `out + x`, written into out;
    the normalised rows within the dtype's tolerance of `weight * F.rms_norm(h)` (its mean of squares is
    summed in another order), on rows as the block hands them over (a slice of a longer step's rows)."""
    import torch.nn.functional as F

    from specfill.backends.torch_cuda.kernels.norm_triton import rms_norm

    x = randn(1, rows + 2, width, dtype=dtype, device=DEVICE, seed=60, scale=2.0)[:, 2:]
    out = randn(1, rows, width, dtype=dtype, device=DEVICE, seed=61)
    weight = randn(width, dtype=dtype, device=DEVICE, seed=62)
    want_h = out + x if residual else out.clone()
    want = weight * F.rms_norm(want_h, (width,), eps=1e-6)
    h, got = rms_norm(out, weight, 1e-6, x if residual else None)
    assert h.data_ptr() == out.data_ptr() and torch.equal(h, want_h)
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got, want, dtype, "rms_norm")


def test_the_norm_self_check_passes_the_kernel_and_refuses_a_wrong_one(monkeypatch):
    """fused.norm_self_check passes the real kernel and refuses, with one warning, one whose weight is off."""
    from specfill.backends.torch_cuda import fused
    from specfill.backends.torch_cuda.kernels import dispatch
    from specfill.core.self_check import KERNEL_SELF_CHECK

    like = torch.zeros(1, 2, 32, device=DEVICE)
    KERNEL_SELF_CHECK.reset()
    try:
        assert fused.norm_self_check(like, 1e-6)
        KERNEL_SELF_CHECK.reset()
        fetch = dispatch.triton_kernel
        monkeypatch.setattr(dispatch, "triton_kernel", lambda name: lambda x, w, e, r: fetch(name)(x, w * 1.1, e, r))
        with pytest.warns(SpecfillWarning, match="rms norm"):
            assert not fused.norm_self_check(like, 1e-6)
    finally:
        KERNEL_SELF_CHECK.reset()


# (rows, width): a decode token's gate, a prefill step's rows whose count is no multiple of the block
SWIGLU = [(1, 176), (37, 96)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,width", SWIGLU)
def test_swiglu_kernel_is_the_in_place_pair(rows, width, dtype):
    """The SwiGLU kernel (kernels/swiglu_triton.py) writes silu(gate) * up over the gate: bitwise the
    in-place pair `F.silu(gate, inplace=True).mul_(up)` on a GPU (torch's expf and IEEE division, rounded
    where torch rounds); in the interpreter, whose exp is NumPy's, within the dtype's tolerance."""
    import torch.nn.functional as F

    from specfill.backends.torch_cuda.kernels.swiglu_triton import swiglu

    gate = randn(1, rows, width, dtype=dtype, device=DEVICE, seed=70, scale=4.0)
    up = randn(1, rows, width, dtype=dtype, device=DEVICE, seed=71)
    want = F.silu(gate.clone(), inplace=True).mul_(up)
    got = swiglu(gate, up)
    assert got.data_ptr() == gate.data_ptr() and got.dtype == dtype and got.shape == want.shape
    if DEVICE == "cuda":
        assert torch.equal(got, want)
    else:
        assert_close(got, want, dtype, "swiglu")


def test_swiglu_kernel_refuses_strided_or_mismatched_operands():
    """One clear error for operands the kernel cannot take (a strided gate, shapes that differ)."""
    from specfill.backends.torch_cuda.kernels.swiglu_triton import swiglu

    gate = randn(1, 4, 32, dtype=torch.float32, device=DEVICE, seed=72)
    with pytest.raises(ValueError, match="swiglu kernel: gate and up contiguous"):
        swiglu(gate.transpose(1, 2), gate.transpose(1, 2).contiguous())
    with pytest.raises(ValueError, match="swiglu kernel"):
        swiglu(gate, gate[:, :3])


def test_the_swiglu_self_check_passes_the_kernel_and_refuses_a_wrong_one(monkeypatch):
    """fused.swiglu_self_check passes the real kernel and refuses, with one warning, one that gates by
    the wrong operand."""
    from specfill.backends.torch_cuda import fused
    from specfill.backends.torch_cuda.kernels import dispatch
    from specfill.core.self_check import KERNEL_SELF_CHECK

    like = torch.zeros(1, 2, 32, device=DEVICE)
    KERNEL_SELF_CHECK.reset()
    try:
        assert fused.swiglu_self_check(like)
        KERNEL_SELF_CHECK.reset()
        fetch = dispatch.triton_kernel
        monkeypatch.setattr(dispatch, "triton_kernel", lambda name: lambda g, u: fetch(name)(u.clone(), g))
        with pytest.warns(SpecfillWarning, match="swiglu"):
            assert not fused.swiglu_self_check(like)
    finally:
        KERNEL_SELF_CHECK.reset()


def test_a_static_decode_step_launches_ten_kernels_a_layer_with_the_fused_kernels(monkeypatch):
    """What a GPU's decode step launches per layer once RoPE, the norms and SwiGLU's gating are fused:
    the aten ops test_decode_launches.py counts on the CPU path (21), less RoPE's five and the two cache
    writes, the norms' sums and products (both residual adds, each joining the norm after it, the input
    norm taking the previous layer's MLP sum, and two weight products; the norms themselves were one op
    each) and the SiLU and its product, plus one rotary_store, two rms_norm and one swiglu launch: 10.
    Counted here with kernels forced, each Triton launch as one."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from specfill.backends.torch_cuda import decode_graph
    from specfill.backends.torch_cuda.kernels import dispatch
    from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
    from specfill.core.self_check import kernels_env
    from tests.torch_cuda.test_decode_launches import VIEWS
    from tests.torch_cuda.tiny_torch_models import make_tiny, prompt_ids

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.launches, self.paused = 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if not self.paused and not func.is_view and name not in VIEWS and not name.startswith("empty"):
                self.launches += 1
            return func(*args, **(kwargs or {}))

    fetch, counter = dispatch.triton_kernel, Count()

    def counted(name):
        kernel = fetch(name)

        def launch(*args):
            counter.launches += 1
            counter.paused = True  # the interpreter's own tensor traffic is not the kernel's launches
            try:
                return kernel(*args)
            finally:
                counter.paused = False

        return launch

    def third_step(layers):
        model = make_tiny("llama", num_hidden_layers=layers).ours(device=DEVICE)
        model.ops.static_decode = True
        model.ops.decode_graphs = decode_graph.DecodeGraphs(None, attention="sdpa")
        steps = model.generate_step(
            prompt_ids(12), max_tokens=3, sampling=SamplingConfig(), stop_ids=frozenset(), method=PrefillMethod(),
            info=GenerationInfo(),
        )  # fmt: skip
        next(steps), next(steps)
        counter.launches = 0
        with counter:
            next(steps)
        return counter.launches

    monkeypatch.setattr(dispatch, "triton_kernel", counted)
    per_layer = {}
    for word in ("off", "on"):
        with kernels_env(word):
            two, four = third_step(2), third_step(4)
        per_layer[word] = (four - two) / 2
    # eleven fewer wherever it runs (a GPU's aten decompositions may count the rest apart), 10 from the CPU's 21
    assert per_layer["off"] - per_layer["on"] == 11, per_layer
    assert DEVICE == "cuda" or per_layer == {"off": 21, "on": 10}, per_layer
