"""A nested speculator: its first K layers read every prompt token, its deeper layers only the
tokens those K layers' own window scores keep (a share `--inner-keep`, at their original
positions), so it can still look ahead with every layer. probe.py found that scoring from the
first K layers keeps what the whole speculator keeps when the look-ahead tokens are the whole
speculator's ("look-ahead (bound)"), and early_exit.py that look-ahead tokens from the first K
layers alone lose variable-tracking hops. Here the look-ahead tokens come from all layers, the
deep ones over the inner subset; the scores are the first K layers' (window + look-ahead queries
over every prompt key), as in the probe's bound rows.

Runs the real 0.5B speculator (torch, float32) on the protocol's samples (ids from the saved
passes): stage 1 is the product's pass (`run_speculator` on the K-layer view, H2O for `--base
auto`), the deep layers are the model's own blocks over the subset's layer-K states (a forward
hook keeps them; the view's last layer computes every row here). Writes results as it goes.

    .venv/bin/python research/speculator_depth/nested.py RECORDS.json PASSES_DIR --depth 12 --inner-keep 0.3 --out FILE
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

TASK_ORDER = ("vt", "niah_multikey_2", "qa_1", "qa_2", "niah_multivalue")
MODELS = Path.home() / ".cache" / "specfill" / "models"
DEEP_STEP = 1024  # the deep layers' prefill step over the subset (tokens)


class DeepHead(torch.nn.Module):
    """Stands in for the K-layer view's final norm and LM head; `layer_k` (a forward hook on the
    view's last block) sees every layer-K output. When the prompt's last step has passed layer K,
    it scores the prompt from the first K layers' window queries, picks the inner subset and
    prefills the deep layers (K..N-1) over the subset's layer-K states; each look-ahead token's
    layer-K state then goes through the deep layers too (the last one as well: its deep queries
    score). The head returns the real norm and LM head of the deep layers' last output."""

    def __init__(self, model, depth: int, inner, ops, scoring, n_prompt: int, lookahead: int, window: int):
        super().__init__()
        self.__dict__["model"] = model  # not a child module (the view already holds its layers)
        self.depth, self.inner, self.ops, self.scoring = depth, inner, ops, scoring
        self.n_prompt, self.lookahead = n_prompt, lookahead
        self.window = window  # the final scoring's query window: the subset holds those tokens
        self.states: list = []  # layer-K outputs of the prompt's steps
        self.seen = 0
        self.attend = self.cache = None  # the view's QueryCapture and cache (a pre-hook sets them)
        self.deep = self.subset = self.capture = None  # the deep layers' cache, tokens, QueryCapture
        self.fed = 0
        self.last = None

    def _blocks(self, x, positions):
        ropes = {False: self.model.rope(positions, x.dtype)}
        ropes[True] = ropes[False] if self.model.rope_local is None else self.model.rope_local(positions, x.dtype)
        for layer in range(self.depth, len(self.model.layers)):
            x = self.model.layers[layer](x, ropes, positions, self.deep.layers[layer], self.capture, 0)
        return x

    def layer_k(self, module, inputs, out) -> None:
        if self.subset is None:
            self.states.append(out)
            self.seen += out.shape[1]
            if self.seen == self.n_prompt:
                self._inner_prefill()
        else:  # a look-ahead token at position P + fed
            self.last = self._blocks(out[:, -1:], torch.tensor([self.n_prompt + self.fed]))
            self.fed += 1

    def _inner_prefill(self) -> None:
        from specfill.core.methods.selection import select_tokens
        from specfill.core.methods.specprefill import QueryCapture, token_importance
        from specfill.core.stages import layer_terms

        args = self.model.args
        states = torch.cat(self.states, dim=1)  # [1, P, hidden]
        self.states = []
        queries = self.attend.stacked()  # [K, W, Hq, D]: the window's, no look-ahead yet
        importance = token_importance(
            self.ops,
            queries,
            lambda layer: self.cache.layer_keys(layer, self.n_prompt),
            self.scoring,
            args.attention_scale,
            args.layer_windows,
            layer_terms(args),
            queries.shape[1],
            list(range(self.depth)),
        )
        chosen = select_tokens(self.ops.to_numpy(importance), self.inner).kept
        self.subset = np.union1d(chosen, np.arange(max(0, self.n_prompt - self.window), self.n_prompt))
        self.deep = self.ops.new_cache(self.model, len(self.subset) + self.lookahead + 1)
        n_layers = args.num_hidden_layers
        self.capture = QueryCapture(
            self.ops,
            n_layers,
            len(self.subset),
            args.attention_scale,
            n_window=self.window,
            layers=list(range(self.depth, n_layers)),
        )
        index = torch.as_tensor(self.subset)
        inner = states[:, index]
        for lo in range(0, len(self.subset), DEEP_STEP):
            hi = min(lo + DEEP_STEP, len(self.subset))
            self.last = self._blocks(inner[:, lo:hi], index[lo:hi])[:, -1:]

    def forward(self, x):
        return self.model.lm_head(self.model.norm(self.last))


