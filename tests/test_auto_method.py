"""method="auto": full prefill below the crossover calibrated on THIS machine, the sparse method above."""

import dataclasses
import json

import pytest

from specfill.api import load, prefill_method, stream_generate
from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig, crossover, probe
from specfill.core.runtime import GenerationInfo, PrefillMethod

H2O = H2OConfig(chunk_size=256, batch_size=1024, local=32, heavy=32)  # few chunks: quick at 3000 tokens
SMALL_H2O = H2OConfig(chunk_size=8, batch_size=8, local=2, heavy=2)


@pytest.fixture
def tiny(tiny_checkpoint, tmp_path, monkeypatch):
    """The tiny llama on torch CPU with an empty calibration cache of its own."""
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path / "calibration"))
    return load(str(tiny_checkpoint("llama", "safetensors")), backend="cuda", device="cpu", dtype="float32")


def fake_measure(monkeypatch, table: dict[int, tuple[float, float]]) -> list[int]:
    """probe._measure replaced by `table` {length: (full s, sparse s)}; returns the lengths measured."""
    calls: list[int] = []

    def measure(lm, method, length, cached=0):
        calls.append(length)
        return table[length]

    monkeypatch.setattr(probe, "_measure", measure)
    return calls


def run_auto(model, tok, n_tokens: int, **options) -> str:
    info = GenerationInfo()
    list(
        stream_generate(
            model,
            tok,
            [5 + i % 300 for i in range(n_tokens)],
            1,
            method=prefill_method("auto", h2o=H2O, **options),
            prefill_info=info,
        )
    )
    return info.method


def test_crossover_is_the_shortest_length_from_which_the_sparse_method_always_wins():
    points = {2048: (1.0, 0.9), 4096: (2.0, 2.1), 8192: (4.0, 3.0), 16384: (8.0, 5.0)}
    assert crossover.crossover_from_points(points) == 8192
    assert crossover.crossover_from_points({2048: (1.0, 1.0)}) is None  # a tie is not a win
    assert crossover.crossover_from_points({2048: (1.0, 0.98)}) is None  # nor a win inside the noise


def test_auto_picks_full_where_the_calibration_found_the_sparse_method_slower(tiny, monkeypatch):
    model, tok = tiny
    calls = fake_measure(monkeypatch, {2048: (1.0, 1.5), 4096: (2.0, 2.5)})
    assert run_auto(model, tok, 3000) == "full"
    assert run_auto(model, tok, 4000) == "full"  # never faster at any length: full everywhere
    assert calls == [2048, 2048, 4096]  # warm-up, then each length once; then the cache
    method = PrefillMethod("auto", h2o=H2O)
    fake_measure(monkeypatch, {2048: (1.0, 0.8), 4096: (2.0, 2.5)})  # faster at 2048, slower at 4096
    assert probe.auto_crossover(model, method, refresh=True)[0] is None  # refreshed, as doctor and bench do
    assert run_auto(model, tok, 3000) == "full"
    calls = fake_measure(monkeypatch, {2048: (1.0, 0.5), 4096: (2.0, 1.0)})
    assert probe.auto_crossover(model, method, refresh=True)[0] == 2048
    assert run_auto(model, tok, 2000) == "full" and run_auto(model, tok, 3000) == "h2o"
    assert run_auto(model, tok, 40) == "full" and calls == [2048, 2048, 4096]  # short prompt: no probe


def test_auto_never_reads_a_crossover_measured_on_another_machine(tiny, monkeypatch):
    model, tok = tiny
    method = PrefillMethod("auto", h2o=H2O)
    key = probe.key_for(model, method)
    elsewhere = {**key, "machine": {**key["machine"], "cpu": "Intel Xeon (AMX)", "gemm_flags": ["amx_bf16"]}}
    crossover.save_calibration(elsewhere, {2048: (2.0, 1.0)}, "another machine")
    # the other machine's file copied to where this machine's calibration would be
    crossover.calibration_path(elsewhere).rename(crossover.calibration_path(key))
    calls = fake_measure(monkeypatch, {2048: (1.0, 2.0), 4096: (2.0, 3.0)})
    assert run_auto(model, tok, 3000) == "full" and calls  # measured here, not read
    saved = json.loads(crossover.calibration_path(key).read_text())
    assert saved["key"] == key and saved["crossover_tokens"] is None


