#!/usr/bin/env bash
# The GPU session in one command (issues #40, #50), for a bare CUDA machine that already has torch,
# triton, numpy, transformers, tokenizers, safetensors, jinja2 and matplotlib (nothing is fetched;
# gguf, and pytest where missing, travel as pure-Python wheels in the gitignored .whl/, see below).
# Steps, in order of what matters most, each timed and each running even if an earlier one failed,
# every result in $OUT:
#   1. machine: nvidia-smi, torch / CUDA / Triton versions, GPU name and capability -> machine.txt
#   2. bench (scripts/gpu_bench.py) on random Llama-3.1-8B-shape weights with a random
#      Llama-3.2-1B-shape speculator, bf16: decode tok/s after an 8K prefill per decode mode
#      (CUDA graphs, the same static steps eager, the layer-by-layer path, the compiled step;
#      greedy tokens compared), drafting with the 1B; TTFT of full / H2O / SpecPrefill /
#      the composition as auto runs it (row composition: core/config.AUTO_COMPOSITION, an H2O speculator,
#      keep 0.1, window 32, one neighbour; until 2026-11-29 row specprefill+h2o at keep 0.3) (+ VARIANTS, e.g. a larger prefill step) at 8K / 32K /
#      128K, warm medians of 3, peak memory, beside the roofline; the attention kernels the device
#      chose; e2e.json with decode_tokens_per_s, prefill_roofline_fraction, issue 50's acceptance lines and
#      H2O's walk graphs (walk_graph.py: batches captured / replayed, a refusal's reason; per row in ttft.json)
#                                                   -> ttft.{json,md}, ttft_ttft.png, e2e.json
#   3. exact (only when STEPS names it, or SMOKE): the same model in float32 (EXACT_MODEL), decode as graphs and eagerly after an 8K
#      prefill: greedy tokens equal to the eager path's where no bf16 rounding parts them
#      (random weights' logits are nearly flat: in bf16 any two kernels part after a few tokens)
#                                                   -> exact.{json,md}
#   4. hybrid: a Qwen3.5-0.8B-shaped random hybrid through the torch adapter on the device
#      (scripts/hybrid_speed.py; which fast kernels transformers could use is logged)
#                                                   -> hybrid.{json,md,png}
#   5. the kernel tests: Triton kernels vs their torch twins compiled for this GPU, float32 /
#      float16 / bfloat16 (tests/torch_cuda_kernels/kernel_cases.py but its conformance groups,
#      step 6's run; fused_cases.py beside it, the decoder's fused RoPE (+ cache writes) / RMSNorm / SwiGLU;
#      tests/torch_cuda_methods/kernel_model_cases.py with H2O's walk graphs captured for real, the AOT and
#      dispatch tests)
#                                                   -> kernel_tests.log
#   6. conformance on the cuda backend, Triton kernels on, on the GPU (CONFORMANCE_DTYPES)
#                                                   -> conformance-cuda.{json,md}
#   7. profile (only when STEPS names it): scripts/gpu_profile.py, the PROFILE_METHODS rows (full by
#      default) at PROFILE_TOKENS (the first length) and one decode per PROFILE_DECODE_MODES
#      (eager-static shows the static step kernel by kernel)
#                                                   -> profile/profile.md
#   every step's start, end, seconds and exit code  -> session.log
# With PACK=1 (the device tool brings back at most 8 files) everything also goes into all.tar.gz
# and only e2e.json, ttft.md, ttft_ttft.png, exact.md, hybrid.md, machine.txt and session.log stay
# beside it.
# Time: BUDGET_S (default 560) for the whole script. A step's limit is what is left of the budget
# minus the shares of the steps after it (SHARES, seconds: machine, bench, exact, hybrid, kernels,
# conformance, profile), so time a step leaves unused goes to the later ones; each step runs under `timeout`
# with its limit and the bench also budgets itself run by run (roofline x 4), writing its rows as
# it goes. The exit code says whether every step passed.
#
# The device-tool call (the `run` tool) the lead uses, after fetching the wheels here once with
#   .venv/bin/pip download --no-deps --only-binary=:all: -d .whl gguf==0.19.0 fla-core==0.6.0
#   (add pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 for an image without pytest;
#   fla-core: flash-linear-attention's Triton kernels, for the hybrid step alone)
#   and FlashAttention-4 packed once with `bash scripts/fa4_pack.sh` (~4 min: .fa4/site-cp312.tar.xz.part00
#   ..part03 and .sha256, ~52 MiB). A call sends the working tree (~47 MiB, ~41 of it results/) and what it
#   carries, at most 64 MiB, so results/ is held out of the tree for the call (nothing on the GPU reads it
#   but results/gpu/aot/, which stays): one call carries everything.
#     python3 scripts/device_tree.py hold && python3 scripts/device_tree.py size --carry .whl .fa4   # <= 64 MiB
#     command:   PACK=1 OUT=$OUT/gpu bash scripts/gpu_session.sh
#     carry:     [".whl", ".fa4"]
#     timeout_s: 600   (the script stops itself at BUDGET_S = 560 s, setup included; kill margins)
#   The machine's start and that call leave ~3 of the session's 15 minutes: too few to start a machine, but
#   the warm one (30 s idle) takes a second call at once, where `status` has budget_left_s >= 200: full prefill
#   at 128K kernel by kernel (2026-12-04: 1.59x its roofline, GEMMs at ~764 TFLOP/s by the H2O profile at 32K,
#   attention ~590 by subtraction: which kernel each 16K step runs, and at what rate), and SpecPrefill at 128K
#   (its 1B pass) and at 8K, where its look-ahead took a third of the TTFT (43 of 135 ms: ttft.md's
#   lookahead_setup part says how much of it is the per-prompt graph capture; the host-waits table where the
#   host waited), and the static decode step uncaptured, whose host time (25 ms a token for the 8B, 0.8 ms a
#   layer, where the replayed graph takes 5.7 ms) is what each new prompt's first decode step and capture pay
#   (decode setup 50-140 ms a request in 2026-12-04's rows; the stack table names the lines); the 2026-12-04
#   call 2 (composition, SpecPrefill and H2O at 32K) is results/gpu/h200/2026-12-04/run2.
#   New since 2026-12-04, checked on no GPU yet: graphs are captured without the torch.cuda.graph context's
#   device synchronisation and cache emptying (decode_graph.record), and a prompt's first decode or look-ahead
#   step of a kind the process has captured before is captured without its eager run; the kernel tests (walk
#   graphs captured for real) and the bench's decode token check are their test; their gain: the runs' decode
#   setup_s (2026-12-04: 50-140 ms a request), lookahead_setup, and the 8K / 32K rows of H2O, SpecPrefill and
#   the composition; a log line "run eagerly once before their capture" (a decode row's capture_first false in
#   ttft.json) says a capture without one failed. Also new: a causal step of more than 4K queries is probed
#   apart at 8,192 queries (e2e.json attention_kernels "causal ... over 4K queries"; 2026-12-04 chose the 16K first
#   steps' kernel on the 5,120-token warm-up), and "prefix" steps per span of keys (over 16K, over 64K)
#   Read first (2026-12-05): ttft.md's acceptance table says what a missed line needs (the TTFT, and for
#   SpecPrefill the 1B pass with its other parts as measured); each probe's "rate" (e2e.json attention_kernels,
#   TFLOP/s of the chosen kernel) gives the head-64 / head-128 rate ratio per span. Both #50 lines together need
#   the 1B's head-64 attention at >= ~0.86 of the 8B's head-128 rate (results/gpu/h200/2026-12-04/analysis.md,
#   "Can both lines hold together", "Decision"); measured 0.70-0.81: #50 was blocked on it (2026-12-05).
#     command:   STEPS=profile PROFILE_METHODS=full,specprefill PROFILE_TOKENS=131008,8192 PROFILE_DECODE_MODES=eager-static BUDGET_S=140 PACK=1 OUT=$OUT/prof bash scripts/gpu_session.sh
#     carry:     []   (what call 1 carried stays on the warm machine, if it is still warm)   timeout_s: 170
#     python3 scripts/device_tree.py restore        # at once, before any commit (results/ is deleted meanwhile)
#   Should the tool refuse the held tree (files missing from git's list), restore it and send the parts one a
#   call instead, back to back (the machine keeps a call's carried files while it stays warm, ~30 s after
#   each): `command: ls -l .fa4`, `carry: [".fa4/site-cp312.tar.xz.part00"]`, `timeout_s: 60`, then part01,
#   part02 (PART_MIB is what the whole tree leaves, 15 MiB today), and the session's call with
#   carry [".whl", ".fa4/site-cp312.tar.xz.part03", ".fa4/site-cp312.tar.xz.sha256"].
# The files come back under files_at/gpu: commit them under results/gpu/h100/ (or h200/).
#
# Smoke mode (CPU, tiny random models, seconds; tests/test_random_model.py runs it):
#   SMOKE=1 OUT=/tmp/gpu-smoke bash scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-results/gpu}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-560}
if [[ "${SMOKE:-0}" == 1 ]]; then
    MODEL=${MODEL:-random:tiny-llama} SPECULATOR=${SPECULATOR:-random:tiny-llama-32k} LENGTHS=${LENGTHS:-48,96}
    DEVICE=${DEVICE:-cpu} DTYPE=${DTYPE:-float32} KERNELS=${KERNELS:-off} REPEATS=${REPEATS:-2} DECODE=${DECODE:-8}
    ROOFLINE=${ROOFLINE:-h100}  # H100 figures on a CPU: only to exercise the code
    # a quick file: the smoke run checks the step, the suite runs the tests
    TESTS=${TESTS:-tests/torch_cuda_kernels/test_cpu_units.py}
    CONFORMANCE_DTYPES=${CONFORMANCE_DTYPES:-float32}
    HYBRID_SHAPE=${HYBRID_SHAPE:-tiny} HYBRID_LENGTHS=${HYBRID_LENGTHS:-64} HYBRID_PARITY=${HYBRID_PARITY:-32}
    VARIANTS=${VARIANTS-"full-s32=full:--step 32"} DECODE_MODES=${DECODE_MODES:-graphs,eager-static,eager}
