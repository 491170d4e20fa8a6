"""`specfill doctor`'s report: doctor.json (everything) and doctor.md (what a person reads)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .machine import machine_line


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def _environment_lines(env: dict[str, Any]) -> list[str]:
    torch, mlx = env["torch"], env["mlx"]
    packages = ", ".join(f"{name} {version}" for name, version in env["packages"].items() if version)
    rows = [
        ("machine", machine_line(env["machine"])),
        ("packages", packages),
        ("memory available", f"{env['memory_available_gb']} GB of {env['machine']['memory_gb']} GB"),
        ("NumPy BLAS", env["numpy_blas"]),
    ]
    if torch["installed"]:
        gpu = (
            (
                f"{torch['gpu']} ({torch['gpu_memory_gb']} GB, sm {torch['compute_capability']}), CUDA "
                f"{torch['cuda_version']}"
            )
            if torch["cuda_available"]
            else "none"
        )
        rows += [
            ("CUDA GPU (torch)", gpu),
            ("torch BLAS / threads", f"{torch['blas']} / {torch['threads']}"),
            (
                "Triton kernels",
                torch["triton_kernels_unavailable"]
                or "available" + (" (interpreter)" if torch["triton_interpreter"] else ""),
            ),
        ]
    else:
        rows.append(("torch", "not installed"))
    if mlx["installed"]:
        info = ", ".join(f"{k} {v}" for k, v in mlx["device_info"].items())
        rows += [
            ("Metal (MLX)", _yes(mlx["metal_available"]) + (f": {info}" if info else "")),
            ("MLX CPU BLAS", mlx["cpu_blas"]),
        ]
    else:
        rows.append(("MLX", "not installed"))
    return ["| what | found |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def _kernel_lines(report: dict[str, Any]) -> list[str]:
    conformance = report["kernel_conformance"]
    if "skipped" in conformance:
        lines = [f"Kernel-vs-twin conformance (kernels forced): **skipped** — {conformance['skipped']}."]
    else:
        verdict = "PASS" if conformance["passed"] else "FAIL"
        lines = [
            f"Kernel-vs-twin conformance (kernels forced, {', '.join(conformance['dtypes'])}): **{verdict}** "
            f"— {conformance['checks'] - conformance['failed']}/{conformance['checks']} checks in "
            f"{conformance['seconds']} s."
        ]
        lines += [f"- FAIL {failure}" for failure in conformance["failures"]]
    metal = report.get("metal_matrix", {"skipped": "not run"})
    if "skipped" in metal:
        lines += ["", f"Metal kernel matrix on real Metal: **skipped** — {metal['skipped']}."]
    else:
        lines += [
            "",
            f"Metal kernel matrix on real Metal ({metal['device']}): "
            f"**{'FAIL' if metal['failures'] else 'PASS'}** — {metal['cells'] - metal['failures']}/"
            f"{metal['cells']} cells (backends/mlx/kernels/matrix.py).",
        ]
        lines += [f"- FAIL {cell}" for cell in metal["failed"]]
    lines += ["", f"First-use self-checks during the micro-bench (kernels setting: {report['kernels_setting']}):"]
    if not report["self_checks"]:
        lines.append(
            "none ran: no micro-bench ran"
            if "skipped" in report["micro_bench"]
            else "none ran: the dispatchers used the ops twins (no custom kernel can run here, or kernels off)."
        )
    for check in report["self_checks"]:
        outcome = "passed" if check["passed"] else f"FAILED, twin used: {check['reason']}"
        lines.append(f"- {check['backend']} '{check['kernel']}' ({check['dtype']}, {check['shape_class']}): {outcome}")
    return lines


def _bench_lines(bench: dict[str, Any], roofline: dict[str, Any]) -> list[str]:
    if "skipped" in bench:
        return [f"Skipped: {bench['skipped']}."]
    predicted = {(r["method"], r["prompt_tokens"]): r["predicted_s"] for r in roofline.get("rows", [])}
    plan = bench["plan"]
    lines = [
        f"Model {plan['model']}, dtype {plan['dtype'] or 'backend default'}, H2O S={plan['h2o']['chunk_size']} "
        f"L={plan['h2o']['local']} H={plan['h2o']['heavy']}, SpecPrefill {plan['speculator']} keep "
        f"{plan['specprefill']['keep_ratio']}; one run each after a warm-up.",
        "",
        "| method | prompt tokens | TTFT (s) | roofline prediction (s) | speed-up vs full | kept |",
        "|---|---|---|---|---|---|",
    ]
    for r in bench["rows"]:
        ratio = f"{r['ttft_speedup_vs_full']:.2f}x" if r["ttft_speedup_vs_full"] else "-"
        guess = predicted.get((r["method"], r["prompt_tokens"]))
        lines.append(
            f"| {r['method']} | {r['prompt_tokens']} | {r['ttft_s']:.3f} | "
            f"{'-' if guess is None else f'{guess:.3f}'} | {ratio} | {r['kept_tokens']} |"
        )
    for c in bench.get("calibration", []):  # refreshed by the micro-bench (docs/methods.md#auto)
        lines.append(
            f'\n`method="auto"` on this machine, this model: {c["method"]} from {c["auto_crossover"]} '
            f"tokens ({c['auto_source']})."
        )
    if "skipped" in roofline:
        return lines + ["", f"Roofline prediction: skipped — {roofline['skipped']}."]
    rates = roofline["rates"]
    return lines + [
        "",
        f"Roofline prediction (evaluation/roofline.py) from this machine's rates: GEMM "
        f"{rates['gemm'] / 1e9:.1f} GFLOP/s, attention {rates['attention'] / 1e9:.1f} GFLOP/s, "
        f"copy {rates['bandwidth'] / 1e9:.1f} GB/s ({rates['name']}); norms, RoPE and "
        "launch gaps are not priced, so it is a lower bound.",
    ]


def render_markdown(report: dict[str, Any]) -> str:
    """doctor.md: environment table, kernel verdicts and skip reasons, micro-bench table."""
    lines = [
        f"# specfill doctor — backend {report['backend']}",
        "",
        "Attach this file (and doctor.json) to a bug report.",
        "",
        "## Environment",
        "",
        *_environment_lines(report["environment"]),
        "",
        "## Kernels",
        "",
        *_kernel_lines(report),
        "",
        "## TTFT micro-bench",
        "",
        *_bench_lines(report["micro_bench"], report.get("roofline", {})),
        "",
        f"Doctor ran in {report['seconds']} s.",
    ]
    return "\n".join(lines) + "\n"


def write_doctor(report: dict[str, Any], out_dir: str | os.PathLike) -> list[Path]:
    """doctor.json and doctor.md in out_dir, each written whole (a temporary file, then renamed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (
        ("doctor.json", json.dumps(report, indent=1, default=str) + "\n"),
        ("doctor.md", render_markdown(report)),
    ):
        partial = out / f"{name}.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, out / name)
        paths.append(out / name)
    return paths
