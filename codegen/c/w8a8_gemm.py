"""A GEMM in integers for prefill: float activations quantized to 7-bit codes per row and
call ("dynamic", as ONNX Runtime's quantize_dynamic does per tensor), times the int8 weight
(format "int8", eqsat_llm/formats/quant_formats.py: q [K, N] in [-127, 127], W = q[k, n] scale[n]),
int32 sums, scaled by the row's scale times the column's.

Activations. Row m of A is coded q = clamp(rint(a / s) + z, 0, 127) with
s = (max(a, 0) - min(a, 0)) / 127 and the zero point z = rint(-min(a, 0) / s), so that
a ~ s (q - z) within s / 2 (the range holds 0, whose code z is exact). Then
C[m, n] = s[m] scale[n] (sum_k q[m, k] q_w[k, n] - z[m] colsum[n]), colsum[n] = sum_k q_w[k, n]
prepared with the weight: the correction is one integer product per output.
Why 7 bits: AVX2 without VNNI multiplies bytes with vpmaddubsw (u8 x s8, adjacent pairs
summed into int16 with SATURATION). Codes <= 127 bound a pair sum by 2 * 127 * 128 = 32512 <
32767, for any int8 weight (-128 included): nothing saturates, and every path (AVX2,
VNNI's vpdpbusd, the portable C) computes the same integers. The other way, the sign trick
(symmetric codes in [-127, 127], |a| as the unsigned operand, a's sign moved onto the weight
with vpsignb), has half the error for a row symmetric about 0 (step max|a| / 127 instead of
(max - min) / 127) but costs a vpsignb per vpmaddubsw, on the same two pipes as the
multiplies on Zen 3: measured 0.70-0.74x this kernel's speed (one thread, M = 128, the four
TinyLlama shapes); and a -128 weight breaks it. The error of a product: |C - A @ W| <=
s[m] / 2 * sum_k |W[k, n]| per element; for randn rows of 2048 (range ~ +-3.5), 1.5-2% of
max |C| (the sign trick's 0.8-1.2%; weight-only eq_gemm_q's ~2e-6). ORT's dynamic
quantization codes the whole tensor in 8 bits (u8 with a zero point, step range / 255 over
all rows; its AVX2 path's vpmaddubsw may saturate, which ORT's reduce_range option avoids
with 7-bit weights).

Layout (W8A8Panels): panels of 16 columns, each K in groups of 4 rows: int8
[P][ceil(K / 4)][16][4], byte [p][g][j][i] = q_w[4 g + i, 16 p + j]: a k group of a panel is
one 64-byte line, two vectors of 8 columns x 4 k; the K tail and the last panel's columns
zero-padded. A SwiGLU weight's gate and up halves are panelled apart (the gate's panels,
then the up's), so that a panel never straddles them. colsum int32 [P][16], scales float
[P][16].

Kernel (eq_gemm_w8a8, W8A8_GEMM_C), per call: A's rows are quantized into a buffer of the
calling thread (eq_grow), rows split between the threads, codes row stride a multiple of 64
bytes plus 64; then the threads split the panels, and per panel all M rows in register tiles
of EQ_W8MR = 5 rows x 16 columns (10 ymm int32 accumulators for the whole of K): per k group
two weight vectors, per row the 4 codes broadcast, vpmaddubsw + vpmaddwd (ones) + vpaddd per
vector (32 multiply-adds; vpdpbusd with VNNI, compile-only here). While a panel runs, the
thread's next panel is prefetched into L2, a share per tile (+0-6%). K up to EQ_W8KMAX =
65536 is summed in int32 (no overflow: 65536 * 127 * 128 < 2^31), longer K in such chunks
added in int64. Each tile is scaled into a float [M][16] buffer per thread (swiglu: gate and
up), then eq_gemv_store (packed_gemm.py) writes C's 16 columns: alpha, the row scale,
addends, activation, or swiglu's silu(G) * U. Tiles of 4 and 6 rows ran as fast as 5; 7 and
8 spill. The tiles are compiled apart (noipa): inlined, or specialised by GCC 12's
interprocedural constant propagation, the same loop kept accumulators on the stack.

Measured on 2 cores of an AMD EPYC (Zen 3), AVX2 without AVX-512 or VNNI (GCC
12, the backend's CFLAGS; benchmarks/w8a8_kernels.py --passive: rounds interleaved, 5 x 5
calls, medians; idle OpenMP threads sleeping and ORT not spinning, since other processes
shared the cores (load 1.1-1.8): a spinning worker that lost its core held each parallel
region 4-8 ms). GOP/s = 2 M K N / wall time, two threads; ORT: quantize_dynamic's model
(com.microsoft DynamicQuantizeMatMul), intra_op 2; 11264s: SwiGLU gate|up (ours with the
join, ORT the plain product):

    M    system            2048x2560  2048x11264s  5632x2048  2048x32000
    128  eq_gemm_w8a8         255        245          233        279
         eq_gemm_q (int8)     114         99           88        119
         fp32 packed           97         91           87        103
         ORT int8             224        244          204        244
    32   eq_gemm_w8a8         204        218          225        228
         ORT int8             194        224          203        216
    512  eq_gemm_w8a8         274        246          259        266
         ORT int8             234        253          220        290

Against ORT 0.91-1.18x (M = 128: 1.01-1.15x; by CPU time 1.03-1.20x), against eq_gemm_q
2.2-2.6x. What bounds it: vpmaddubsw and vpmaddwd both issue to Zen 3's two vector integer
multiply pipes, so 32 multiply-adds per cycle per core (measured: independent chains of the
three instructions at 1.03 cycles each, 1.41 with a vpsignb): 176-186 GOP/s on one core,
348-357 on two. The tile alone, operands in L1: 170-182 on one core; the whole kernel, one
thread, M = 128: 152-164 (82-88%; ORT 146-167): the weight panel re-read from L2 per row
tile and the per-tile scaling; quantizing A takes 0.2-3% of the time. ORT's MLAS kernel uses
the same instruction pair: per core parity is this ISA's ceiling. SwiGLU: eq_gemv_store's
silu(G) * U loop is scalar with GCC 12 under the default -ftrapping-math (eq_expf's
comparisons are not if-converted); with -fno-trapping-math this kernel's swiglu went from
149 to 169 GOP/s on one thread and 1.01x to 1.14x ORT on two."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .packed_gemm import PACKED_GEMM
from .quant_gemm import WeightView
from .static_c import StaticLibrary, kernel_source, library_text
from .tiles import W8A8_K_GROUP, W8A8_PANEL


@dataclass(frozen=True)
class W8A8Panels(WeightView):
    """A prepared constant of eq_gemm_w8a8 (one of its three weight operands, by `part`).

    The view (WeightView) has each half cut into panels of W8A8_PANEL = 16 columns
    (tiles.py), the last one zero-padded; P = halves * ceil(n / 16) panels.
    - part "q": `name` is the int8 q [K, N] (rows = K): int8 [P][ceil(K / 4)][16][4], panel
      p's 16 columns with their K rows in groups of 4 (k = 4 g + i at [p][g][j][i]), the K
      tail zero-padded.
    - part "colsum": the same view of q; int32 [P][16], the column sums of q (the kernel's
      zero-point correction).
    - part "scale": `name` is the scales [N] (rows = 1, rs unused): float32 [P][16].
    The values are the constant's, unchanged."""
    part: str = "q"
    panel = W8A8_PANEL  # columns per panel (WeightView.parts)

    def panels(self) -> int:
        return self.halves * -(-self.n // W8A8_PANEL)

    def shape(self) -> tuple[int, ...]:
        """The prepared tensor's shape."""
        if self.part == "q":
            return (self.panels(), -(-self.rows // W8A8_K_GROUP), W8A8_PANEL, W8A8_K_GROUP)
        return (self.panels(), W8A8_PANEL)

    def dtype(self) -> str:
        return {"q": "int8", "colsum": "int32", "scale": "float32"}[self.part]

    def prepare(self, constants: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.part not in ("q", "colsum", "scale"):
            raise ValueError(f"W8A8Panels: unknown part {self.part!r}")
        rows = 1 if self.part == "scale" else self.rows
        halves = self.halves_of(constants, rows)
        if self.part == "q" and halves[0].dtype != torch.int8:
            raise ValueError(f"W8A8Panels: {self.name} is {halves[0].dtype}, not int8")
        parts = []
        for part in halves:
            if self.part == "colsum":
                part = part.to(torch.int32).sum(0, dtype=torch.int32)[None]
            elif self.part == "scale":
                part = part.to(torch.float32)
            part = torch.nn.functional.pad(part, (0, -self.n % W8A8_PANEL))
            panels = part.shape[1] // W8A8_PANEL
            if self.part == "q":  # [K, n] -> [panels][K / 4][16][4], the K tail zero-padded
                part = torch.nn.functional.pad(part, (0, 0, 0, -rows % W8A8_K_GROUP))
                part = part.reshape(part.shape[0] // W8A8_K_GROUP, W8A8_K_GROUP, panels,
                                    W8A8_PANEL).permute(2, 0, 3, 1)
                parts.append(part)
            else:
                parts.append(part.reshape(panels, W8A8_PANEL))
        return torch.cat(parts, 0).contiguous()


W8A8_GEMM_C = kernel_source("w8a8_gemm.c")
# the panel's numbers as tiles.py defines them (the C code restates them)
W8A8_GEMM_C = W8A8_GEMM_C.replace("{NP}", str(W8A8_PANEL)).replace("{KG}", str(W8A8_K_GROUP))
W8A8_GEMM_H, W8A8_GEMM_C = library_text("w8a8_gemm", W8A8_GEMM_C)
W8A8_GEMM = StaticLibrary("w8a8_gemm", W8A8_GEMM_C, ("eq_gemm_w8a8",), (PACKED_GEMM,),
                          W8A8_GEMM_H)
