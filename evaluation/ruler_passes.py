"""The speculator's saved passes of the selection protocol (evaluation/ruler_protocol.py): one
pass per sample and speculator prefill (dense, or an H2O prompt pass for SpecPrefill over an H2O
speculator; queries of the prompt's last tokens and of the look-ahead, the prompt keys), every
SpecPrefill candidate's selection scored on it as the NumPy reference scores, and the main
model's sparse prefill and decoding from it."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig

from .ruler_tasks import RulerSample, score

PASS_LOOKAHEAD = SpecPrefillConfig.lookahead  # the look-ahead a saved pass holds (candidates may use fewer)
PASS_QUERY_WINDOW = 64  # the prompt's last tokens whose queries a saved pass holds (candidates may use fewer)
DENSE = "dense"  # a dense pass's prefill, as SavedPass.prefill names it


def prefill_name(h2o: H2OConfig | None) -> str:
    """The speculator prefill a pass ran, as one word: "dense", or "h2o-" and a digest of the H2OConfig."""
    if h2o is None:
        return DENSE
    return "h2o-" + hashlib.sha256(json.dumps(asdict(h2o), sort_keys=True).encode()).hexdigest()[:12]


def pass_path(passes: Path, name: str, setting: SpecPrefillConfig) -> Path:
    """Where the sample `name`'s pass for this candidate's speculator prefill is saved (a dense
    pass keeps the name passes had before H2O passes existed)."""
    prefill = prefill_name(setting.speculator_prefill)
    return passes / (f"{name}.npz" if prefill == DENSE else f"{name}_{prefill}.npz")


@dataclass
class SavedPass:
    """A speculator pass over one prompt, on the host: queries [n_l, W + N', Hq, D] (the prompt's
    last W = n_window tokens', then the look-ahead's) and prompt keys [n_l, Hkv, P, D] (float32),
    the prompt ids [P], its wall time, the attention scale and the speculator's sliding windows
    (None: global), the prompt pass's prefill (prefill_name) and the machine its time was taken on
    (machine.timing_machine; "" for a pass saved before passes said). A pass saved before query windows
    existed holds W = 1; one saved before H2O passes existed is dense."""

    queries: np.ndarray
    keys: np.ndarray
    ids: np.ndarray
    seconds: float
    scale: float
    windows: tuple
    n_window: int = 1
    prefill: str = DENSE
    timed_on: str = ""

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        windows = np.array([-1 if w is None else w for w in self.windows], np.int64)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(
            tmp,
            queries=self.queries,
            keys=self.keys,
            ids=self.ids,
            seconds=self.seconds,
            scale=self.scale,
            windows=windows,
            n_window=self.n_window,
            prefill=self.prefill,
            timed_on=self.timed_on,
        )
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "SavedPass":
        with np.load(path) as f:
            windows = tuple(None if w < 0 else int(w) for w in f["windows"])
            n_window = int(f["n_window"]) if "n_window" in f.files else 1
            prefill = str(f["prefill"]) if "prefill" in f.files else DENSE
            timed_on = str(f["timed_on"]) if "timed_on" in f.files else ""
            return cls(
                f["queries"],
                f["keys"],
                f["ids"],
                float(f["seconds"]),
                float(f["scale"]),
                windows,
                n_window,
                prefill,
                timed_on,
            )


def speculate(
    model,
    speculator,
    tokenizer,
    sample: RulerSample,
    lookahead: int = PASS_LOOKAHEAD,
    query_window: int = PASS_QUERY_WINDOW,
    h2o: H2OConfig | None = None,
    timed_on: str = "",
) -> SavedPass:
    """The speculator's pass over the sample's prompt (core/methods/specprefill.run_speculator; an
    H2O prompt pass with `h2o`, as SpecPrefill over an H2O speculator runs it), timed on the machine
    `timed_on` names (machine.timing_machine)."""
    from specfill.api import encode_prompt
    from specfill.core.methods.specprefill import run_speculator
    from specfill.core.plan import check_token_ids
    from specfill.core.request import fit_lookahead

    ops = model.ops
    ids = np.asarray(check_token_ids(encode_prompt(tokenizer, sample.prompt), model.args.vocab_size), np.int64)
    spec_model, spec_step = model.speculator_model(speculator)
    with ops.device_scope():
        started = time.perf_counter()
        lookahead = fit_lookahead(lookahead, len(ids), spec_model.args.max_position_embeddings)
        spec = run_speculator(
            ops,
            spec_model,
            ids,
            lookahead=lookahead,
            stop_ids=frozenset(tokenizer.eos_token_ids),
            step_size=spec_step,
            query_window=query_window,
            h2o=h2o,
        )
        queries, keys = ops.to_numpy(spec.queries), ops.to_numpy(spec.keys)
        seconds = time.perf_counter() - started
    return SavedPass(
        queries.astype(np.float32),
        keys.astype(np.float32),
        ids,
        seconds,
        spec_model.args.attention_scale,
        tuple(spec_model.args.layer_windows),
        spec.n_window,
        prefill_name(h2o),
        timed_on,
    )


class PassScores:
    """Every SpecPrefill candidate's selection on one saved pass, as the NumPy reference selects
    (core/reference/specprefill.speculative_selection; tests/test_ruler_protocol.py checks they
    agree): the per-layer softmax over the prompt keys, the pooling and the head reduction run
    once per (pool kernel, head reduction) and are shared by the candidates; the layer subset,
    the layer and look-ahead reductions and the selection run per candidate."""

    def __init__(self, saved: SavedPass):
        self.saved = saved
        self._per_layer: dict[tuple[int, str], np.ndarray] = {}

    def _reduced_heads(self, kernel: int, heads: str) -> np.ndarray:
        """[n_q, n_l, P] float64: per layer, softmax over the prompt keys, pooled, heads reduced."""
        from specfill.core.reference.specprefill import attention_scores, reduce_axis, smooth_scores
        from specfill.core.stages import query_start

        key = (kernel, heads)
        if key not in self._per_layer:
            q = self.saved.queries.astype(np.float64)
            k = self.saved.keys.astype(np.float64)
            layers = []
            for i in range(q.shape[0]):
                window = self.saved.windows[i] if any(w is not None for w in self.saved.windows) else None
                start = query_start(k.shape[2], self.saved.n_window)
                probs = attention_scores(q[i : i + 1], k[i : i + 1], self.saved.scale, window, query_start=start)
                layers.append(reduce_axis(smooth_scores(probs, kernel), heads, axis=2))  # [n_q, 1, P]
            self._per_layer[key] = np.concatenate(layers, axis=1)
        return self._per_layer[key]

    def importance(self, config: SpecPrefillConfig) -> np.ndarray:
        from specfill.core.reference.specprefill import reduce_axis

        if config.lookahead > PASS_LOOKAHEAD:  # a pass holds PASS_LOOKAHEAD tokens' queries at most
            raise ConfigError(f"look-ahead {config.lookahead} exceeds the saved pass's {PASS_LOOKAHEAD}")
        saved = self.saved.n_window
        window = min(config.query_window, len(self.saved.ids))
        if window > saved:
            raise ConfigError(f"query window {config.query_window} exceeds the saved pass's {saved}")
        per_layer = self._reduced_heads(config.pool_kernel, config.head_reduction)
        layers = config.layer_indices(per_layer.shape[1])
        chosen = per_layer[saved - window : saved + config.lookahead, layers]
        return reduce_axis(reduce_axis(chosen, config.layer_reduction, axis=1), config.lookahead_reduction, axis=0)

    def select(self, config: SpecPrefillConfig):
        from specfill.core.reference.specprefill import select_tokens

        return select_tokens(self.importance(config), config)


def _answer(tokenizer, tokens, sample: RulerSample, started: float) -> tuple[str, float, float]:
    """Detokenize greedy tokens until the score is final or they end: (text, score, TTFT)."""
    detok, text, ttft = tokenizer.streaming_detokenizer(), "", 0.0
    for token in tokens:
        ttft = ttft or time.perf_counter() - started
        if token in tokenizer.eos_token_ids:
            break
        text += detok.add_token(token)
        if score(text, sample.outputs, sample.metric) == 1.0:
            break
    text += detok.finish()
    return text, score(text, sample.outputs, sample.metric), ttft


def decode_from_pass(
    model, tokenizer, sample: RulerSample, saved: SavedPass, selection, budget: int, started: float
) -> tuple[str, float, float]:
    """The main model's sparse prefill of the kept tokens, then greedy decoding: (answer, score,
    TTFT = the saved pass's time + everything since `started`: the protocol starts it after the selection,
    whose NumPy reference is not what SpecPrefill runs)."""
    from specfill.core.decoding import decode_tokens
    from specfill.core.methods.specprefill import prefill_kept
    from specfill.core.runtime import SamplingConfig

    ops, stop = model.ops, frozenset(tokenizer.eos_token_ids)
    with ops.device_scope():
        logits, cache = prefill_kept(
            ops, model.model, saved.ids, selection, extra_slots=budget, step_size=model.prefill_step_size
        )
        tokens = decode_tokens(
            ops,
            model.model,
            logits,
            next_position=len(saved.ids),
            max_tokens=budget,
            sampling=SamplingConfig(),
            stop_ids=stop,
            cache=cache,
            history=saved.ids,
        )
        text, value, first = _answer(tokenizer, tokens, sample, started)
    return text, value, saved.seconds + first