def test_calibration_cache_is_invalidated_by_machine_dtype_threads_and_corruption(tiny, monkeypatch):
    model, _ = tiny
    method = PrefillMethod("auto", h2o=H2O)
    calls = fake_measure(monkeypatch, {2048: (2.0, 1.0), 4096: (4.0, 1.0)})
    assert probe.auto_crossover(model, method)[0] == 2048 and len(calls) == 3
    assert "calibrated 20" in probe.auto_crossover(model, method)[1] and len(calls) == 3  # cached
    real = crossover.cpu_description()
    monkeypatch.setattr(crossover, "cpu_description", lambda: {**real, "gemm_flags": real["gemm_flags"] + ["amx"]})
    assert "calibrated now" in probe.auto_crossover(model, method)[1] and len(calls) == 6
    monkeypatch.setattr(crossover, "cpu_description", lambda: real)
    path = crossover.calibration_path(probe.key_for(model, method))
    path.write_text("{not json")
    assert probe.auto_crossover(model, method)[0] == 2048 and len(calls) == 9  # corrupt: measured again
    monkeypatch.setattr(type(model.ops), "compute_threads", property(lambda self: 7))
    assert probe.key_for(model, method)["threads"] == 7
    assert "calibrated now" in probe.auto_crossover(model, method)[1]
    other = PrefillMethod("auto", h2o=H2OConfig(chunk_size=16, batch_size=16, local=2, heavy=2))
    assert crossover.calibration_path(probe.key_for(model, other)) != path


def test_the_probe_times_both_prefills_and_records_the_machine(tiny, tiny_checkpoint):
    model, _ = tiny
    for method in (PrefillMethod("auto", h2o=SMALL_H2O), PrefillMethod("auto", speculator="self:1")):
        value, source = probe.auto_crossover(model, method, lengths=[32, 64])
        data = json.loads(crossover.calibration_path(probe.key_for(model, method)).read_text())
        assert source.startswith("calibrated now") and data["crossover_tokens"] == value
        assert set(data["points"]) == {"32", "64"} and all(
            p["full_s"] > 0 and p["sparse_s"] > 0 for p in data["points"].values()
        )
        key = data["key"]
        assert key["machine"]["cpu"] and isinstance(key["machine"]["gemm_flags"], list)
        assert key["dtype"] == "float32" and key["threads"] >= 1 and key["device"] == "cpu"
        assert key["model_shape"]["hidden_size"] == 64 and key["method"] == method.sparse


def test_calibration_stops_at_its_budget():
    ticks = iter(range(100))
    measured = crossover.calibrate(
        lambda n: (float(n), 1.0), [4096, 2048, 8192], budget_s=0.5, clock=lambda: float(next(ticks))
    )
    assert list(measured) == [2048]  # the first length always runs, then the budget is spent
    ticks = iter(range(100))
    measured = crossover.calibrate(
        lambda n: (float(n), 1.0), [4096, 2048, 8192], budget_s=0.5, clock=lambda: float(next(ticks)), min_points=2
    )
    assert list(measured) == [2048, 4096]  # a turn's calibration: its first two whatever the budget
    with pytest.raises(ValueError):
        crossover.calibrate(lambda n: (1.0, 1.0), [])


def test_explicit_threshold_overrides_the_calibration(tiny, monkeypatch):
    model, tok = tiny
    calls = fake_measure(monkeypatch, {})
    assert run_auto(model, tok, 40, auto_threshold=40) == "h2o"
    assert run_auto(model, tok, 40, auto_threshold=41) == "full"
    assert run_auto(model, tok, 40, auto_threshold=10, speculator="self:1") == "specprefill" and not calls
    with pytest.raises(ConfigError, match="auto threshold"):
        PrefillMethod("auto", auto_threshold=0)