def layer_scores(ops, queries, keys, config, scale: float, n_window: int):
    """One layer's scores [n_q, P]: token_importance's inner step (no sliding window, no terms:
    the 0.5B has neither)."""
    from specfill.core.stages import query_start

    probs = ops.attention_scores(queries, keys, scale, None, None, query_start=query_start(keys.shape[2], n_window))
    return ops.reduce_axis(ops.smooth_scores(probs, config.pool_kernel), config.head_reduction, axis=2)[:, 0]


def combined_importance(ops, config, scale, shallow, shallow_keys, deep, deep_keys, subset, n_prompt, n_window):
    """Every layer's scores: the first K layers' queries over every prompt key, the deep layers'
    over the subset's keys (zero elsewhere), reduced over layers then over the queries as
    token_importance does. shallow / deep: [n_l, W + N', Hq, D]; *_keys: row -> [1, Hkv, n, D]."""
    rows = [
        layer_scores(ops, shallow[r : r + 1], shallow_keys(r), config, scale, n_window) for r in range(len(shallow))
    ]
    index = torch.as_tensor(subset)
    for r in range(len(deep)):
        scores = layer_scores(ops, deep[r : r + 1], deep_keys(r), config, scale, n_window)
        full = scores.new_zeros((scores.shape[0], n_prompt))
        full[:, index] = scores
        rows.append(full)
    stacked = torch.stack(rows)  # [n_layers, n_q, P]
    combined = stacked.amax(0) if config.layer_reduction == "max" else stacked.mean(0)
    return ops.reduce_axis(combined, config.lookahead_reduction, axis=0)


@contextmanager
def every_row():
    """Inside it, a model's last layer computes every row (the layer-K hook reads them all), not
    only those the head reads (core/ops.last_rows)."""
    import specfill.backends.torch_cuda.model as model_module

    rows = model_module.last_rows
    model_module.last_rows = lambda *a, **k: 0
    try:
        yield
    finally:
        model_module.last_rows = rows


def nested_pass(ops, model, ids, depth: int, inner, base, stop_ids, step_size: int):
    """The nested speculator's pass over ids [P] (H2O in its first `depth` layers with
    base.speculator_prefill), its look-ahead (PASS_LOOKAHEAD tokens) and the window's queries
    (PASS_QUERY_WINDOW, the inner subset's scoring): (run_speculator's pass of the first layers,
    the DeepHead holding the deep layers' cache, subset and queries)."""
    from specfill.core.methods.specprefill import run_speculator
    from specfill.evaluation.ruler_passes import PASS_LOOKAHEAD, PASS_QUERY_WINDOW

    n_prompt = len(ids)
    view = ops.first_layers(model, depth)
    head = DeepHead(model, depth, inner, ops, base, n_prompt, PASS_LOOKAHEAD, base.query_window)
    view.norm = torch.nn.Identity()
    view.lm_head = head
    keep_states = view.layers[depth - 1].register_forward_hook(head.layer_k)

    def seen(module, inputs):
        head.attend, head.cache = inputs[4], inputs[2]

    watch = view.register_forward_pre_hook(seen)
    try:
        with ops.device_scope(), torch.inference_mode():
            run = run_speculator(
                ops,
                view,
                ids,
                lookahead=PASS_LOOKAHEAD,
                stop_ids=stop_ids,
                step_size=step_size,
                query_window=PASS_QUERY_WINDOW,
                h2o=base.speculator_prefill,
                cache=ops.new_cache(view, n_prompt + PASS_LOOKAHEAD),
                cached=0,
            )
    finally:
        keep_states.remove()
        watch.remove()
    return run, head


