"""scripts/gpu_bench.py's reading of its rows: the figures the GPU issue asks for (e2e.json), the
Markdown table, the TTFT plot; and its decode modes with the logits check that compares them."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from gpu_clocks import clocks_table  # scripts/ is on the path wherever this sibling of gpu_bench.py is imported

from specfill.evaluation.roofline import Shape


def decode_mode(model, mode: str) -> None:
    """graphs: static steps captured as CUDA graphs; eager-static: the same steps uncaptured;
    eager: the layer-by-layer path (backends/torch_cuda/decode_graph.py)."""
    from specfill.backends.torch_cuda.decode_graph import CudaGraphCapture, DecodeGraphs

    ops = model.ops
    ops.static_decode = mode != "eager"
    captured = mode in ("graphs", "compiled") and bench_on_cuda(ops)
    ops.decode_graphs = DecodeGraphs(CudaGraphCapture() if captured else None, compiled=mode == "compiled")


def walk_ops(*models) -> list:
    """The distinct ops objects of the models (and speculator) that record H2O batches as CUDA graphs."""
    found: dict[int, object] = {}
    for m in models:
        ops = getattr(m, "ops", None)
        if getattr(ops, "walk_stats", None) is not None:
            found.setdefault(id(ops), ops)
    return list(found.values())


def graph_state(ops) -> dict[str, bool | None]:
    """A decode row's CUDA graphs at its end (None where steps are not captured): capture_failed, a capture
    failed and its kind's steps ran eagerly (logged once); capture_first false, a step captured without its
    eager run failed, so every later new prompt's first step ran eagerly first (decode_graph.DecodeGraphs)."""
    graphs = ops.decode_graphs
    if graphs is None or not graphs.capture:
        return {"capture_failed": None, "capture_first": None}
    return {"capture_failed": bool(graphs.failed), "capture_first": graphs.capture_first}


def walk_counts(ops_list: list) -> dict:
    """H2O's walk graphs so far (backends/torch_cuda/walk_graph.py), summed over the ops objects:
    batches captured and replayed, capture seconds, and why they were turned off (None: they were not)."""
    stats = [ops.walk_stats for ops in ops_list]
    return {
        "captured": sum(s.captured for s in stats),
        "replayed": sum(s.replayed for s in stats),
        "capture_seconds": round(sum(s.capture_seconds for s in stats), 4),
        "refused": next((s.refused for s in stats if s.refused), None),
    }


@contextmanager
def walk_row(row: dict, models, eager: bool):
    """Around one bench row: H2O's walk graphs of the models' ops off where the row says --eager-walk
    (its batches run as they come), and row["walk_graphs"] what the row captured and replayed."""
    ops_list = walk_ops(*models)
    before, saved = walk_counts(ops_list), [ops.walk_capture for ops in ops_list]
    for ops in ops_list if eager else []:
        ops.walk_capture = None
    try:
        yield ops_list
    finally:
        for ops, capture in zip(ops_list, saved):
            ops.walk_capture = capture
        if ops_list:
            after = walk_counts(ops_list)
            row["walk_graphs"] = {k: (v - before[k] if k != "refused" else v) for k, v in after.items()}


def logits_check(model, ids: list[int]) -> dict:
    """One prefill of ids, then the same two decode steps on three copies of its cache: eager (the
    layer-by-layer path), eager-static (decode_graph.static_step) and graphs (the second step a
    replay). Max |difference| of the logits beside their spread and the eager top-2 gap: a
    difference far below the gap is rounding (fused kernels differ), one near the spread a bug."""
    from specfill.core.methods.prefill import prefill

    ops, out = model.ops, {}
    with ops.device_scope():
        cache = ops.new_cache(model.model, len(ids) + 8)
        prefill(ops, model.model, ops.tokens(np.array(ids)), 0, cache, step_size=model.prefill_step_size)
        logits = {}
        for mode in ("eager", "eager-static", "graphs"):
            decode_mode(model, mode)
            copy = cache.copy(cache.filled, cache.capacity)
            steps = [
                ops.forward(model.model, ops.tokens(np.array([t])), len(ids) + i, copy, None, 0)[-1]
                for i, t in enumerate((5, 7))
            ]
            logits[mode] = [x.float() for x in steps]
        decode_mode(model, "graphs")
        eager = logits["eager"]
        top2 = torch.topk(eager[0], 2).values
        out["eager_logit_std"] = float(eager[0].std())
        out["eager_top2_gap"] = float(top2[0] - top2[1])
        for mode in ("eager-static", "graphs"):
            out[f"{mode}_vs_eager_max_abs"] = [float((a - b).abs().max()) for a, b in zip(logits[mode], eager)]
            out[f"{mode}_argmax_equal"] = [bool(a.argmax() == b.argmax()) for a, b in zip(logits[mode], eager)]
        out["graphs_vs_eager_static_bitwise"] = [
            bool(torch.equal(a, b)) for a, b in zip(logits["graphs"], logits["eager-static"])
        ]
    return out