def test_fastest_picks_the_least_ratio_among_the_crossovers_reached():
    def data(crossover, points):
        return {"crossover_tokens": crossover, "points": {str(n): {"full_s": f, "sparse_s": s} for n, (f, s) in points}}

    calibrations = {
        "a": data(2048, [(2048, (1.0, 0.8)), (4096, (2.0, 1.2))]),
        "b": data(4096, [(2048, (1.0, 1.1)), (4096, (2.0, 0.8))]),
        "c": data(None, [(2048, (1.0, 1.5))]),
    }
    assert crossover.fastest(calibrations, 1000) is None  # below every crossover: full
    assert crossover.fastest(calibrations, 3000) == "a"  # b's crossover not reached yet
    assert crossover.fastest(calibrations, 9000) == "b"  # at 4096 b's 0.4 beats a's 0.6
    assert crossover.fastest({"x": calibrations["a"], "y": calibrations["a"]}, 5000) == "x"  # ties: the first


@pytest.mark.parametrize("winner", ["specprefill", "specprefill+h2o", "h2o", "full"])
def test_auto_with_a_speculator_picks_among_h2o_specprefill_and_the_composition(tiny, monkeypatch, winner):
    """Each sparse method has its own calibration (the method config, speculator_prefill included,
    is in the key); auto runs the fastest whose crossover the prompt reaches."""
    model, tok = tiny
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 1080))  # above the composition's chunk of 1024
    fast, slow = {1040: (1.0, 0.5), 1080: (2.0, 1.0)}, {1040: (1.0, 0.8), 1080: (2.0, 1.6)}
    measured: list[str] = []

    def measure(lm, method, length, cached=0):
        measured.append(probe.sparse_name(method))
        if winner == "full":
            return (1.0, 2.0)
        return (fast if probe.sparse_name(method) == winner else slow)[length]

    monkeypatch.setattr(probe, "_measure", measure)
    composed = SpecPrefillConfig(speculator_prefill="h2o")  # asked for: auto never picks it on its own
    assert run_auto(model, tok, 1100, speculator="self:1", specprefill=composed) == winner
    assert set(measured) == {"specprefill", "specprefill+h2o", "h2o"}


def test_auto_weighs_the_composition_only_where_its_evidence_holds(tiny):
    """With SpecPrefill's defaults auto adds the composition, run as AUTO_COMPOSITION (the settings
    of its accuracy evidence), from AUTO_COMPOSITION_FROM prompt tokens on; shorter prompts and
    other settings of the caller's keep to plain SpecPrefill and H2O."""
    method = PrefillMethod("auto", h2o=H2O, speculator="self:1", specprefill=SpecPrefillConfig())
    names = [probe.sparse_name(m) for m in probe.auto_options(method, probe.AUTO_COMPOSITION_FROM - 1)]
    assert names == ["specprefill", "h2o"]
    options = probe.auto_options(method, probe.AUTO_COMPOSITION_FROM)
    assert [probe.sparse_name(m) for m in options] == ["specprefill", "specprefill+h2o", "h2o"]
    assert options[0].specprefill == SpecPrefillConfig() and options[1].specprefill == probe.AUTO_COMPOSITION
    assert options[1].specprefill.speculator_prefill.layers == "all"
    # a speculator that cannot run a nested pass (core/methods/speculator_depth.nestable) reads every token
    whole = probe.auto_options(method, probe.AUTO_COMPOSITION_FROM, nests=False)[1].specprefill
    assert whole == dataclasses.replace(probe.AUTO_COMPOSITION, deep_keep=None, deep_from=None)
    chosen = PrefillMethod("auto", h2o=H2O, speculator="self:1", specprefill=SpecPrefillConfig(keep_ratio=0.2))
    assert [probe.sparse_name(m) for m in probe.auto_options(chosen, 10**6)] == ["specprefill", "h2o"]
    asked = SpecPrefillConfig(keep_ratio=0.2, speculator_prefill="h2o")  # asked for: run as asked, at any length
    options = probe.auto_options(PrefillMethod("auto", h2o=H2O, speculator="self:1", specprefill=asked), 100)
    assert options[1].specprefill == asked