fi
MODEL=${MODEL:-random:llama-8b}
SPECULATOR=${SPECULATOR:-random:llama-1b}
LENGTHS=${LENGTHS:-8192,32768,131072}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
KERNELS=${KERNELS:-on}
REPEATS=${REPEATS:-3}
DECODE=${DECODE:-64}
ROOFLINE=${ROOFLINE:-auto}
CONFORMANCE_DTYPES=${CONFORMANCE_DTYPES:-bfloat16}
TESTS=${TESTS:-tests/torch_cuda_kernels/kernel_cases.py tests/torch_cuda_kernels/fused_cases.py
tests/torch_cuda_methods/kernel_model_cases.py
tests/torch_cuda_kernels/test_aot.py tests/torch_cuda_kernels/test_torch_stages_dispatch.py}
# (2026-12-04 at 15 320 45 70 60 50: the bench took 233 s, the hybrid and the kernel tests ran out of theirs)
read -r -a SHARES <<< "${SHARES:-15 260 45 120 120 45 0}"  # machine, bench, exact, hybrid, kernels, conformance, profile
# more rows per length, NAME=METHOD:FLAGS;... (2026-11-28 and -29 measured larger steps: 1-10%; since
# 2026-12-02 the loader's own step on a GPU with room is 16K, so e.g. "full-s2k=full:--step 2048" is the
# old default; none by default: the compiled decode row's compilation comes out of the TTFT rows' time)
VARIANTS=${VARIANTS-}
DECODE_MODES=${DECODE_MODES:-graphs,eager-static,eager,compiled}
HYBRID_LENGTHS=${HYBRID_LENGTHS:-8192}  # 32768 with fla's tuning and the torch fallback: past the step's time
HYBRID_PARITY=${HYBRID_PARITY:-2048}
HYBRID_SHAPE=${HYBRID_SHAPE:-qwen3.5-0.8b}
EXACT_MODEL=${EXACT_MODEL:-$MODEL}
PROFILE_DECODE_MODES=${PROFILE_DECODE_MODES:-eager-static,graphs,compiled}
# the prefill rows the profile step profiles (gpu_bench.py's row names: full, h2o, specprefill, composition)
# and their prompt lengths (comma-separated: every row at each); e.g. PROFILE_METHODS=full,composition
# PROFILE_TOKENS=32768 for where the composition's time goes (2026-12-04 run2: host-bound, 252 ms of GPU
# work in a 470 ms TTFT); a run up to 32K tokens also counts where the host waited on the device
PROFILE_METHODS=${PROFILE_METHODS:-full}
PROFILE_TOKENS=${PROFILE_TOKENS:-${LENGTHS%%,*}}
# more scripts/gpu_bench.py flags, e.g. "--methods full --draft-tokens 0", or "--compiled-early" for the
# compiled decode row before the TTFT rows (2026-11-29 left it the question: 42.9 tok/s, then its cache
# copies removed). By default it runs last, where 100 s are left: its ~45 s of inductor, FlashAttention-4's
# compilations and the probes' new candidates would otherwise take the 128K rows' time (the bench's rows
# were ~310 s of its 305 by the 2026-11-29 timings), and those rows are the acceptance lines
BENCH_FLAGS=${BENCH_FLAGS-}
mkdir -p "$OUT"
START=$SECONDS
LOG="$OUT/session.log"
: > "$LOG"

