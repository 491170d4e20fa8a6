"""The CPU attention path's rate per q.k product for the Qwen pair's two head shapes, bf16 (study bf16_cpu).

One prefill step of T queries after S0 cached keys, as torch CPU runs it (backends/torch_cuda/attention.py
`causal_attention`: two fused flash calls merged by log-sum-exp), and three variants of its unmasked
prefix part: as it is (grouped KV heads passed through), the G query heads of a KV head folded into rows
(one [Hkv, G*T, D] call), and KV heads expanded. GFLOP/s counts 4*T*S*D*Hq (q.k and p.v).

    .venv/bin/python research/bf16_cpu/attention_rates.py     # prints one line per shape; run alone
"""

import time

import torch

from specfill.backends.torch_cuda.attention import causal_attention

torch.set_num_threads(2)
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def bench(fn, reps=2):
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


T, S0 = 2048, 14336
for name, hq, hkv, d in [("0.5B (14 x 64, 2 KV)", 14, 2, 64), ("1.5B (12 x 128, 2 KV)", 12, 2, 128)]:
    q = torch.randn(1, hq, T, d, dtype=torch.bfloat16)
    k = torch.randn(1, hkv, S0 + T, d, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    step, prefix = 4 * T * (S0 + T / 2) * d * hq, 4 * T * S0 * d * hq
    s = bench(lambda: causal_attention(q, k, v))
    sp = bench(lambda: flash(q, k[:, :, :S0], v[:, :, :S0], 0.0, False))
    g = hq // hkv
    qf = q.reshape(1, hkv, g * T, d)
    kc, vc = k[:, :, :S0].contiguous(), v[:, :, :S0].contiguous()
    sf = bench(lambda: flash(qf, kc, vc, 0.0, False))
    ke, ve = kc.repeat_interleave(g, 1), vc.repeat_interleave(g, 1)
    se = bench(lambda: flash(q, ke, ve, 0.0, False))
    print(
        f"{name}: step {s:.3f} s ({step / s / 1e9:.0f} GFLOP/s); prefix part {sp:.3f} s ({prefix / sp / 1e9:.0f}); "
        f"folded {sf:.3f} s ({prefix / sf / 1e9:.0f}); expanded {se:.3f} s ({prefix / se / 1e9:.0f})",
        flush=True,
    )