def test_auto_runs_the_recorded_composition_where_it_is_fastest(tiny, monkeypatch):
    """Past AUTO_COMPOSITION_FROM (lowered here to fit the tiny model) a default auto request runs
    SpecPrefill over an H2O speculator with AUTO_COMPOSITION's keep rule when its calibration wins."""
    model, tok = tiny
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 1080))  # above the composition's chunk of 1024
    monkeypatch.setattr(probe, "AUTO_COMPOSITION_FROM", 1050)
    measured: list[str] = []

    def measure(lm, method, length, cached=0):
        measured.append(probe.sparse_name(method))
        return (1.0, 0.3 if probe.sparse_name(method) == "specprefill+h2o" else 0.6)

    monkeypatch.setattr(probe, "_measure", measure)
    info = GenerationInfo()
    prompt = [5 + i % 300 for i in range(1100)]
    list(stream_generate(model, tok, prompt, 1, method=prefill_method("auto", speculator="self:1"), prefill_info=info))
    assert info.method == "specprefill+h2o" and set(measured) == {"specprefill", "specprefill+h2o", "h2o"}
    direct = GenerationInfo()  # the composition asked for by name, with AUTO_COMPOSITION's settings
    method = prefill_method("specprefill", specprefill=probe.AUTO_COMPOSITION, speculator="self:1")
    list(stream_generate(model, tok, prompt, 1, method=method, prefill_info=direct))
    assert list(info.kept_positions) == list(direct.kept_positions)
    assert len(direct.kept_positions) < len(prompt)
    measured.clear()
    assert run_auto(model, tok, 1040, speculator="self:1") == "specprefill"  # below it: no composition weighed
    assert "specprefill+h2o" not in measured


def test_common_length_and_extended_calibrations(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path))

    def data(points):
        return {"crossover_tokens": None, "points": {str(n): {"full_s": f, "sparse_s": s} for n, (f, s) in points}}

    short, long = data([(2048, (1.0, 0.8))]), data([(2048, (1.0, 0.9)), (4096, (2.0, 1.2)), (8192, (4.0, 2.0))])
    assert crossover.common_length([short, long], 32000) == 8192
    assert crossover.common_length([short, long], 5000) == 4096 and crossover.common_length([short], 1000) is None
    key = {"backend": "test", "method": "composition", "n": 1}
    seen: list[int] = []
    grown = crossover.extended(key, short, lambda n: seen.append(n) or (n / 2048, n / 8192), [2048, 4096, 8192])
    assert seen == [4096, 8192] and grown["crossover_tokens"] == 2048
    assert set(grown["points"]) == {"2048", "4096", "8192"}
    assert crossover.read_calibration(key) == grown  # saved
    assert crossover.extended(key, grown, lambda n: pytest.fail("measured again"), [2048, 8192]) is grown


