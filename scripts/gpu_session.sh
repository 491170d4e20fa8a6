#!/usr/bin/env bash
# The GPU checks of issue #4 in one command, for a CUDA machine that already has torch, triton,
# numpy, tokenizers, safetensors, jinja2 and matplotlib (nothing is fetched):
#   1. the machine and versions            -> $OUT/machine.txt
#   2. conformance with the Triton kernels  -> $OUT/conformance-cuda.{json,md}
#   3. the CUDA-only tests (kernels vs twins compiled for the GPU, bf16, device paths) -> $OUT/tests.log
#   4. TTFT of full (torch SDPA) / H2O / SpecPrefill on random Llama-3.2-1B-shape weights,
#      bf16, 8K/16K/32K                     -> $OUT/bench_llama1b_bf16.{json,md,_ttft.png}
# Every step runs even if an earlier one fails; the exit code says whether all passed.
# STEPS=conformance,tests (or bench) runs a subset, to fit a device call's 10-minute limit.
#
#   OUT=results/gpu bash scripts/gpu_session.sh
# With the device tool: carry [".whl"] holding gguf's wheel (the GPU image lacks it), fetched here with
#   pip download --no-deps --only-binary=:all: -d .whl gguf==0.19.0
# and OUT=$OUT (8 files come back: machine.txt, tests.log, conformance-cuda.*, the bench's 3 files).
#   MODEL=random:tiny-llama LENGTHS=64,128 DEVICE=cpu DTYPE=float32 SPECULATOR=self:1 KERNELS=off \
#     TESTS=tests/torch_cuda/test_attention.py NAME=smoke OUT=/tmp/gpu-smoke bash scripts/gpu_session.sh  # smoke run
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-results/gpu}
PY=${PYTHON:-python3}
MODEL=${MODEL:-random:llama-1b}
LENGTHS=${LENGTHS:-8192,16384,32768}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
SPECULATOR=${SPECULATOR:-self:4}  # 4 of the 16 layers, about SmolLM2's self:8 of 30
KERNELS=${KERNELS:-on}
NAME=${NAME:-bench_llama1b_bf16}
TESTS=${TESTS:-tests/torch_cuda_kernels tests/torch_cuda tests/torch_cuda_methods}
STEPS=${STEPS:-conformance,tests,bench}  # a subset splits the work over several device calls
mkdir -p "$OUT"

SITE=/tmp/specfill-site
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
if ! "$PY" -c "import specfill.core" 2>/dev/null; then
    # specfill alone into a scratch folder; its dependencies are the machine's own
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE" . \
        || { echo "gpu_session: cannot install specfill" >&2; exit 2; }
fi
if ! "$PY" -c "import gguf" 2>/dev/null; then
    # the test fixtures write tiny GGUF files: carry the pure-Python wheel in .whl/ (gitignored)
    wheel=$(ls .whl/gguf-*.whl 2>/dev/null | head -1)
    if [[ -n "$wheel" ]]; then
        "$PY" -m pip install -q --no-deps --no-index --target "$SITE" "$wheel" \
            || echo "gpu_session: cannot install $wheel" >&2
    else
        echo "gpu_session: no gguf package and no .whl/gguf-*.whl: the tests will fail to import" >&2
    fi
fi
SPECFILL=("$PY" -m specfill.cli.main)
failed=()

{ date -u; nvidia-smi 2>&1 | head -15
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__);
print('gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"; } > "$OUT/machine.txt" 2>&1

wants() { [[ ",$STEPS," == *",$1,"* ]]; }

if wants conformance; then
    "${SPECFILL[@]}" conformance --backend cuda --kernels "$KERNELS" --out "$OUT" || failed+=(conformance)
fi

if wants tests; then
    # shellcheck disable=SC2086  # TESTS is a list of paths
    PYTHONUNBUFFERED=1 "$PY" -m pytest -q -p no:cacheprovider $TESTS > "$OUT/tests.log" 2>&1 || failed+=(tests)
    tail -3 "$OUT/tests.log"
fi

if wants bench; then
    "${SPECFILL[@]}" bench --backends cuda --device "$DEVICE" --dtype "$DTYPE" --model "$MODEL" \
        --lengths "$LENGTHS" --speculator "$SPECULATOR" --decode-tokens 32 --repeats 3 \
        --out "$OUT" --name "$NAME" || failed+=(bench)
fi

if ((${#failed[@]})); then
    echo "gpu_session: failed: ${failed[*]}" >&2
    exit 1
fi
echo "gpu_session: all passed; results in $OUT"
