"""backends/torch_cuda/attention_choice.py: the probe that picks a device's prefill attention.

On the CPU the probe runs on small shapes: candidates that raise (CUDA-only raw kernels) or give
a wrong answer are dropped and reported, a correct one is chosen; scripts/gpu_session.sh records
what a GPU chooses. Tolerances are the module's (TOLERANCE: a wrong mask or head grouping errs by
O(0.1-1) on unit-scale data, far above them).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
import torch.nn.functional as F

from specfill.backends.torch_cuda import attention_choice as choice

CPU = torch.device("cpu")


def unmasked(q, k, v, start, scale):  # wrong: sees the future
    k, v = choice._expand(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


def broken(q, k, v, start, scale):
    raise RuntimeError("no kernel image for this device")


@pytest.mark.parametrize("kind", ["causal", "prefix"])
def test_probe_drops_failing_and_wrong_kernels(kind):
    kernels = {"unmasked": unmasked, "broken": broken, **choice.candidates(kind)}
    name, kernel, report = choice.probe(kind, 4, 2, 16, torch.float32, CPU, kernels, queries=8, prefix=24)
    assert report["unmasked"].startswith("wrong") and report["broken"].startswith("failed: RuntimeError")
    assert name in choice.candidates(kind) and report[name].endswith(" ms")
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8 + (24 if kind == "prefix" else 0), 16), None
    v = torch.randn_like(k)
    start = k.shape[2] - 8
    torch.testing.assert_close(kernel(q, k, v, start, None), choice.reference(q, k, v, start, None), atol=1e-5, rtol=0)


def test_every_prefix_candidate_that_runs_here_is_exact():
    q, k = torch.randn(1, 6, 5, 8), torch.randn(1, 2, 17, 8)
    v = torch.randn_like(k)
    ran = 0
    for name, kernel in choice.candidates("prefix").items():
        try:
            out = kernel(q, k, v, 12, 0.3)
        except RuntimeError:  # the raw flash / cuDNN ops have no CPU kernel
            continue
        torch.testing.assert_close(out, choice.reference(q, k, v, 12, 0.3), atol=1e-5, rtol=0, msg=name)
        ran += 1
    assert ran >= 2  # both lower-right variants run on the CPU


def test_split_merge_is_exact():
    """The log-sum-exp merge of the prefix and causal halves (a CPU stand-in for the raw op)."""

    def raw(q, k, v, causal, scale):
        k2, v2 = choice._expand(q, k, v)
        logits = (q @ k2.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
        if causal:
            logits = logits.masked_fill(torch.ones_like(logits, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(logits, -1) @ v2, torch.logsumexp(logits, -1)

    q, k = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 20, 8)
    v = torch.randn_like(k)
    out = choice._split(raw)(q, k, v, 14, None)
    torch.testing.assert_close(out, choice.reference(q, k, v, 14, None), atol=1e-5, rtol=0)


def test_no_kernel_is_an_error():
    with pytest.raises(RuntimeError, match="no prefix attention kernel works here"):
        choice.probe("prefix", 4, 2, 16, torch.float32, CPU, {"broken": broken}, queries=4, prefix=4)


def test_decode_probe_drops_failing_and_wrong_kernels():
    """The decode kind: one token's grouped rows over a bucket whose last slots are masked."""

    def unmasked_decode(q, k, v, bias, scale):  # wrong: reads the bucket's unfilled slots
        return choice.sdpa_decode(q, k, v, torch.zeros_like(bias), scale)

    def broken_decode(q, k, v, bias, scale):
        raise RuntimeError("no kernel image for this device")

    kernels = {"unmasked": unmasked_decode, "broken": broken_decode, "sdpa": choice.sdpa_decode}
    name, kernel, report = choice.probe_decode(8, 2, 16, torch.float32, CPU, kernels, slots=160)
    assert name == "sdpa" and kernel is choice.sdpa_decode and report["sdpa"].endswith(" ms")
    assert report["unmasked"].startswith("wrong") and report["broken"].startswith("failed: RuntimeError")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (Linux only)")
