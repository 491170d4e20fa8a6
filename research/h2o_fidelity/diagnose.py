"""Why H2O loses RULER answers that full prefill gets (issue 34, item 2): per sample, full and H2O
prefill of the same prompt through the driver, then

1. memory: per layer, the share of (KV head, chunk) memory sets of the chunks after the answer
   span that hold its tokens (is the answer in M when later chunks are read?);
2. drift: per layer, the cosine between H2O's cached keys / values and full prefill's, for the
   tokens of chunk 0 (exact: causal attention inside the first chunk), the answer span, the other
   tokens after chunk 0 and the dense tail;
3. patching: H2O's cache with full prefill's keys and values put back for some (layers,
   positions), then the same greedy decoding from it (the last prompt token prefilled again on
   the patched cache): which repair brings the answer back says where the loss is made.

    .venv/bin/python research/h2o_fidelity/diagnose.py --tasks qa_1 --samples 0,1 --length 4000 \\
        --out research/h2o_fidelity/results/diagnosis_4k.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from specfill.api import encode_prompt, load
from specfill.core import H2OConfig
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine
from specfill.evaluation.ruler_run import answer_budget
from specfill.evaluation.ruler_tasks import build_sample, score

MODELS = Path(os.environ.get("SPECFILL_CACHE", Path.home() / ".cache/specfill")) / "models"


def generate(model, tokenizer, ids, sample, budget, method, info, reuse=None):
    stop = frozenset(tokenizer.eos_token_ids)
    detok, text = tokenizer.streaming_detokenizer(), ""
    for token in model.generate_step(ids, max_tokens=budget, sampling=SamplingConfig(), stop_ids=stop, method=method,
                                     info=info, reuse=reuse):
        if token in stop:
            break
        text += detok.add_token(token)
        if score(text, sample.outputs, sample.metric) == 1.0:
            break
    text += detok.finish()
    return text.strip(), score(text, sample.outputs, sample.metric)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[Hkv, T, D] x2 -> [T]: cosine per token, averaged over KV heads."""
    a, b = a.float(), b.float()
    return (torch.nn.functional.cosine_similarity(a, b, dim=-1)).mean(dim=0)


def diagnose(model, tokenizer, sample, budget, config: H2OConfig) -> dict:
    ids = encode_prompt(tokenizer, sample.prompt)
    n = len(ids)
    full_info, h2o_info = GenerationInfo(), GenerationInfo(record_memory=True)
    full_text, full_score = generate(model, tokenizer, ids, sample, budget, PrefillMethod("full"), full_info)
    h2o_text, h2o_score = generate(model, tokenizer, ids, sample, budget, PrefillMethod("h2o", h2o=config), h2o_info)
    kf, vf = full_info.kv.cache.k[:, 0, :, :n].clone(), full_info.kv.cache.v[:, 0, :, :n].clone()
    h2o_cache = h2o_info.kv.cache
    kh, vh = h2o_cache.k[:, 0, :, :n].clone(), h2o_cache.v[:, 0, :, :n].clone()
    spans = sample.spans.get("needle", [])
    answer = np.zeros(n, bool)
    for a, b in spans:
        answer[a:b] = True
    s, w = config.chunk_size, config.dense_tail
    groups = {"chunk 0": np.arange(n) < s, "answer": answer & (np.arange(n) >= s),
              "other after chunk 0": (~answer) & (np.arange(n) >= s) & (np.arange(n) < n - w),
              "dense tail": np.arange(n) >= n - w}
    drift = {"keys": {}, "values": {}}
    for name, mask in groups.items():
        where = torch.from_numpy(np.flatnonzero(mask))
        if len(where) == 0:
            continue
        drift["keys"][name] = [round(float(cosine(kf[l][:, where], kh[l][:, where]).mean()), 4) for l in range(len(kf))]
        drift["values"][name] = [round(float(cosine(vf[l][:, where], vh[l][:, where]).mean()), 4) for l in range(len(vf))]
    memory = []
    for sets in h2o_info.memory_sets:  # per layer: memory sets after chunks 0..C-2, each [Hkv, M]
        shares = []
        for c, indices in enumerate(sets):
            chunk_end = (c + 1) * s
            held = [a for a, b in spans if b <= chunk_end]  # spans that exist when this memory is built
            if held:
                shares.append(np.mean([np.isin(np.arange(a, b), np.asarray(indices)[h]).mean()
                                       for a, b in spans if b <= chunk_end for h in range(len(indices))]))
        memory.append(round(float(np.mean(shares)), 3) if shares else None)
    n_layers = kf.shape[0]
    patches = {"answer span, all layers": (range(n_layers), answer),
               "answer span, first third": (range(n_layers // 3), answer),
               "answer span, last two thirds": (range(n_layers // 3, n_layers), answer),
               "all prompt tokens, first third": (range(n_layers // 3), np.ones(n, bool)),
               "all prompt tokens, all layers": (range(n_layers), np.ones(n, bool))}
    repaired = {}
    for name, (layers, mask) in patches.items():
        cache = type(h2o_cache)(h2o_cache.k.clone(), h2o_cache.v.clone())  # a normal tensor (not inference mode)
        cache.positions.copy_(h2o_cache.positions)
        for layer, filled in zip(cache.layers, h2o_cache.layers):
            layer.offset = filled.offset
        where = torch.from_numpy(np.flatnonzero(mask[:n - 1]))
        for l in layers:
            cache.k[l, 0][:, where] = kf[l][:, where]
            cache.v[l, 0][:, where] = vf[l][:, where]
        text, value = generate(model, tokenizer, ids, sample, budget, PrefillMethod("full"), GenerationInfo(),
                               reuse=KVState(cache, n - 1))
        repaired[name] = {"score": value, "answer": text[:120]}
    return {"task": sample.task, "index": sample.index, "prompt_tokens": n, "answer_spans": spans,
            "full": {"score": full_score, "answer": full_text[:120]}, "h2o": {"score": h2o_score, "answer": h2o_text[:120]},
            "answer_in_memory_by_layer": memory, "cosine_by_layer": drift, "patched": repaired}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="qa_1")
    parser.add_argument("--samples", default="0")
    parser.add_argument("--length", type=int, default=4000)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--h2o", default="", help="H2OConfig fields, key=value,...")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    fields = {k: int(v) for k, v in (item.split("=") for item in filter(None, args.h2o.split(",")))}
    config = H2OConfig(**fields)
    model, tokenizer = load(str(MODELS / args.model), backend="cuda", dtype=args.dtype, device="cpu")
    result = json.loads(args.out.read_text()) if args.out.exists() else {"runs": [], "samples": []}
    result["runs"].append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": describe_machine(),
                           "model": args.model, "dtype": args.dtype, "h2o": vars(config)})
    for task in args.tasks.split(","):
        for index in map(int, args.samples.split(",")):
            if any(s["task"] == task and s["index"] == index and s["length"] == args.length for s in result["samples"]):
                continue
            sample = build_sample(tokenizer, task, args.length, index, 0, True)
            found = diagnose(model, tokenizer, sample, answer_budget(sample, None), config)
            found["length"] = args.length
            result["samples"].append(found)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result, indent=1) + "\n")
            os.replace(tmp, args.out)
            print(task, index, found["full"], found["h2o"], found["patched"], flush=True)


if __name__ == "__main__":
    main()
