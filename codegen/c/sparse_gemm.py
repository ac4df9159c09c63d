"""Sparse-weight GEMMs: float activations times a pruned float32 weight stored as 2:4
("sparse24") or as 16 x 16 blocks ("bsr16"), the zeros skipped, accumulated in float32.

Formats (eqsat_llm/formats/sparse_formats.py, their reference; W [K, N], the weight as `x @ W` reads
it):
- "sparse24": 2:4 along K. values float32 [K/2, N]: rows 2g, 2g + 1 hold W[4g + i0, n] and
  W[4g + i1, n] for the group's kept positions i0 < i1; index uint8 [K/4, N], byte i0 | i1 << 2.
  Stored bytes: K N (2 + 1/4) = 0.5625 of fp32's 4 K N.
- "bsr16": the non-zero 16 x 16 blocks, block column by block column. values float32 [B, 16,
  16] (block b = W[16i : 16i + 16, 16j : 16j + 16], row-major), index int32 [N/16 + 1 + B]:
  the column pointers (column j's blocks are b in [index[j], index[j + 1])), then each block's
  block row i.

The kernel `eq_gemm_sparse` (SPARSE_GEMM_C; its contract is eq_gemm_q's, quant_gemm.py, the
weight in one of these formats: see the comment above it) has three paths.
- sparse24, M <= EQ_SGEMV_M rows (decode): a GEMV that reads the weight once per call,
  whatever M. Threads split the columns in blocks of 64 (the last thread also takes the tail,
  N mod 64: whole vectors, then scalar columns). A thread walks K in chunks of EQ_SKG = 2
  groups across all its columns (6 sequential streams: values rows 2g, 2g + 1 and index row g;
  4 groups, 12 streams, ran as fast, 8 groups 1.5-2x slower: rows 2^k floats apart share an
  L1 set and 16 of them overflow its 8 ways). Per group and vector of columns, the inner loop
  (AVX2: 8 columns) loads the group's 4 x's repeated in both 128-bit halves
  (vbroadcastf128, once per group and row), widens 8 index bytes (vpmovzxbd), and per row
  selects x[i0] and x[i1] with two in-lane variable permutes (vpermilps reads the low 2 bits of
  each lane, so that i1 is just the byte shifted right by 2: no masks) and issues two FMAs with
  the two value rows: 6 instructions per 4 x 8 weights for one row, the index work shared by
  the rows of a tile. Tiles: one row, 64 columns in 8 accumulators; more rows, EQ_SR (2; 4 with
  16-float vectors) rows of 4 vectors. The chunk's sums go to a per-thread buffer; then
  alpha, the row scale, the epilogue (eq_tile_epilogue) or swiglu's join, as eq_gemm_q's GEMV.
  Software prefetch of the rows ahead (EQ_SGPF blocks ahead, as eq_qgemv does; or the next
  chunk's rows, EQ_SNEXT lines) measured slower or no better here: both are off (knobs kept).
- sparse24, more rows (prefill): per EQ_SSP (2) panels of 32 columns the weight is expanded
  to dense K x 32 panels in a thread-local buffer (PackedWeight's layout; each of a group's 4
  rows selected lane by lane, which vectorises where a scatter does not) and `eq_panel`
  (packed_gemm.py) runs its tiles and the epilogue, as eq_qpanel_rows does for quantized weights:
  the dense FLOPs plus the expansion, so about dense's time (the cost model keeps dense there).
  Threshold: with AVX2 32 rows (measured, K = 2048, N = 5632: the GEMV took 0.2x the panels'
  time at 8 rows, 0.9x at 32, 1.4x at 64, 1.25x at 128); with AVX-512 16 (not measured: its
  eq_panel's 14 x 32 tiles are faster); otherwise 64.
- bsr16, every M: threads split the block columns by cost (4 per stored block, 1 per column,
  so that the columns' uneven block counts balance). Per block column, row tiles of EQ_BR rows
  x 16 columns in registers (AVX2: 6 rows x 2 ymm = 12 accumulators, as eq_tile_half; AVX-512:
  14 rows x 1 zmm; 4-float vectors: 3 rows x 4) accumulate over the column's stored blocks only:
  per block, 16 k-steps of a broadcast A[m][16i + kk] times the block row's vectors. A column's
  blocks are contiguous in memory (one sequential stream per thread). Few rows split the 16
  k-steps over S accumulator sets (S R 16/V <= EQ_BACC: 1 row 4 sets with AVX2, 8 with
  AVX-512), enough chains to hide the FMA latency. The tile is stored times alpha and the
  epilogue runs on it in L1, as eq_panel does; an empty block column gives zeros (then the
  epilogue). swiglu: the gate (column j) and up (column j + N/16) tiles land in L1 buffers and
  are joined. A is copied with its rows apart (eq_unaliased) when they alias in L1, as the
  packed GEMM does.
The code is GNU C vectors whose width follows the ISA (EQ_SV: 16 floats with AVX-512, 8 with
AVX2, 4 otherwise), with intrinsics for the index widening (vpmovzxbd), the 4-float repeat and
the permute (vpermilps) where the ISA has them, and portable fallbacks (__builtin_shuffle with
GCC, OR-ed masks elsewhere): one source, every target (tests: native, no AVX2, SSE only,
16-float tiling through generic vectors, every row count through sparse24's panels).

Measured on 2 cores of an AMD EPYC (Zen 3), AVX2 without AVX-512, 32 MiB L3 (
the native build; 2 OpenMP threads; benchmarks/sparse_kernels.py: ctypes calls, per kernel 5
interleaved rounds of 21 calls, the median per round, the median of rounds; the table is the
median of 3 such runs, the range of the 3 in brackets. Other processes ran on the
machine at times (1-minute load 0.8-1.6): single runs differed by up to 30%, and dense fp32's
prefill here, 108-115 GFLOP/s, is benchmarks/RESULTS.md's 97-111). Dense fp32 is
eq_gemm_packed (what a constant weight runs at every M, PACKED_MIN_M = 1); sparse24 is 2:4 at
random positions, bsr16 has each block stored with probability 1/2. GB/s = the weight's
stored bytes (values + index) per second; cold: after writing 64 MiB (the harness now
reads 64 MiB instead, as benchmarks/quant_kernels.py does: written lines cost their
write-back too, which weighs more on a small weight; this table is from the writing flush),
warm: back to back (the sparse weights, 23-26 MB, then fit the L3; fp32's 46 MB never
does). At M = 128, GFLOP/s of
the dense product (2 M K N / t; the sparse kernels skip half of it):

    M = 1, ms (x dense) GB/s     K = 2048, N = 5632               K = 5632, N = 2048
                                 cold              warm            cold              warm
    dense fp32 (packed)          2.14        22    1.93       24   2.07        22    1.74       27
    sparse24                     1.25 (0.59) 21    0.71 (0.37) 36   1.46 (0.69) 18    0.79 (0.47) 33
    bsr16, 50% of blocks         1.06 (0.50) 22    0.67 (0.36) 35   1.17 (0.56) 20    0.63 (0.36) 37

    M = 128, ms (x dense) GFLOP/s  K = 2048, N = 5632             K = 5632, N = 2048
    dense fp32 (packed)            25.6             115           27.3             108
    sparse24 (expanded panels)     21.7 (1.07, 0.85-1.11) 136     28.5 (1.11, 0.89-1.21) 104
    bsr16, 50% of blocks           11.0 (0.56, 0.43-0.57) 269     14.0 (0.52, 0.50-0.59) 211

Ranges of the x-dense ratio over the 3 runs at M = 1 cold: sparse24 0.55-0.60 and 0.59-0.71,
bsr16 0.49-0.61 and 0.55-0.57. Decode reads the sparse weights at about the dense kernel's
bandwidth, so it takes about their byte ratio of its time (sparse24 0.56, bsr16 0.50);
sparse24 with N = 2048 is the weakest (each thread's runs along a weight row are 4 KiB per
chunk, a page, so the hardware prefetcher restarts on every row; a K split between the threads
would double the runs, not done: threads split the columns). At 2-8 rows (decode of a batch)
the sparse kernels read the weight once while eq_panel's small tiles are latency bound: one
run, K = 2048, N = 5632, cold, dense 3.0 / 3.9 / 4.9 ms at M = 2 / 4 / 8, sparse24 0.30x and
bsr16 0.30-0.32x of it. bsr16 prefill runs the dense kernel's tile shape over half the blocks:
0.5-0.57x its time.

Tuning knobs (#define before the source, tests set some): EQ_SV, EQ_SR, EQ_SGEMV_M, EQ_SKG,
EQ_SGPF, EQ_SNEXT, EQ_BR, EQ_BACC.
"""

from __future__ import annotations

from .packed_gemm import PACKED_GEMM
from .static_c import StaticLibrary, library_text

SPARSE_GEMM_H, SPARSE_GEMM_C = library_text("sparse_gemm")
SPARSE_GEMM = StaticLibrary("sparse_gemm", SPARSE_GEMM_C, ("eq_gemm_sparse",), (PACKED_GEMM,),
                            SPARSE_GEMM_H)