def test_the_decode_probe_follows_the_kernels_setting(monkeypatch):
    """The split-key Triton kernel competes for decode steps unless the kernels are turned off: then the
    probe (the static step's and, on a GPU, the eager decode's: attention.one_query_cuda) times SDPA alone."""
    monkeypatch.setenv("SPECFILL_KERNELS", "off")
    assert list(choice.decode_candidates()) == ["sdpa"]
    monkeypatch.setenv("SPECFILL_KERNELS", "auto")
    assert list(choice.decode_candidates()) == ["sdpa", "split-triton"]


def test_decode_kernel_is_sdpa_off_cuda_and_in_compiled_steps():
    """ "auto" probes on CUDA only; a named kernel is that one; a compiled static step traces no
    probe (DecodeGraphs asks for SDPA there)."""
    from specfill.backends.torch_cuda.decode_graph import DecodeGraphs

    q, k = torch.randn(2, 4, 16), torch.randn(2, 32, 16)
    assert choice.decode_kernel("auto", q, k) is choice.sdpa_decode
    assert choice.decode_kernel("split-triton", q, k) is choice.split_decode
    assert DecodeGraphs(None).attention == "auto" and DecodeGraphs(None, compiled=True).attention == "sdpa"
    assert DecodeGraphs(None, compiled=True, attention="split-triton").attention == "split-triton"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (Linux only)")
def test_the_triton_candidate_follows_the_kernels_setting(monkeypatch):
    """Our Triton prefill kernel competes in both kinds unless the kernels are turned off; on CPU
    tensors (no interpreter in this process) it fails at the call and the probe reports it."""
    monkeypatch.setenv("SPECFILL_KERNELS", "off")
    assert "triton" not in choice.candidates("causal") and "triton" not in choice.candidates("prefix")
    monkeypatch.setenv("SPECFILL_KERNELS", "auto")
    assert "triton" in choice.candidates("causal") and "triton" in choice.candidates("prefix")
    if not os.environ.get("TRITON_INTERPRET"):
        _, _, report = choice.probe("prefix", 4, 2, 16, torch.float32, CPU, queries=8, prefix=24)
        assert report["triton"].startswith("failed: RuntimeError: the Triton prefill kernel needs CUDA"), report


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (Linux only)")
@pytest.mark.parametrize("capability,tma", [((9, 0), True), ((8, 9), False)])
def test_the_tma_candidate_only_where_the_gpu_has_tma(monkeypatch, capability, tma):
    from specfill.backends.torch_cuda.placement import simulated_cuda
    from tests.torch_cuda.simulated_gpu import FakeRuntime

    monkeypatch.setenv("SPECFILL_KERNELS", "auto")
    assert "triton-tma" not in choice.candidates("prefix")  # no GPU here
    with simulated_cuda(FakeRuntime(capability)):
        for kind in ("causal", "prefix"):
            assert "triton" in choice.candidates(kind)
            assert ("triton-tma" in choice.candidates(kind)) is tma
            assert ("triton-tma-wide" in choice.candidates(kind)) is tma


@pytest.mark.parametrize("steps,probed", [(50, 2048), (4096, 4096), (16384, 8192)])
def test_the_probe_takes_the_first_calls_step_within_bounds(monkeypatch, steps, probed):
    """A GPU's 16K steps are probed at 8K queries, a short first prompt at the library's 2,048; "prefix"
    after three steps' worth of slots; the report says what was probed."""
    asked = []

    def probe(kind, heads, kv_heads, head_dim, dtype, device, kernels, queries, prefix, layouts):
        asked.append((queries, prefix))
        return "sdpa", None, {}

    monkeypatch.setattr(choice, "probe", probe)
    monkeypatch.setattr(choice, "_CHOSEN", {})
    choice.kernel_for(
        "prefix", torch.empty(1, 4, steps, 16, device="meta"), torch.empty(1, 2, steps, 16, device="meta")
    )
    assert asked == [(probed, 3 * probed)]