def bench_on_cuda(ops) -> bool:
    return ops.device.type == "cuda"


def plot(result: dict, path: Path, device_name: str | None = None) -> Path:
    """TTFT vs prompt length, one line per row name; the title names the models, dtype and device."""
    from specfill.evaluation.plots import plot_ttft

    plan = result["plan"]
    device = device_name or result.get("device_name") or plan["device"]
    rows = [
        {"backend": plan["device"], "method": r["method"], "prompt_tokens": r["prompt_tokens"], "ttft_s": r["ttft_s"]}
        for r in result["rows"]
        if r.get("ttft_s") is not None
    ]
    title = f"{plan['model']} (speculator {plan['speculator']}), {plan['dtype']}, {device}, 1 GPU stream"
    return plot_ttft(rows, path, title)


def prefill_flops(shape: Shape, n_tokens: int) -> float:
    """FLOPs of a full prefill: the projections and MLP of every token, causal attention's
    q.k and p.v products, the last token's logits (evaluation/roofline.py counts the same)."""
    pairs = n_tokens * (n_tokens + 1) / 2
    return (
        2 * n_tokens * shape.layer_params() * shape.layers
        + 4 * shape.head_dim * shape.heads * pairs * shape.layers
        + 2 * shape.hidden * shape.vocab
    )


def e2e(result: dict, shape: Shape) -> dict:
    """The figures the issue asks for: warm decode tokens/s (graphs, plain), and per prompt length
    full prefill's roofline fraction (predicted / measured) and TFLOP/s; the attention kernels chosen;
    every first-use kernel self-check of the run (a kernel that failed one ran as its torch twin)."""
    from specfill.backends.torch_cuda.attention_choice import chosen
    from specfill.core.self_check import KERNEL_SELF_CHECK

    decode = {d["mode"]: d for d in result["decode"] if not d["draft_tokens"] and d.get("decode_tps")}
    out: dict = {
        "decode_tokens_per_s": decode["graphs"]["decode_tps"] if "graphs" in decode else None,
        "decode_tokens_per_s_by_mode": {m: d["decode_tps"] for m, d in decode.items()},
        "decode_tokens_equal_eager": {m: d.get("tokens_equal_eager") for m, d in decode.items()},
        "decode_setup_s": {m: d.get("first_run_setup_s") for m, d in decode.items()},
        "prefill_roofline_fraction": {},
        "prefill_tflops": {},
        "ttft_s": {},
        "acceptance": acceptance(result),
        "attention_kernels": chosen(),
        "kernel_self_checks": [
            {"kernel": v.kernel, "dtype": v.dtype, "shape": v.shape_class, "passed": v.passed, "reason": v.reason}
            for v in KERNEL_SELF_CHECK.verdicts()
        ],
    }
    for r in result["rows"]:
        if r.get("ttft_s") is None:
            continue
        out["ttft_s"].setdefault(r["method"], {})[str(r["prompt_tokens"])] = r["ttft_s"]
        if r["kind"] == "full":
            key = str(r["prompt_tokens"]) if r["method"] == "full" else f"{r['prompt_tokens']} ({r['method']})"
            if r.get("predicted_s"):
                out["prefill_roofline_fraction"][key] = r["predicted_s"] / r["ttft_s"]
            out["prefill_tflops"][key] = prefill_flops(shape, r["prompt_tokens"]) / r["ttft_s"] / 1e12
    return out


# issue 50's acceptance lines, read off a run's rows: decode (graphs, warm median) at the decode rows' length,
# full prefill's measured / roofline at ~32K and the longest length, and at the longest: SpecPrefill's and the
# composition's speed-ups, H2O's against 0.8 of its roofline ratio (full's roofline over its own)
DECODE_TPS, FULL_OVER_ROOFLINE, SPECPREFILL_X, COMPOSITION_X, H2O_SHARE = 150.0, 1.5, 2.5, 4.0, 0.8


