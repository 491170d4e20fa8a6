"""The speculator's query capture: the `PrefillAttention` SpecPrefill's pass runs its layers with
(core/methods/specprefill.py's whole pass, speculator_depth.py's nested one), keeping the queries
the scoring reads."""

from __future__ import annotations

from typing import Any, Generic, Sequence

from ..ops import ModelOps, PrefillAttention
from ..stages import A, AttentionTerms, active_terms


class QueryCapture(Generic[A]):
    """`PrefillAttention` for the speculator: causal attention (inside each layer's sliding window,
    `windows`, with each layer's attention `terms`) that also keeps, per layer, the post-RoPE
    queries of the prompt's last `n_window` tokens (the prompt ends at slot `first_slot`) and the
    query of every later step (each fed look-ahead token), of the layers `layers` scores (None:
    every layer; no other layer's queries are kept). prompt_attend: the attention of the prompt's
    steps when it is not full (an H2O pass: H2OPrefillAttention); later steps attend to every
    cached key whatever it is. final: the speculator's last layer where prompt_attend's last prompt
    row attends to every key there (H2O's dense tail): nothing reads that layer's other rows' outputs,
    so a model that asks `queries_from` (it then computes only the rows named: core/ops.last_rows)
    gets those rows attended to every key, the same outputs for what is read, and that layer's H2O
    walk is skipped; a model that never asks (the adapters compute every row) walks it as before."""

    def __init__(
        self,
        ops: ModelOps[A],
        n_layers: int,
        first_slot: int,
        scale: float,
        windows: Sequence[int | None] = (),
        terms: Sequence[AttentionTerms[A] | None] = (),
        n_window: int = 1,
        prompt_attend: PrefillAttention[A] | None = None,
        layers: Sequence[int] | None = None,
        final: int | None = None,
    ):
        self.ops = ops
        self.prompt_attend = prompt_attend
        self.final = final
        self.final_rows_asked = False  # the model computes only the rows queries_from names
        self.layers = list(range(n_layers)) if layers is None else list(layers)
        self.captured = set(self.layers)
        self.windows = list(windows) or [None] * n_layers
        self.terms = [active_terms(t) for t in terms] or [None] * n_layers
        self.first_slot = first_slot
        self.window_start = first_slot - n_window
        self.scale = scale
        self.queries: list[list[A]] = [[] for _ in range(n_layers)]

    def __call__(self, layer: int, q: A, k: A, v: A) -> A:
        end = k.shape[2]  # k holds every slot up to this step's end
        if end > self.window_start and layer in self.captured:  # a step ending in the window, or a look-ahead
            n = end - max(self.window_start, end - q.shape[2]) if end <= self.first_slot else 1
            self.queries[layer].append(self.ops.last_queries(q, n))
        if self.prompt_attend is not None and end <= self.first_slot and not self._final_dense(layer):
            return self.prompt_attend(layer, q, k, v)
        return self.ops.causal_step(q, k, v, self.scale, self.windows[layer], self.terms[layer])

    @property
    def plain(self) -> bool:
        """Whether its look-ahead steps are plain causal steps (no layer has attention terms), which a
        backend's own capturing step (ModelOps.capture_step) may run in its place."""
        return all(terms is None for terms in self.terms)

    def keep_step(self, queries: A) -> None:
        """A look-ahead step run by ModelOps.capture_step: its queries [len(layers), T, Hq, D], the
        layers' in `layers` order, kept as __call__ would have kept them."""
        for row, layer in enumerate(self.layers):
            self.queries[layer].append(queries[row])

    def _final_dense(self, layer: int) -> bool:
        return layer == self.final and self.final_rows_asked

    def queries_from(self, layer: int, steps: int, end: int) -> int:
        """The queries it keeps (the window's rows of a prompt step; a look-ahead step's one),
        and those its prompt attention must see."""
        if layer not in self.captured:
            needed = steps
        elif end > self.first_slot:  # a look-ahead step
            needed = 0
        else:
            needed = min(steps, max(0, self.window_start - (end - steps)))
        if layer == self.final:
            self.final_rows_asked = True  # its prompt rows from here on attend to every key (see the class)
        elif self.prompt_attend is not None and end <= self.first_slot:
            needed = min(needed, self.prompt_attend.queries_from(layer, steps, end))
        return needed

    def arrays(self) -> list[A]:
        captured = [q for per_layer in self.queries for q in per_layer]
        return captured + ([] if self.prompt_attend is None else self.prompt_attend.arrays())

    def stacked(self) -> A:
        """[len(layers), n_queries, Hq, D]: the captured layers' queries, in `layers` order."""
        return self.ops.stack([self.ops.concat(self.queries[layer], axis=0) for layer in self.layers])


def capturing_step(
    ops: ModelOps[A], model: Any, ids: A, position: int, cache: Any, captures: Sequence[QueryCapture[A]]
) -> A | None:
    """A look-ahead step ids [T] at positions position.. through the backend's own capturing step
    (ModelOps.capture_step) in place of `forward` with the captures: each capture's layers' queries kept
    as its __call__ keeps them; the step's float32 logits [T, vocab], or None where it cannot stand in
    (a layer with attention terms) or the backend has none (the caller then runs the step itself)."""
    if not all(capture.plain for capture in captures):
        return None
    kept = ops.capture_step(model, ids, position, cache, [layer for capture in captures for layer in capture.layers])
    if kept is None:
        return None
    logits, queries = kept
    row = 0
    for capture in captures:
        capture.keep_step(queries[row : row + len(capture.layers)])
        row += len(capture.layers)
    return logits
