"""Where lookahead_paths.py's 600-token bf16 run parted (a nested speculator's look-ahead, eager against
static steps, from its second token): the first look-ahead step's logits in float32 (eager, static) and
bfloat16 (eager, static) beside each other, for SpecPrefill nested (deep_keep 0.3, deep_from 0.5) and auto's
turn composition. Prints each path's look-ahead and its top 3 logits against float32 eager's.

    .venv/bin/python research/decode_paths/lookahead_tie.py > research/decode_paths/results/lookahead_tie.log
"""

import dataclasses

import numpy as np
import torch
from decode_paths import MODELS, prompt_ids, set_mode

from specfill import api
from specfill.core.config import AUTO_TURN_COMPOSITION, SpecPrefillConfig
from specfill.core.methods import speculator_depth
from specfill.core.methods.specprefill import speculate_and_select

SPEC = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
rec = []
orig = speculator_depth.DeepSubset.step


def step(self, token, s, capture, wants):
    out = orig(self, token, s, capture, wants)
    rec.append((token, None if out is None else out[-1].float().clone()))
    return out


speculator_depth.DeepSubset.step = step
res = {}
cfgs = {
    "nested_dense": dataclasses.replace(SpecPrefillConfig(), deep_keep=0.3, deep_from=0.5),
    "turn": AUTO_TURN_COMPOSITION,
}
for dtype in ("float32", "bfloat16"):
    lm, tok = api.load(str(SPEC), backend="cuda", dtype=dtype, device="cpu")
    ids = np.array(prompt_ids(tok, 600))
    for cname, cfg in cfgs.items():
        for mode in ("eager", "static"):
            set_mode(lm.ops, mode)
            rec.clear()
            with lm.ops.device_scope():
                spec, sel, _ = speculate_and_select(
                    lm.ops, lm.model, ids, cfg, stop_ids=frozenset(), speculator_step_size=256
                )
            res[(dtype, cname, mode)] = [r for r in rec]
            print(dtype, cname, mode, spec.lookahead, flush=True)
for cname in cfgs:
    ref = res[("float32", cname, "eager")][0][1]
    top = torch.topk(ref, 3)
    print(cname, "fp32 top3", top.indices.tolist(), top.values.tolist())
    for key in [("float32", cname, "static"), ("bfloat16", cname, "eager"), ("bfloat16", cname, "static")]:
        l = res[key][0][1]
        print(
            key,
            "max|d| vs fp32 eager",
            float((l - ref).abs().max()),
            "top3",
            torch.topk(l, 3).indices.tolist(),
            [round(x, 3) for x in torch.topk(l, 3).values.tolist()],
        )
