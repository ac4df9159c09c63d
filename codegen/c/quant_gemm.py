"""Weight-only quantized GEMMs: float activations times int8, int4 or half-precision weights,
dequantized (widened) on the fly, accumulated in float32.

Formats (eqsat_llm/quant_formats.py, their reference; W [K, N], the weight as `x @ W` reads it;
q the stored integers):
- "int8": symmetric per output column. scale[n] = max_k |W[k, n]| / 127, q = round(W / scale)
  in [-127, 127], stored int8 [K, N]; W = q[k, n] * scale[n].
- "int4_g32", "int4_g64", "int4_g128": symmetric per group of `group` consecutive rows of a
  column. scale[g, n] = max |W| over the group / 7 (a float16 value), q = round(W / scale) in
  [-8, 7], stored as
  q + 8 in a nibble: byte [k2, n] of the uint8 [K / 2, N] array holds row 2 k2 in its low nibble
  and row 2 k2 + 1 in its high one (group is even: a byte never straddles two groups);
  W = q[k, n] * scale[k / group, n].
- "fp8_e4m3", "fp8_e5m2": per output column, scale[n] = max_k |W[k, n]| / 448 (57344), q = W /
  scale as float8 e4m3 (e5m2), its bits stored uint8 [K, N]: the int8 path and layout, each
  byte widened through float16 (eq_qwiden8f: F16C's conversion; e5m2 is a float16's top byte,
  e4m3 leaves a 2^8 that goes with the scale).
An all-zero column (group) gets scale 1, so that it dequantizes to exactly 0.
- "fp16", "bf16" (half_formats.WEIGHT_FORMATS): W's values held as float16 / bfloat16 [K, N], no
  scales (what a half-precision model's weights are). They take the int8 path below with two
  bytes a value, widened by F16C's vcvtph2ps (float16) or a 16-bit shift (bfloat16).

The C backend's copy of the integers is laid out for the kernel when the program is built
(QuantPanels below, a prepared W slot as PackedWeight is for fp32 weights; the e-graph, the
rules and the folding see the formats above, unchanged): panels of 64 columns (a cache line
of int8 per weight row, of int4 per two rows), each all down K contiguous, the last one
zero-padded: int8 [ceil(N / 64)][K][64], int4 [ceil(N / 64)][K / 2][64] (the same nibbles),
the scales likewise, int8 [panels][64] float32, int4 [panels][K / group][64] float16 (llama.cpp's
Q4_0 keeps its scales so too: int4_g32 at 4.5 bits a weight, not 5). A SwiGLU weight's gate
and up halves are panelled apart (the gate's panels, then the up's), so that a panel never
straddles them.

The kernel `eq_gemm_q` (QUANT_GEMM_C) has two paths.
- M <= EQ_QGEMV_M rows (decode): a GEMV that reads each weight byte from memory once per call,
  whatever M. Threads split the panels; a thread's panels lie one after the other, so it
  reads one sequential stream, each panel whole down K. (The row-major [K, N] integers this
  replaced were walked in chunks of 16 rows across a thread's columns: 16 short strided
  streams, which the hardware prefetchers followed poorly: int8 at 12-16 GB/s from memory.)
  A panel is taken in chunks of K. Per chunk, the bytes are widened to float in registers and
  multiplied into a tile of accumulators (one row: all 64 columns, 8 vectors with AVX2,
  enough chains to hide the FMA latency; more rows: up to EQ_QR rows of 4 vectors, the
  weights widened once for them), and the tile's sums are scaled (int8 by the column's scale,
  int4 by the group's) and added to the thread's sums. One row: int8 chunks of EQ_QKB (256)
  rows, int4 a group, the tile prefetching a line per row EQ_QGPF (4 KiB) ahead, across the
  page boundaries where the hardware prefetchers stop (distances of 1-16 KiB and the locality
  hints measured alike, none a fifth slower). More rows: the row tiles and the panel's two
  32-column halves re-read the chunk from L1, so chunks are short (int8 16 rows, int4 a group)
  and the next ones are prefetched as each starts (one pass prefetching the stream while the
  others left the memory idle: 1.5x slower at 4 rows). int4 widens a byte x = 16 hi + lo
  (rows k, k + 1) once: A is rewritten per call as b = A[k] - A[k + 1] / 16, c = A[k + 1] / 16,
  so that b lo + c x = A[k] lo + A[k + 1] hi (no shift), the nibbles' -8 folded into a term
  -8 * sum(A) per group. The code is GNU C vectors whose width follows the ISA (16 floats with
  AVX-512, 8 with AVX2, 4 otherwise; the widening by the ISA's instruction, as GCC widens
  generic byte vectors lane by lane): one source, every target. The tail panel's padding is
  computed and not stored.
- More rows (prefill): per panel the weight is dequantized into a thread-local buffer of two
  K x 32 float panels laid out as PackedWeight's (read as one sequential stream; 8 float
  panels at once outgrew L2: 1.4-1.6x slower at M = 128), and `eq_panel` (packed_gemm.py) runs
  its tiles and the epilogue on each: the dequantization, a float per weight, is amortized
  over the M rows.
The threshold: with AVX-512, 8 rows (not measured: it was set on an AVX2-only machine; with
AVX-512 eq_panel runs 14-row tiles at 250-360 GFLOP/s); with AVX2, 24: measured (K = 2048,
N = 5632, a one-gemm program) the GEMV at 0.5x the panels' time at 4 rows, 0.7-0.9x at 16,
1.07-1.12x at 32, 1.35x at 64, once eq_panel had its AVX2 tiles; without either, 128 (the
portable eq_panel: the GEMV took 0.4-0.9 of the panels' time from 8 to 128 rows, 0.75-1 at
256 and 512).
The epilogue is the packed GEMM's: times alpha, a per-row scale, addends, an activation; or
swiglu, silu(G) * U with G and U the gate and up products (weight columns [0, N) and [N, 2N)),
each times alpha and the row scale.

Measured on 2 cores of an AMD EPYC (Zen 3), AVX2 without AVX-512, 32 MiB L3 (
the native build, so 8-float vectors; 2 OpenMP threads; benchmarks/quant_kernels.py
--baseline <the commit before the panels>: this kernel, the row-major one before it and
eq_gemm_packed (fp32) in one
process, rounds interleaved, median of 21 calls per round, median of 7 rounds (warm: 5), whose
spread was 1.1-1.5x; 1-minute load 1.2-1.6 with the benchmark's own 2 threads), M = 1; GB/s =
the weight's bytes (scales included) per second; cold: after reading 64 MiB (the weight comes
from memory, the lines it evicts clean), warm: back to back (the quantized weights in L3;
fp32's 46 MB are not):

    ms, GB/s      fp32 packed    int8 panels   int8 before   int4_g32      int4_g32 before
    cold
    2048 x 5632   2.33 ms 19.8   0.73 ms 15.9  1.03 ms 11.3  0.59 ms 12.3  0.76 ms  9.5
    5632 x 2048   2.52 ms 18.3   0.78 ms 14.9  1.20 ms  9.6  0.64 ms 11.3  0.89 ms  8.1
    2048 x 2560   1.14 ms 18.4   0.37 ms 14.4  0.47 ms 11.2  0.32 ms 10.3  0.38 ms  8.6
    2048 x 32000  12.1 ms 21.7   3.26 ms 20.1  3.98 ms 16.5  2.47 ms 16.6  2.62 ms 15.6
    warm
    2048 x 5632   1.65 ms 27.9   0.33 ms 34.7  0.44 ms 26.1  0.33 ms 22.0  0.39 ms 18.4
    5632 x 2048   2.03 ms 22.8   0.36 ms 32.1  0.58 ms 19.7  0.38 ms 19.1  0.45 ms 15.9
    2048 x 2560   0.44 ms 47.7   0.14 ms 37.8  0.17 ms 30.7  0.13 ms 26.1  0.15 ms 21.3
    2048 x 32000  10.7 ms 24.5   2.70 ms 24.3  4.32 ms 15.2  2.04 ms 20.1  2.67 ms 15.3

Cold, int8 takes 0.27-0.32x the fp32 kernel's time (before: 0.33-0.48x), int4_g32 0.20-0.28x
(before 0.22-0.35x); int4_g64 and g128 run 0-15% faster than g32 (fewer scales). Cold after
writing 64 MiB instead (the evicted lines dirty, their write-back a larger share of a small
weight's traffic): int8 15.0-17.7 GB/s (before 11.5-13.3), int4_g32 11.5-17.5 (before
8.1-12.6), fp32 20-21. Warm, int8 reaches 32-38 GB/s on two cores: the widening leaves room
above the memory's ~20 GB/s, int4 (two conversions per byte) 19-26: it is bound by them
about as much as by memory. A cold call has ~45 us of fixed cost (a 64 x 128 GEMM's time).
More rows, against the row-major kernel in the same run (5 rounds of 11 calls): M = 2 and 8
cold, int8 1.05 and 3.28 ms (before 0.98 and 3.14), int4_g32 0.79 and 2.96 (0.76 and 3.08);
M = 24 (K = 5632, N = 2048) int8 6.96 ms (7.65), int4_g32 8.20 (7.31); within the rounds'
spread (1.1-1.5x). One thread (7 rounds, K = 2048 or 5632): M = 2, 4, 8, 16 took 0.73-0.96x
the row-major kernel's time, M = 24 1.02x (int8) and 1.00-1.08x (int4_g32, two runs).
Prefill, M = 128 through the panels: int8 22.8 and 26.3 ms (before 25.8 and 28.7) for K x N =
2048 x 5632 and 5632 x 2048, int4_g32 24.5 and 25.3 (24.5 and 27.4), fp32 25.1 and 30.0.
Whole model (benchmarks/quantized.py --rounds 5, TinyLlama's shape with 4 layers, one token;
the commit before and after the panels, each its own process, one after the other): int8
0.37 -> 0.29 of the fp32 program's time (its weights at 13.7 -> 17.4 GB/s), int4_g32 0.26 ->
0.19 (12.0 -> 16.7 GB/s); prefill 1x128 int8 1.02 -> 0.94.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ...errors import GraphError
from .tiles import QUANT_PANEL


@dataclass(frozen=True)
class WeightView:
    """The view (offset, `rows` x `halves` * n, row stride rs, unit column stride) of the
    constant `name` that a prepared weight is made from, split into `halves` blocks of n
    columns (2: a SwiGLU weight's gate and up halves, prepared apart so that no panel
    straddles them)."""
    name: str
    offset: int
    rows: int
    n: int
    rs: int
    halves: int = 1

    panel = QUANT_PANEL  # columns per panel: a panel is one index of the prepared dim 0

    def parts(self, constants: Any) -> list[tuple[WeightView, slice]]:
        """The views another program may prepare alone that are rows (dim 0) of this one's
        prepared tensor: each half of a SwiGLU weight (prepare puts the halves' panels one
        after the other), and each part of a merged weight whose columns start and end on
        panel boundaries (the q, k and v of a merged projection: `constants.column_parts`)."""
        if self.halves > 1:
            per = self.panels() // self.halves
            return [(replace(self, offset=self.offset + h * self.n, halves=1),
                     slice(h * per, (h + 1) * per)) for h in range(self.halves)]
        cuts = constants.column_parts(self.name, self.offset, self.rows, self.n, self.rs)
        return [(replace(self, offset=self.offset + start, n=width),
                 slice(start // self.panel, (start + width) // self.panel))
                for start, width in cuts if start % self.panel == 0 and
                width % self.panel == 0 and width < self.n]

    def halves_of(self, constants: dict[str, torch.Tensor], rows: int | None = None
                  ) -> list[torch.Tensor]:
        """The [rows, n] views of the halves (rows: self.rows unless given)."""
        rows = self.rows if rows is None else rows
        t, width = constants[self.name].detach(), self.halves * self.n
        if t.dim() == 2 and self.rs == t.shape[1] and self.offset % self.rs + width <= self.rs:
            # whole rows of a matrix: a slice of it as it lies (a transposed nn.Linear weight
            # stays a view: no row-major copy of it before its panels are made)
            r0, c0 = divmod(self.offset, self.rs)
            v = t[r0:r0 + rows, c0:c0 + width]
        else:
            v = t.reshape(-1).as_strided((rows, width), (self.rs, 1), self.offset)
        return [v[:, h * self.n:(h + 1) * self.n] for h in range(self.halves)]


@dataclass(frozen=True)
class QuantPanels(WeightView):
    """A prepared constant: the stored integers or scales of a quantized weight as eq_gemm_q
    reads them. The view (WeightView: int8 q [K, N], int4 q [K / 2, N], int4 scales [K / G,
    N]; int8's scales [N] are one row; a half-precision weight [K, N]), each half cut into
    panels of QUANT_PANEL (tiles.py) columns, the last one zero-padded, laid out
    [panels][rows][QUANT_PANEL]: the halves' panels one after the other, each panel's rows
    contiguous. The values are the constant's, unchanged; `stored` "float16" keeps float32
    ones (int4's scales, float16 values by their definition) in half the bytes."""
    stored: str | None = None

    @classmethod
    def of_scales(cls, name: str, offset: int, rows: int, n: int, rs: int, halves: int,
                  group: int) -> QuantPanels:
        """The panels of a quantized weight's scales: int4's (group > 0) kept as float16."""
        return cls(name, offset, rows, n, rs, halves, "float16" if group else None)

    @property
    def c_dtype(self) -> str:
        """How the C side sees the panels of float scales (float16 as its bits)."""
        return "int16" if self.stored == "float16" else "float32"

    def panels(self) -> int:
        return self.halves * -(-self.n // QUANT_PANEL)

    def prepare(self, constants: dict[str, torch.Tensor]) -> torch.Tensor:
        halves = self.halves_of(constants)
        per = self.panels() // self.halves
        if self.stored == "float16":
            halves = [_exactly_half(h, self.name) for h in halves]
        # written in place, panel by panel: no padded or concatenated copy of the weight
        out = torch.zeros(self.panels(), self.rows, QUANT_PANEL, dtype=halves[0].dtype)
        for h, half in enumerate(halves):
            full = half.shape[1] // QUANT_PANEL  # whole panels in one strided copy
            out[h * per:h * per + full] = half[:, :full * QUANT_PANEL].reshape(
                self.rows, full, QUANT_PANEL).permute(1, 0, 2)
            if full < per:
                out[h * per + full, :, :half.shape[1] - full * QUANT_PANEL] = \
                    half[:, full * QUANT_PANEL:]
        # half-precision values travel as their bits (the C side has no half type)
        return out.view(torch.int16) if out.dtype in (torch.float16, torch.bfloat16) else out


def _exactly_half(values: torch.Tensor, name: str) -> torch.Tensor:
    """`values` as float16, refusing any it would round (scales not made by quant_formats)."""
    half = values.to(torch.float16)
    if not torch.equal(half.to(values.dtype), values):
        raise GraphError(f"the int4 scales {name!r} are not float16 values, as the format "
                         "defines them (quant_formats.quantize makes them so)")
    return half


QUANT_GEMM_C = r"""
/* ---- weight-only quantized GEMM (codegen/c/quant_gemm.py) ---- */
#ifndef EQ_QV  /* floats per vector (tests set it to run another target's tiling) */
#if defined(__AVX512F__)
#define EQ_QV 16
#elif defined(__AVX2__)
#define EQ_QV 8
#else
#define EQ_QV 4
#endif
#endif
/* rows per register tile: EQ_QR x 4 accumulator vectors, leaving registers for the weights */
#if EQ_QV == 16
#define EQ_QR 4
#else
#define EQ_QR 2
#endif
#ifndef EQ_QGEMV_M  /* the GEMV path up to this many rows (tests set it) */
#if defined(__AVX512F__)
#define EQ_QGEMV_M 8
#elif defined(__AVX2__) && defined(__FMA__)
#define EQ_QGEMV_M 24  /* measured: the crossover with eq_panel's AVX2 tiles is 16-32 rows */
#else
#define EQ_QGEMV_M 128
#endif
#endif
#ifndef EQ_QKB
#define EQ_QKB 256     /* int8 GEMV, one row: weight rows per chunk (16 KiB of a panel) */
#endif
#ifndef EQ_QKBM
#define EQ_QKBM 16     /* int8 GEMV, more rows: weight rows per chunk (1 KiB, in L1) */
#endif
#ifndef EQ_QGPF
#define EQ_QGPF 4096   /* GEMV: bytes ahead in the thread's stream that it prefetches (0: none;
                          the hardware prefetchers stop at each 4 KiB page) */
#endif
#ifndef EQ_QPFL
#define EQ_QPFL 3      /* its locality hint (3: into L1) */
#endif
typedef float eq_qf __attribute__((vector_size(EQ_QV * 4)));
typedef int32_t eq_qi __attribute__((vector_size(EQ_QV * 4)));
#if defined(__SSE4_1__)
#include <immintrin.h>
#endif
/* EQ_QV bytes widened to int32, sign-extended (int8) or not (nibble pairs). GCC widens a
   generic byte vector lane by lane through scalar registers: one instruction here instead. */
static inline __attribute__((always_inline)) eq_qi eq_qwiden(const uint8_t* p, const int sign) {
#if EQ_QV == 16 && defined(__AVX512F__)
    const __m128i b = _mm_loadu_si128((const __m128i*)p);
    return (eq_qi)(sign ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
#elif EQ_QV == 8 && defined(__AVX2__)
    const __m128i b = _mm_loadl_epi64((const __m128i*)p);
    return (eq_qi)(sign ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#elif EQ_QV == 4 && defined(__SSE4_1__)
    int32_t v;
    memcpy(&v, p, 4);
    const __m128i b = _mm_cvtsi32_si128(v);
    return (eq_qi)(sign ? _mm_cvtepi8_epi32(b) : _mm_cvtepu8_epi32(b));
#else
    eq_qi q;
    for (int i = 0; i < EQ_QV; i++) q[i] = sign ? (int32_t)(int8_t)p[i] : (int32_t)p[i];
    return q;
#endif
}

/* a float16 (fmt 16) or bfloat16 (17) value's float (the portable path; bfloat16 is the upper
   half of a float32) */
static inline float eq_h2f(const uint16_t h, const int fmt) {
    uint32_t bits = (uint32_t)h << 16;
    if (fmt == 16) {
        const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023;
        if (e == 31) bits = sign | 0x7f800000u | (m << 13);  /* inf, nan */
        else if (e) bits = sign | ((e + 112) << 23) | (m << 13);
        else {  /* zero, subnormal: m 2^-24 */
            const float f = (float)m * 0x1p-24f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* EQ_QV half-precision values widened to float: F16C's conversion, bfloat16 by a shift */
static inline __attribute__((always_inline)) eq_qf eq_qwidenh(const uint16_t* p, const int fmt) {
#if EQ_QV == 16 && defined(__AVX512F__)
    const __m256i h = _mm256_loadu_si256((const __m256i*)p);
    return fmt == 16 ? (eq_qf)_mm512_cvtph_ps(h)
                     : (eq_qf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif EQ_QV == 8 && defined(__AVX2__) && defined(__F16C__)
    const __m128i h = _mm_loadu_si128((const __m128i*)p);
    return fmt == 16 ? (eq_qf)_mm256_cvtph_ps(h)
                     : (eq_qf)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    eq_qf f;
    for (int i = 0; i < EQ_QV; i++) f[i] = eq_h2f(p[i], fmt);
    return f;
#endif
}

/* EQ_QV float8 bytes widened to float through float16's bits, F16C's conversion. e5m2 (fmt
   10) is a float16's top byte: shifted by 8. e4m3 (fmt 9): the byte's sign, exponent and
   mantissa moved into a float16's (e4m3's bias 7 is float16's 15 less 8; its subnormals are
   float16 subnormals, read exactly): 2^-8 of its value, the 2^8 going with the column's
   scale. (A NaN byte would not read as NaN: float8 weights are finite, quant_formats.py.) */
static inline __attribute__((always_inline)) eq_qf eq_qwiden8f(const uint8_t* p, const int fmt) {
#if EQ_QV == 16 && defined(__AVX512F__)
    /* sign-extended and shifted by 7: the sign lands in bits 14 and 15; 0xbf80 keeps 15 */
    const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
    const __m256i h = fmt == 10 ? _mm256_slli_epi16(b, 8)
        : _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xbf80));
    return (eq_qf)_mm512_cvtph_ps(h);
#elif EQ_QV == 8 && defined(__AVX2__) && defined(__F16C__)
    const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i*)p));
    const __m128i h = fmt == 10 ? _mm_slli_epi16(b, 8)
        : _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16((short)0xbf80));
    return (eq_qf)_mm256_cvtph_ps(h);
#else
    eq_qf f;
    for (int i = 0; i < EQ_QV; i++)
        f[i] = eq_h2f((uint16_t)(fmt == 10 ? p[i] << 8
                                 : ((p[i] & 0x80) << 8) | ((p[i] & 0x7f) << 7)), 16);
    return f;
#endif
}
/* the bytes of a panel row: int8 (8) and float8 (9, 10) weights */
#define EQ_QBYTES(fmt) ((fmt) >= 8 && (fmt) <= 10)

/* t[rows, nv * EQ_QV] (row stride ldt) += (A[rows, kc] @ W[kc, nv * EQ_QV] + o[rows]) * sg[..],
   the partial sums in registers for the chunk.
   fmt 8: w int8 rows, a the rows of A, o none. fmt 9, 10: w float8 e4m3 / e5m2 rows, else as 8.
   fmt 4: w nibble rows, a byte x = 16 hi + lo for rows k, k + 1 of A. a holds, per pair,
   b = A[k] - A[k + 1] / 16 and c = A[k + 1] / 16, so that b lo + c x = A[k] lo + A[k + 1] hi:
   two conversions and FMAs, no shift; o = -8 * (the chunk's sum of A), the nibbles' offset.
   fmt 16, 17: w float16 / bfloat16 rows (ldw in values), a the rows of A; no scale, no o.
   sg: int8's scales float, int4's float16 bits. */
static inline __attribute__((always_inline)) void eq_qtile(
        const int rows, const int nv, const int fmt, int64_t kc, const float* a, int64_t lda,
        const uint8_t* w, int64_t ldw, const void* sg, const float* o, int64_t ldo, float* t,
        int64_t ldt, const int64_t pf) {
    eq_qf x[EQ_QR][8];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++) x[r][v] = (eq_qf){0};
    if (EQ_QBYTES(fmt)) {
        for (int64_t k = 0; k < kc; k++) {
            if (pf) __builtin_prefetch(w + k * ldw + pf, 0, EQ_QPFL);
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) {
                const eq_qf f = fmt != 8 ? eq_qwiden8f(w + k * ldw + v * EQ_QV, fmt)
                    : __builtin_convertvector(eq_qwiden(w + k * ldw + v * EQ_QV, 1), eq_qf);
#pragma GCC unroll 4
                for (int r = 0; r < rows; r++) x[r][v] += a[r * lda + k] * f;
            }
        }
    } else if (fmt >= 16) {
        const uint16_t* wh = (const uint16_t*)w;
        for (int64_t k = 0; k < kc; k++) {
            if (pf) {  /* a row of a panel: two lines */
                __builtin_prefetch((const uint8_t*)(wh + k * ldw) + pf, 0, EQ_QPFL);
                __builtin_prefetch((const uint8_t*)(wh + k * ldw) + pf + 64, 0, EQ_QPFL);
            }
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) {
                const eq_qf f = eq_qwidenh(wh + k * ldw + v * EQ_QV, fmt);
#pragma GCC unroll 4
                for (int r = 0; r < rows; r++) x[r][v] += a[r * lda + k] * f;
            }
        }
    } else {
        for (int64_t k = 0; k < kc; k += 2) {
            if (pf) __builtin_prefetch(w + k / 2 * ldw + pf, 0, EQ_QPFL);
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) {
                const eq_qi q = eq_qwiden(w + k / 2 * ldw + v * EQ_QV, 0);
                const eq_qf lo = __builtin_convertvector(q & 15, eq_qf);
                const eq_qf xf = __builtin_convertvector(q, eq_qf);
#pragma GCC unroll 4
                for (int r = 0; r < rows; r++) {
                    x[r][v] += a[r * lda + k] * lo;
                    x[r][v] += a[r * lda + k + 1] * xf;
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++) {
            eq_qf y, sv;
            memcpy(&y, t + r * ldt + v * EQ_QV, sizeof y);
            if (fmt >= 16) {
                y += x[r][v];
            } else if (EQ_QBYTES(fmt)) {
                memcpy(&sv, (const float*)sg + v * EQ_QV, sizeof sv);
                y += x[r][v] * (fmt == 9 ? sv * 256.0f : sv);
            } else {
                sv = eq_qwidenh((const uint16_t*)sg + v * EQ_QV, 16);
                y += (x[r][v] + o[r * ldo]) * sv;
            }
            memcpy(t + r * ldt + v * EQ_QV, &y, sizeof y);
        }
}
/* vectors per tile row: one row takes a whole 64-column block (up to 8 accumulators, chains
   enough to hide the FMA latency), more rows 4 vectors each */
#define EQ_QNV1 (64 / EQ_QV < 8 ? 64 / EQ_QV : 8)
/* column c of a panel row w: half formats hold 2 bytes a value; no scales */
#define EQ_QCOL(w, c) ((w) + (fmt >= 16 ? 2 : 1) * (c))
#define EQ_QSCALE(sg, c) (fmt >= 16 ? (sg) : fmt == 4 ? (const void*)((const uint16_t*)(sg) + (c)) \
                                   : (const void*)((const float*)(sg) + (c)))
/* the tiles of a chunk's 64-column block: rows <= EQ_QR, the constants propagated */
static inline __attribute__((always_inline)) void eq_qblock(
        int rows, const int fmt, int64_t kc, const float* a, int64_t lda, const uint8_t* w,
        int64_t ldw, const void* sg, const float* o, int64_t ldo, float* t, int64_t ldt,
        const int64_t pf) {
    switch (rows) {
    case 1:
        for (int c = 0; c < 64; c += EQ_QNV1 * EQ_QV)
            eq_qtile(1, EQ_QNV1, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf);
        break;
#if EQ_QR == 4
    case 2:
        for (int c = 0; c < 64; c += 4 * EQ_QV)
            eq_qtile(2, 4, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf);
        break;
    case 3:
        for (int c = 0; c < 64; c += 4 * EQ_QV)
            eq_qtile(3, 4, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf);
        break;
#endif
    default:
        for (int c = 0; c < 64; c += 4 * EQ_QV)
            eq_qtile(EQ_QR, 4, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf);
        break;
    }
}
/* int4: A [M, K] rewritten as eq_qtile reads it, into ap [M, K] (pairs b, c) and o [M, K / kc]
   (the offsets per chunk of kc rows: a group) */
static void eq_qprep4(int64_t M, int64_t K, const float* a, int64_t lda, int64_t kc, float* ap,
                      float* o) {
    for (int64_t m = 0; m < M; m++) {
        const float* ar = a + m * lda;
        float* pr = ap + m * K;
        for (int64_t k = 0; k < K; k += 2) {
            pr[k + 1] = ar[k + 1] * 0.0625f;
            pr[k] = ar[k] - pr[k + 1];
        }
        for (int64_t j = 0; j < K / kc; j++) {
            float sum = 0.0f;
            for (int64_t k = j * kc; k < (j + 1) * kc; k++) sum += ar[k];
            o[m * (K / kc) + j] = -8.0f * sum;
        }
    }
}
/* t[M, 64 * (p1 - p0)] (row stride ldt) = A[M, K] @ the dequantized panels [p0, p1) (wq, s:
   QuantPanels' layout: panel p is K byte rows of 64 bytes, int4 K / 2, at wq + p * K * 64
   (int4 half that), its scales 64 floats at s + 64 p, int4 K / group rows of 64 float16s);
   for int4, a and lda are eq_qprep4's ap and K, o its offsets per group. The thread's panels
   lie one after the other: one sequential stream, each panel taken whole down K in chunks (int8
   EQ_QKB rows, int4 a group: its scale) that stay in L1 while the row tiles re-read them. */
static __attribute__((noinline)) void eq_qgemv(
        int64_t M, int64_t K, const float* a, int64_t lda, const float* o, int fmt,
        int64_t group, const uint8_t* wq, const void* s, int64_t p0, int64_t p1, float* t,
        int64_t ldt) {
    /* one row whose tile spans the panel (one pass over a chunk): long chunks, the tile
       prefetching a line per row; else short chunks that the passes re-read from L1, the
       next ones prefetched as each starts (a pass prefetching ahead would leave the memory
       idle while the others run: measured, 4 rows 1.5x slower) */
    const int onepass = M == 1 && EQ_QNV1 * EQ_QV == 64;
    const int64_t kc = fmt == 4 ? group : onepass ? EQ_QKB : EQ_QKBM, nch = (K + kc - 1) / kc;
    /* bytes per weight row of a panel; scale rows per panel */
    const int64_t rb = EQ_QBYTES(fmt) ? 64 : fmt == 4 ? 32 : 128;
    const int64_t ng = EQ_QBYTES(fmt) ? 1 : fmt == 4 ? K / group : 0;
    const int64_t pf = onepass ? EQ_QGPF : 0;
    for (int64_t m = 0; m < M; m++) memset(t + m * ldt, 0, (size_t)(p1 - p0) * 64 * sizeof(float));
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t* wp = wq + p * K * rb;
        const float* sp = EQ_QBYTES(fmt) ? (const float*)s + p * 64 : 0;
        const uint16_t* sh = fmt == 4 ? (const uint16_t*)s + p * ng * 64 : 0;
        float* tp = t + (p - p0) * 64;
        for (int64_t j = 0; j < nch; j++) {
            const int64_t k0 = j * kc, kn = K - k0 < kc ? K - k0 : kc;
            const uint8_t* w = wp + k0 * rb;
            /* (past the panel: the next one's start, contiguous) */
            if (!onepass && EQ_QGPF)
                for (int64_t b = 0; b < kn * rb; b += 64)
                    __builtin_prefetch(w + EQ_QGPF + b);
            for (int64_t m = 0; m < M; m += EQ_QR) {
                const int rows = M - m < EQ_QR ? (int)(M - m) : EQ_QR;
                const float* ar = a + m * lda + k0;
                float* tm = tp + m * ldt;
                if (fmt == 8)
                    eq_qblock(rows, 8, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf);
                else if (fmt == 9)
                    eq_qblock(rows, 9, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf);
                else if (fmt == 10)
                    eq_qblock(rows, 10, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf);
                else if (fmt == 16)
                    eq_qblock(rows, 16, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf);
                else if (fmt == 17)
                    eq_qblock(rows, 17, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf);
                else
                    eq_qblock(rows, 4, kn, ar, lda, w, 64, sh + j * 64, o + m * nch + j, nch,
                              tm, ldt, pf);
            }
        }
    }
}

/* the calling thread's buffers (GEMV sums, int4's A, dequantized panels), grown by eq_grow */
static __thread float* eq_qacc = 0;
static __thread int64_t eq_qacc_n = 0;
static __thread float* eq_qa = 0;
static __thread int64_t eq_qa_n = 0;
static __thread float* eq_qpan = 0;
static __thread int64_t eq_qpan_n = 0;
/* bp[2][K][32]: quantized panel p (64 columns, QuantPanels' layout) dequantized into two
   float panels as PackedWeight lays them out, read as one sequential stream */
static void eq_qdequant(int64_t K, int fmt, int64_t group, const uint8_t* wq, const void* s,
                        int64_t p, float* bp) {
    float* b0 = bp;
    float* b1 = bp + K * 32;
    if (fmt >= 16) {
        const uint16_t* w = (const uint16_t*)wq + p * K * 64;
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < 32; j += EQ_QV) {
                const eq_qf f0 = eq_qwidenh(w + k * 64 + j, fmt);
                const eq_qf f1 = eq_qwidenh(w + k * 64 + 32 + j, fmt);
                memcpy(b0 + k * 32 + j, &f0, sizeof f0);
                memcpy(b1 + k * 32 + j, &f1, sizeof f1);
            }
        return;
    }
    if (fmt == 9 || fmt == 10) {
        const uint8_t* w = wq + p * K * 64;
        eq_qf sv[64 / EQ_QV];  /* the columns' scales (e4m3's times 2^8) */
        for (int j = 0; j < 64; j += EQ_QV) {
            memcpy(&sv[j / EQ_QV], (const float*)s + p * 64 + j, sizeof sv[0]);
            if (fmt == 9) sv[j / EQ_QV] *= 256.0f;
        }
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < 64; j += EQ_QV) {
                const eq_qf f = eq_qwiden8f(w + k * 64 + j, fmt) * sv[j / EQ_QV];
                memcpy((j < 32 ? b0 + k * 32 + j : b1 + k * 32 + j - 32), &f, sizeof f);
            }
        return;
    }
    if (fmt == 8) {
        const uint8_t* w = wq + p * K * 64;
        const float* sp = (const float*)s + p * 64;
        for (int64_t k = 0; k < K; k++) {
            const uint8_t* wk = w + k * 64;
#pragma omp simd
            for (int j = 0; j < 32; j++) {
                b0[k * 32 + j] = (float)(int8_t)wk[j] * sp[j];
                b1[k * 32 + j] = (float)(int8_t)wk[32 + j] * sp[32 + j];
            }
        }
        return;
    }
    const uint8_t* w = wq + p * (K / 2) * 64;
    const uint16_t* sp = (const uint16_t*)s + p * (K / group) * 64;
    float sk[64];  /* the group's scales, widened as each group starts */
    for (int64_t k = 0; k < K; k += 2) {
        const uint8_t* wk = w + k / 2 * 64;
        if (k % group == 0)
            for (int j = 0; j < 64; j += EQ_QV) {
                const eq_qf f = eq_qwidenh(sp + k / group * 64 + j, 16);
                memcpy(sk + j, &f, sizeof f);
            }
        float* r0 = b0 + k * 32;
        float* r1 = b1 + k * 32;
#pragma omp simd
        for (int j = 0; j < 32; j++) {
            r0[j] = (float)((wk[j] & 15) - 8) * sk[j];
            r0[32 + j] = (float)((wk[j] >> 4) - 8) * sk[j];
            r1[j] = (float)((wk[32 + j] & 15) - 8) * sk[32 + j];
            r1[32 + j] = (float)((wk[32 + j] >> 4) - 8) * sk[32 + j];
        }
    }
}
/* the columns [64 p, 64 p + 64) (those below N) of C through dequantized panels
   (eq_expanded_panels); swiglu: the up half's panel pu dequantized too */
static void eq_qpanels(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, int fmt,
                       int64_t group, const uint8_t* wq, const void* s, int64_t p, int64_t pu,
                       float* c, int64_t ldc, float alpha, const float* rowscale,
                       const eq_addend* e, int ne, int act, int swiglu) {
    const int64_t n0 = 64 * p;
    const int ncols = (int)(N - n0 < 64 ? N - n0 : 64);
    float* bp = eq_grow(&eq_qpan, &eq_qpan_n, (swiglu ? 2 : 1) * 2 * K * 32);
    if (!bp) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
    float* bu = bp + 2 * K * 32;
    eq_qdequant(K, fmt, group, wq, s, p, bp);
    if (swiglu) eq_qdequant(K, fmt, group, wq, s, pu, bu);
    eq_expanded_panels(M, K, a, lda, bp, bu, n0, ncols, c, ldc, alpha, rowscale, e, ne, act,
                       swiglu);
}
/* C[M, N] (row stride ldc) = act(alpha * rowscale[m] * (A @ W) + sum_i e_i.scale * e_i), or
   when swiglu: C[M, N] = silu(G) * U with G = alpha*rowscale*(A @ W[:, 0:N]),
   U = alpha*rowscale*(A @ W[:, N:2N]) (addends and act not used then).
   A: float [M, K], row stride lda, unit column stride. rowscale may be NULL; e may be NULL
   (ne = 0).
   W as QuantPanels (codegen/c/quant_gemm.py) prepares it: P = ceil(N / 64) panels of 64
   columns (with swiglu 2 P: the gate's, then the up half's), the last of each half zero-padded.
   fmt 8: wq int8 [P][K][64], s float [P][64] (per column); fmt 9, 10: wq float8 e4m3 / e5m2
   bytes, else as 8.
   fmt 4: wq uint8 [P][K / 2][64] (two rows per byte), s float16 bits [P][K / group][64].
   fmt 16, 17: wq float16 / bfloat16 [P][K][64], s unused (NULL). */
static __attribute__((noinline)) void eq_gemm_q(
        int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, int fmt, int64_t group,
        const void* wq, const void* s, float* c, int64_t ldc, float alpha,
        const float* rowscale, const eq_addend* e, int ne, int act, int swiglu, int parallel) {
    if (M <= 0 || N <= 0) return;
    const uint8_t* w = (const uint8_t*)wq;
    const int gemv = M <= EQ_QGEMV_M;
    const int64_t np = (N + 63) / 64;
    if (!gemv) a = eq_unaliased(a, &lda, M, K);
    /* int4's GEMV reads A as eq_qprep4 writes it, shared by the threads */
    const float *ga = a, *go = 0;
    int64_t glda = lda;
    if (gemv && fmt == 4) {
        float* ap = eq_grow(&eq_qa, &eq_qa_n, M * K + M * (K / group));
        if (!ap) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
        eq_qprep4(M, K, a, lda, group, ap, ap + M * K);
        ga = ap; go = ap + M * K; glda = K;
    }
#pragma omp parallel if(parallel)
    {
        int nt = 1, t = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads(); t = omp_get_thread_num();
#endif
        const int64_t p0 = np * t / nt, p1 = np * (t + 1) / nt;
        const int64_t n0 = 64 * p0, nc = (64 * p1 < N ? 64 * p1 : N) - n0, ldt = 64 * (p1 - p0);
        if (gemv && p1 > p0) {
            float* tg = eq_grow(&eq_qacc, &eq_qacc_n, (swiglu ? 2 : 1) * M * ldt);
            if (!tg) EQ_INDEX_ERROR();  /* out of memory */
            else {
                float* tu = tg + M * ldt;
                eq_qgemv(M, K, ga, glda, go, fmt, group, w, s, p0, p1, tg, ldt);
                if (swiglu)
                    eq_qgemv(M, K, ga, glda, go, fmt, group, w, s, np + p0, np + p1, tu, ldt);
                eq_gemv_store(M, tg, tu, ldt, c, ldc, n0, nc, alpha, rowscale, e, ne, act,
                              swiglu);
            }
        }
        if (!gemv)
            for (int64_t p = p0; p < p1; p++)
                eq_qpanels(M, N, K, a, lda, fmt, group, w, s, p, np + p, c, ldc, alpha,
                           rowscale, e, ne, act, swiglu);
    }
}
"""