def test_auto_compares_its_options_at_one_length(tiny, monkeypatch):
    """A probe cut short by its budget (here: the composition's, measured at the shortest length only,
    where it loses) is measured on to the longest length another option reached before auto compares
    them: there the composition wins (issue 47: a fresh machine's auto chose plain SpecPrefill at 32K)."""
    model, tok = tiny
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 1080))
    monkeypatch.setattr(probe, "AUTO_COMPOSITION_FROM", 1050)
    method = PrefillMethod("auto", h2o=H2O, speculator="self:1", specprefill=SpecPrefillConfig())
    plain, composed, h2o = probe.auto_options(method, 1100)
    for option, points in ((plain, {1040: (1.0, 0.7), 1080: (2.0, 1.2)}), (composed, {1040: (1.0, 0.8)})):
        crossover.save_calibration(probe.key_for(model, option), points, "probe (core/probe.py)")
    crossover.save_calibration(probe.key_for(model, h2o), {1040: (1.0, 2.0), 1080: (2.0, 4.0)}, "probe")
    calls = fake_measure(monkeypatch, {1080: (2.0, 0.6)})  # the composition at 1080 (with its warm-up call)
    chosen, why = probe.auto_choice(model, method, 1100)
    assert probe.sparse_name(chosen) == "specprefill+h2o" and calls == [1080, 1080], why
    assert set(crossover.read_calibration(probe.key_for(model, composed))["points"]) == {"1040", "1080"}
    calls.clear()
    assert probe.sparse_name(probe.auto_choice(model, method, 1100)[0]) == "specprefill+h2o" and calls == []


def test_auto_weighs_settings_alone_and_hands_the_protected_spans_to_its_choice(tiny, monkeypatch):
    """Protected spans are one prompt's data: with them auto weighs the same options (the composition
    included) under the same calibration keys as without, and the SpecPrefill it picks keeps them."""
    model, _ = tiny
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 1080))
    monkeypatch.setattr(probe, "AUTO_COMPOSITION_FROM", 1050)
    keys: list[str] = []

    def measure(lm, method, length, cached=0):
        keys.append(json.dumps(probe.key_for(lm, method), sort_keys=True))
        return (1.0, 0.3 if probe.sparse_name(method) == "specprefill+h2o" else 0.6)

    monkeypatch.setattr(probe, "_measure", measure)
    spans = ((0, 40), (1000, 1100))
    bare = PrefillMethod("auto", h2o=H2O, speculator="self:1", specprefill=SpecPrefillConfig())
    protected = dataclasses.replace(bare, specprefill=SpecPrefillConfig(protected=spans))
    chosen, _ = probe.auto_choice(model, protected, 1100)
    assert probe.sparse_name(chosen) == "specprefill+h2o" and chosen.specprefill.protected == spans
    measured = set(keys)
    plain, _ = probe.auto_choice(model, bare, 1100)  # read back: nothing measured again
    assert set(keys) == measured and plain.specprefill.protected == ()
    assert dataclasses.replace(chosen.specprefill, protected=()) == plain.specprefill

    # spans over at least half of the new part (an agent's first request): full prefill, nothing weighed
    def with_spans(*spans):
        return dataclasses.replace(bare, specprefill=SpecPrefillConfig(protected=spans))

    keys.clear()
    chosen, why = probe.auto_choice(model, with_spans((0, 300), (800, 1050)), 1100)
    assert chosen.name == "full" and "550 of 1100" in why and keys == []
    assert probe.auto_choice(model, with_spans((0, 300), (800, 1049)), 1100)[0].name == "specprefill"
    # a turn counts only the spans' new part: 1100 new tokens over 2000 cached, the first 2000 protected
    assert probe.auto_choice(model, with_spans((0, 2000)), 1100, cached=2000)[0].name == "specprefill"


def test_the_composition_and_plain_specprefill_have_their_own_calibration_keys(tiny):
    model, _ = tiny
    asked = SpecPrefillConfig(speculator_prefill="h2o")
    dense, composed, h2o = probe.auto_options(
        PrefillMethod("auto", h2o=H2O, speculator="self:1", specprefill=asked), 2048
    )
    keys = [probe.key_for(model, m) for m in (dense, composed, h2o)]
    assert [k["method"] for k in keys] == ["specprefill", "specprefill+h2o", "h2o"]
    assert keys[0]["method_config"]["speculator_prefill"] is None
    assert keys[1]["method_config"]["speculator_prefill"]["layers"] == "all"
    assert len({crossover.calibration_path(k) for k in keys}) == 3
    older = {
        **keys[0],
        "method_config": {k: v for k, v in keys[0]["method_config"].items() if k != "speculator_prefill"},
    }
    assert crossover.calibration_path(older) != crossover.calibration_path(keys[0])  # a calibration before the field


