"""`specfill doctor` prints the roofline model's prediction from this machine's rates beside the
TTFT it measured (evaluation/doctor.py roofline_prediction)."""

from __future__ import annotations

import pytest

from specfill.evaluation.doctor import DoctorPlan, roofline_prediction, run_doctor
from specfill.evaluation.doctor_report import render_markdown


@pytest.mark.slow
def test_doctor_report_has_a_prediction_beside_each_measured_ttft():
    plan = DoctorPlan(backend="cuda", lengths=(64,), run_kernel_conformance=False)
    report = run_doctor(plan, log=lambda line: None)
    bench, prediction = report["micro_bench"]["rows"], report["roofline"]["rows"]
    assert [(r["method"], r["prompt_tokens"]) for r in prediction] == [(r["method"], r["prompt_tokens"]) for r in bench]
    assert all(p["predicted_s"] > 0 and p["measured_s"] == b["ttft_s"] for p, b in zip(prediction, bench))
    assert report["roofline"]["rates"]["name"].startswith("torch cpu float32")
    markdown = render_markdown(report)
    assert "roofline prediction (s)" in markdown and "from this machine's rates: GEMM" in markdown
    assert f"| {prediction[0]['predicted_s']:.3f} |" in markdown
    assert report["metal_matrix"] == {"skipped": "not asked (--no-kernel-check)"}


def test_no_prediction_without_a_bench_or_a_known_shape():
    assert roofline_prediction(DoctorPlan("cuda"), {"skipped": "no lengths asked"}) == {"skipped": "no micro-bench ran"}
    rows = [{"method": "full", "prompt_tokens": 8, "ttft_s": 1.0, "kept_tokens": 8}]
    result = roofline_prediction(DoctorPlan("cuda", model="/models/llama"), {"rows": rows})
    assert "only random:SHAPE models" in result["skipped"]