def main(argv=None) -> int:
    from specfill import api
    from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig
    from specfill.core.methods.selection import select_tokens
    from specfill.core.methods.specprefill import token_importance
    from specfill.evaluation.machine import describe_machine
    from specfill.evaluation.ruler_passes import SavedPass, prefill_name
    from specfill.evaluation.ruler_protocol import write_atomic

    sys.path.insert(0, str(Path(__file__).parent))
    from probe import HELD

    p = argparse.ArgumentParser()
    p.add_argument("records", type=Path)
    p.add_argument("passes", type=Path)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--inner-keep", type=float, default=0.3)
    p.add_argument("--base", choices=("auto", "default"), default="auto")
    p.add_argument("--tasks", default=",".join(TASK_ORDER))
    p.add_argument("--indices", default=None, help="only these sample indices (e.g. 1,3)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    spec, tokenizer = api.load(str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), backend="cuda", dtype="float32")
    ops, model = spec.ops, spec.model
    base = AUTO_COMPOSITION if args.base == "auto" else SpecPrefillConfig()
    h2o = base.speculator_prefill
    inner = dataclasses.replace(SpecPrefillConfig(), keep_ratio=args.inner_keep, lookahead=0)
    suffix = "" if h2o is None else f"_{prefill_name(h2o)}"
    data = json.loads(args.records.read_text())
    samples = {}
    for r in data["records"]:
        samples.setdefault((r["task"], r["tokens"], r["index"]), r["spans"])
    tasks = args.tasks.split(",")
    indices = None if args.indices is None else {int(i) for i in args.indices.split(",")}
    wanted = [k for k in samples if k[0] in tasks and (indices is None or k[2] in indices)]
    order = sorted(wanted, key=lambda k: (TASK_ORDER.index(k[0]), k[2]))
    result = {
        "machine": describe_machine(),
        "depth": args.depth,
        "inner_keep": args.inner_keep,
        "base": args.base,
        "of": model.args.num_hidden_layers,
        "rows": [],
    }
    for task, tokens, index in order:
        path = args.passes / f"{task}_{tokens}_0_{index}_chat{suffix}.npz"
        if not path.exists():
            print(f"no pass: {path.name}", file=sys.stderr)
            continue
        saved = SavedPass.load(path)
        n_prompt = len(saved.ids)
        began = time.perf_counter()
        with every_row():
            run, head = nested_pass(
                ops,
                model,
                saved.ids,
                args.depth,
                inner,
                base,
                frozenset(tokenizer.eos_token_ids),
                spec.prefill_step_size,
            )
        with ops.device_scope(), torch.inference_mode():
            seconds = time.perf_counter() - began
            window = base.query_window  # the pass kept PASS_QUERY_WINDOW (the inner subset's scoring)
            shallow = run.queries[:, run.n_window - window :]
            scale = model.args.attention_scale
            first = token_importance(
                ops, shallow, run.layer_keys, base, scale, n_window=window, layers=list(range(args.depth))
            )
            deep = head.capture.stacked()
            every = combined_importance(
                ops,
                base,
                scale,
                shallow,
                lambda r: run.layer_keys(r),
                deep,
                lambda r: head.deep.layer_keys(args.depth + r, len(head.subset)),
                head.subset,
                n_prompt,
                window,
            )
            # the same without the look-ahead's queries: the window's alone
            first_window = token_importance(
                ops, shallow[:, :window], run.layer_keys, base, scale, n_window=window, layers=list(range(args.depth))
            )
            every_window = combined_importance(
                ops,
                base,
                scale,
                shallow[:, :window],
                lambda r: run.layer_keys(r),
                deep[:, :window],
                lambda r: head.deep.layer_keys(args.depth + r, len(head.subset)),
                head.subset,
                n_prompt,
                window,
            )
        scorings = (("first", first), ("every", every), ("first_window", first_window), ("every_window", every_window))
        kept = {name: select_tokens(ops.to_numpy(v), base).kept for name, v in scorings}
        # the look-ahead tokens against the whole speculator's: layer 0's query depends on the token alone
        ours = ops.to_numpy(run.queries[0, run.n_window :]).astype(np.float32)
        theirs = saved.queries[0, saved.n_window :]
        same = [
            bool(i < len(theirs) and np.allclose(ours[i], theirs[i], atol=1e-3, rtol=1e-3)) for i in range(len(ours))
        ]
        spans = samples[task, tokens, index].get("needle", [])

        def held(positions):
            row = np.zeros(n_prompt)
            row[positions] = 1.0
            return [float(row[a:b].mean()) if b > a else 0.0 for a, b in spans]

        record = {
            "task": task,
            "index": index,
            "pass_s": seconds,
            "saved_pass_s": saved.seconds,
            "lookahead": run.lookahead,
            "lookahead_same": same,
            "n_saved_lookahead": int(len(theirs)),
            "inner_share": len(head.subset) / n_prompt,
            "inner_spans": held(head.subset),
        }
        for name, positions in kept.items():
            shares = held(positions)
            record[name] = {
                "kept_share": len(positions) / n_prompt,
                "answer_kept": shares,
                "all_kept": all(x >= HELD for x in shares),
            }
        result["rows"].append(record)
        print(
            f"{task} {index}: pass {seconds:.0f} s (whole {saved.seconds:.0f} s), look-ahead same "
            f"{sum(same)}/{len(theirs)}, inner {[round(x, 2) for x in record['inner_spans']]}, "
            f"first {[round(x, 2) for x in record['first']['answer_kept']]}, "
            f"every {[round(x, 2) for x in record['every']['answer_kept']]}, "
            f"every_window {[round(x, 2) for x in record['every_window']['answer_kept']]}",
            flush=True,
        )
        write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    rows = result["rows"]
    for name in ("first", "every", "first_window", "every_window"):
        held = sum(r[name]["all_kept"] for r in rows)
        print(f"nested depth {args.depth}, inner keep {args.inner_keep}, {name}: {held}/{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