def acceptance(result: dict) -> list[dict]:
    """Each line: what it asks, the measured figure, the bound, whether it holds (None: not measured, a row
    missing or out of time) and, where it does not, what it needs (`needs`: the TTFT or decode step the bound
    asks for; for SpecPrefill and the composition also their speculator's pass with the rest as measured, the
    part their speed-up turns on). Decode tokens against the eager path are the exact step's (float32)."""
    rows = {(r["method"], r["prompt_tokens"]): r for r in result["rows"] if r.get("ttft_s")}
    lengths = sorted({n for _, n in rows})
    out: list[dict] = []

    def line(what: str, measured: float | None, bound: float, at_least: bool, needs: str = "") -> None:
        holds = None if measured is None else (measured >= bound if at_least else measured <= bound)
        out.append({"line": what, "measured": measured, "bound": bound, "holds": holds, "needs": needs * (not holds)})

    graphs = [d for d in result["decode"] if d.get("mode") == "graphs" and not d["draft_tokens"]]
    tps = graphs[0].get("decode_tps") if graphs else None
    at = f" at {graphs[0]['prompt_tokens']}" if graphs else ""
    step = f"a step <= {1e3 / DECODE_TPS:.3g} ms (ran {1e3 / tps:.3g})" if tps else ""
    line(f"decode tok/s (graphs, warm median){at} >= {DECODE_TPS:g}", tps, DECODE_TPS, True, step)
    longest = lengths[-1] if lengths else None
    mid = min(lengths, key=lambda n: abs(n - 32768)) if lengths else None
    for n in dict.fromkeys(n for n in (mid, longest) if n is not None):
        full = rows.get(("full", n), {})
        ratio = full.get("measured_over_predicted")
        needs = _ttft_needs(full, FULL_OVER_ROOFLINE * full["predicted_s"]) if ratio else ""
        line(
            f"full prefill at {n}: measured / roofline <= {FULL_OVER_ROOFLINE:g}",
            ratio,
            FULL_OVER_ROOFLINE,
            False,
            needs,
        )
    full = rows.get(("full", longest), {})
    for method, bound in (("specprefill", SPECPREFILL_X), ("composition", COMPOSITION_X)):
        row = rows.get((method, longest), {})
        speedup = row.get("speedup_vs_full")
        needs = _ttft_needs(row, full["ttft_s"] / bound) if speedup and full else ""
        line(f"{method} at {longest}: speed-up vs full >= {bound:g}", speedup, bound, True, needs)
    h2o = rows.get(("h2o", longest), {})
    priced = full.get("predicted_s") and h2o.get("predicted_s")
    bound = H2O_SHARE * full["predicted_s"] / h2o["predicted_s"] if priced else float("nan")
    measured = h2o.get("speedup_vs_full") if priced else None
    needs = _ttft_needs(h2o, full["ttft_s"] / bound) if measured else ""
    line(f"h2o at {longest}: speed-up vs full >= {H2O_SHARE:g} x its roofline ratio", measured, bound, True, needs)
    return out


def _ttft_needs(row: dict, ttft: float) -> str:
    """'TTFT <= 3.84 s (ran 4.45)', and where the row has a speculator pass, the pass that would give that TTFT
    with the other parts as measured: '; its speculator pass <= 2.14 s (ran 2.74), the rest as measured'."""
    said = f"TTFT <= {ttft:.3g} s (ran {row['ttft_s']:.3g})"
    ran = (row.get("parts") or {}).get("speculator_pass", {}).get("measured_s")
    if ran:
        said += f"; its speculator pass <= {ttft - (row['ttft_s'] - ran):.3g} s (ran {ran:.3g}), the rest as measured"
    return said


def acceptance_lines(result: dict) -> list[str]:
    lines = [
        "",
        "Issue 50's acceptance lines as this run measured them:",
        "",
        "| line | measured | bound | holds | needs |",
        "|---|---|---|---|---|",
    ]
    for a in acceptance(result):
        holds = {True: "yes", False: "no", None: "not measured"}[a["holds"]]
        lines.append(
            f"| {a['line']} | {fmt(a['measured'], '.3g')} | {fmt(a['bound'], '.3g')} | {holds} | {a['needs']} |"
        )
    return lines