def test_auto_weighs_the_turn_composition_on_a_turns_new_part():
    """Over a reused prefix auto also weighs SpecPrefill over an H2O speculator, as
    AUTO_TURN_COMPOSITION (SpecPrefill's keep rule), below AUTO_COMPOSITION_FROM new tokens; from it
    on, AUTO_COMPOSITION as for a fresh prompt of as many tokens (a shorter fresh prompt weighs no
    composition); a caller's own settings keep to what they ask."""
    method = PrefillMethod("auto", h2o=H2O, speculator="self:1", specprefill=SpecPrefillConfig())
    options = probe.auto_options(method, 4000, cached=10_000)
    assert [probe.sparse_name(m) for m in options] == ["specprefill", "specprefill+h2o", "h2o"]
    assert options[1].specprefill == probe.AUTO_TURN_COMPOSITION
    assert options[1].specprefill.speculator_prefill.layers == "all"
    assert (options[1].specprefill.deep_keep, options[1].specprefill.deep_from) == (0.3, 0.5)  # nested
    flat = probe.auto_options(method, 4000, nests=False, cached=10_000)[1].specprefill  # a speculator that cannot nest
    assert flat == dataclasses.replace(probe.AUTO_TURN_COMPOSITION, deep_keep=None, deep_from=None)
    long_from = probe.AUTO_COMPOSITION_FROM
    assert probe.auto_options(method, long_from, cached=10)[1].specprefill == probe.AUTO_COMPOSITION
    assert probe.auto_options(method, long_from - 1, cached=10)[1].specprefill == probe.AUTO_TURN_COMPOSITION
    assert probe.auto_options(method, long_from)[1].specprefill == probe.AUTO_COMPOSITION
    assert len(probe.auto_options(method, long_from - 1)) == 2  # a fresh prompt: no composition below it
    assert len(probe.auto_options(method, 4000)) == 2  # a fresh prompt below AUTO_COMPOSITION_FROM
    chosen = dataclasses.replace(method, specprefill=SpecPrefillConfig(keep_ratio=0.2))
    assert [probe.sparse_name(m) for m in probe.auto_options(chosen, 4000, cached=10_000)] == ["specprefill", "h2o"]


def _turn(model, prefix: int, new: int, method: PrefillMethod) -> GenerationInfo:
    """auto over a reused dense prefix of `prefix` tokens, `new` tokens after it: the info of the turn."""
    from specfill.core.runtime import SamplingConfig

    ids = [5 + i % 300 for i in range(prefix + new)]
    run = {"max_tokens": 1, "sampling": SamplingConfig(), "stop_ids": frozenset()}
    first = GenerationInfo()
    list(model.generate_step(ids[:prefix], method=PrefillMethod(), info=first, **run))
    info = GenerationInfo()
    list(model.generate_step(ids, method=method, info=info, reuse=first.kv, **run))
    return info


