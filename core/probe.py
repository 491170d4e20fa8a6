"""The timing run behind `auto`'s calibration (core/crossover.py), over any backend's `ModelOps`.

The probe runs the real prefill code paths on random prompts, on views of the model's first layers
(`ops.first_layers`), so that a calibration takes seconds, and prices the whole model from two
views (TimedViews): the first k layers (k = 1, or on a hybrid up to its first attention layer: what
does not grow with depth, the embedding, the LM head of the logits row and of every look-ahead
token, the last layer that computes only the rows read) and the first 2k (k more layers computing
every row). An n-layer pass costs
  t(n) = t_short + (n - k) * (t_long - t_short) / k
per part: full prefill, H2O's, and SpecPrefill's speculator pass (its layers over every token;
a nested pass's deeper ones over their subset), its main-model prefill of the kept tokens and its
scoring (per scored layer). The composition times the speculator's layers running H2O, mixed with
a dense run by the share of the speculator's layers its H2O config names. Scaling the one-layer
view's whole time by the layer count instead priced the 0.5B speculator's pass 1.5x over the real
one on a 2-core CPU (its 8 look-ahead LM heads counted 24 times) and kept `auto` from SpecPrefill.
`auto_choice` calibrates every sparse method auto may pick (auto_options) and lets
core/crossover.fastest choose. A turn (a new part over a reused prefix) is weighed on calibrations of
turns: each run prefills the new part over a copy of the views' dense caches of a random prefix
TURN_CACHED_PER_NEW times as long (full, H2O from that origin, SpecPrefill with both models' prefix).
Each length is timed in three pairs of runs (full, then sparse), its ratio the pairs' median, after
one warm-up run at the shortest length (first calls compile kernels, run self-checks and size
caches). The clock is the backend's own (`ops.wall_time`, which waits for its device), so core
imports no backend.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from typing import Any, Callable, Protocol

import numpy as np

from .config import AUTO_COMPOSITION, AUTO_COMPOSITION_FROM, AUTO_TURN_COMPOSITION, H2OConfig, SpecPrefillConfig
from .crossover import CANDIDATE_LENGTHS, calibrated, calibration_key, common_length, extended, fastest
from .methods.h2o import H2OPrefillAttention, h2o_prefill, h2o_step_size
from .methods.prefill import prefill
from .methods.specprefill import scoring_layers, speculative_prefill
from .methods.speculator_depth import nestable, pass_layers
from .models import ModelArgs
from .ops import ModelOps
from .request import fit_lookahead
from .runtime import COMPOSED, PrefillMethod
from .stages import attention_layers

REPEATS = 3
# a turn is calibrated with its new part over this many times as many cached tokens (the agent turns
# measured: 1.8-4x, results/cpu_bf16_turns/)
TURN_CACHED_PER_NEW = 2
# every calibration measures its first MIN_POINTS candidate lengths whatever the budget: one point would
# carry a short prompt's verdict to every longer one (on an AMX CPU in bfloat16 a 2K turn is break-even
# where a 4K one gains 1.4x; plain SpecPrefill and the composition are nearest, and most often misranked,
# at 2K: results/cpu_bf16_long/notes.md)
MIN_POINTS = 2
# one prompt's data in a SpecPrefill config, never a calibration's: left out of its key (a request's protected
# spans are also set aside while auto weighs its options; its text units' starts differ with every prompt, and
# with them in the key each prompt with select_units "text" calibrated anew and wrote a file of its own)
PROMPT_DATA = ("protected", "unit_starts")


class ProbedModel(Protocol):
    """What the probe needs of core.driver.CausalLM (imported there, so not named here)."""

    ops: ModelOps[Any]
    model: Any
    args: ModelArgs
    prefill_step_size: int

    @property
    def backend(self) -> str: ...

    @property
    def device_name(self) -> str: ...

    @property
    def dtype(self) -> Any: ...

    def speculator_model(self, speculator: Any) -> tuple[Any, int]: ...


def _speculator(lm: ProbedModel, method: PrefillMethod) -> tuple[Any, ModelArgs, int]:
    """(the model whose first layers the speculator's timed views are: the speculator, or the main
    model for "self:K"; the args of the speculator as it runs (a "self:K" speculator's: K layers
    shaped as the main model's), its step size)."""
    run, step = lm.speculator_model(method.speculator)
    return (lm.model if isinstance(method.speculator, str) else run), run.args, step


def timed_layers(args: Any) -> int:
    """How many first layers a calibration times (then scaled to the whole model): one, or on a
    hybrid whose first layers are recurrent, up to and including its first attention layer (the
    methods act on attention layers only; a hybrid's layer pattern repeats, so the view's mix of
    recurrent and attention layers stands for the model's)."""
    attention = attention_layers(args)
    return attention[0] + 1 if attention else 1


@dataclasses.dataclass(frozen=True)
class TimedViews:
    """The two views of a model a calibration times, and the whole model's seconds from theirs.

    short: the first k (timed_layers) layers; long: the first 2k; short None where the model has
    fewer than 2k layers (long is then the whole model). A model's last layer computes only the rows
    something reads (core/ops.last_rows: the logits row, the speculator's query window), so each
    view's last layer is cheap as the whole model's is: long - short is k layers computing every
    row, and short holds what a deeper model does not repeat (the embedding, the LM heads, the
    cheap last layer; on a hybrid, the recurrent layers before its first attention layer with it)."""

    long: Any
    short: Any | None
    k: int

    def price(self, long_s: float, short_s: float, layers: float) -> float:
        """Seconds of `layers` of the model's layers from the views' seconds: short + (layers - k)
        x the per-layer (long - short) / k; without a short view, layers x long / k."""
        if self.short is None:
            return layers * long_s / self.k
        return max(0.0, short_s + (layers - self.k) * self.per_layer(long_s, short_s))

    def per_layer(self, long_s: float, short_s: float) -> float:
        """One layer's seconds, computing every row (on a hybrid: the average over its pattern)."""
        return (long_s - (0.0 if self.short is None else short_s)) / self.k


def timed_views(ops: ModelOps[Any], model: Any, args: Any) -> TimedViews:
    """The views of `model` a calibration times (TimedViews): its first timed_layers layers and twice
    as many, or the whole model where it has fewer (a view ending at a timed layer would time that
    layer cut to its read rows: on the 1.5B the probe priced full prefill ~8x low)."""
    k, n = timed_layers(args), args.num_hidden_layers
    if 2 * k > n:
        return TimedViews(ops.first_layers(model, n), None, n)
    return TimedViews(ops.first_layers(model, 2 * k), ops.first_layers(model, k), k)


def sparse_name(method: PrefillMethod) -> str:
    """The sparse method of an "auto" method by the name statistics give it: h2o, specprefill or
    specprefill+h2o (its speculator prefilling with H2O)."""
    spec = method.specprefill
    return COMPOSED if method.sparse == "specprefill" and spec and spec.speculator_prefill else method.sparse


def auto_options(method: PrefillMethod, prompt_tokens: int, nests: bool = True, cached: int = 0) -> list[PrefillMethod]:
    """The "auto" methods, one sparse method each, that auto chooses among for a `prompt_tokens`
    prompt (a turn's new part over `cached` reused tokens): without a speculator H2O alone (method
    itself); with one SpecPrefill with a dense speculator, SpecPrefill over an H2O speculator (the
    composition) and H2O, in that order. The composition runs as the config asks when it sets
    speculator_prefill; with SpecPrefill's default settings, as AUTO_COMPOSITION from
    AUTO_COMPOSITION_FROM tokens of a fresh prompt or a turn's new part on (where its accuracy evidence
    holds: core/config.py), as AUTO_TURN_COMPOSITION on a shorter turn's new part (cached > 0), and not
    on shorter fresh prompts; with other settings, not at all.
    nests: whether the speculator runs a nested pass (speculator_depth.nestable); where it cannot,
    either composition's speculator reads every token with every layer."""
    if method.speculator is None:
        return [method]
    spec = method.specprefill or SpecPrefillConfig()
    composed = []
    if spec.speculator_prefill is not None:
        composed = [dataclasses.replace(method, specprefill=spec)]
    elif spec == SpecPrefillConfig() and (prompt_tokens >= AUTO_COMPOSITION_FROM or cached > 0):
        auto = AUTO_COMPOSITION if prompt_tokens >= AUTO_COMPOSITION_FROM else AUTO_TURN_COMPOSITION
        auto = auto if nests else dataclasses.replace(auto, deep_keep=None, deep_from=None)
        composed = [dataclasses.replace(method, specprefill=auto)]
    return [
        dataclasses.replace(method, specprefill=dataclasses.replace(spec, speculator_prefill=None)),
        *composed,
        dataclasses.replace(method, speculator=None),
    ]


def measured_unit_starts(config: SpecPrefillConfig, total: int) -> tuple[int, ...]:
    """The text units a probe's random tokens are selected by (select_units "text"): one every
    select_chunk tokens, the longest a text unit is (core/text_units.py), whatever prompt the request
    brings, so that what is timed, like the key it is saved under, is the settings' alone; () for chunks."""
    return tuple(range(0, total, config.select_chunk)) if config.select_units == "text" else ()


def method_config(lm: ProbedModel, method: PrefillMethod) -> dict[str, Any]:
    """The sparse method's settings (and the speculator's shape): part of the calibration key."""
    if method.sparse == "h2o":
        return asdict(method.h2o or H2OConfig())
    whole, run_args, step = _speculator(lm, method)
    return {
        **asdict(method.specprefill or SpecPrefillConfig()),
        **{name: () for name in PROMPT_DATA},  # as a config without them has them: keys made before stay valid
        "speculator": asdict(whole.args),
        "speculator_layers": run_args.num_hidden_layers,
        "speculator_step": step,
    }


def _paired_times(full_run: Callable[[], float], sparse_run: Callable[[], float]) -> tuple[float, float]:
    """(full seconds, sparse seconds) from REPEATS pairs of runs, each a full run then a sparse one:
    full prefill's median and the sparse method's at the median of the pairs' sparse / full ratios.
    A pair shares its moment of a shared machine, so its ratio (what auto compares) is steadier
    than either time: the faster of two runs of each, which took full's from one moment and the
    sparse method's from another, set plain SpecPrefill before the composition at 4K in 1 of 5
    calibrations on a 2-core VM where the pairs' ratios never crossed (results/cpu_bf16_long/notes.md)."""
    pairs = [(full_run(), sparse_run()) for _ in range(REPEATS)]  # in order: full, sparse, full, ...
    full = float(np.median([f for f, _ in pairs]))
    return full, full * float(np.median([sp / max(f, 1e-12) for f, sp in pairs]))


def _measure(lm: ProbedModel, method: PrefillMethod, length: int, cached: int = 0) -> tuple[float, float]:
    """(full seconds, sparse seconds) estimated for the whole model at a `length`-token prompt, or
    with `cached` > 0 at a turn: `length` new tokens over `cached` tokens both models hold densely
    (the server's prompt cache), each run from a copy of the views' seeded caches as a turn is."""
    ops, args = lm.ops, lm.args
    main = timed_views(ops, lm.model, args)
    n_main, total = args.num_hidden_layers, cached + length
    ids = np.random.default_rng(total).integers(0, args.vocab_size, size=total, dtype=np.int64)
    room = length + 64  # the turn's tokens and decode slots (a speculator's look-ahead: its cache grows)

    def seeded(view: Any) -> Callable[[int], Any]:
        """A copy of `view`'s dense cache of the first `cached` tokens with room for n more, per call."""
        if not cached:
            return lambda n: ops.new_cache(view, n)
        cache = ops.new_cache(view, cached + room)
        prefill(ops, view, ops.tokens(ids[:cached]), 0, cache, step_size=lm.prefill_step_size)
        return lambda n: cache.copy(cached, cached + n)

    caches = {id(view): seeded(view) for view in (main.long, main.short) if view is not None}

    def prefill_s(view: Any, step: int, attend: Callable[[Any], Any]) -> float:
        cache = caches[id(view)](room)
        started = ops.wall_time()
        prefill(ops, view, ops.tokens(ids[cached:]), cached, cache, step_size=step, attend=attend(view))
        return ops.wall_time() - started

    def priced(step: int = lm.prefill_step_size, attend: Callable[[Any], Any] = lambda view: None) -> float:
        long_s = prefill_s(main.long, step, attend)
        short_s = 0.0 if main.short is None else prefill_s(main.short, step, attend)
        return main.price(long_s, short_s, n_main)

    if method.sparse == "h2o":
        h2o_config = method.h2o or H2OConfig()
        sparse_layer = dataclasses.replace(h2o_config, layers="all")  # the timed layers run H2O
        step = h2o_step_size(h2o_config, lm.prefill_step_size)  # a fresh attention (its carries) per run

        def walk(view: Any) -> H2OPrefillAttention | None:
            """The view's H2O attention as a prefill makes it (None where the new part reads every key)."""
            return h2o_prefill(ops, sparse_layer, view.args, total, lm.prefill_step_size, origin=cached)[0]

        full, h2o = _paired_times(priced, lambda: priced(step=step, attend=walk))
        n_attention = len(attention_layers(args))  # H2O's layers count attention layers; the others cost what full's do
        sparse = len(h2o_config.layer_indices(n_attention)) / n_attention
        return full, (1.0 - sparse) * full + sparse * h2o
    whole, run_args, spec_step = _speculator(lm, method)
    spec, spec_args = timed_views(ops, whole, whole.args), whole.args
    caches.update({id(view): seeded(view) for view in (spec.long, spec.short) if view is not None})
    n_spec = run_args.num_hidden_layers
    config = method.specprefill or SpecPrefillConfig()
    config = dataclasses.replace(
        config,
        lookahead=fit_lookahead(config.lookahead, total, spec_args.max_position_embeddings),
        unit_starts=measured_unit_starts(config, total),
    )
    scored = scoring_layers(config, run_args)
    view_scored = max(1, len(scoring_layers(config, spec.long.args)))  # the layers the timed selection scores
    # the layers over every token; a nested pass's deeper layers' worth over its subset, timed as dense ones
    # (pessimistic from DEEP_H2O_FROM subset tokens, where they walk by H2O)
    depth, deep = pass_layers(n_spec, scored, config.lookahead, 0, config)
    speculator_h2o, share = config.speculator_prefill, 1.0
    if speculator_h2o is not None:  # the timed layers run H2O; the speculator's others cost what a dense pass's do
        share = len([i for i in speculator_h2o.layer_indices(n_spec) if i < depth]) / depth
        config = dataclasses.replace(config, speculator_prefill=dataclasses.replace(speculator_h2o, layers="all"))

    def parts(run_config: SpecPrefillConfig, short: bool) -> dict[str, float]:
        """The parts' seconds with both models' long views, or both short ones (a model without
        one: its long view, whose seconds the pricing then leaves out)."""
        view_of = (lambda v: v.short if v.short is not None else v.long) if short else (lambda v: v.long)
        main_view, spec_view = view_of(main), view_of(spec)
        return speculative_prefill(
            ops,
            main_view,
            ids,
            spec_view,
            run_config,
            stop_ids=frozenset(),
            extra_slots=1,
            step_size=lm.prefill_step_size,
            speculator_step_size=spec_step,
            reused=cached,
            main_cache=caches[id(main_view)] if cached else None,
            speculator_cache=(caches[id(spec_view)](room), cached) if cached else None,
        ).seconds

    shorts = main.short is not None or spec.short is not None  # else the long views are the whole models

    def both(run_config: SpecPrefillConfig) -> tuple[dict[str, float], dict[str, float]]:
        long_s = parts(run_config, False)
        return long_s, parts(run_config, True) if shorts else long_s

    def sparse_run() -> float:
        long_s, short_s = both(config)
        speculator = (long_s["speculator"], short_s["speculator"])
        dense = speculator
        if speculator_h2o is not None and (share < 1.0 or deep):
            dense_long, dense_short = both(dataclasses.replace(config, speculator_prefill=None))
            dense = (dense_long["speculator"], dense_short["speculator"])
            speculator = tuple(share * h + (1.0 - share) * d for h, d in zip(speculator, dense))
        pass_s = spec.price(*speculator, depth) + deep * spec.per_layer(*dense)
        selection_s = len(scored) * long_s["selection"] / view_scored
        return pass_s + selection_s + main.price(long_s["main_prefill"], short_s["main_prefill"], n_main)

    return _paired_times(priced, sparse_run)


def key_for(lm: ProbedModel, method: PrefillMethod, turn: bool = False) -> dict[str, Any]:
    """The calibration key of `method.sparse` on `lm` here (core/crossover.py calibration_key); a
    turn's (timed over TURN_CACHED_PER_NEW x the new tokens cached) names that ratio in the config."""
    config = method_config(lm, method)
    key = calibration_key(
        backend=lm.backend,
        device=lm.device_name,
        dtype=str(lm.dtype).rsplit(".", 1)[-1],
        threads=lm.ops.compute_threads,
        model_shape=asdict(lm.args),
        method=sparse_name(method),
        method_config={**config, "turn_cached_per_new": TURN_CACHED_PER_NEW} if turn else config,
    )
    return json.loads(json.dumps(key))  # as it reads back from the file (tuples become lists)


def probe_lengths(lm: ProbedModel, method: PrefillMethod, turn: bool = False) -> list[int]:
    """CANDIDATE_LENGTHS within the model's context (H2O: above one chunk, where it is not full); a
    turn's new parts, whose cached conversation must fit beside them."""
    spec = method.specprefill or SpecPrefillConfig()
    sparse_h2o = (method.h2o or H2OConfig()) if method.sparse == "h2o" else spec.speculator_prefill
    floor = 0 if sparse_h2o is None else sparse_h2o.chunk_size
    scale = 1 + TURN_CACHED_PER_NEW if turn else 1
    return [n for n in CANDIDATE_LENGTHS if floor < n and scale * n <= lm.args.max_position_embeddings]


def auto_crossover(
    lm: ProbedModel,
    method: PrefillMethod,
    *,
    prompt_tokens: int | None = None,
    refresh: bool = False,
    lengths: list[int] | None = None,
) -> tuple[int | None, str]:
    """(prompt tokens from which `auto` runs method.sparse on this machine, or None: never; where
    the figure came from): cached for this machine, model shape, dtype and method, else probed.
    A prompt of `prompt_tokens` shorter than every calibration length gets None unmeasured: no
    crossover lies below the shortest measured length."""
    crossover, where, _ = _calibration(lm, method, prompt_tokens, refresh, lengths)
    return crossover, where


def auto_choice(
    lm: ProbedModel,
    method: PrefillMethod,
    prompt_tokens: int,
    cached: int = 0,
    announce: Callable[[str], None] | None = None,
) -> tuple[PrefillMethod, str]:
    """The method an "auto" `method` runs an n-token prompt (a turn's new part over `cached` reused
    tokens) with on this machine, and why: each of auto_options calibrated (cached, else probed)
    and measured on to the longest length any of them reached (crossover.common_length), the
    fastest whose crossover the prompt reaches (core/crossover.fastest; a turn's new part read
    on calibrations of turns, timed over a cached prefix), else full prefill. A new part shorter
    than the shortest calibration length runs full prefill, however long the conversation it follows.
    The SpecPrefill config's protected spans (one prompt's data) are set aside while the options are
    weighed and go to the one chosen; where they cover at least half of the new part (an agent's
    first request: system prompt, tool schemas, question) auto runs full prefill. `announce` gets a
    line before each option's probe starts timing (none where every calibration is read back)."""
    asked = method.specprefill
    spans = asked.protected if asked is not None else ()
    new_spans = asked.for_new_part(cached).protected if asked is not None and spans else ()
    covered = sum(max(0, min(b, prompt_tokens) - a) for a, b in new_spans)
    if 2 * covered >= prompt_tokens > 0:  # SpecPrefill would pay its speculator to drop little
        said = f"protected spans cover {covered} of {prompt_tokens} new tokens (at least half): full prefill"
        return dataclasses.replace(method, name="full", auto_threshold=None), said
    if asked is not None and spans:  # one prompt's data, not a setting: the options and calibrations are the settings'
        method = dataclasses.replace(method, specprefill=dataclasses.replace(asked, protected=()))
    nests = method.speculator is not None and nestable(lm.ops, lm.speculator_model(method.speculator)[0])
    options, calibrations, why = auto_options(method, prompt_tokens, nests, cached), {}, []
    turn = cached > 0
    if turn:
        why.append(f"{prompt_tokens} new tokens over {cached} cached: the turn calibrations")
    wheres = {}
    for index, option in enumerate(options):
        _, wheres[index], data = _calibration(lm, option, prompt_tokens, False, None, turn, announce)
        if data is not None:
            calibrations[str(index)] = data
    # the options compared at one length: each measured on to the longest any of them reached (a
    # request's usual case, every calibration already there, measures and reads nothing more)
    common = common_length(list(calibrations.values()), prompt_tokens) or 0
    for name, data in calibrations.items():
        option = options[int(name)]
        lengths = [n for n in probe_lengths(lm, option, turn) if n <= common and str(n) not in data["points"]]
        if lengths:
            measure = _measurer(lm, option, turn, announce)
            calibrations[name] = extended(key_for(lm, option, turn), data, measure, lengths)
    for index, option in enumerate(options):
        data = calibrations.get(str(index))
        crossover = None if data is None else data["crossover_tokens"]
        why.append(f"{sparse_name(option)} from {crossover}: {wheres[index]}")
    chosen = fastest(calibrations, prompt_tokens)
    if chosen is None:
        return dataclasses.replace(method, name="full", auto_threshold=None), "; ".join(why)
    option = options[int(chosen)]
    if spans and option.specprefill is not None:  # whichever SpecPrefill runs keeps the prompt's protected spans
        option = dataclasses.replace(option, specprefill=dataclasses.replace(option.specprefill, protected=spans))
    return dataclasses.replace(option, name=option.sparse, auto_threshold=None), "; ".join(why)


def auto_shapes(lm: ProbedModel) -> list[tuple[int, int]]:
    """The prompts calibrate_auto prepares `auto` for, as (new tokens, cached tokens): a long fresh
    prompt (AUTO_COMPOSITION_FROM tokens, where the composition is weighed; the model's context where
    that is shorter), an agent turn (the shortest calibration length of new tokens over as many
    cached, where the turn composition is weighed) and a long one (AUTO_COMPOSITION_FROM new tokens,
    where a turn's new part gets AUTO_COMPOSITION), each once."""
    shortest, long = CANDIDATE_LENGTHS[0], min(AUTO_COMPOSITION_FROM, lm.args.max_position_embeddings)
    return list(dict.fromkeys([(long, 0), (shortest, shortest), (long, shortest)]))


def calibrate_auto(lm: ProbedModel, method: PrefillMethod, announce: Callable[[str], None] | None = None) -> list[str]:
    """Calibrate (or read the cached calibrations of) every option an "auto" `method` weighs on a
    long fresh prompt and on agent turns (auto_shapes): what `specfill serve --method auto` does
    before it listens, so that no request waits for the measurement (once per machine, model and
    settings: the Qwen2.5-Coder pair 188 s in bf16 on a 2-core AMX CPU, its three shapes; `announce`
    gets a line as each option's probe starts). One line per shape: what auto runs there."""
    lines = []
    for tokens, cached in auto_shapes(lm):
        chosen, _ = auto_choice(lm, method, tokens, cached, announce)
        shape = f"{tokens} new tokens over {cached} cached" if cached else f"a prompt of {tokens} tokens"
        lines.append(f"{shape}: {'full' if chosen.name == 'full' else sparse_name(chosen)}")
    return lines


def _calibration(
    lm: ProbedModel,
    method: PrefillMethod,
    prompt_tokens: int | None,
    refresh: bool,
    lengths: list[int] | None,
    turn: bool = False,
    announce: Callable[[str], None] | None = None,
) -> tuple[int | None, str, dict[str, Any] | None]:
    """(crossover, where it came from, the calibration data or None where none was measured), the
    first MIN_POINTS lengths measured whatever the budget; a turn's: lengths of new tokens, each timed
    over TURN_CACHED_PER_NEW times as many cached."""
    lengths = sorted(probe_lengths(lm, method, turn) if lengths is None else lengths)
    if not lengths:
        return None, "no calibration length fits the model's context: full prefill", None
    if prompt_tokens is not None and prompt_tokens < lengths[0]:
        return None, f"prompt shorter than the shortest calibration length ({lengths[0]}): full prefill", None
    key = key_for(lm, method, turn)
    return calibrated(key, _measurer(lm, method, turn, announce), lengths, refresh=refresh, min_points=MIN_POINTS)


def _measurer(
    lm: ProbedModel, method: PrefillMethod, turn: bool, announce: Callable[[str], None] | None = None
) -> Callable[[int], tuple[float, float]]:
    """length -> (full s, sparse s) of `method` (a turn's: over TURN_CACHED_PER_NEW x length cached),
    its first call preceded by an untimed one (it compiles kernels, runs self-checks, sizes caches)
    and by `announce`'s line, the wait's reason."""
    warm: list[int] = []

    def measure(length: int) -> tuple[float, float]:
        cached = TURN_CACHED_PER_NEW * length if turn else 0
        with lm.ops.device_scope():
            if not warm:
                warm.append(length)
                if announce is not None:
                    spec = method.specprefill if method.sparse != "h2o" else None
                    keep = "" if spec is None else f" at keep {spec.keep_ratio:g}"  # the two compositions apart
                    shape = f" on turns ({TURN_CACHED_PER_NEW}x as many tokens cached)" if turn else ""
                    announce(
                        f"auto: timing {sparse_name(method)}{keep} against full prefill on this machine{shape}, "
                        f"from {length} tokens (once for this model and these settings)"
                    )
                _measure(lm, method, length, cached)
            return _measure(lm, method, length, cached)

    return measure
