"""The PyTorch backend (CUDA with Triton kernels; torch ops on CPU)."""