# specfill as links to this checkout's source folders (pyproject's package-dir), first on the path:
# no pip, no setuptools, and no other installed specfill can shadow it
SITE=$(mktemp -d /tmp/specfill-site.XXXXXX)
trap 'rm -rf "$SITE"' EXIT
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$SITE/specfill"
# the root folders package-dir maps into specfill (core, backends, ...), read off its one line
FOLDERS=$(sed -n 's/^package-dir = {\(.*\)}$/\1/p' pyproject.toml | grep -o '= "[^"]*"' | tr -d '= "' | grep -vx specfill)
[[ -n "$FOLDERS" ]] || { echo "gpu_session: no package-dir line in pyproject.toml" | tee -a "$LOG" >&2; exit 1; }
# shellcheck disable=SC2086  # FOLDERS is a list
for entry in specfill/* $FOLDERS; do ln -s "$PWD/$entry" "$SITE/specfill/"; done
# Python puts the working directory (this checkout, whose specfill/ lacks core/ and the rest) before
# PYTHONPATH, and pytest puts the rootdir there too: a finder first on sys.meta_path, installed by a
# sitecustomize in $SITE (imported at start-up, before either), resolves the top-level `specfill`
# to $SITE/specfill, whose submodules then follow its __path__
cat > "$SITE/sitecustomize.py" <<PYEOF
import importlib.machinery, sys
class _SpecfillFromSite:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "specfill":
            return importlib.machinery.PathFinder.find_spec(name, ["$SITE"])
        return None
sys.meta_path.insert(0, _SpecfillFromSite)
PYEOF
# what the bare image lacks travels as pure-Python wheels in .whl/ (gitignored): gguf (the test
# fixtures write tiny GGUF files; its yaml / tqdm / requests come with transformers) and pytest with
# its pluggy, iniconfig and pygments; each is unpacked (a pure-Python wheel is a zip of its modules)
# only where the machine has no such module
for module in gguf pytest pluggy iniconfig pygments; do
    "$PY" -c "import $module" 2>/dev/null && continue
    wheel=$(ls .whl/"$module"-*.whl 2>/dev/null | head -1)
    if [[ -n "$wheel" ]]; then
        "$PY" -m zipfile -e "$wheel" "$SITE" >> "$LOG" 2>&1 \
            || echo "gpu_session: cannot install $wheel" | tee -a "$LOG" >&2
    else
        echo "gpu_session: no $module module and no .whl/$module-*.whl: the steps needing it will fail" | tee -a "$LOG"
    fi
done
# flash-linear-attention's kernels (fla-core, pure Python and Triton) for the hybrid step alone, where .whl/
# has its wheel: transformers' delta-net layers take fla's gated delta rule where `fla` imports (the torch
# reference otherwise, run 2 of 2026-11-29); kept off the other steps' path (conformance compares with torch)
FLA_SITE=""
fla_wheel=$(ls .whl/fla_core-*.whl 2>/dev/null | head -1)
if [[ -n "$fla_wheel" && "$DEVICE" == cuda* ]]; then
    if "$PY" -m zipfile -e "$fla_wheel" "$SITE/fla" >> "$LOG" 2>&1; then
        FLA_SITE="$SITE/fla"
    else
        echo "gpu_session: cannot unpack $fla_wheel: the hybrid runs transformers' torch path" | tee -a "$LOG"
    fi
fi
# FlashAttention-4 (the attention probe's "flash-attn-4" candidate: the FA3 design on Hopper, which torch's
# own kernels lack), where the calls carried it: .fa4/site-cpXY.tar.xz.partNN and its .sha256 (scripts/
# fa4_pack.sh; a part a call, see the head of this file), joined, checked and unpacked after specfill on
# the path for the CPython the archive is for. A missing part (the machine went back between the calls) or
# another Python: logged, and the session runs without it, as it does without the parts.
FA4_PACK=.fa4/site-cp$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")').tar.xz
if [[ -f "$FA4_PACK.sha256" ]]; then
    FA4_SITE="$SITE/fa4"
    mkdir -p "$FA4_SITE"
    cat "$FA4_PACK".part* > "$SITE/fa4.tar.xz" 2>> "$LOG"
    parts=$(ls "$FA4_PACK".part* 2>/dev/null | wc -l)
    if [[ $(sha256sum < "$SITE/fa4.tar.xz" | cut -d' ' -f1) != $(cut -d' ' -f1 "$FA4_PACK.sha256") ]]; then
        echo "gpu_session: FlashAttention-4's $parts parts here do not make its archive: left out" | tee -a "$LOG"
    elif tar -xJf "$SITE/fa4.tar.xz" -C "$FA4_SITE" >> "$LOG" 2>&1; then
        rm -f "$SITE/fa4.tar.xz"
        export PYTHONPATH=$PYTHONPATH:$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/python_packages
        "$PY" -c "import flash_attn.cute.interface; print('flash-attn-4 importable')" >> "$LOG" 2>&1 \
            || echo "gpu_session: FlashAttention-4 unpacked but does not import (session.log)" | tee -a "$LOG"
    else
        echo "gpu_session: cannot unpack FlashAttention-4's archive" | tee -a "$LOG"
    fi
elif ls .fa4/site-cp*.sha256 > /dev/null 2>&1; then
    echo "gpu_session: FlashAttention-4 is packed for another Python ($(ls .fa4/*.sha256)): left out" | tee -a "$LOG"
fi
"$PY" -c "import specfill.core, specfill; print('specfill from', specfill.__file__)" >> "$LOG" 2>&1 \
    || { echo "gpu_session: cannot import specfill" | tee -a "$LOG" >&2; exit 2; }
echo "setup: $((SECONDS - START)) s; budget ${BUDGET_S} s from the start, shares ${SHARES[*]}" | tee -a "$LOG"
BUDGET_END=$((START + BUDGET_S))
failed=()
COMPOSE=""
if "$PY" -m specfill.cli.main bench --help 2>/dev/null | grep -q -- --speculator-prefill; then
    COMPOSE=--compose
fi
# the attention probe's kept choices (backends/torch_cuda/probe_store.py) in the checkout's gitignored
# .gpu_calibration/, which a warm machine keeps between calls: call 2 reads call 1's instead of probing again
export SPECFILL_CALIBRATION_DIR=${SPECFILL_CALIBRATION_DIR:-$PWD/.gpu_calibration}
export PY OUT MODEL SPECULATOR LENGTHS DEVICE DTYPE KERNELS REPEATS DECODE ROOFLINE CONFORMANCE_DTYPES TESTS COMPOSE
export VARIANTS DECODE_MODES HYBRID_LENGTHS HYBRID_PARITY HYBRID_SHAPE BENCH_FLAGS EXACT_MODEL PROFILE_DECODE_MODES
export PROFILE_METHODS PROFILE_TOKENS FLA_SITE

# step INDEX FUNCTION: the function under `timeout` (its output in session.log), its limit (LIMIT)
# the budget left minus the shares of the steps after it
step() {
    local index=$1 name=$2 later=0 i
    for ((i = index + 1; i < ${#SHARES[@]}; i++)); do later=$((later + SHARES[i])); done
    local limit=$((BUDGET_END - SECONDS - later))
    # at least 15 s: nvidia-smi on a cold GPU took >5 s (2026-11-29, BUDGET_S 540 under shares of 560)
    ((limit < 15)) && limit=15
    local t0=$SECONDS rc note=""
    echo "$name: start at $((SECONDS - START)) s, limit $limit s" | tee -a "$LOG"
    LIMIT=$limit timeout -k 15 "$limit" bash -c "$name" >> "$LOG" 2>&1
    rc=$?
    ((rc == 124 || rc == 137)) && note=" (out of its time: what it wrote so far is kept)"
    echo "$name: $((SECONDS - t0)) s, exit $rc$note" | tee -a "$LOG"
    ((rc == 0)) || failed+=("$name")
}

machine() {
    {
        date -u
        nvidia-smi 2>&1 || echo "nvidia-smi: not available"
        "$PY" -c '
import platform, torch
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = None
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton_version)
try:
    from importlib.metadata import version
    import flash_attn.cute.interface
    print("flash-attn-4", version("flash-attn-4"), "nvidia-cutlass-dsl", version("nvidia-cutlass-dsl"))
except Exception as e:
    print("flash-attn-4 None:", type(e).__name__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, "capability %d.%d" % (p.major, p.minor), "memory %.1f GiB" % (p.total_memory / 2**30))
else:
    print("gpu None: torch sees no CUDA device")
'
    } > "$OUT/machine.txt" 2>&1
    cat "$OUT/machine.txt"
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() or '$DEVICE' == 'cpu' else 1)"
}

conformance() {
    "$PY" -m specfill.cli.main conformance --backend cuda --kernels "$KERNELS" --dtype "$CONFORMANCE_DTYPES" --out "$OUT"
}

kernels() {
    # shellcheck disable=SC2086  # TESTS is a list of paths
    # the conformance groups with kernels forced are the conformance step's run (the same checks, CLI-driven)
    PYTHONUNBUFFERED=1 "$PY" -m pytest -v -p no:cacheprovider -k "not conformance_with_kernels_forced" $TESTS \
        > "$OUT/kernel_tests.log" 2>&1
    local rc=$?
    tail -3 "$OUT/kernel_tests.log"
    return $rc
}

bench() {
    [[ -n "$COMPOSE" ]] || echo "bench: no --speculator-prefill flag in this checkout: the composition is skipped"
    local variants=() v
    IFS=';' read -r -a specs <<< "$VARIANTS"
    for v in "${specs[@]}"; do [[ -n "$v" ]] && variants+=(--variant "$v"); done
    # shellcheck disable=SC2086  # COMPOSE is empty or one flag, BENCH_FLAGS a list
    PYTHONUNBUFFERED=1 "$PY" scripts/gpu_bench.py --model "$MODEL" --speculator "$SPECULATOR" --lengths "$LENGTHS" \
        --repeats "$REPEATS" --decode-tokens "$DECODE" --dtype "$DTYPE" --device "$DEVICE" --roofline "$ROOFLINE" \
        --decode-modes "$DECODE_MODES" --budget-s "$((LIMIT > 30 ? LIMIT - 15 : LIMIT))" --out "$OUT" --name ttft \
        $COMPOSE "${variants[@]}" $BENCH_FLAGS
}

exact() {
    # float32: the replayed static steps against the layer-by-layer path, token by token
    PYTHONUNBUFFERED=1 "$PY" scripts/gpu_bench.py --model "$EXACT_MODEL" --speculator self:1 \
        --lengths "${LENGTHS%%,*}" --methods full --draft-tokens 0 --repeats 1 --decode-tokens "$DECODE" \
        --dtype float32 --device "$DEVICE" --roofline "$ROOFLINE" --decode-modes graphs,eager \
        --budget-s "$((LIMIT > 10 ? LIMIT - 5 : LIMIT))" --out "$OUT" --name exact
}

profile() {
    PYTHONUNBUFFERED=1 "$PY" scripts/gpu_profile.py --model "$MODEL" --speculator "$SPECULATOR" \
        --tokens "$PROFILE_TOKENS" --methods "$PROFILE_METHODS" --decode-prompt "${LENGTHS%%,*}" --decode-tokens 16 \
        --decode-modes "$PROFILE_DECODE_MODES" --dtype "$DTYPE" --device "$DEVICE" --out "$OUT/profile"
}

hybrid_run() {
    "$PY" -c 'import importlib.util as u; print("hybrid kernels:", {m: bool(u.find_spec(m)) for m in ("fla", "causal_conv1d", "mamba_ssm")})'
    # shellcheck disable=SC2086  # HYBRID_LENGTHS is a list
    PYTHONUNBUFFERED=1 "$PY" scripts/hybrid_speed.py --out "$OUT/hybrid" --device "$DEVICE" --dtype "$DTYPE" \
        --shape "$HYBRID_SHAPE" --parity-length "$HYBRID_PARITY" --lengths $HYBRID_LENGTHS --checkpoint "$SITE/hybrid-model"
}

hybrid() {
    # a Qwen3.5-0.8B-shaped random hybrid through the torch adapter on the device: transformers' forward
    # against specfill's full prefill, then full / h2o / specprefill; which fast kernels transformers found.
    # With fla carried: that run first, in two thirds of the step's time (fla tunes its kernels on first
    # use); if it fails or runs out of that time, transformers' torch path in what is left. Both runs read
    # one random checkpoint, written by the first ($SITE/hybrid-model: 2026-12-04 wrote it twice, 33 + 22 s)
    if [[ -n "$FLA_SITE" ]]; then
        local share=$((LIMIT * 2 / 3)) rc
        PYTHONPATH=$FLA_SITE:$PYTHONPATH timeout -k 5 $share bash -c hybrid_run
        rc=$?
        [[ $rc == 0 ]] && return 0
        if [[ $rc == 124 || $rc == 137 ]]; then
            echo "hybrid: the run with flash-linear-attention ran out of its $share s: transformers' torch path instead"
        else
            echo "hybrid: the run with flash-linear-attention failed (exit $rc, above): transformers' torch path instead"
        fi
    fi
    hybrid_run
}
export -f machine conformance kernels bench exact hybrid hybrid_run profile

# STEPS: the steps to run (a rerun after a partial session names only what it still needs); a step
# left out has no share and no files
# (exact: by name on a GPU since 2026-12-04, whose bf16 decode gave the eager path's logits bitwise; the smoke
# run takes every step)
if [[ -n "${SMOKE:-}" ]]; then
    STEPS=${STEPS:-machine bench exact hybrid kernels conformance}
else
    STEPS=${STEPS:-machine bench hybrid kernels conformance}
fi
NAMES=(machine bench exact hybrid kernels conformance profile)
for index in "${!NAMES[@]}"; do [[ " $STEPS " == *" ${NAMES[index]} "* ]] || SHARES[index]=0; done
for index in "${!NAMES[@]}"; do [[ " $STEPS " == *" ${NAMES[index]} "* ]] && step "$index" "${NAMES[index]}"; done

echo "total: $((SECONDS - START)) s" | tee -a "$LOG"
if [[ "${PACK:-0}" == 1 ]]; then
    # the device tool brings back at most 8 files: the ones read first stay apart, the rest go in one archive
    # written beside, then moved in: an archive growing inside the folder it reads makes tar warn and fail
    packed=$(mktemp /tmp/gpu-session-all.XXXXXX)
    tar -czf "$packed" -C "$OUT" --exclude all.tar.gz . && mv "$packed" "$OUT/all.tar.gz" \
        && echo "packed: $(ls "$OUT" | wc -l) files before" >> "$LOG"
    find "$OUT" -maxdepth 1 -type f ! -name all.tar.gz ! -name e2e.json ! -name ttft.md ! -name session.log \
        ! -name hybrid.md ! -name machine.txt ! -name ttft_ttft.png ! -name exact.md -delete
fi
if ((${#failed[@]})); then
    echo "gpu_session: failed: ${failed[*]}" | tee -a "$LOG" >&2
    exit 1
fi
echo "gpu_session: all passed; results in $OUT" | tee -a "$LOG"
