"""Does scoring with the prompt's last W queries (an observation window, as SnapKV does) keep more
of each answer span than the last token + look-ahead alone? (issue 34, qa_2 losses.)

Per sample: the speculator runs the prompt once through core's run_speculator with query_window
W_MAX (the post-RoPE queries of the last W_MAX prompt positions, then the look-ahead's); every
variant's importance is
the reference's (softmax over the prompt keys, causal for the window queries, pooling, head max,
layer reduction, mean over the scoring queries); the selection is the reference's select_tokens.
Writes results/<length>.json (per sample, per variant: answer-span shares), resumable.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

W_MAX = 128
HERE = Path(__file__).resolve().parent


def layer_scores(q, k, scale, causal_from, kernel, heads):
    """q [n_q, Hq, D], k [Hkv, P, D] -> [n_q, P] (softmax over visible keys, pooled, heads reduced)."""
    from specfill.core.reference.specprefill import smooth_scores
    n_q, hq, _ = q.shape
    k = np.repeat(k, hq // k.shape[0], axis=0)
    logits = np.einsum("qhd,hpd->qhp", q, k) * scale
    if causal_from is not None:
        pos = causal_from + np.arange(n_q)
        mask = np.arange(k.shape[1])[None, :] <= pos[:, None]
        logits = np.where(mask[:, None, :], logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(-1, keepdims=True)
    pooled = smooth_scores(w, kernel)
    return pooled.max(axis=1) if heads == "max" else pooled.mean(axis=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="qa_2,qa_1,vt,niah_multivalue,niah_multikey_2")
    ap.add_argument("--length", type=int, default=4000)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--models", default=os.path.expanduser("~/.cache/specfill/models"))
    args = ap.parse_args()
    import specfill.core.methods.specprefill as sp
    from specfill.api import encode_prompt, load, load_speculator
    from specfill.core import SpecPrefillConfig
    from specfill.core.reference.specprefill import select_tokens
    from specfill.evaluation.machine import describe_machine
    from specfill.evaluation.ruler_run import span_shares
    from specfill.evaluation.ruler_tasks import build_sample

    out = HERE / "results" / f"{args.length}.json"
    result = json.loads(out.read_text()) if out.exists() else {"records": []}
    result["machine"] = describe_machine()
    done = {(r["task"], r["index"]) for r in result["records"]}
    m = Path(args.models)
    model, tok = load(str(m / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), backend="cuda", dtype="bfloat16")
    spec = load_speculator(str(m / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), model, tok, dtype="bfloat16")
    variants = {"max 0.3": (0, "max", 0.3), "max 0.3 w16": (16, "max", 0.3), "max 0.3 w32": (32, "max", 0.3),
                "max 0.3 w64": (64, "max", 0.3), "max 0.3 w128": (128, "max", 0.3),
                "mean 0.3 w32": (32, "mean", 0.3), "max 0.2 w32": (32, "max", 0.2), "max 0.2": (0, "max", 0.2),
                "max 0.3 w32 only": (-32, "max", 0.3)}
    for task in args.tasks.split(","):
        for index in range(args.trials):
            if (task, index) in done:
                continue
            sample = build_sample(tok, task, args.length, index, 0, True)
            ids = np.asarray(encode_prompt(tok, sample.prompt), np.int64)
            spec_model, step = model.speculator_model(spec)
            ops = model.ops
            t0 = time.perf_counter()
            with ops.device_scope():
                p = sp.run_speculator(ops, spec_model, ids, lookahead=8, stop_ids=frozenset(tok.eos_token_ids),
                                      step_size=step, query_window=W_MAX)
            secs = time.perf_counter() - t0
            every = ops.to_numpy(p.queries).astype(np.float64)  # [n_l, W_MAX + N, Hq, D]
            win_q, la_q = every[:, :W_MAX], every[:, W_MAX - 1:]  # the window; the last token + look-ahead
            keys = ops.to_numpy(p.keys).astype(np.float64)  # [n_l, Hkv, P, D]
            P, scale = len(ids), spec_model.args.attention_scale
            n_l = keys.shape[0]
            la = np.stack([layer_scores(la_q[i], keys[i], scale, None, 13, "max") for i in range(n_l)], 1)  # [nq, nl, P]
            wq = np.stack([layer_scores(win_q[i], keys[i], scale, P - W_MAX, 13, "max") for i in range(n_l)], 1)
            rec = {"task": task, "index": index, "P": P, "speculator_s": secs, "variants": {}}
            for name, (w, lred, keep) in variants.items():
                red = (lambda x: x.max(1)) if lred == "max" else (lambda x: x.mean(1))
                parts = [] if w < 0 else [red(la)]
                if w:
                    parts.append(red(wq[:, :, :][W_MAX - abs(w):]))
                imp = np.concatenate(parts, 0).mean(0)
                sel = select_tokens(imp, SpecPrefillConfig(keep_ratio=keep, layer_reduction=lred))
                row = np.zeros(P)
                row[sel.kept] = 1
                rec["variants"][name] = {"kept": int(len(sel.kept)),
                                         "answer_kept": span_shares(row, sample.spans.get("needle", []))}
            result["records"].append(rec)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result) + "\n")
            os.replace(tmp, out)
            summary = {n: round(min(v["answer_kept"] or [1]), 2) for n, v in rec["variants"].items()}
            print(f"{task} #{index} P={P} {secs:.1f}s least-kept span: {summary}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