def row_line(r: dict) -> str:
    if not r["runs"]:
        return f"{r['method']:<16} {r['prompt_tokens']:>7}: {r['error']}"
    ratio = f"{r['measured_over_predicted']:.2f}x roofline" if r.get("measured_over_predicted") else "no roofline"
    return (
        f"{r['method']:<16} {r['prompt_tokens']:>7}: TTFT {r['ttft_s']:.3f} s (median of {len(r['runs'])}), "
        f"{ratio}, peak {r['peak_gb']:.1f} GB, kept {r['kept_tokens']}" + (f"; {r['error']}" if r["error"] else "")
    )


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def parts_table(rows: list[dict]) -> list[str]:
    """Where each row's time went: its prefill's parts (medians of its runs, the backend's clock)
    beside the roofline's price of the same work; none when no row timed its parts."""
    timed = sorted((r for r in rows if r.get("parts")), key=lambda r: r["prompt_tokens"])
    if not timed:
        return []
    lines = [
        "",
        "Parts of each prefill (medians; speculator = its pass and look-ahead, selection = the scoring, "
        "main_prefill = the main model over the kept tokens; the rest of a TTFT is the first token and the host):",
        "",
        "| method | prompt tokens | part | measured (s) | roofline (s) | measured / roofline |",
        "|---|---|---|---|---|---|",
    ]
    for r in timed:
        for name, part in r["parts"].items():
            measured, guess = part["measured_s"], part.get("predicted_s")
            ratio = measured / guess if guess else None
            lines.append(
                f"| {r['method']} | {r['prompt_tokens']} | {name} | {measured:.4g} | {fmt(guess, '.4g')} "
                f"| {fmt(ratio, '.2f')} |"
            )
    return lines


def report(result: dict) -> str:
    plan = result["plan"]
    rates = result.get("roofline")
    lines = [
        "# GPU session: TTFT and decode on random weights",
        "",
        *(
            ["Partial: the step stopped before the end; these are the rows it completed.", ""]
            if not result["complete"]
            else []
        ),
        f"Model {plan['model']}, speculator {plan['speculator']}, {plan['dtype']} on {plan['device']}; "
        f"medians of up to {plan['repeats']} runs, {plan['decode_tokens']} decoded tokens each. Roofline: "
        + (f"{rates['name']} (evaluation/roofline.py DEVICES)." if rates else "none for this device.")
        + f" Peak GB: the most allocated during a run (torch.cuda.max_memory_allocated on a GPU, the process's"
        f" peak RSS on a CPU), both models' weights included ({fmt(result.get('weights_gb'), '.1f')} GB loaded).",
        "",
        "| method | prompt tokens | runs | TTFT median (s) | speed-up vs full | kept | peak GB | roofline (s) "
        "| measured / roofline | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(result["rows"], key=lambda r: r["prompt_tokens"]):  # run longest first, read shortest first
        lines.append(
            f"| {r['method']} | {r['prompt_tokens']} | {len(r['runs'])} | {fmt(r.get('ttft_s'), '.3f')} "
            f"| {fmt(r.get('speedup_vs_full'), '.2f')} | {fmt(r.get('kept_tokens'), 'd')} | {fmt(r['peak_gb'], '.1f')} "
            f"| {fmt(r.get('predicted_s'), '.3g')} | {fmt(r.get('measured_over_predicted'), '.2f')} "
            f"| {r['error'] or ''} |"
        )
    lines += parts_table(result["rows"])
    lines += acceptance_lines(result)
    lines += clocks_table(result)
    lines += [
        "",
        "| decode after full prefill | mode | prompt tokens | tok/s (warm median) | first run tok/s | setup s "
        "| roofline tok/s (plain) | tokens = eager | accepted / drafted | note |",
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|---|"]
    for d in result["decode"]:
        accepted = f"{d['accepted']} / {d['drafted']}" if d.get("drafted") is not None else "-"
        label = f"drafting k={d['draft_tokens']} ({plan['speculator']})" if d["draft_tokens"] else "plain"
        lines.append(
            f"| {label} | {d.get('mode', '-')} | {d['prompt_tokens']} | {fmt(d.get('decode_tps'), '.1f')} "
            f"| {fmt(d.get('first_run_tps'), '.1f')} | {fmt(d.get('first_run_setup_s'), '.3f')} "
            f"| {fmt(d['predicted_plain_tps'], '.1f')} | {d.get('tokens_equal_eager', '-')} | {accepted} "
            f"| {d['error'] or ''} |"
        )
    if result.get("e2e"):
        listed = ("attention_kernels", "kernel_self_checks", "acceptance")
        lines += ["", "e2e: `" + json.dumps({k: v for k, v in result["e2e"].items() if k not in listed}) + "`"]
        for key, value in result["e2e"]["attention_kernels"].items():
            lines.append(f"- attention {key}: chose {value['chosen']}; {value['candidates']}")
        for check in result["e2e"].get("kernel_self_checks", []):
            verdict = "passed" if check["passed"] else f"FAILED ({check['reason']}): its torch twin ran"
            lines.append(f"- self-check {check['kernel']} {check['dtype']} {check['shape']}: {verdict}")
    return "\n".join(lines + ["", *(f"- {n}" for n in result["notes"])])
