"""MLX backend: H2O two-phase prefill and speculative prefill stages on MLX.

Metal kernels (through `mx.fast.metal_kernel`) run the hot stages on Apple silicon; MLX-ops
twins with the same semantics run everywhere else (MLX's CPU backend on Linux). Importing this
package does not import mlx, so the torch-only installs can still import `specfill.backends`.
"""
