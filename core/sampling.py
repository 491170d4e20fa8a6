"""The sampler: one for both backends and every setting, on host logits (NumPy).

`make_sampler(sampling, history)` builds it once per decode, as mlx-lm's make_sampler does: a
callable from float logits [vocab] to the chosen token id. The decode loop (core/decoding.py) hands
it a host copy of each step's logits, after the logits processors if there are any; speculative
decoding draws its drafts and its tokens with `draw` and the same `probabilities`. Plain greedy
decoding (`greedy`: temperature 0 and no penalty) takes the argmax on the device instead
(ModelOps.argmax): the same token, the lowest id of tied maxima, without a host copy per token.

The definitions are llama.cpp's and mlx-lm's, over the last PENALTY_WINDOW tokens of the prompt
plus the tokens generated so far (llama.cpp's penalty_last_n):

- repetition_penalty r (llama.cpp / mlx-lm / CTRL): a seen token's logit l becomes l / r if l > 0,
  else l * r (r > 1 makes repeats less likely; 1 is off).
- presence_penalty p: a seen token's logit minus p (OpenAI's and llama.cpp's; 0 is off).
- frequency_penalty f: a token's logit minus f times its count in the window (0 is off).
- top_k k: only the k largest logits stay, ties at the k-th broken toward the lower id (0 is off).
- min_p m: only tokens whose probability is at least m times the most likely one's stay, measured
  before temperature as llama.cpp and mlx-lm do (0 is off).
- then temperature (0: the argmax of the penalised, filtered logits) and top_p on the scaled
  probabilities (speculative decoding's acceptance reads the same rule).

All arithmetic is float64 on the host: the logits arrive as float32 [vocab] NumPy arrays.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Callable, Iterable

import numpy as np

from .runtime import SamplingConfig

PENALTY_WINDOW = 64  # tokens the penalties look back over (llama.cpp's default penalty_last_n)
# the settings beyond temperature, top_p and seed (the CLI's and the server's further sampling options)
HOST_FIELDS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
NUCLEUS_CANDIDATES = 256  # the most likely tokens top_p sorts first (eight times more while the cut is past them)

Sampler = Callable[[np.ndarray], int]  # float logits [vocab] -> the chosen token id


def greedy(sampling: SamplingConfig) -> bool:
    """Whether every token is the argmax of the model's own logits: temperature 0 and no penalty
    (top_k and min_p keep the argmax, ties to the lower id as argmax breaks them)."""
    return (
        sampling.temperature == 0.0
        and sampling.repetition_penalty == 1.0
        and sampling.presence_penalty == 0.0
        and sampling.frequency_penalty == 0.0
    )


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


def nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """probs [vocab] cut to the smallest set of most likely tokens (ties: the lower id first) whose
    mass reaches top_p, renormalised. Only the NUCLEUS_CANDIDATES most likely tokens are sorted
    while the cut falls among them: each token left out is less likely than every candidate, so
    the candidates' order is the vocabulary's, and so are their masses before them."""
    size = NUCLEUS_CANDIDATES
    while True:
        if size < probs.size:
            floor = np.partition(probs, probs.size - size)[probs.size - size]
            candidates = np.flatnonzero(probs >= floor)
        else:
            candidates = np.arange(probs.size)
        order = candidates[np.argsort(-probs[candidates], kind="stable")]
        before = np.cumsum(probs[order]) - probs[order]  # mass of strictly more likely tokens
        if candidates.size == probs.size or before[-1] >= top_p:
            break
        size *= 8
    kept = order[before < top_p]
    cut = np.zeros_like(probs)
    cut[kept] = probs[kept]
    return cut / cut.sum()


def probabilities(logits: np.ndarray, sampling: SamplingConfig) -> np.ndarray:
    """The distribution [vocab] (float64) of float logits [vocab] (filtered or not): temperature,
    then the smallest set of tokens whose probability reaches top_p, renormalised."""
    scaled = logits.astype(np.float64) / sampling.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    return nucleus(probs, sampling.top_p) if sampling.top_p < 1.0 else probs


def draw(scores: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator) -> tuple[int, np.ndarray | None]:
    """A token from float logits [vocab] and the distribution it was drawn from: the argmax and
    None at temperature 0, else a draw from `probabilities`."""
    if sampling.temperature == 0.0:
        return int(np.argmax(scores)), None
    probs = probabilities(scores, sampling)
    return int(rng.choice(probs.size, p=probs)), probs


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
        token, _ = draw(scores, self.sampling, self.rng)
        self.window.append(token)
        return token


def make_sampler(sampling: SamplingConfig, history: Iterable[int] = ()) -> Sampler:
    """The sampler of one decode: float logits [vocab] -> token id, by every setting of `sampling`
    (its seed fixes the draws), with `history` (the prompt's ids) as the penalties' first window."""
    return HostSampler(sampling, history).choose
