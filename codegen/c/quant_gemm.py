"""Weight-only quantized GEMMs: float activations times int8, int4 or half-precision weights,
dequantized (widened) on the fly, accumulated in float32.

Formats (eqsat_llm/formats/quant_formats.py, their reference; W [K, N], the weight as `x @ W`
reads it; q the stored integers):
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
  byte widened through float16 (eq_qwiden8f, eq_qwiden8eo: F16C's conversion; e5m2 is a
  float16's top byte, e4m3 leaves a 2^8 that goes with the scale).
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

"int4_dynamic" (fmt 5) reads int4_g32's panels with the activations coded per block of 32 in
8 bits (eq_qcode4): its GEMV, eq_qgemv4i, multiplies bytes (docs/quantization.md says how and
what it measured); at more rows the codes are decoded and fmt 4's path runs on them.

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
from ...formats.quant_formats import DYNAMIC4, float8_of, is_nibbles
from .packed_gemm import PACKED_GEMM
from .static_c import StaticLibrary, library_text
from .tiles import QUANT_PANEL

# eq_gemm_q's fmt argument per weight format (int4_g32/64/128: 4; quant_gemm.c says each)
FORMAT_CODES = {"int8": 8, "fp8_e4m3": 9, "fp8_e5m2": 10, DYNAMIC4: 5, "fp16": 16, "bf16": 17}


def format_code(fmt: str) -> int:
    """The fmt argument eq_gemm_q takes for a weight format (a grouped float8 format: its
    encoding's, with the group passed beside it)."""
    return FORMAT_CODES.get(float8_of(fmt) or fmt) or (4 if is_nibbles(fmt) else 8)


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
                  fmt: str) -> QuantPanels:
        """The panels of a quantized weight's scales: int4's kept as float16."""
        return cls(name, offset, rows, n, rs, halves, "float16" if is_nibbles(fmt) else None)

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


QUANT_GEMM_H, QUANT_GEMM_C = library_text("quant_gemm")
QUANT_GEMM = StaticLibrary("quant_gemm", QUANT_GEMM_C, ("eq_gemm_q",), (PACKED_GEMM,),
                           QUANT_GEMM_H)


def format_library(code: int) -> StaticLibrary:
    """QUANT_GEMM for a kernel whose weights have the format `code`: `#define EQ_QFMT_<code>`
    before it, so that a program compiles the GEMV tiles of its own formats only (0.42-0.52 s
    less gcc a program: benchmarks/compile_time.py). The tests build the library without any:
    every format."""
    return _FORMAT_LIBRARIES[code]


_FORMAT_LIBRARIES = {
    code: StaticLibrary(f"quant_gemm_fmt{code}", f"#define EQ_QFMT_{code} 1", ("eq_gemm_q",),
                        (QUANT_GEMM,))
    for code in (4, 5, 8, 9, 10, 16, 17)}
# the order a program includes them in: the formats' defines before the library
FORMAT_LIBRARIES = tuple(_FORMAT_LIBRARIES.values())
