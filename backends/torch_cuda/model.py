"""Llama / Mistral / Qwen2 / Qwen3 / Gemma 3 decoder in small modules, batch 1.

Differences between the families come from ModelArgs: which projections carry a bias
(`biased_projections`: q/k/v for Qwen2, q/k/v/o for Llama and Qwen3 with `attention_bias`),
per-head RMSNorm on q and k before RoPE (Qwen3, Gemma 3), each layer's sliding window and RoPE
base (`layer_window`, `local_rope`: Mistral, Gemma 3), and Gemma 3's scaled embeddings, norms
after attention and around the MLP (`sandwich_norms`) and GELU-tanh MLP.

Module names follow Hugging Face, as the MLX model's do (`self_attn.o_proj`, `mlp.gate_proj`,
`input_layernorm`, `embed_tokens`, `lm_head`, ...), with one difference: q/k/v are fused into one
matmul, `qkv_proj` (Phi-3's name for it), one weight read and one GEMM launch instead of three.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from specfill.core.models import ModelArgs
from specfill.core.ops import PrefillAttention, checkpoint, last_rows

from . import fused
from .attention import causal_attention, windowed_attention
from .cache import LayerKVCache, ModelKVCache
from .rope import RotaryEmbedding, apply_rope

# Few-row products on the CPU: Linear reads the weight once, at GEMV speed, in a verify step.
# `nn.Linear` computes x @ W^T. On the CPU (torch 2.13, AVX2 fp32, 2 threads, AMD EPYC) that GEMM
# costs 2-3x more for 2-16 rows than for one, because the BLAS repacks the whole weight for every
# call: the 1.5B's MLP weight [8960, 1536] took 4.7 ms for 1 row, 13.0 ms for 4, 15.6 ms for 16,
# while W @ x^T (the same product, the weight as the left operand) took 4.4 / 4.5 / 10.6 ms; its
# 151,936-row lm_head took 257 ms for 5 rows against 91 ms. Speculative decoding verifies k + 1
# rows per round, so with nn.Linear a verify cost ~3x a decode step and drafting never paid here.
# The result is the same product summed in a different order: equal within fp32 rounding, not
# bitwise. So the weight-left order runs only inside `few_row_products()`, which TorchOps enters
# around a verify step (ModelOps.verify_scope): prefill keeps one order for every step size (its
# logits stay bitwise the same for any --prefill-step-size), and so does every GPU (cuBLAS picks
# its own kernels for skinny products).
WEIGHT_LEFT_MAX_ROWS = 64  # measured above: 1.1-3x faster up to 64 rows, equal at 128-256
_FEW_ROWS: ContextVar[bool] = ContextVar("few_row_products", default=False)


@contextmanager
def few_row_products() -> Iterator[None]:
    """Within it, Linear layers on the CPU take the weight-left product for 2..64 rows."""
    token = _FEW_ROWS.set(True)
    try:
        yield
    finally:
        _FEW_ROWS.reset(token)


class Linear(nn.Linear):
    """nn.Linear with the weight-left product for 2..WEIGHT_LEFT_MAX_ROWS rows on the CPU, inside
    few_row_products() only.

    x: [..., in_features] -> [..., out_features]; parameters and state dict as nn.Linear's.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        # a compiled step (decode_graph.py) is a GPU's: no CPU order, and no ContextVar read to trace
        if torch.compiler.is_compiling() or not _FEW_ROWS.get() or x.device.type != "cpu":
            return super().forward(x)
        if not 2 <= rows <= WEIGHT_LEFT_MAX_ROWS:
            return super().forward(x)
        out = (self.weight @ x.reshape(rows, -1).T).T.contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) with float32 statistics, rounded to the activation dtype, then
        # the scale in that dtype (as the reference does). F.rms_norm computes half / bfloat16 input
        # in float32 and rounds once: bitwise x.float() * torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        # rounded on the CPU (tests/torch_cuda/test_decode_launches.py), one fused kernel on CUDA where
        # those six ops were six launches: a decode step is launch-bound (results/gpu/h200/2026-11-29).
        # On a GPU the weight's product joins it: one Triton launch (kernels/norm_triton.py, fused.py)
        if self._kernel_runs(x):
            from .kernels import dispatch

            return dispatch.triton_kernel("rms_norm")(x, self.weight, self.eps)[1]
        return self.weight * F.rms_norm(x, self.weight.shape, eps=self.eps)

    def add_forward(self, out: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, this norm of h) for h = out + x, written into out (the block's `out.add_(x)`): the sum
        and the norm one launch on a GPU, two (three) kernels otherwise."""
        if self._kernel_runs(out) and out.dim() == 3 and fused.norm_launchable(x, self.weight) and x.shape == out.shape:
            from .kernels import dispatch

            return dispatch.triton_kernel("rms_norm")(out, self.weight, self.eps, x)
        h = out.add_(x)
        return h, self(h)

    def _kernel_runs(self, x: torch.Tensor) -> bool:
        return fused.kernel_runs(
            x, lambda: fused.norm_launchable(x, self.weight), lambda: fused.norm_self_check(x, self.eps)
        )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.layer = layer
        self.window = args.layer_window(layer)
        self.scale = args.attention_scale
        self.n_heads, self.n_kv_heads, self.head_dim = (
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        )
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.split_sizes = (q_size, kv_size, kv_size)
        biased = args.biased_projections  # q, k, v carry biases together, o only in some families
        # fused [q; k; v] rows: one GEMM per step instead of three (the loaders concatenate HF's)
        self.qkv_proj = Linear(args.hidden_size, q_size + 2 * kv_size, bias="q_proj" in biased)
        self.o_proj = Linear(q_size, args.hidden_size, bias="o_proj" in biased)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if args.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        positions: torch.Tensor,
        cache: LayerKVCache,
        attend: PrefillAttention | None,
        rows_from: int = 0,
    ) -> torch.Tensor:
        """x [1, T, hidden] at positions [T] -> [1, T - rows_from, hidden]: every row's keys and
        values cached, the queries from row `rows_from` on attended (core/ops.last_rows); `attend`
        (H2O, the speculator's capture) replaces causal attention and applies the layer's window itself."""
        _, steps, _ = x.shape
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split(self.split_sizes, dim=-1)
        v = v.view(1, steps, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        if self.q_norm is None:
            # q's and k's heads are adjacent columns of the fused product: rotated together and, on a GPU,
            # with the cache writes in the same launch (a decode step is launch-bound: one where five were)
            qk = qkv[..., : self.split_sizes[0] + self.split_sizes[1]]
            qk = qk.view(1, steps, self.n_heads + self.n_kv_heads, self.head_dim).transpose(1, 2)
            q, keys, values = cache.store_rotated(qk, v, cos, sin, self.n_heads)
        else:  # each normalised by its own weight first
            q = self.q_norm(q.view(1, steps, self.n_heads, self.head_dim))
            k = self.k_norm(k.view(1, steps, self.n_kv_heads, self.head_dim))
            q = apply_rope(q.transpose(1, 2), cos, sin)
            k = apply_rope(k.transpose(1, 2), cos, sin)
            keys, values = cache.update_and_fetch(k, v)
        # a windowed layer records every step's positions, whoever attends (decode reads them)
        keys_at = cache.slot_positions(positions) if self.window is not None else None
        if rows_from:
            if rows_from == steps:  # only the keys and values were wanted
                return x.new_empty((1, 0, x.shape[2]))
            q, positions, steps = q[:, :, rows_from:], positions[rows_from:], steps - rows_from
        if attend is not None:
            out = attend(self.layer, q, keys, values)
        elif self.window is not None:
            out = windowed_attention(q, keys, values, self.scale, self.window, positions, keys_at)
        else:
            out = causal_attention(q, keys, values, self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(1, steps, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), or Gemma's GeGLU with GELU-tanh in place of silu. Gate
    and up stay two matmuls: on CPU the fused one was slower, and its strided halves slow the
    elementwise ops."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gelu = args.mlp_activation == "gelu_tanh"
        self.gate_proj = Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In place: each [T, ffn] temporary is the largest activation of the layer.
        if self.gelu:
            return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh").mul_(self.up_proj(x)))
        gate, up = self.gate_proj(x), self.up_proj(x)
        # on a GPU SiLU and the product are one launch and one pass (kernels/swiglu_triton.py), bitwise the pair
        if fused.kernel_runs(gate, lambda: fused.swiglu_launchable(gate, up), lambda: fused.swiglu_self_check(gate)):
            from .kernels import dispatch

            return self.down_proj(dispatch.triton_kernel("swiglu")(gate, up))
        return self.down_proj(F.silu(gate, inplace=True).mul_(up))


class TransformerBlock(nn.Module):
    """Pre-norm residual block (HF names); with sandwich norms (Gemma 3) post_attention_layernorm
    normalises the attention output and pre/post_feedforward_layernorm wrap the MLP, otherwise
    post_attention_layernorm is the pre-MLP norm."""

    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.local_rope = args.local_rope(layer)
        self.sandwich = args.sandwich_norms
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        ropes: dict[bool, tuple[torch.Tensor, torch.Tensor]],
        positions: torch.Tensor,
        cache: LayerKVCache,
        attend: PrefillAttention | None,
        rows_from: int = 0,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ropes: the (cos, sin) tables by `local_rope` (False: global, True: sliding layers' base);
        rows_from: the output's first row (Attention.forward). The block's input is x + residual (the
        previous block's two terms; None: x alone), x [1, T, hidden]; returns the two terms of its output,
        each [1, T - rows_from, hidden], unsummed: the next block's input norm adds them in its own launch
        on a GPU (vLLM's fused add-norm), one residual add a layer fewer in a launch-bound decode step."""
        if residual is None:
            normed = self.input_layernorm(x)
        else:
            x, normed = self.input_layernorm.add_forward(x, residual)
        out = self.self_attn(normed, ropes[self.local_rope], positions, cache, attend, rows_from)
        x = x[:, rows_from:]
        if not self.sandwich:
            h, normed = self.post_attention_layernorm.add_forward(out, x)
            return self.mlp(normed), h
        h = self.post_attention_layernorm(out).add_(x)
        return self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h))), h


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        # an empty weight skips nn.Embedding's normal_ init: on the meta device (weights.py) that
        # init alone imports torch._dynamo, seconds of start-up for weights that are replaced anyway
        self.embed_tokens = nn.Embedding(
            args.vocab_size, args.hidden_size, _weight=torch.empty(args.vocab_size, args.hidden_size)
        )
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.num_hidden_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(args)
        self.rope_local = RotaryEmbedding(args, local=True) if args.rope_local_theta is not None else None
        self._views: dict[int, Transformer] = {}  # first_layers' views, by depth

    def first_layers(self, n: int) -> "Transformer":
        """A model of this one's first n blocks with its embedding, final norm and LM head, all
        shared (no copies): the "self:K" speculator. Made once per n (~4 ms of module building, in
        every request that names it) and kept: the same object each time, so the static steps
        captured for it (keyed by the model) are found again on a reused cache."""
        if not 1 <= n <= len(self.layers):
            raise ValueError(f"first_layers takes 1..{len(self.layers)} layers, got {n}")
        if n not in self._views:
            self._views[n] = self._view(n)
        return self._views[n]

    def _view(self, n: int) -> "Transformer":
        with torch.device("meta"):  # placeholders, replaced by the shared modules below
            view = Transformer(replace(self.args, num_hidden_layers=n))
        view.embed_tokens, view.norm, view.lm_head = self.embed_tokens, self.norm, self.lm_head
        view.rope = self.rope
        view.rope_local = self.rope_local
        view.layers = nn.ModuleList(self.layers[:n])
        return view.eval()

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelKVCache,
        logits_from: int | None = 0,
        attend: PrefillAttention | None = None,
    ) -> torch.Tensor | None:
        """ids [1, T] at RoPE `positions` [T], stored in the cache's next T slots; `attend`
        replaces causal attention (H2O, the speculator's query capture).

        Returns logits [1, T - logits_from, vocab] float32 for the step's tokens from index
        `logits_from` on (the LM head runs only there), or None when logits_from is None.
        """
        return self.from_layer(0, self.embed(ids), positions, cache, logits_from, attend)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [1, T] -> the first block's input [1, T, hidden]."""
        x = self.embed_tokens(ids)
        if self.args.embedding_scale is not None:  # rounded to the activation dtype, as HF does
            x = x * torch.tensor(self.args.embedding_scale, dtype=x.dtype)
        return x

    def states(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: ModelKVCache, attend: PrefillAttention | None
    ) -> torch.Tensor:
        """ids [1, T] through every block (stored in the cache as forward stores them): the last
        block's output [1, T, hidden], every row, before the final norm (a nested speculator's
        deeper layers read it: core/methods/speculator_depth.py)."""
        return self._blocks(0, self.embed(ids), positions, cache, 0, attend)[0]

    def from_layer(
        self,
        first: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelKVCache,
        logits_from: int | None = 0,
        attend: PrefillAttention | None = None,
    ) -> torch.Tensor | None:
        """forward from block `first` on: x [1, T, hidden] is its input (0: the embedding; a
        nested speculator's deeper layers: the states of its first `first` blocks)."""
        steps = x.shape[1]
        if logits_from is not None and logits_from < 0:
            logits_from += steps
        x, rows_from = self._blocks(first, x, positions, cache, logits_from, attend)
        if logits_from is None:
            return None
        return self.lm_head(self.norm(x[:, logits_from - rows_from :])).float()

    def _blocks(
        self,
        first: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: ModelKVCache,
        logits_from: int | None,
        attend: PrefillAttention | None,
    ) -> tuple[torch.Tensor, int]:
        """Blocks first.. over x; the last computes only the rows read (core/ops.last_rows):
        (the output, its first row)."""
        ropes = {False: self.rope(positions, x.dtype)}
        ropes[True] = ropes[False] if self.rope_local is None else self.rope_local(positions, x.dtype)
        steps, last = x.shape[1], len(self.layers) - 1
        rows_from, residual = 0, None
        for index in range(first, len(self.layers)):
            block, layer_cache = self.layers[index], cache.layers[index]
            if not torch.compiler.is_compiling():  # a compiled decode step is one graph: checked per step
                checkpoint()  # a cancelled request (core/ops.py) stops before the next layer: eager, exact
            if index == last and logits_from != 0:  # its rows nothing reads are not computed
                rows_from = last_rows(steps, logits_from, attend, block.self_attn.layer, layer_cache.offset + steps)
            x, residual = block(x, ropes, positions, layer_cache, attend, rows_from, residual)
        # the last block's two terms summed (every other block's sum is its successor's input norm's)
        return (x if residual is None else x.add_(residual)), rows_from
