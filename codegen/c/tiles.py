"""The blocking of the C backend's GEMM kernels, as the Python side needs it: how a prepared
weight is laid out (the kernels read it so), the local blocks the generated kernels walk, and
the row counts that choose a kernel. Each value is defined here once; the #defines of the C
sources that restate one are generated from it (w8a8_gemm.py). What only the C code decides
(register tiles, chunks of K, prefetch distances: they follow the target's vector width) is
set by the #defines at the top of each kernel's source (packed_gemm.py, quant_gemm.py,
sparse_gemm.py, w8a8_gemm.py)."""

# Prepared weights' panels: columns each, the last panel zero-padded
PACKED_PANEL = 32  # fp32 (PackedWeight): two AVX-512 vectors per k (tile rows: EQ_MR, in C)
QUANT_PANEL = 64  # quantized and half (QuantPanels): a cache line of int8 per weight row
W8A8_PANEL = 16  # int8 of eq_gemm_w8a8 (W8A8Panels): two AVX2 vectors of 8 int32 sums
W8A8_K_GROUP = 4  # weight rows interleaved per column: an int32 lane holds 4 k's bytes

# Kernel choice by rows (measured: docs/c-backend.md)
BLAS_MIN_M = 8  # BLAS from this many rows; fewer (decode) stream each weight row once
PACKED_MIN_M = 1  # a constant weight runs the packed kernel from this many rows

# Local blocks of the generated kernels (stack arrays: nothing is allocated on the heap)
NORM_ROW_BLOCK = 256  # rms_norm prologue, packed: rows whose 1/rms are computed at once
NORM_MAX_LOCAL = 1 << 16  # rms_norm prologue, row by row: at most this many floats in a row
FORMAT_ROW_BLOCK = 32  # rms_norm prologue, format weight: rows normalised per call
FORMAT_MAX_K = 16384  # ... so that the normalised block, FORMAT_ROW_BLOCK x K floats, <= 2 MiB
SWIGLU_CHUNK = 256  # SwiGLU, not packed: columns whose gate and up sums are held at once
