"""Runs an `mx.fast.metal_kernel` source as C++ on the CPU, for machines without Metal.

The function is declared the way MLX declares it (template parameters, inputs in order, scalars
as references, outputs, `thread_position_in_grid` when the source uses it) and is called once per
grid point. Metal's address-space words are defined away, `metal::` maths maps to the C++
library, half is _Float16, bfloat16_t a 16-bit struct converting to and from float with
round-to-nearest-even (as MLX's Metal bfloat16 does), and every buffer is a bounds-checked pointer: an
out-of-range read or
write is counted and fails the call. What this cannot see: MSL-only compile errors, threadgroup
memory and SIMD semantics (the kernels here use none), fast-math rounding on a real GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

CACHE = Path(tempfile.gettempdir()) / "specfill-metal-emulator"

# MLX's get_type_string names, and the NumPy dtype that holds the same bytes
TYPES: dict[mx.Dtype, tuple[str, type]] = {
    mx.float32: ("float", np.float32),
    mx.float16: ("float16_t", np.float16),
    mx.bfloat16: ("bfloat16_t", np.uint16),  # NumPy has no bfloat16: the raw bits travel
    mx.int32: ("int32_t", np.int32),
    mx.uint32: ("uint32_t", np.uint32),
}

PRELUDE = r"""
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#define device
#define constant
#define thread
typedef _Float16 float16_t;
typedef _Float16 half;
typedef unsigned int uint;
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40u)   // NaN stays NaN
                                           : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
