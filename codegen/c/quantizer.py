"""`quant_formats.quantize` in C: the same integers and scales bit for bit, in one pass.

Loading a quantized model quantizes every GEMM weight; torch's form of it (quant_formats.py)
makes seven passes over each weight in float32 (widen, abs, amax, divide, round, clamp,
narrow), 0.1 GB/s of bf16 weights on the machines here: most of a warm start. Here each
column's groups are read once, from the weight as it is (float32 or bf16 bits, any strides: a
transposed nn.Linear weight is read down its rows), with the same float32 operations in the
same order (|w| max, max / 7 rounded to float16 or max / 127, an all-zero group's scale 1,
w / scale rounded half to even, clamped), so the result equals torch's;
tests/test_quantizer.py compares them. Built once per machine through the C backend's
compile cache; where there is no C compiler, `quantize_in_c` returns None and torch's form
runs."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from .build import CFLAGS, build, compiler

QUANTIZE_C = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EQ_QCHUNK 256  /* values of a column read into a local row at a time */

/* v[0..m) = w[base + i * sk], widened from bf16 bits or copied (contiguous: vector loops) */
static inline void eq_values(const void* w, int bf16, int64_t base, int64_t sk, int64_t m,
                             float* restrict v) {
    if (bf16) {
        const uint16_t* p = (const uint16_t*)w + base;
        if (sk == 1) {
            for (int64_t i = 0; i < m; i++) {
                uint32_t b = (uint32_t)p[i] << 16;
                memcpy(&v[i], &b, 4);
            }
        } else {
            for (int64_t i = 0; i < m; i++) {
                uint32_t b = (uint32_t)p[i * sk] << 16;
                memcpy(&v[i], &b, 4);
            }
        }
    } else {
        const float* p = (const float*)w + base;
        for (int64_t i = 0; i < m; i++) v[i] = p[i * sk];
    }
}

/* x rounded to the nearest float16 value, ties to even, as a float (inf past float16's range;
   x finite, not NaN): the mantissa cut to 10 bits, or below 2^-14 to multiples of 2^-24 */
static inline float eq_round_half(float x) {
    const float a = fabsf(x);
    if (a < 0x1p-14f) return copysignf(nearbyintf(a * 0x1p24f) * 0x1p-24f, x);
    uint32_t b;
    memcpy(&b, &x, 4);
    b = (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu;
    float r;
    memcpy(&r, &b, 4);
    return fabsf(r) > 65504.0f ? copysignf(INFINITY, x) : r;
}

/* w [K, N] (element strides sk, sn). group 0: int8, one scale per column (q int8 [K, N],
   scale [N]); else int4 in groups of `group` rows (q uint8 [K / 2, N], two rows a byte, the
   even row low; scale [K / group, N], each rounded to float16). As
   quant_formats.quantize_in_torch: a NaN in a group makes its max NaN, so its scale 1, as
   torch's amax and where do. */
void eq_quantize(const void* w, int bf16, int64_t K, int64_t N, int64_t sk, int64_t sn,
                 int64_t group, void* q, float* scale) {
    const int64_t G = group ? group : K;
    const float top = group ? 7.0f : 127.0f, lo = group ? -8.0f : -127.0f,
                hi = group ? 7.0f : 127.0f;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float v[EQ_QCHUNK];
        for (int64_t g0 = 0; g0 < K; g0 += G) {
            float amax = 0.0f;
            int nan = 0;
            for (int64_t c0 = g0; c0 < g0 + G; c0 += EQ_QCHUNK) {
                const int64_t m = g0 + G - c0 < EQ_QCHUNK ? g0 + G - c0 : EQ_QCHUNK;
                eq_values(w, bf16, c0 * sk + n * sn, sk, m, v);
                for (int64_t i = 0; i < m; i++) {
                    float a = fabsf(v[i]);
                    nan |= a != a;
                    amax = a > amax ? a : amax;
                }
            }
            float s = nan ? NAN : amax / top;
            if (group && !nan && s <= 3.0e38f) s = eq_round_half(s);
            if (!(s > 0.0f)) s = 1.0f;
            scale[group ? (g0 / G) * N + n : n] = s;
            for (int64_t c0 = g0; c0 < g0 + G; c0 += EQ_QCHUNK) {
                const int64_t m = g0 + G - c0 < EQ_QCHUNK ? g0 + G - c0 : EQ_QCHUNK;
                eq_values(w, bf16, c0 * sk + n * sn, sk, m, v);
                for (int64_t i = 0; i < m; i++) {  /* w / s rounded half to even, clamped */
                    float x = nearbyintf(v[i] / s);
                    v[i] = x < lo ? lo : (x > hi ? hi : x);
                }
                if (!group) {
                    for (int64_t i = 0; i < m; i++) ((int8_t*)q)[(c0 + i) * N + n] = (int8_t)v[i];
                } else {
                    for (int64_t i = 0; i < m; i += 2)  /* two rows a byte, the even one low */
                        ((uint8_t*)q)[((c0 + i) / 2) * N + n] = (uint8_t)(
                            (uint8_t)(v[i] + 8.0f) | ((uint8_t)(v[i + 1] + 8.0f) << 4));
                }
            }
        }
    }
}
"""


class _Source:
    """What build() reads of a program: the source, and where a compile error is (none)."""

    source = QUANTIZE_C

    @staticmethod
    def kernel_at(line: int) -> None:
        return None


@cache
def _library() -> ctypes.CDLL | None:
    if compiler() is None:
        return None
    lib = ctypes.CDLL(str(build(_Source(), CFLAGS).path))
    lib.eq_quantize.restype = None
    lib.eq_quantize.argtypes = [ctypes.c_void_p, ctypes.c_int, *[ctypes.c_int64] * 5,
                                ctypes.c_void_p, ctypes.c_void_p]
    return lib


def quantize_in_c(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(integers, scales) of the [K, N] weight `w` (float32 or bfloat16, on the CPU) as
    quant_formats.quantize gives them: int8 per column (group 0) or int4 in groups of `group`
    rows; None where no C compiler is found or `w` is of another kind."""
    if w.dtype not in (torch.float32, torch.bfloat16) or w.device.type != "cpu" or \
            w.dim() != 2 or w.is_meta:
        return None
    lib = _library()
    if lib is None:
        return None
    k, n = w.shape
    if group:
        q = torch.empty(k // 2, n, dtype=torch.uint8)
        scale = torch.empty(k // group, n, dtype=torch.float32)
    else:
        q = torch.empty(k, n, dtype=torch.int8)
        scale = torch.empty(n, dtype=torch.float32)
    w = w.detach()
    lib.eq_quantize(w.data_ptr(), int(w.dtype == torch.bfloat16), k, n, w.stride(0),
                    w.stride(1), group, q.data_ptr(), scale.data_ptr())
    return q, scale