def test_auto_reads_a_turn_on_calibrations_of_turns(tiny, monkeypatch):
    """A turn's new part is weighed on calibrations timed over a cached prefix (TURN_CACHED_PER_NEW x
    the new tokens; keys of their own), not on the fresh prompts': where the sparse methods win fresh
    prompts but lose short turns, a short turn runs full and a longer one the option that wins it,
    AUTO_TURN_COMPOSITION here; a new part shorter than every calibration length runs full."""
    model, tok = tiny
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 1300))  # 1300 new over 2600 fits the 4096 context
    turn_ratios = {"specprefill": (1.1, 1.05), "specprefill+h2o": (1.2, 0.5), "h2o": (1.3, 1.1)}  # at 1040, 1300
    measured: list[tuple[str, int, int, SpecPrefillConfig | None]] = []
    keys = set()

    def measure(lm, method, length, cached=0):
        name = probe.sparse_name(method)
        measured.append((name, length, cached, method.specprefill))
        keys.add(json.dumps(probe.key_for(lm, method, cached > 0), sort_keys=True))
        return (1.0, turn_ratios[name][length == 1300] if cached else 0.5)

    monkeypatch.setattr(probe, "_measure", measure)
    method = prefill_method("auto", h2o=H2O, speculator="self:1")
    assert run_auto(model, tok, 1100, speculator="self:1") != "full"  # fresh prompts: every option wins
    assert {cached for _, _, cached, _ in measured} == {0}
    measured.clear()
    assert _turn(model, 600, 1100, method).method == "full"  # the turn calibrations: only from 1300 new tokens
    assert {(length, cached) for _, length, cached, _ in measured} == {(1040, 2080), (1300, 2600)}
    assert _turn(model, 600, 1350, method).method == "specprefill+h2o"
    assert ("specprefill+h2o", 1300, 2600, probe.AUTO_TURN_COMPOSITION) in measured
    assert _turn(model, 2000, 1000, method).method == "full"  # 1000 new tokens: under 1040
    fresh = [k for k in keys if "turn_cached_per_new" not in json.loads(k)["method_config"]]
    assert (len(fresh), len(keys)) == (2, 5)  # fresh: specprefill, h2o (below AUTO_COMPOSITION_FROM); turns: three


def test_calibrate_auto_measures_a_long_prompts_and_a_turns_options_once(tiny, monkeypatch, capsys):
    """What `specfill serve --method auto` does before it listens: every option auto weighs on a long
    fresh prompt (AUTO_COMPOSITION among them), on an agent turn (AUTO_TURN_COMPOSITION) and on a long
    turn (AUTO_COMPOSITION, timed over a cached prefix) is calibrated, each once; one line per shape
    says what auto runs there; a second start measures nothing (the calibrations are read back)."""
    from types import SimpleNamespace

    from specfill.cli.serve import _calibrate_auto

    model, _ = tiny
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 2080))
    monkeypatch.setattr(probe, "AUTO_COMPOSITION_FROM", 3000)  # within the tiny model's 4096-token context
    measured: list[tuple[str, SpecPrefillConfig | None]] = []  # (the sparse method, its SpecPrefill settings)
    turns: list[tuple[str, SpecPrefillConfig | None]] = []  # the same, timed over a cached prefix

    def measure(lm, method, length, cached=0):
        measured.append((probe.sparse_name(method), method.specprefill))
        if cached:
            turns.append(measured[-1])
        return (1.0, {"specprefill": 0.8, "specprefill+h2o": 0.5, "h2o": 0.9}[measured[-1][0]])

    monkeypatch.setattr(probe, "_measure", measure)
    session = SimpleNamespace(model=model, speculator="self:1")
    _calibrate_auto(session, H2O, SpecPrefillConfig())
    err = capsys.readouterr().err
    assert (
        "auto on this machine: a prompt of 3000 tokens: specprefill+h2o; "
        "1040 new tokens over 1040 cached: specprefill+h2o; 3000 new tokens over 1040 cached: specprefill+h2o" in err
    ), err
    assert "specfill: auto: timing h2o against full prefill on this machine, from 1040 tokens" in err  # as it starts
    assert "specfill: auto: timing specprefill+h2o at keep 0.1 against full prefill on this machine on turns" in err
    assert "specfill: auto: timing specprefill+h2o at keep 0.3 against full prefill on this machine on turns" in err
    composed = {(c.keep_ratio, c.query_window) for name, c in measured if name == "specprefill+h2o"}
    auto, turn = probe.AUTO_COMPOSITION, probe.AUTO_TURN_COMPOSITION
    assert composed == {(auto.keep_ratio, auto.query_window), (turn.keep_ratio, turn.query_window)}
    assert {name for name, _ in measured} == {"specprefill", "specprefill+h2o", "h2o"}
    assert ("specprefill", SpecPrefillConfig()) in measured
    assert {c for name, c in turns if name == "specprefill+h2o"} == {auto, turn}  # no request waits for either
    again = len(measured)
    assert probe.calibrate_auto(model, prefill_method("auto", h2o=H2O, speculator="self:1")) == [
        "a prompt of 3000 tokens: specprefill+h2o",
        "1040 new tokens over 1040 cached: specprefill+h2o",
        "3000 new tokens over 1040 cached: specprefill+h2o",
    ]
    assert len(measured) == again