struct uint3 { uint x, y, z; };
namespace metal {
inline float exp(float x) { return std::exp(x); }
template <typename T> inline T min(T a, T b) { return a < b ? a : b; }
template <typename T> inline T max(T a, T b) { return a > b ? a : b; }
}
static long g_violations = 0;
template <typename T>
struct checked_ptr {
  T* base;
  std::ptrdiff_t size;
  std::ptrdiff_t offset;
  template <typename I> checked_ptr operator+(I n) const {
    return checked_ptr{base, size, offset + static_cast<std::ptrdiff_t>(n)};
  }
  template <typename I> T& operator[](I i) const {
    const std::ptrdiff_t at = offset + static_cast<std::ptrdiff_t>(i);
    if (at < 0 || at >= size) {
      ++g_violations;
      static std::remove_const_t<T> dummy{};
      return dummy;
    }
    return base[at];
  }
};
"""


class EmulatedKernel:
    """Drop-in for the callable `mx.fast.metal_kernel(...)` returns (plain outputs only)."""

    def __init__(
        self, name: str, input_names: list[str], output_names: list[str], source: str, header: str = ""
    ) -> None:
        self.name, self.input_names, self.output_names = name, list(input_names), list(output_names)
        self.source, self.header = source, header
        self.launches = 0

    def _signature(self, inputs: list[mx.array], output_dtypes: list[mx.Dtype]) -> list[str]:
        params = []
        for name, arr in zip(self.input_names, inputs):
            ctype = TYPES[arr.dtype][0]
            params.append(f"const {ctype}& {name}" if arr.ndim == 0 else f"checked_ptr<const {ctype}> {name}")
        params += [f"checked_ptr<{TYPES[d][0]}> {n}" for n, d in zip(self.output_names, output_dtypes)]
        if "thread_position_in_grid" in self.source:
            params.append("uint3 thread_position_in_grid")
        return params

    def _library(self, inputs: list[mx.array], template: list, output_dtypes: list[mx.Dtype]) -> ctypes.CDLL:
        names = ", ".join(
            f"{'typename' if isinstance(v, mx.Dtype) else 'bool' if isinstance(v, bool) else 'int'} {n}"
            for n, v in template
        )
        values = ", ".join(TYPES[v][0] if isinstance(v, mx.Dtype) else str(v).lower() for _, v in template)
        n_in = len(inputs)
        args = []
        for i, arr in enumerate(inputs):
            ctype = TYPES[arr.dtype][0]
            args.append(
                f"*(const {ctype}*)buffers[{i}]"
                if arr.ndim == 0
                else f"checked_ptr<const {ctype}>{{(const {ctype}*)buffers[{i}], sizes[{i}], 0}}"
            )
        for j, dtype in enumerate(output_dtypes):
            ctype = TYPES[dtype][0]
            args.append(f"checked_ptr<{ctype}>{{({ctype}*)buffers[{n_in + j}], sizes[{n_in + j}], 0}}")
        if "thread_position_in_grid" in self.source:
            args.append("uint3{x, y, z}")
        code = "\n".join(
            [
                PRELUDE,
                self.header,
                f"template <{names}>" if template else "",
                f"void kernel_body({', '.join(self._signature(inputs, output_dtypes))}) {{",
                self.source,
                "}",
                'extern "C" long launch(void** buffers, const long* sizes, unsigned gx, unsigned gy, unsigned gz) {',
                "  g_violations = 0;",
                "  for (unsigned z = 0; z < gz; ++z) for (unsigned y = 0; y < gy; ++y)"
                " for (unsigned x = 0; x < gx; ++x)",
                f"    kernel_body{f'<{values}>' if template else ''}({', '.join(args)});",
                "  return g_violations;",
                "}",
            ]
        )
        digest = hashlib.sha256(code.encode()).hexdigest()[:20]
        CACHE.mkdir(parents=True, exist_ok=True)
        lib = CACHE / f"{self.name}-{digest}.so"
        if not lib.exists():
            src = CACHE / f"{self.name}-{digest}-{os.getpid()}.cpp"
            src.write_text(code)
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            done = subprocess.run(
                ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise RuntimeError(f"kernel {self.name} does not compile as C++:\n{done.stderr[-4000:]}")
            tmp.replace(lib)
            src.unlink()  # kept only when it fails to compile, for reading
        library = ctypes.CDLL(str(lib))
        library.launch.restype = ctypes.c_long
        return library

    def __call__(
        self,
        *,
        inputs: list,
        template: list,
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        output_shapes: list,
        output_dtypes: list,
        init_value: float | None = None,
        verbose: bool = False,
    ) -> list[mx.array]:
        if len(inputs) != len(self.input_names) or len(output_shapes) != len(self.output_names):
            raise ValueError(
                f"{self.name}: {len(inputs)} inputs / {len(output_shapes)} outputs, expected "
                f"{len(self.input_names)} / {len(self.output_names)}"
            )
        if any(t < 1 for t in threadgroup) or int(np.prod(threadgroup)) > 1024:
            raise ValueError(f"{self.name}: threadgroup {threadgroup} is not a legal Metal threadgroup")
        if any(g < 1 for g in grid):
            raise ValueError(f"{self.name}: empty grid {grid}")
        arrays = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]  # int -> int32, float -> float32
        host = [np.ascontiguousarray(_host(a)) for a in arrays]
        fill = np.nan if init_value is None else init_value  # unwritten outputs show up as NaN
        outputs = [
            np.full(shape, _bits(fill) if d == mx.bfloat16 else fill, dtype=TYPES[d][1])
            for shape, d in zip(output_shapes, output_dtypes)
        ]
        buffers = (ctypes.c_void_p * (len(host) + len(outputs)))(*[b.ctypes.data for b in host + outputs])
        sizes = (ctypes.c_long * (len(host) + len(outputs)))(*[b.size for b in host + outputs])
        library = self._library(arrays, template, output_dtypes)
        violations = library.launch(buffers, sizes, *[ctypes.c_uint(g) for g in grid])
        self.launches += 1
        if violations:
            raise IndexError(f"{self.name}: {violations} out-of-bounds buffer accesses")
        return [
            mx.array(o).view(mx.bfloat16) if d == mx.bfloat16 else mx.array(o) for o, d in zip(outputs, output_dtypes)
        ]


def _host(a: mx.array) -> np.ndarray:
    """The array's bytes as NumPy (bfloat16 as its uint16 bits)."""
    return np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a, dtype=TYPES[a.dtype][1])


def _bits(value: float) -> int:
    """bfloat16 bits of a float (NaN: the quiet NaN)."""
    return 0x7FC0 if np.isnan(value) else int(np.array(value, dtype=np.float32).view(np.uint32) >> 16)
