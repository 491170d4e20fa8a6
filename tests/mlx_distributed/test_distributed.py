"""Issue 39: an mlx-lm model sharded by mlx-lm's own tensor- or pipeline-parallel code over two
ring ranks on this machine (mlx.launch --backend ring -n 2 --hosts 127.0.0.1), run by specfill.

Every rank runs tests/mlx_distributed/scenarios.py through the public API; this process runs the
same scenarios on the unsharded model (mlx_lm.load's pair, adapted: one process). Tokens equal
the one-process run's for full prefill, H2O, SpecPrefill (a replicated 1-layer speculator),
drafting and the prompt cache; H2O memory sets gathered over the ranks (tensor: KV heads in rank
order; pipeline: each layer from the rank holding it) and SpecPrefill's kept positions equal the
one-process run's; what is refused is refused by name. A rank that dies ends the other with one
error line within seconds. Each launch is bounded (launch.LAUNCH_LIMIT_S); the module skips with
the reason where mlx.launch or the ring back-end cannot run here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from tests.adapters.mlx_archs import HONOURED, HYBRID, save_directory
from tests.mlx_distributed.launch import HERE, LAUNCH_LIMIT_S, RANKS, launch, unavailable

pytestmark = pytest.mark.slow

ARCHS = {
    "llama": {},
    "qwen3_moe": dict(HONOURED["qwen3_moe"], num_hidden_layers=4),
    "qwen3_5": dict(HYBRID["qwen3_5"], num_hidden_layers=4),  # a hybrid: delta-net, attention, delta-net, attention
}
BITS = {"llama": 8}  # quantized as mlx-lm's convert does: mlx-lm's shard splits the quantized layers
PAIR = {"llama"}  # handed over as mlx_lm.load's unsharded (model, tokenizer) pair, the others as directories
# what is refused under each kind, and the words of its refusal
REFUSED = {
    "tensor": {"spec_self": "refused under tensor parallelism", "auto": "needs auto_threshold"},
    "hybrid-tensor": {"spec_self": "refused under tensor parallelism", "auto": "needs auto_threshold"},
    "pipeline": {
        "spec_self": "refused under pipeline parallelism",
        "draft_self": "refused under pipeline parallelism",
        "auto": "needs auto_threshold",
    },
}
COMPARED = ("full", "h2o", "specprefill", "spec_self", "draft", "draft_self", "reuse_first", "reuse")


@pytest.fixture(scope="module")
def ring() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("distributed")
    made = {arch: save_directory(arch, root / arch, config, bits=BITS.get(arch)) for arch, config in ARCHS.items()}
    made["speculator"] = save_directory("llama", root / "speculator", {"num_hidden_layers": 1})
    return made


_REFERENCE: dict[str, dict[str, Any]] = {}


def reference(arch: str, models: dict[str, Path]) -> dict[str, Any]:
    """The scenarios on the unsharded mlx-lm model in this process (once per architecture)."""
    if arch not in _REFERENCE:
        from mlx_lm import load as mlx_lm_load

        import specfill
        from tests.mlx_distributed.scenarios import run_scenarios

        model, tokenizer = specfill.load(mlx_lm_load(str(models[arch])), backend="mlx")
        _REFERENCE[arch] = run_scenarios(model, tokenizer, str(models["speculator"]), None)
    return _REFERENCE[arch]


def gathered_memory_sets(ranks: list[dict[str, Any]], kind: str) -> list[list[np.ndarray]]:
    """Every layer's H2O memory sets [Hkv, L + H] from the ranks' own: tensor, each rank's KV heads
    in rank order (mlx-lm's all-to-sharded split gives rank r the r-th run of heads); pipeline,
    each layer from the one rank that ran it (the others record none)."""
    per_rank = [[[np.asarray(m) for m in layer] for layer in r["h2o"]["memory_sets"]] for r in ranks]
    if kind == "tensor":
        return [[np.concatenate(sets, axis=0) for sets in zip(*layers)] for layers in zip(*per_rank)]
    merged = []
    for layers in zip(*per_rank):
        held = [sets for sets in layers if sets]
        assert len(held) == 1, f"a layer's memory sets come from {len(held)} ranks, expected 1"
        merged.append(held[0])
    return merged


@pytest.mark.parametrize(
    "arch, kind", [("llama", "tensor"), ("qwen3_moe", "tensor"), ("qwen3_moe", "pipeline"), ("qwen3_5", "tensor")]
)
def test_sharded_run_equals_one_process(
    ring: None, models: dict[str, Path], tmp_path: Path, arch: str, kind: str
) -> None:
    run = launch(
        HERE / "rank_run.py",
        str(models[arch]),
        str(models["speculator"]),
        kind,
        str(tmp_path),
        *(["--pair"] if arch in PAIR else []),
    )
    assert run.returncode is not None, f"the launch ran past {LAUNCH_LIMIT_S} s:\n{run.output[-3000:]}"
    files = [tmp_path / f"rank{r}.json" for r in range(RANKS)]
    assert all(f.exists() for f in files), f"a rank wrote no results:\n{run.output[-3000:]}"
    ranks = [json.loads(f.read_text()) for f in files]
    want = reference(arch, models)
    assert [r["size"] for r in ranks] == [RANKS] * RANKS
    refusals = REFUSED[f"hybrid-{kind}" if arch in HYBRID else kind]
    for name in COMPARED:
        refused = refusals.get(name)
        for r in ranks:
            got = r[name]
            if refused is not None:
                assert refused in got.get("error", ""), f"rank {r['rank']} {name}: {got}"
            else:
                assert "error" not in got, f"rank {r['rank']} {name}: {got['error']}"
                assert got["tokens"] == want[name]["tokens"], f"rank {r['rank']} {name}"
                assert got["distributed"] == f"{RANKS} ranks, {kind}"
                assert f"Distributed: {RANKS} ranks, {kind}" in got["stats"]
    assert "Distributed" not in want["full"]["stats"] and want["full"]["distributed"] == ""
    for r in ranks:
        assert r["specprefill"]["kept_positions"] == want["specprefill"]["kept_positions"]
        assert r["h2o"]["info_distributed"] == f"{RANKS} ranks, {kind}"
        assert r["draft"]["drafted"] > 0  # the draft model did draft (a fixed length on every rank)
    # a sampling run without a seed: one seed for all ranks (rank 0's), so every rank samples alike
    assert ranks[0]["sampled"]["tokens"] == ranks[1]["sampled"]["tokens"]
    got_sets = gathered_memory_sets(ranks, kind)
    want_sets = [[np.asarray(m) for m in layer] for layer in want["h2o"]["memory_sets"]]
    assert [len(layer) for layer in got_sets] == [len(layer) for layer in want_sets]
    attention = [0, 1, 0, 1] if arch in HYBRID else [1] * len(want_sets)  # a hybrid's recurrent layers: none
    assert [int(len(layer) > 0) for layer in want_sets] == attention
    for index, (got_layer, want_layer) in enumerate(zip(got_sets, want_sets)):
        for chunk, (got, wanted) in enumerate(zip(got_layer, want_layer)):
            np.testing.assert_array_equal(got, wanted, err_msg=f"layer {index}, memory set {chunk}")


def test_dead_rank_ends_the_other_with_one_line(ring: None, models: dict[str, Path], tmp_path: Path) -> None:
    """Rank 1 exits right after loading; rank 0, generating, ends at its next collective with one
    error line (DistributedError), no hang and no traceback."""
    run = launch(
        HERE / "rank_run.py",
        str(models["llama"]),
        str(models["speculator"]),
        "tensor",
        str(tmp_path),
        "--die",
        "1",
        limit_s=LAUNCH_LIMIT_S,
    )
    assert run.returncode is not None, f"rank 0 hung after rank 1 died:\n{run.output[-3000:]}"
    assert run.output.count("specfill: error: rank 0 of 2: another rank is gone") == 1, run.output[-3000:]
    assert "generated without its peer" not in run.output
    assert "Traceback" not in run.output, run.output[-3000:]
    assert run.seconds < LAUNCH_LIMIT_S


def test_cli_generate_under_mlx_launch(ring: None, models: dict[str, Path]) -> None:
    """`specfill generate` on two ranks: rank 0 alone prints, and its statistics name the ranks."""
    run = launch(
        HERE / "cli_rank.py",
        "generate",
        "--backend",
        "mlx",
        "--model",
        str(models["qwen3_moe"]),
        "--pipeline",
        "--prompt",
        "hello world",
        "--max-tokens",
        "4",
        "--ignore-chat-template",
        "--method",
        "h2o",
    )
    assert run.returncode is not None, f"the launch ran past {LAUNCH_LIMIT_S} s:\n{run.output[-3000:]}"
    assert run.output.count("Distributed: 2 ranks, pipeline") == 1, run.output[-3000:]
    assert run.output.count("Generation: 4 tokens") == 1, run.output[-3000:]


SERVE_FLAGS = (
    "--backend",
    "mlx",
    "--log-level",
    "warning",
    "--chunk-size",
    "8",
    "--batch-size",
    "64",
    "--h2o-local",
    "2",
    "--h2o-heavy",
    "3",
    "--h2o-layers",
    "all",
    "--keep",
    "0.5",
    "--select-chunk",
    "4",
)
LONG = [int(t) for t in np.random.default_rng(1).integers(3, 320, 40)]
FRESH = [int(t) for t in np.random.default_rng(2).integers(3, 320, 40)]  # a conversation no earlier request began
SERVED = [  # (request fields, what the responses share) in order: the prompt cache sees them in turn
    ({"prompt": LONG[:16], "max_tokens": 6}, "full"),
    ({"prompt": LONG, "max_tokens": 6, "method": "specprefill", "prompt_cache": "off"}, "specprefill"),
    ({"prompt": LONG, "max_tokens": 6, "method": "h2o", "prompt_cache": "off"}, "h2o"),
    ({"prompt": LONG[:16], "max_tokens": 6}, "full, the prompt cache's hit"),
    ({"prompt": LONG, "max_tokens": 6, "temperature": 0.8, "seed": 3}, "sampled, seeded"),
]


def _post(port: int, body: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def _health(port: int, limit_s: float) -> dict[str, Any] | None:
    import time
    import urllib.request

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                return json.loads(reply.read())
        except OSError:
            time.sleep(0.5)
    return None


def _rebuilt(port: int, limit_s: float = 30) -> bool:
    """Whether the prompt cache has no dense rebuild pending (waits up to limit_s)."""
    import time

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        health = _health(port, limit_s)
        if health is not None and health["prompt_cache"]["pending_tokens"] == 0:
            return True
        time.sleep(0.3)
    return False


def _cancelled_stream(port: int) -> None:
    """A streamed request the client leaves after its first event (the server cancels it)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(
        "POST",
        "/v1/completions",
        json.dumps({"prompt": LONG[:4], "max_tokens": 400, "stream": True}),
        {"content-type": "application/json"},
    )
    reply = connection.getresponse()
    assert reply.status == 200
    assert reply.fp.readline()  # the first event
    connection.close()


def test_serve_under_mlx_launch(ring: None, models: dict[str, Path]) -> None:
    """`specfill serve` on two ranks (pipeline): rank 0 serves HTTP and the other follows it; every
    response (full, SpecPrefill, H2O, a prompt-cache hit, a seeded sample) equals a one-process
    server's; a stream the client leaves is cancelled on both ranks alike (the next request is
    served); SIGINT to rank 0 stops both ranks."""
    import subprocess
    import sys
    import time

    from tests.mlx_distributed.launch import free_port, kill, rank_pid, start

    model = ("--model", str(models["qwen3_moe"]), "--speculator", str(models["speculator"]))
    ports = free_port(), free_port()
    launched = start(HERE / "cli_rank.py", "serve", *SERVE_FLAGS, *model, "--pipeline", "--port", str(ports[0]))
    alone = subprocess.Popen(
        [
            "nice",
            "-n",
            "19",
            sys.executable,
            str(HERE / "cli_rank.py"),
            "serve",
            *SERVE_FLAGS,
            *model,
            "--port",
            str(ports[1]),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        health = _health(ports[0], LAUNCH_LIMIT_S), _health(ports[1], LAUNCH_LIMIT_S)
        assert health[0] is not None and health[1] is not None, "a server did not start"
        assert health[0]["distributed"] == f"{RANKS} ranks, pipeline" and "distributed" not in health[1]
        for body, what in SERVED:
            sharded, one = _post(ports[0], body), _post(ports[1], body)
            assert sharded["choices"] == one["choices"], what
            assert sharded["usage"] == one["usage"], what
            for key in ("prefill_method", "kept_tokens", "cached_tokens"):
                assert sharded["specfill"][key] == one["specfill"][key], (what, key)
        assert _post(ports[0], SERVED[3][0])["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        # an H2O prefill kept in the exact prompt cache is rebuilt densely between requests (idle
        # steps, which rank 0 tells rank 1 to run too); the next turn then reuses the rebuilt KV
        first = {"prompt": FRESH, "max_tokens": 4, "method": "h2o"}
        replies = [_post(port, first) for port in ports]
        assert replies[0]["choices"] == replies[1]["choices"]
        for port in ports:
            assert _rebuilt(port), "the prompt cache's dense rebuild did not finish"
            assert _health(port, 5)["prompt_cache"]["completed_tokens"] > 0  # the rebuild ran
        turn = {"prompt": FRESH + [t for t in range(3, 12)], "max_tokens": 6}
        replies = [_post(port, turn) for port in ports]
        assert replies[0]["choices"] == replies[1]["choices"] and replies[0]["usage"] == replies[1]["usage"]
        assert replies[0]["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(FRESH)
        assert _post(ports[0], SERVED[1][0])["specfill"]["kept_tokens"] < len(LONG)  # SpecPrefill kept a part
        _cancelled_stream(ports[0])
        time.sleep(1)
        assert _post(ports[0], SERVED[1][0])["choices"] == _post(ports[1], SERVED[1][0])["choices"]
        leader = rank_pid(launched, 0)
        assert leader is not None
        import os
        import signal

        os.kill(leader, signal.SIGINT)  # rank 0 drains, then tells rank 1 to stop
        output, _ = launched.communicate(timeout=30)
        assert "exited with code" not in output and "Traceback" not in output, output[-3000:]
    finally:
        kill(launched)
        kill(alone)
        alone.communicate()


def test_serving_rank_that_dies_ends_the_other(ring: None, models: dict[str, Path]) -> None:
    """A follower killed while the server idles: rank 0 (told by mlx.launch) stops with one line."""
    import os
    import signal
    import time

    from tests.mlx_distributed.launch import free_port, kill, rank_pid, start

    port = free_port()
    launched = start(
        HERE / "cli_rank.py",
        "serve",
        "--backend",
        "mlx",
        "--model",
        str(models["llama"]),
        "--port",
        str(port),
        "--log-level",
        "warning",
    )
    try:
        assert _health(port, LAUNCH_LIMIT_S) is not None, "the server did not start"
        follower = rank_pid(launched, 1)
        assert follower is not None
        started = time.monotonic()
        os.kill(follower, signal.SIGKILL)
        output, _ = launched.communicate(timeout=30)
        assert time.monotonic() - started < 30
        assert output.count("specfill: error: rank 0 of 2: another rank is gone") == 1, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    finally:
        kill(launched)


def test_group_refused_on_the_cuda_backend() -> None:
    from specfill.backends import get_backend
    from specfill.core.errors import ConfigError

    with pytest.raises(ConfigError, match="supported on the mlx backend only, not cuda"):
        get_backend("cuda").load("unused", group=object())


def test_refused_by_name_before_sharding(models: dict[str, Path]) -> None:
    """What mlx-lm's model files cannot shard is a one-line ConfigError, before any rank is waited
    for: llama has tensor- but no pipeline-parallel code in mlx-lm; heads that do not split."""
    import mlx.core as mx

    from specfill.backends.mlx.distributed import load_distributed
    from specfill.core.errors import ConfigError, ModelLoadError

    class TwoRanks:  # the group's size is all the checks read before sharding
        def size(self) -> int:
            return 2

        def rank(self) -> int:
            return 0

    cpu = mx.Device(mx.cpu)
    with pytest.raises(ConfigError, match=r"^llama: mlx-lm has no pipeline-parallel code for it .*tensor"):
        load_distributed(models["llama"], None, cpu, 2048, group=TwoRanks(), pipeline=True)

    class ThreeRanks(TwoRanks):
        def size(self) -> int:
            return 3

    with pytest.raises(ConfigError, match="4 query and 2 KV heads do not split over 3 ranks"):
        load_distributed(models["llama"], None, cpu, 2048, group=ThreeRanks())
    with pytest.raises(ModelLoadError, match=r"qwen3_5 layer 0 is recurrent .*pipeline-parallel model runs softmax"):
        load_distributed(models["qwen3_5"], None, cpu, 2048, group=TwoRanks(), pipeline=True)


def test_group_of_one_loads_as_one_process(models: dict[str, Path]) -> None:
    """A group of size 1 (mx.distributed.init() outside mlx.launch) loads as if none was given."""
    import mlx.core as mx

    import specfill

    model, _ = specfill.load(str(models["llama"]), backend="mlx", group=mx.distributed.init())
    assert model.distributed is None
