"""Hostile inputs (issue #17): a deterministic corpus of broken model files, directories and special
files, each loaded on every installed backend under a per-case time limit. Each must either load
and compute finite logits or raise one of our own one-line errors, and both backends must agree.
The larger run (more architectures and random flips, the CLI cases, a second identical run) is
scripts/fuzz_inputs.py; its results are in results/fuzz/.
"""

from __future__ import annotations

import collections
import importlib.util

import pytest

from tests.fixtures.fuzz_run import PASSING, corpus, run_corpus

CASE_TIME_LIMIT_S = 20.0  # a hang guard; a typical case takes milliseconds
BACKENDS = tuple(
    name
    for name, module in (("cuda", "torch"), ("mlx", "mlx.core"))
    if importlib.util.find_spec(module.split(".")[0]) is not None
)
# Cases named in the issue, with a word their error must contain.
EXPECTED = {
    "gguf/llama/meta/llama.attention.layer_norm_rms_epsilon=nan": "finite and > 0",
    "gguf/llama/meta/llama.attention.layer_norm_rms_epsilon=neg": "finite and > 0",
    "gguf/llama/meta/llama.rope.freq_base=zero-f": "finite and > 0",
    "gguf/llama/meta/general.alignment=nan": "power of two",
    "gguf/llama/meta/general.alignment=int-array": "power of two",
    "gguf/llama/meta/tokenizer.ggml.bos_token_id=nan": "must be an integer",
    "gguf/llama/meta/tokenizer.ggml.bos_token_id=int-array": "must be an integer",
    "gguf/llama/meta/tokenizer.ggml.bos_token_id=out-of-vocab": "bos_token_id must be in",
    "gguf/llama/header/nested-array-depth=3000": "nested arrays are not supported",
    "gguf/llama/header/1e6-empty-arrays": "nested arrays are not supported",
    "gguf/llama/header/duplicate-key": "appears twice",
    "gguf/llama/table/0/dim=0": "zero dimension",
    "gguf/llama/table/0/duplicate-name": "appears twice",
    "gguf/llama/table/0/offset+16": "not a multiple of the alignment",
    "gguf/llama/table/0/retype=0": "overlaps",  # F16 -> F32: twice the bytes
    "gguf/llama/table/0/retype=8": "unused bytes",  # F16 -> Q8_0: fewer bytes, a gap
    "gguf/llama/table/0/type=99": "unknown GGML type id 99",
    "dir/config/rms_norm_eps=nan": "finite and > 0",
    "dir/config/model_type=str": "unsupported architecture 'x'",
    "dir/rope/linear-no-factor": "lacks factor",
    "dir/safetensors/header-list": "not a JSON object",
    "dir/config/quantization_config=str": "quantized with",
    "special/fifo": "not a regular file",
    "special/device-zero": "not a regular file",
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("fuzz")
    cases = corpus(folder, seed=17, archs=("llama",), n_flips=30, n_cuts=10)
    return run_corpus(cases, folder / "cases", lambda index: BACKENDS, CASE_TIME_LIMIT_S)


@pytest.mark.slow
def test_every_case_loads_finite_or_raises_our_one_line_error(outcomes):
    assert BACKENDS, "needs torch or mlx"
    assert len({o.case for o in outcomes}) >= 500
    bad = [f"{o.backend} {o.case}: {o.status} {o.error_type} {o.message}" for o in outcomes if o.status not in PASSING]
    assert not bad, "\n".join(bad[:20])
    counts = collections.Counter(o.status for o in outcomes)
    assert counts["error"] >= 500 and counts["ok"] >= 50, counts  # the corpus both breaks and spares


@pytest.mark.slow
def test_the_issue_cases_are_refused_by_name(outcomes):
    by_case = {(o.case, o.backend): o for o in outcomes}
    for case, words in EXPECTED.items():
        for backend in BACKENDS:
            outcome = by_case[(case, backend)]
            assert outcome.status == "error" and words in outcome.message, (case, backend, outcome)


@pytest.mark.slow
def test_both_backends_refuse_the_same_files(outcomes):
    if len(BACKENDS) < 2:
        pytest.skip("needs both backends")
    status: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for o in outcomes:
        status[o.case][o.backend] = o.status
    differ = sorted(case for case, by_backend in status.items() if len(set(by_backend.values())) > 1)
    assert not differ, differ[:20]