def test_prefix_calls_are_probed_per_span_of_their_keys(monkeypatch):
    """A 16K step after 112K slots is not timed on a 2K step's probe: "prefix" calls over more than 16K and
    more than 64K keys are probed apart, each on its span's slots, and reported under their span; a call of
    a span already probed probes nothing. "causal" calls of more than 4K queries are probed apart too, on the
    most queries the probe takes whatever the first one's size (the H200 bench's 5,120-token warm-up chose the
    8B's 16K first steps' kernel), and the span of a short one on its own size."""
    asked = []

    def probe(kind, heads, kv_heads, head_dim, dtype, device, kernels, queries, prefix, layouts):
        asked.append((kind, queries, prefix))
        return "sdpa", None, {}

    monkeypatch.setattr(choice, "probe", probe)
    monkeypatch.setattr(choice, "_CHOSEN", {})
    for kind, steps, slots in [
        ("prefix", 2048, 8192),
        ("prefix", 16384, 32768),
        ("prefix", 16384, 49152),
        ("prefix", 16384, 131072),
        ("prefix", 4096, 100000),
        ("causal", 5120, 5120),
        ("causal", 16384, 16384),
        ("causal", 3000, 3000),
        ("causal", 1000, 1000),
    ]:
        q, k = torch.empty(1, 4, steps, 16, device="meta"), torch.empty(1, 2, slots, 16, device="meta")
        choice.kernel_for(kind, q, k)
    assert asked == [
        ("prefix", 2048, 3 * 2048),
        ("prefix", 8192, 40960 - 8192),
        ("prefix", 8192, 98304 - 8192),
        ("causal", 8192, 3 * 8192),
        ("causal", 3000, 3 * 3000),
    ]
    assert sorted(choice.chosen()) == [
        "causal 4/2x16 float32 meta",
        "causal 4/2x16 float32 meta over 4K queries",
        "prefix 4/2x16 float32 meta",
        "prefix 4/2x16 float32 meta over 16K keys",
        "prefix 4/2x16 float32 meta over 64K keys",
    ]