def test_text_units_are_one_prompts_data_calibrated_once_and_handed_to_the_choice(tiny, monkeypatch):
    """select_units "text": each prompt's unit starts differ. They stay out of the calibration's key (with
    them in it every such prompt calibrated anew and wrote a file of its own) and go to the chosen
    method; the probe times its random tokens in units of select_chunk tokens, whatever the prompt."""
    model, _ = tiny
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 1080))
    keys: list[str] = []

    def measure(lm, method, length, cached=0):
        keys.append(json.dumps(probe.key_for(lm, method), sort_keys=True))
        return (1.0, 0.5)

    monkeypatch.setattr(probe, "_measure", measure)

    def prompt(*starts):
        spec = SpecPrefillConfig(select_units="text", unit_starts=starts)
        return PrefillMethod("auto", speculator="self:1", specprefill=spec)

    first, _ = probe.auto_choice(model, prompt(0, 17, 40, 300), 1100)
    measured = set(keys)
    assert measured and first.name == "specprefill" and first.specprefill.unit_starts == (0, 17, 40, 300)
    second, _ = probe.auto_choice(model, prompt(0, 9, 500), 1100)
    assert set(keys) == measured and second.specprefill.unit_starts == (0, 9, 500)  # read back, not measured
    assert len(list((crossover.calibration_dir()).iterdir())) == len(measured)
    text, chunks = SpecPrefillConfig(select_units="text", select_chunk=32), SpecPrefillConfig()
    assert probe.measured_unit_starts(text, 100) == (0, 32, 64, 96) and probe.measured_unit_starts(chunks, 100) == ()


def test_select_units_text_is_calibrated_without_a_prompt(tiny):
    """The probe's own units (measured_unit_starts) let a text-unit SpecPrefill be timed with no
    prompt at hand: `specfill serve --method auto --select-units text` before it listens, bench and
    doctor (before: "select_units text needs the prompt's unit_starts", and every request calibrated)."""
    model, _ = tiny
    spec = SpecPrefillConfig(select_units="text", select_chunk=16)
    method = PrefillMethod("specprefill", speculator="self:1", specprefill=spec)
    _, where = probe.auto_crossover(model, method, lengths=[1040])
    assert "calibrated now" in where and crossover.read_calibration(probe.key_for(model, method)) is not None


def test_a_calibration_measured_in_a_request_is_named_apart_in_its_response(tiny, monkeypatch):
    """Through the API the first auto request measures its calibrations: they are in its TTFT (the
    caller waited), named in calibration_seconds and info.seconds, and not in its prompt_tps."""
    from specfill.api import format_stats

    model, tok = tiny
    fake_measure(monkeypatch, {2048: (1.0, 0.5), 4096: (2.0, 1.0)})
    responses = []
    for _ in range(2):
        info = GenerationInfo()
        ids = [5 + i % 300 for i in range(3000)]
        (last,) = stream_generate(model, tok, ids, 1, method=prefill_method("auto", h2o=H2O), prefill_info=info)
        responses.append((last, info))
    (first, info), (second, again) = responses
    assert first.method == "h2o" and 0 < first.calibration_seconds < first.ttft
    assert info.seconds["auto_calibration"] == first.calibration_seconds
    assert first.prompt_tps == pytest.approx(3000 / (first.ttft - first.calibration_seconds))
    assert "s of it auto's calibration on this machine" in format_stats(first)
    assert second.calibration_seconds == 0.0 and "auto_calibration" not in again.seconds  # read back
    assert "calibration" not in format_stats(second)
