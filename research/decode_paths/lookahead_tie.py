"""Where lookahead_paths.py's 600-token bf16 run parted (a nested speculator's look-ahead, eager against
static steps, from its second token): the first look-ahead step's logits in float32 (eager, static) and
bfloat16 (eager, static) beside each other, for SpecPrefill nested (deep_keep 0.3, deep_from 0.5) and auto's
turn composition. Prints each path's look-ahead and its top 3 logits against float32 eager's.

    .venv/bin/python research/decode_paths/lookahead_tie.py > research/decode_paths/results/lookahead_tie.log
"""

import dataclasses

import numpy as np
import torch
from decode_paths import prompt_ids, set_mode
from lookahead_paths import SPEC

from specfill import api
from specfill.core.config import AUTO_TURN_COMPOSITION, SpecPrefillConfig
from specfill.core.methods import speculator_depth
from specfill.core.methods.specprefill import speculate_and_select

CONFIGS = {
    "nested_dense": dataclasses.replace(SpecPrefillConfig(), deep_keep=0.3, deep_from=0.5),
    "turn": AUTO_TURN_COMPOSITION,
}


def first_step_logits(dtype: str) -> dict[tuple[str, str], torch.Tensor]:
    """(config, path) -> the nested look-ahead's first step's logits (float32 copies), the look-ahead printed."""
    firsts: list[torch.Tensor] = []
    step = speculator_depth.DeepSubset.step

    def recording(self, token, index, capture, wants_logits):
        out = step(self, token, index, capture, wants_logits)
        if index == 0:
            firsts.append(out[-1].float().clone())
        return out

    lm, tokenizer = api.load(str(SPEC), backend="cuda", dtype=dtype, device="cpu")
    ids = np.array(prompt_ids(tokenizer, 600))
    logits = {}
    speculator_depth.DeepSubset.step = recording
    try:
        for name, config in CONFIGS.items():
            for mode in ("eager", "static"):
                set_mode(lm.ops, mode)
                firsts.clear()
                with lm.ops.device_scope():
                    spec, _, _ = speculate_and_select(
                        lm.ops, lm.model, ids, config, stop_ids=frozenset(), speculator_step_size=256
                    )
                logits[name, mode] = firsts[0]
                print(dtype, name, mode, spec.lookahead, flush=True)
    finally:
        speculator_depth.DeepSubset.step = step
    return logits


def main() -> None:
    logits = {dtype: first_step_logits(dtype) for dtype in ("float32", "bfloat16")}
    for name in CONFIGS:
        ref = logits["float32"][name, "eager"]
        top = torch.topk(ref, 3)
        print(name, "fp32 top3", top.indices.tolist(), top.values.tolist())
        for dtype, mode in (("float32", "static"), ("bfloat16", "eager"), ("bfloat16", "static")):
            other = logits[dtype][name, mode]
            top = torch.topk(other, 3)
            difference = float((other - ref).abs().max())
            print((dtype, name, mode), "max|d| vs fp32 eager", difference, "top3", top.indices.tolist(),
                  [round(x, 3) for x in top.values.tolist()])  # fmt: skip


if __name__ == "__main__":
    main()