@pytest.mark.parametrize("start", [0, 5])
def test_the_reference_by_heads_and_query_blocks_is_the_whole_computation(start):
    """The probe's float32 reference runs a KV head's query heads and `block` queries at a time (a long
    span's scores whole would be ~100 GB): the same numbers as one masked call over expanded heads."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 6, 7, 8, generator=gen), torch.randn(1, 2, start + 7, 8, generator=gen)
    v = torch.randn(1, 2, start + 7, 8, generator=gen)
    mask = torch.arange(start + 7)[None, :] <= start + torch.arange(7)[:, None]
    k3, v3 = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k3, v3, attn_mask=mask, scale=0.3)
    assert torch.allclose(choice.reference(q, k, v, start, 0.3, block=3), whole, atol=1e-6)
    assert torch.allclose(choice.reference(q, k, v, start, 0.3), whole, atol=1e-6)


def test_the_probe_report_names_its_shape_and_the_chosen_kernels_rate():
    _, _, report = choice.probe("prefix", 4, 2, 16, torch.float32, CPU, {"expanded": choice._lower_right(False)}, 8, 24)
    assert report["probed on"] == "8 queries after 24 slots" and report["expanded"].endswith(" ms")
    seconds = float(report["expanded"].split()[0]) / 1e3
    assert report["rate"] == f"{choice.probe_flops(4, 16, 8, 24) / seconds / 1e12:.0f} TFLOP/s"


@pytest.mark.parametrize("queries,start", [(1, 0), (5, 0), (8, 24)])
def test_probe_flops_counts_the_visible_pairs_of_every_query_head(queries, start):
    """2 x 2 x head_dim FLOPs (q.k, p.v) per visible (query, slot) pair per query head, counted one by one."""
    pairs = sum(start + t + 1 for t in range(queries))
    assert choice.probe_flops(4, 16, queries, start) == 4 * 4 * 16 * pairs


def _fake_flash_attn_4(monkeypatch, calls: list) -> None:
    """flash_attn.cute.interface as FlashAttention-4 lays it out: q [B, Sq, Hq, D], k / v [B, Sk, Hkv, D],
    causal aligned to the bottom right, (out [B, Sq, Hq, D], lse); here in float32 through the probe's
    reference, recording what it was handed."""
    import sys
    import types
    from importlib.machinery import ModuleSpec

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        calls.append((q, k, v, causal))
        assert causal and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        start = k.shape[1] - q.shape[1]
        out = choice.reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), start, softmax_scale)
        return out.transpose(1, 2).contiguous().to(q.dtype), None

    for name in ("flash_attn", "flash_attn.cute", "flash_attn.cute.interface"):
        module = types.ModuleType(name)
        module.__spec__ = ModuleSpec(name, None, is_package=not name.endswith("interface"))
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["flash_attn.cute.interface"].flash_attn_func = flash_attn_func


def test_flash_attn_4_is_a_candidate_where_installed_and_kernels_are_not_off(monkeypatch):
    import sys

    monkeypatch.setenv("SPECFILL_KERNELS", "auto")
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # not installed (whatever this machine has)
    assert "flash-attn-4" not in choice.candidates("causal")
    _fake_flash_attn_4(monkeypatch, [])
    assert all("flash-attn-4" in choice.candidates(kind) for kind in ("causal", "prefix"))
    monkeypatch.setenv("SPECFILL_KERNELS", "off")
    assert "flash-attn-4" not in choice.candidates("prefix")


@pytest.mark.parametrize("kind", ["causal", "prefix"])
def test_flash_attn_4_gets_sequence_major_views_and_is_chosen_only_if_right(monkeypatch, kind):
    """The wrapper hands FlashAttention-4 [1, T, H, D] views of the layer's [1, H, T, D] tensors (the
    same storage: no copy), grouped heads as they are, causal for either kind (its bottom-right
    alignment is the prefix kind's lower-right mask), and returns the [1, H, T, D] view back; the probe
    checks it like any candidate."""
    calls: list = []
    _fake_flash_attn_4(monkeypatch, calls)
    name, kernel, report = choice.probe(
        kind, 4, 2, 16, torch.float32, CPU, {"flash-attn-4": choice._flash_attn_4}, queries=8, prefix=24
    )
    assert name == "flash-attn-4" and report[name].endswith(" ms"), report
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8 + (24 if kind == "prefix" else 0), 16)
    v = torch.randn_like(k)
    calls.clear()
    got = kernel(q, k, v, k.shape[2] - 8, 0.25)
    ((fq, fk, fv, _),) = calls
    assert fq.shape == (1, 8, 4, 16) and fk.shape == (1, k.shape[2], 2, 16)
    assert (fq.data_ptr(), fk.data_ptr(), fv.data_ptr()) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    torch.testing.assert_close(got, choice.reference(q, k, v, k.shape[2] - 8, 0.25), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="queries last"):
        kernel(q, k, v, 0 if kind == "prefix" else 3, 0.25)


def _fused_view(tokens: int, heads: int = 4, kv_heads: int = 2, dim: int = 16) -> torch.Tensor:
    """q [1, H, T, D] as a layer hands it over: the heads of a fused [1, T, (H + 2 Hkv) x D] projection."""
    fused = torch.randn(1, tokens, (heads + 2 * kv_heads) * dim)
    return fused[..., : heads * dim].view(1, tokens, heads, dim).transpose(1, 2)


def test_a_layout_family_is_the_same_whatever_the_sizes():
    """q from a fused projection at any step length, a cache's filled slots at any fill: one family each
    (one probe, not one per step), and laid_out rebuilds the family at the probe's sizes."""
    cache = torch.randn(1, 2, 100, 16)
    assert choice.layout(_fused_view(7)) == choice.layout(_fused_view(300)) != choice.layout(torch.randn(1, 4, 7, 16))
    assert choice.layout(cache[:, :, :30]) == choice.layout(cache[:, :, :99]) != choice.layout(cache)
    gen = torch.Generator().manual_seed(0)
    for real, shape in ((_fused_view(7), (1, 4, 9, 16)), (cache[:, :, :30], (1, 2, 50, 16))):
        probed = choice.laid_out(choice.layout(real), shape, gen, torch.float32, CPU)
        assert probed.shape == shape and choice.layout(probed) == choice.layout(real) and not probed.is_contiguous()
    odd = torch.randn(100)[3:67].view(1, 4, 16)  # a storage offset of 3 elements: an unaligned base
    assert choice.layout(choice.laid_out(choice.layout(odd), (1, 4, 16), gen, torch.float32, CPU))[2] == 3


def contiguous_only(q, k, v, start, scale):  # wrong on a padded layout: reads the storage as if compact
    q, k, v = (x.as_strided(x.shape, torch.empty(x.shape).stride()) for x in (q, k, v))
    return choice.reference(q, k, v, start, scale)


@pytest.mark.parametrize("kind", ["causal", "prefix"])
def test_the_probe_runs_candidates_in_the_calls_layout(kind, monkeypatch):
    """A kernel that assumes compact tensors passes a probe on contiguous data and errs on the layer's
    views; kernel_for probes in the call's layout, so it is dropped there (and reported under that layout)."""
    kernels = {"contiguous-only": contiguous_only, "expanded": choice._lower_right(False)}
    _, _, report = choice.probe(kind, 4, 2, 16, torch.float32, CPU, kernels, 8, 24)
    assert report["contiguous-only"].endswith(" ms")  # contiguous probe data: it looks right
    cache = torch.randn(1, 2, 64, 16)
    q, k = _fused_view(8), cache[:, :, : 8 + (24 if kind == "prefix" else 0)]
    layouts = tuple(choice.layout(x) for x in (q, k, k))
    _, _, report = choice.probe(kind, 4, 2, 16, torch.float32, CPU, kernels, 8, 24, layouts)
    assert report["contiguous-only"].startswith("wrong") and report["expanded"].endswith(" ms")

    monkeypatch.setattr(choice, "_CHOSEN", {})
    monkeypatch.setattr(choice, "candidates", lambda kind: kernels)
    assert choice.kernel_for(kind, q, k, cache[:, :, : k.shape[2]]) is kernels["expanded"]
    ((label, record),) = choice.chosen().items()
    assert label.endswith("(q dim 2 padded; k dim 1 padded; v dim 1 padded)") and record["chosen"] == "expanded"
    assert record["candidates"]["contiguous-only"].startswith("wrong")
    choice.kernel_for(kind, _fused_view(8), cache[:, :, : k.shape[2] + 4])  # the next step: no new probe
    assert len(choice.chosen()) == 1


def test_the_decode_probe_runs_in_the_steps_layout():
    """The decode kind likewise: keys and values a bucket of a larger cache's slots (its heads padded)."""

    def contiguous_only_decode(q, k, v, bias, scale):
        k, v = (x.as_strided(x.shape, torch.empty(x.shape).stride()) for x in (k, v))
        return choice.sdpa_decode(q, k, v, bias, scale)

    kernels = {"contiguous-only": contiguous_only_decode, "sdpa": choice.sdpa_decode}
    bucket = torch.randn(2, 256, 16)[:, :160]
    layouts = (choice.layout(torch.randn(2, 4, 16)), choice.layout(bucket), choice.layout(bucket))
    _, _, contiguous = choice.probe_decode(8, 2, 16, torch.float32, CPU, kernels, slots=160)
    name, _, laid = choice.probe_decode(8, 2, 16, torch.float32, CPU, kernels, slots=160, layouts=layouts)
    assert contiguous["contiguous-only"].endswith(" ms") and laid["contiguous-only"].startswith("wrong")
    assert name == "sdpa"


class Counted:
    """A candidate that counts its calls (the probe calls each candidate it tries several times)."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __call__(self, *args):
        self.calls += 1
        return self.kernel(*args)


def _probe_in_a_new_process(monkeypatch, kernels: dict) -> str:
    """kernel_for on a simulated GPU with a fresh in-process memory (a new process): the chosen name."""
    from specfill.backends.torch_cuda.placement import simulated_cuda
    from tests.torch_cuda.simulated_gpu import FakeRuntime

    monkeypatch.setattr(choice, "_CHOSEN", {})
    monkeypatch.setattr(choice, "candidates", lambda kind: kernels)
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    with simulated_cuda(FakeRuntime((9, 0))):
        kernel = choice.kernel_for("causal", q, k, k)
    return next(name for name, candidate in kernels.items() if candidate is kernel)


def test_a_choice_is_kept_for_the_next_process_which_checks_it_alone(monkeypatch):
    """The probe's choice is kept on disk (probe_store.py); a new process on the same GPU and software
    probes only that kernel (its check and timing), not the other candidates, and reports both."""
    from specfill.core.crossover import calibration_dir, calibration_path

    kernels = {"expanded": Counted(choice._lower_right(False)), "gqa": Counted(choice._lower_right(True))}
    first = _probe_in_a_new_process(monkeypatch, kernels)
    assert all(kernel.calls > 0 for kernel in kernels.values())
    (kept,) = calibration_dir().glob("cuda-attention-probe-*.json")  # one environment, one file
    assert kept == calibration_path(json.loads(kept.read_text())["key"]) and not list(kept.parent.glob("*.partial"))
    for kernel in kernels.values():
        kernel.calls = 0
    stored = json.loads(kept.read_text())
    ((_, entry),) = stored["choices"].items()
    entry["report"]["rate"] = "999 TFLOP/s"  # the first process's rate: the new one reports its own
    kept.write_text(json.dumps(stored))
    assert _probe_in_a_new_process(monkeypatch, kernels) == first
    other = "gqa" if first == "expanded" else "expanded"
    assert kernels[first].calls > 0 and kernels[other].calls == 0
    ((_, record),) = choice.chosen().items()
    assert "checked again alone" in record["candidates"][first] and record["candidates"][other].endswith(" ms")
    assert record["candidates"]["rate"].endswith(" TFLOP/s") and record["candidates"]["rate"] != "999 TFLOP/s"


def test_a_kept_choice_that_errs_now_or_another_environment_probes_every_candidate(monkeypatch):
    from specfill.backends.torch_cuda import probe_store

    kernels = {"a": Counted(choice._lower_right(False))}
    _probe_in_a_new_process(monkeypatch, kernels)
    # the kept kernel now errs (a new driver, say): dropped, every candidate probed, the new choice kept
    kernels = {"a": Counted(unmasked), "b": Counted(choice._lower_right(True))}
    assert _probe_in_a_new_process(monkeypatch, kernels) == "b" and kernels["a"].calls == 1
    # another offer of candidates, or another environment (a changed kernel source): probed again
    kernels = {"b": Counted(choice._lower_right(True)), "c": Counted(choice._lower_right(False))}
    _probe_in_a_new_process(monkeypatch, kernels)
    assert kernels["c"].calls > 0
    kernels = {"b": Counted(choice._lower_right(True)), "c": Counted(choice._lower_right(False))}
    monkeypatch.setattr(probe_store, "_sources", lambda: "changed")
    _probe_in_a_new_process(monkeypatch, kernels)
    assert kernels["b"].calls > 0 and kernels["c"].calls > 0


def test_a_store_that_cannot_be_written_leaves_the_choice_made(monkeypatch, tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(blocked / "below"))  # a folder under a file
    kernels = {"expanded": Counted(choice._lower_right(False))}
    assert _probe_in_a_new_process(monkeypatch, kernels) == "expanded"
    assert "not kept" in caplog.text and blocked.read_text() == ""


def test_another_driver_probes_every_candidate(monkeypatch, tmp_path):
    """The NVIDIA driver (Linux: /proc/driver/nvidia/version) is part of the kept choice's environment."""
    from specfill.backends.torch_cuda import probe_store

    version = tmp_path / "version"
    monkeypatch.setattr(probe_store, "DRIVER_VERSION_FILE", version)
    assert probe_store.driver_version() == ""  # no such file: no driver named
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
    assert probe_store.driver_version() == "550.54.15"
    kernels = {"b": Counted(choice._lower_right(True)), "c": Counted(choice._lower_right(False))}
    _probe_in_a_new_process(monkeypatch, kernels)
    kernels = {"b": Counted(choice._lower_right(True)), "c": Counted(choice._lower_right(False))}
    _probe_in_a_new_process(monkeypatch, kernels)  # the same driver: the kept kernel alone
    assert (kernels["b"].calls > 0) != (kernels["c"].calls > 0)
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.10  Release Build\n")
    assert probe_store.driver_version() == "570.86.10"
    kernels = {"b": Counted(choice._lower_right(True)), "c": Counted(choice._lower_right(False))}
    _probe_in_a_new_process(monkeypatch, kernels)
    assert kernels["b"].calls > 0 and kernels["c"].calls > 0
