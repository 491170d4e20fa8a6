"""The backend-neutral sampler: penalties, top-k, min-p, top-p and temperature on host logits.

Both backends sample through it whenever a setting beyond temperature / top-p is on
(SamplingConfig.host_side); plain greedy and temperature / top-p keep the backends' own samplers
(no host copy per token). The definitions are llama.cpp's and mlx-lm's, over the last
PENALTY_WINDOW tokens of the prompt plus the tokens generated so far (llama.cpp's penalty_last_n):

- repetition_penalty r (llama.cpp / mlx-lm / CTRL): a seen token's logit l becomes l / r if l > 0,
  else l * r (r > 1 makes repeats less likely; 1 is off).
- presence_penalty p: a seen token's logit minus p (OpenAI's and llama.cpp's; 0 is off).
- frequency_penalty f: a token's logit minus f times its count in the window (0 is off).
- top_k k: only the k largest logits stay, ties at the k-th broken toward the lower id (0 is off).
- min_p m: only tokens whose probability is at least m times the most likely one's stay, measured
  before temperature as llama.cpp and mlx-lm do (0 is off).
- then temperature (0: the argmax of the penalised, filtered logits) and top_p on the scaled
  probabilities (the backends' rule; speculative decoding's acceptance reads the same one).

All arithmetic is float64 on the host: the logits arrive as float32 [vocab] NumPy arrays.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Iterable

import numpy as np

from .runtime import SamplingConfig

PENALTY_WINDOW = 64  # tokens the penalties look back over (llama.cpp's default penalty_last_n)
HOST_FIELDS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")  # their names


def penalize(logits: np.ndarray, window: Iterable[int], sampling: SamplingConfig) -> np.ndarray:
    """logits [vocab] after the repetition, presence and frequency penalties for the window's tokens."""
    counts = Counter(int(t) for t in window)
    if not counts:
        return logits
    out = logits.astype(np.float64, copy=True)
    seen = np.fromiter(counts, dtype=np.int64, count=len(counts))
    times = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
    if sampling.repetition_penalty != 1.0:
        values = out[seen]
        out[seen] = np.where(values > 0, values / sampling.repetition_penalty, values * sampling.repetition_penalty)
    out[seen] -= sampling.presence_penalty + sampling.frequency_penalty * times
    return out


def filtered(logits: np.ndarray, sampling: SamplingConfig) -> np.ndarray:
    """logits [vocab] (float64) with the tokens top_k and min_p remove set to -inf. top_k keeps
    exactly k tokens: among logits tied at the k-th value the lowest ids stay, as argmax picks the
    lowest id of tied maxima (16-bit logits tie often, and top_k=1 is greedy at any temperature)."""
    out = logits.astype(np.float64, copy=True)
    if 0 < sampling.top_k < out.size:
        kth = np.partition(out, out.size - sampling.top_k)[out.size - sampling.top_k]
        keep = out > kth
        keep[np.flatnonzero(out == kth)[: sampling.top_k - int(keep.sum())]] = True
        out[~keep] = -np.inf
    if sampling.min_p > 0.0:
        # p_i >= min_p * p_max  <=>  l_i >= l_max + log(min_p): no softmax needed
        out[out < out.max() + np.log(sampling.min_p)] = -np.inf
    return out


def probabilities(logits: np.ndarray, sampling: SamplingConfig) -> np.ndarray:
    """The distribution [vocab] (float64) of float logits [vocab] (filtered or not): temperature,
    then the smallest set of tokens whose probability reaches top_p, renormalised."""
    scaled = logits.astype(np.float64) / sampling.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of strictly more likely tokens
        cut = np.zeros_like(probs)
        cut[order] = np.where(before < sampling.top_p, probs[order], 0.0)
        probs = cut / cut.sum()
    return probs


class HostSampler:
    """Chooses each token from host logits; remembers the window the penalties look at.

    history: the prompt's token ids (their last PENALTY_WINDOW count as seen); every chosen
    token is appended. seed: the NumPy generator's seed (None: fresh entropy).
    """

    def __init__(self, sampling: SamplingConfig, history: Iterable[int] = ()):
        self.sampling = sampling
        self.window: deque[int] = deque((int(t) for t in history), maxlen=PENALTY_WINDOW)
        self.rng = np.random.default_rng(sampling.seed)

    def choose(self, logits: np.ndarray) -> int:
        """The next token id from float logits [vocab]; it joins the penalty window."""
        scores = filtered(penalize(np.asarray(logits).reshape(-1), self.window, self.sampling), self.sampling)
        if self.sampling.temperature == 0.0:
            token = int(np.argmax(scores))
        else:
            probs = probabilities(scores, self.sampling)
            token = int(self.rng.choice(probs.size, p=probs))
        self.window.append(token)
        return token
