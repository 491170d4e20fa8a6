"""MLX backend: H2O two-phase prefill and speculative prefill stages on MLX.

  kernels/intra.py    phase-1 intra attention of all chunks at once + key column sums
  kernels/inter.py    phase-2 attention to the gathered memory set + slot column sums
  kernels/scoring.py  speculator scoring: softmax of each scoring query over the prompt keys
  kernels/state.py    the (m, l, o) online-softmax state and its exact merge
  h2o.py              memory sets, score accumulation, per-layer orchestration with batch carry
  specprefill.py      pooling, reductions, chunk selection, original positions
  conformance.py      the adapter `specfill conformance --backend mlx` drives

Each kernels/ module holds a Metal kernel (built once through `mx.fast.metal_kernel`), an
MLX-ops twin with the same semantics, and a dispatcher that takes the kernel where Metal exists
(use_kernel=None), or as forced. Importing this package does not import mlx, so torch-only
installs can still import `specfill.backends`.
"""
