"""`auto`'s composition (core/config.AUTO_COMPOSITION) against the same settings with a smaller
speculator H2O, timed in one process on the bench's text (evaluation/texts.tokens_of_length), the
pair (Qwen2.5-Coder 1.5B + 0.5B Q4_K_M) in bfloat16 on the CPU, 2 threads, after a 1K warm-up:
TTFT, its parts (speculator, selection, main prefill) and the kept tokens, in the order given.

    .venv/bin/python research/speculator_h2o/ab.py 32000 base,both,both,base   # run alone

Arms: base (AUTO_COMPOSITION), s512 (speculator chunks of 512), m128 (speculator L = H = 128),
both (chunks of 512 and L = H = 128); df33 (the speculator's deeper layers
from a third of its depth), dk02 (they read 0.2 of the prompt), k08 (keep 0.08); dense (the speculator's
first layers attend densely, no H2O); nb05 (half a neighbour chunk each side)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from specfill import api
from specfill.core.config import AUTO_COMPOSITION, speculator_h2o
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from specfill.evaluation.texts import tokens_of_length

MODELS = Path.home() / ".cache" / "specfill" / "models"
ARMS = {  # built when named: s512's L + H is clamped to its chunk, with a warning
    "base": lambda: AUTO_COMPOSITION,
    "s512": lambda: dataclasses.replace(AUTO_COMPOSITION, speculator_prefill=speculator_h2o(chunk_size=512)),
    "m128": lambda: dataclasses.replace(AUTO_COMPOSITION, speculator_prefill=speculator_h2o(local=128, heavy=128)),
    "both": lambda: dataclasses.replace(
        AUTO_COMPOSITION, speculator_prefill=speculator_h2o(chunk_size=512, local=128, heavy=128)
    ),
    "df33": lambda: dataclasses.replace(AUTO_COMPOSITION, deep_from=0.33),
    "dk02": lambda: dataclasses.replace(AUTO_COMPOSITION, deep_keep=0.2),
    "k08": lambda: dataclasses.replace(AUTO_COMPOSITION, keep_ratio=0.08),
    "dense": lambda: dataclasses.replace(AUTO_COMPOSITION, speculator_prefill="dense"),
    "nb05": lambda: dataclasses.replace(AUTO_COMPOSITION, neighbours=0.5),
}


def main() -> None:
    torch.set_num_threads(2)
    n, arms = int(sys.argv[1]), sys.argv[2].split(",")
    load = {"backend": "cuda", "dtype": "bfloat16", "device": "cpu"}
    lm, tok = api.load(str(MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), **load)[:2]
    spec = api.load(str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), **load)[0]
    ids = tokens_of_length(tok, n)
    for arm in ["warm", *arms]:
        config, prompt = (AUTO_COMPOSITION, ids[:1024]) if arm == "warm" else (ARMS[arm](), ids)
        method = PrefillMethod("specprefill", speculator=spec, specprefill=config)
        info, began = GenerationInfo(), time.perf_counter()
        next(
            lm.generate_step(
                prompt, max_tokens=1, sampling=SamplingConfig(), stop_ids=frozenset(), method=method, info=info
            )
        )
        parts = json.dumps({k: round(v, 2) for k, v in info.seconds.items()})
        print(f"{arm}: TTFT {time.perf_counter() - began:.2f} kept {info.kept_tokens} parts {parts}", flush=True)


if __name__ == "__main__":
    main()
