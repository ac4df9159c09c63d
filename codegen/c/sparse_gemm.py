"""Sparse-weight GEMMs: float activations times a pruned float32 weight stored as 2:4
("sparse24") or as 16 x 16 blocks ("bsr16"), the zeros skipped, accumulated in float32.

Formats (eqsat_llm/sparse_formats.py, their reference; W [K, N], the weight as `x @ W` reads
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
  (packed_gemm.py) runs its tiles and the epilogue, as eq_qpanels does for quantized weights:
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

SPARSE_GEMM_C = r"""
/* ---- sparse-weight GEMM: 2:4 and 16 x 16 blocks (codegen/c/sparse_gemm.py) ---- */
#ifndef EQ_SV  /* floats per vector (tests set it to run another target's tiling) */
#if defined(__AVX512F__)
#define EQ_SV 16
#elif defined(__AVX2__)
#define EQ_SV 8
#else
#define EQ_SV 4
#endif
#endif
/* sparse24 GEMV: rows per register tile (EQ_SR x 4 accumulator vectors) */
#ifndef EQ_SR
#if EQ_SV == 16
#define EQ_SR 4
#else
#define EQ_SR 2
#endif
#endif
#ifndef EQ_SGEMV_M  /* sparse24: the GEMV path up to this many rows (tests set it) */
#if defined(__AVX512F__)
#define EQ_SGEMV_M 16  /* not measured (no AVX-512 here): eq_panel's 14 x 32 tiles are faster */
#elif defined(__AVX2__) && defined(__FMA__)
#define EQ_SGEMV_M 32  /* measured: the GEMV 0.9x the panels' time at 32 rows, 1.4x at 64 */
#else
#define EQ_SGEMV_M 64
#endif
#endif
#ifndef EQ_SKG
#define EQ_SKG 2       /* sparse24 GEMV: groups (4 rows of K) per chunk: 3 streams each */
#endif
#ifndef EQ_SGPF
#define EQ_SGPF 0      /* sparse24 GEMV: 64-column blocks ahead that a chunk is prefetched
                          (0: none) */
#endif
#ifndef EQ_SNEXT
#define EQ_SNEXT 0     /* sparse24 GEMV: lines of each of the next chunk's rows prefetched */
#endif
#define EQ_SSP 2       /* sparse24 panels expanded together (64 columns) */
/* bsr16: rows per register tile and the accumulator vectors it may hold (tests set them) */
#ifndef EQ_BR
#if EQ_SV == 16
#define EQ_BR 14
#elif EQ_SV == 8
#define EQ_BR 6
#else
#define EQ_BR 3
#endif
#endif
#ifndef EQ_BACC
#if EQ_SV == 16
#define EQ_BACC 28
#else
#define EQ_BACC 12
#endif
#endif
#define EQ_BNV (16 / EQ_SV)  /* vectors per block row */
typedef float eq_sf __attribute__((vector_size(EQ_SV * 4)));
typedef int32_t eq_si __attribute__((vector_size(EQ_SV * 4)));
#if defined(__SSE4_1__) || defined(__AVX__)
#include <immintrin.h>
#endif
/* EQ_SV index bytes widened to int32 (one instruction where the ISA has it) */
static inline __attribute__((always_inline)) eq_si eq_swiden(const uint8_t* p) {
#if EQ_SV == 16 && defined(__AVX512F__)
    return (eq_si)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
#elif EQ_SV == 8 && defined(__AVX2__)
    return (eq_si)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
#elif EQ_SV == 4 && defined(__SSE4_1__)
    int32_t v;
    memcpy(&v, p, 4);
    return (eq_si)_mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
#else
    eq_si q;
    for (int i = 0; i < EQ_SV; i++) q[i] = p[i];
    return q;
#endif
}
/* the 4 floats at p repeated across the vector (x of one 2:4 group, for eq_ssel) */
static inline __attribute__((always_inline)) eq_sf eq_sx4(const float* p) {
#if EQ_SV == 16 && defined(__AVX512F__)
    return (eq_sf)_mm512_broadcast_f32x4(_mm_loadu_ps(p));
#elif EQ_SV == 8 && defined(__AVX__)
    return (eq_sf)_mm256_broadcast_ps((const __m128*)p);
#else
    eq_sf x;
    for (int i = 0; i < EQ_SV; i++) x[i] = p[i & 3];
    return x;
#endif
}
/* lane l: x4[q[l] & 3], x4 as eq_sx4 makes it (an in-lane variable permute: the
   instruction reads the low 2 bits, so that the byte's other position may stay above them) */
static inline __attribute__((always_inline)) eq_sf eq_ssel(eq_sf x4, eq_si q) {
#if EQ_SV == 16 && defined(__AVX512F__)
    return (eq_sf)_mm512_permutevar_ps((__m512)x4, (__m512i)q);
#elif EQ_SV == 8 && defined(__AVX__)
    return (eq_sf)_mm256_permutevar_ps((__m256)x4, (__m256i)q);
#elif EQ_SV == 4 && defined(__AVX__)
    return (eq_sf)_mm_permutevar_ps((__m128)x4, (__m128i)q);
#elif defined(__GNUC__) && !defined(__clang__)
    return __builtin_shuffle(x4, q & 3);  /* x4's lanes 0..3 */
#else
    /* portable: the four candidates masked by the index, OR-ed (exact) */
    const eq_si k = q & 3, xi = (eq_si)x4;
    eq_si r = (k == 0) & xi[0];
    r |= (k == 1) & xi[1];
    r |= (k == 2) & xi[2];
    r |= (k == 3) & xi[3];
    return (eq_sf)r;
#endif
}
static inline __attribute__((always_inline)) eq_sf eq_sload(const float* p) {
    eq_sf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) void eq_sstore(float* p, eq_sf v) {
    memcpy(p, &v, sizeof v);
}

/* ---- sparse24 ---- */
/* t[rows, nv * EQ_SV] (row stride ldt) += A[rows, 4 gc] @ W[4 gc, nv * EQ_SV], W as values
   v [2 gc, *] and index ix [gc, *] (row stride ldw), the sums in registers for the chunk. Per
   group: x's 4 floats repeated in a vector, and per column vector the index bytes widened
   once for all the rows, each row selecting its two x's by a permute, two FMAs. */
static inline __attribute__((always_inline)) void eq_s24tile(
        const int rows, const int nv, int64_t gc, const float* a, int64_t lda, const float* v,
        const uint8_t* ix, int64_t ldw, float* t, int64_t ldt) {
    eq_sf x[EQ_SR][8];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++) x[r][u] = (eq_sf){0};
    for (int64_t g = 0; g < gc; g++) {
        eq_sf xa[EQ_SR];
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) xa[r] = eq_sx4(a + r * lda + 4 * g);
        const float* v0 = v + 2 * g * ldw;
        const float* v1 = v0 + ldw;
        const uint8_t* ig = ix + g * ldw;
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++) {
            const eq_si q0 = eq_swiden(ig + u * EQ_SV), q1 = q0 >> 2;
            const eq_sf w0 = eq_sload(v0 + u * EQ_SV), w1 = eq_sload(v1 + u * EQ_SV);
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++) {
                x[r][u] += eq_ssel(xa[r], q0) * w0;
                x[r][u] += eq_ssel(xa[r], q1) * w1;
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++)
            eq_sstore(t + r * ldt + u * EQ_SV, eq_sload(t + r * ldt + u * EQ_SV) + x[r][u]);
}
/* vectors per tile row: one row takes a whole 64-column block (up to 8 accumulators), more
   rows 4 vectors each */
#define EQ_SNV1 (64 / EQ_SV < 8 ? 64 / EQ_SV : 8)
static inline __attribute__((always_inline)) void eq_s24block(
        int rows, int64_t gc, const float* a, int64_t lda, const float* v, const uint8_t* ix,
        int64_t ldw, float* t, int64_t ldt) {
    switch (rows) {
    case 1:
        for (int c = 0; c < 64; c += EQ_SNV1 * EQ_SV)
            eq_s24tile(1, EQ_SNV1, gc, a, lda, v + c, ix + c, ldw, t + c, ldt);
        break;
#if EQ_SR == 4
    case 2:
        for (int c = 0; c < 64; c += 4 * EQ_SV)
            eq_s24tile(2, 4, gc, a, lda, v + c, ix + c, ldw, t + c, ldt);
        break;
    case 3:
        for (int c = 0; c < 64; c += 4 * EQ_SV)
            eq_s24tile(3, 4, gc, a, lda, v + c, ix + c, ldw, t + c, ldt);
        break;
#endif
    default:
        for (int c = 0; c < 64; c += 4 * EQ_SV)
            eq_s24tile(EQ_SR, 4, gc, a, lda, v + c, ix + c, ldw, t + c, ldt);
        break;
    }
}
/* a partial block: ncols < 64 columns, whole vectors one row at a time, then the columns
   past them scalar */
static void eq_s24part(int64_t M, int64_t gc, const float* a, int64_t lda, const float* v,
                       const uint8_t* ix, int64_t ldw, int ncols, float* t, int64_t ldt) {
    const int nv = ncols / EQ_SV;
    for (int64_t m = 0; m < M; m++) {
        for (int u = 0; u < nv; u++)
            eq_s24tile(1, 1, gc, a + m * lda, lda, v + u * EQ_SV, ix + u * EQ_SV, ldw,
                       t + m * ldt + u * EQ_SV, ldt);
        for (int j = nv * EQ_SV; j < ncols; j++) {
            float s = 0.0f;
            for (int64_t g = 0; g < gc; g++) {
                const uint8_t q = ix[g * ldw + j];
                const float* x = a + m * lda + 4 * g;
                s += x[q & 3] * v[2 * g * ldw + j] + x[(q >> 2) & 3] * v[(2 * g + 1) * ldw + j];
            }
            t[m * ldt + j] += s;
        }
    }
}
/* t[M, n1 - n0] (row stride ldt) = A[M, K] @ W[:, n0:n1]. A chunk of EQ_SKG groups at a time
   across all the columns (3 EQ_SKG sequential streams: values rows 2g, 2g + 1 and index row
   g), prefetched EQ_SGPF blocks ahead; whole 64-column blocks, then a partial one. */
static __attribute__((noinline)) void eq_s24gemv(
        int64_t M, int64_t K, const float* a, int64_t lda, const float* values,
        const uint8_t* index, int64_t ldw, int64_t n0, int64_t n1, float* t, int64_t ldt) {
    for (int64_t m = 0; m < M; m++) memset(t + m * ldt, 0, (size_t)(n1 - n0) * sizeof(float));
    const int64_t G = K / 4, nfull = n0 + (n1 - n0) / 64 * 64;
    for (int64_t g0 = 0; g0 < G; g0 += EQ_SKG) {
        const int64_t gc = G - g0 < EQ_SKG ? G - g0 : EQ_SKG;
        const float* v = values + 2 * g0 * ldw;
        const uint8_t* ix = index + g0 * ldw;
        if (EQ_SNEXT && g0 + EQ_SKG < G) {
            /* the next chunk's rows, their first EQ_SNEXT lines: the hardware prefetcher
               starts each row's run over */
            const int64_t pc = G - g0 - EQ_SKG < EQ_SKG ? G - g0 - EQ_SKG : EQ_SKG;
            const float* pv = values + 2 * (g0 + EQ_SKG) * ldw + n0;
            const uint8_t* pi = index + (g0 + EQ_SKG) * ldw + n0;
            const int64_t lv = (n1 - n0 + 15) / 16 < EQ_SNEXT ? (n1 - n0 + 15) / 16 : EQ_SNEXT;
            for (int64_t r = 0; r < 2 * pc; r++)
                for (int64_t l = 0; l < lv; l++) __builtin_prefetch(pv + r * ldw + 16 * l);
            for (int64_t r = 0; r < pc; r++)
                for (int64_t l = 0; l < (lv + 3) / 4; l++)
                    __builtin_prefetch(pi + r * ldw + 64 * l);
        }
        for (int64_t nb = n0; nb < nfull; nb += 64) {
            /* the chunk's rows EQ_SGPF blocks ahead; past the last block, the next chunk's */
            const int64_t pn = nb + EQ_SGPF * 64;
            const int64_t pg = pn < nfull ? g0 : g0 + EQ_SKG;
            if (EQ_SGPF && pg < G) {
                const int64_t pc = (G - pg < EQ_SKG ? G - pg : EQ_SKG);
                const int64_t col = pn < nfull ? pn : n0 + (pn - nfull) % (nfull - n0);
                const float* pv = values + 2 * pg * ldw + col;
                const uint8_t* pi = index + pg * ldw + col;
                for (int64_t r = 0; r < 2 * pc; r++)
                    for (int l = 0; l < 64; l += 16) __builtin_prefetch(pv + r * ldw + l);
                for (int64_t r = 0; r < pc; r++) __builtin_prefetch(pi + r * ldw);
            }
            for (int64_t m = 0; m < M; m += EQ_SR) {
                const int rows = M - m < EQ_SR ? (int)(M - m) : EQ_SR;
                eq_s24block(rows, gc, a + m * lda + 4 * g0, lda, v + nb, ix + nb, ldw,
                            t + m * ldt + (nb - n0), ldt);
            }
        }
        if (nfull < n1)
            eq_s24part(M, gc, a + 4 * g0, lda, v + nfull, ix + nfull, ldw, (int)(n1 - nfull),
                       t + (nfull - n0), ldt);
    }
}
/* the calling thread's buffers (GEMV sums, expanded panels), grown by eq_grow */
static __thread float* eq_sacc = 0;
static __thread int64_t eq_sacc_n = 0;
static __thread float* eq_span = 0;
static __thread int64_t eq_span_n = 0;
/* bp[q][K][32], q < ceil(ncols / 32): the panels of W[:, n0:n0 + ncols] expanded to dense
   (ncols <= 32 * EQ_SSP), zero past ncols; group by group across all the panels */
static void eq_s24expand(int64_t K, const float* values, const uint8_t* index, int64_t ldw,
                         int64_t n0, int ncols, float* bp) {
    const int np = (ncols + 31) / 32;
    for (int64_t g = 0; g < K / 4; g++) {
        const float* v0 = values + 2 * g * ldw + n0;
        const float* v1 = v0 + ldw;
        const uint8_t* ix = index + g * ldw + n0;
        for (int j = 0; j < ncols; j += 16) {
            __builtin_prefetch(v0 + 8 * ldw + j);
            __builtin_prefetch(v1 + 8 * ldw + j);
        }
        for (int q = 0; q < np; q++) {
            float* b = bp + (q * K + 4 * g) * 32;
            const int c0 = 32 * q, nq = ncols - c0 < 32 ? ncols - c0 : 32;
            if (nq == 32) {
                /* each of the 4 rows selected lane by lane: vectorises (a scatter does not) */
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) {
#pragma omp simd
                    for (int j = 0; j < 32; j++) {
                        const int i = ix[c0 + j];
                        b[r * 32 + j] = ((i & 3) == r ? v0[c0 + j] : 0.0f) +
                                        ((i >> 2 & 3) == r ? v1[c0 + j] : 0.0f);
                    }
                }
            } else {
                memset(b, 0, 4 * 32 * sizeof(float));
                for (int j = 0; j < nq; j++) {
                    const int i = ix[c0 + j];
                    b[(i & 3) * 32 + j] = v0[c0 + j];
                    b[((i >> 2) & 3) * 32 + j] = v1[c0 + j];
                }
            }
        }
    }
}
/* columns [n0, n0 + ncols) (ncols <= 32 * EQ_SSP) of C through expanded panels
   (eq_expanded_panels) */
static void eq_s24panels(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                         const float* values, const uint8_t* index, int64_t ldw, int64_t n0,
                         int ncols, float* c, int64_t ldc, float alpha, const float* rowscale,
                         const eq_addend* e, int ne, int act, int swiglu) {
    const int np = (ncols + 31) / 32;
    float* bp = eq_grow(&eq_span, &eq_span_n, (swiglu ? 2 : 1) * np * K * 32);
    if (!bp) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
    float* bu = bp + np * K * 32;
    eq_s24expand(K, values, index, ldw, n0, ncols, bp);
    if (swiglu) eq_s24expand(K, values, index, ldw, N + n0, ncols, bu);
    eq_expanded_panels(M, K, a, lda, bp, bu, n0, ncols, c, ldc, alpha, rowscale, e, ne, act,
                       swiglu);
}

/* ---- bsr16 ---- */
/* t[rows, 16] (row stride ldt) = alpha * A[rows, :] @ (block column: blocks b0 .. b1 - 1 of
   values, block rows brow[b]). Per stored block, 16 k-steps: the block row's EQ_BNV vectors
   times A's element broadcast, per row. Few rows split the k-steps over S accumulator sets
   (S R EQ_BNV <= EQ_BACC), chains enough to hide the FMA latency. */
static inline __attribute__((always_inline)) void eq_btile(
        const int rows, const float* a, int64_t lda, const float* values,
        const int32_t* brow, int64_t b0, int64_t b1, float* t, int64_t ldt, float alpha) {
    enum { EQ_BS0 = EQ_BACC / EQ_BNV };
    const int S = rows * 8 <= EQ_BS0 ? 8 : rows * 4 <= EQ_BS0 ? 4 : rows * 2 <= EQ_BS0 ? 2 : 1;
    eq_sf x[8][EQ_BR][EQ_BNV];
#pragma GCC unroll 8
    for (int s = 0; s < S; s++)
#pragma GCC unroll 14
        for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
            for (int u = 0; u < EQ_BNV; u++) x[s][r][u] = (eq_sf){0};
    for (int64_t b = b0; b < b1; b++) {
        const float* blk = values + b * 256;
        const float* ab = a + 16 * (int64_t)brow[b];
#pragma GCC unroll 16
        for (int kk = 0; kk < 16; kk += S)
#pragma GCC unroll 8
            for (int s = 0; s < S; s++) {
                eq_sf w[EQ_BNV];
#pragma GCC unroll 4
                for (int u = 0; u < EQ_BNV; u++) w[u] = eq_sload(blk + (kk + s) * 16 + u * EQ_SV);
#pragma GCC unroll 14
                for (int r = 0; r < rows; r++) {
                    const float av = ab[r * lda + kk + s];
#pragma GCC unroll 4
                    for (int u = 0; u < EQ_BNV; u++) x[s][r][u] += av * w[u];
                }
            }
    }
#pragma GCC unroll 14
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int u = 0; u < EQ_BNV; u++) {
            eq_sf y = x[0][r][u];
#pragma GCC unroll 8
            for (int s = 1; s < S; s++) y += x[s][r][u];
            eq_sstore(t + r * ldt + u * EQ_SV, y * alpha);
        }
}
/* eq_btile for rows <= EQ_BR, the row count a constant in each instance */
static __attribute__((noinline)) void eq_btiles(
        int rows, const float* a, int64_t lda, const float* values, const int32_t* brow,
        int64_t b0, int64_t b1, float* t, int64_t ldt, float alpha) {
#define EQ_BT(R) case R: eq_btile(R, a, lda, values, brow, b0, b1, t, ldt, alpha); break;
#if EQ_BR < 1 || EQ_BR > 14
#error "EQ_BR: 1 to 14 rows"
#endif
    switch (rows) {
    EQ_BT(1)
#if EQ_BR >= 2
    EQ_BT(2)
#endif
#if EQ_BR >= 3
    EQ_BT(3)
#endif
#if EQ_BR >= 4
    EQ_BT(4)
#endif
#if EQ_BR >= 5
    EQ_BT(5)
#endif
#if EQ_BR >= 6
    EQ_BT(6)
#endif
#if EQ_BR >= 7
    EQ_BT(7)
#endif
#if EQ_BR >= 8
    EQ_BT(8)
#endif
#if EQ_BR >= 9
    EQ_BT(9)
#endif
#if EQ_BR >= 10
    EQ_BT(10)
#endif
#if EQ_BR >= 11
    EQ_BT(11)
#endif
#if EQ_BR >= 12
    EQ_BT(12)
#endif
#if EQ_BR >= 13
    EQ_BT(13)
#endif
#if EQ_BR >= 14
    EQ_BT(14)
#endif
    default: break;
    }
#undef EQ_BT
}
/* block columns [j0, j1) of C: per column, row tiles of EQ_BR, each over the column's stored
   blocks only (an empty column: zeros), then the epilogue on the tile in L1; swiglu: the gate
   (column j) and up (column j + N / 16) tiles joined */
static void eq_bcols(int64_t M, int64_t N, const float* a, int64_t lda, const float* values,
                     const int32_t* ptr, const int32_t* brow, int64_t j0, int64_t j1, float* c,
                     int64_t ldc, float alpha, const float* rowscale, const eq_addend* e,
                     int ne, int act, int swiglu) {
    const int epi = rowscale || ne || act;
    float tg[EQ_BR * 16] __attribute__((aligned(64)));
    float tu[EQ_BR * 16] __attribute__((aligned(64)));
    for (int64_t j = j0; j < j1; j++) {
        for (int64_t m = 0; m < M; m += EQ_BR) {
            const int rows = M - m < EQ_BR ? (int)(M - m) : EQ_BR;
            const float* am = a + m * lda;
            float* cm = c + m * ldc + 16 * j;
            if (!swiglu) {
                eq_btiles(rows, am, lda, values, brow, ptr[j], ptr[j + 1], cm, ldc, alpha);
                if (epi) eq_tile_epilogue(rows, cm, ldc, m, 16 * j, 16, rowscale, e, ne, act);
                continue;
            }
            const int64_t ju = j + N / 16;
            eq_btiles(rows, am, lda, values, brow, ptr[j], ptr[j + 1], tg, 16, alpha);
            eq_btiles(rows, am, lda, values, brow, ptr[ju], ptr[ju + 1], tu, 16, alpha);
            for (int r = 0; r < rows; r++) {
                const float f = rowscale ? rowscale[m + r] : 1.0f;
                float* cr = cm + r * ldc;
#pragma omp simd
                for (int i = 0; i < 16; i++) {
                    const float g = f * tg[r * 16 + i];
                    cr[i] = g * eq_sigmoidf(g) * (f * tu[r * 16 + i]);
                }
            }
        }
    }
}
/* the first block column of thread t's share: the columns split by cost, a stored block 4
   and an output column 1 (all of a column's blocks go to one thread) */
static int64_t eq_bsplit(const int32_t* ptr, int64_t nb, int t, int nt, int swiglu) {
    if (t <= 0) return 0;
    if (t >= nt) return nb;
    const int64_t nbu = swiglu ? nb : 0;  /* swiglu: column j also reads column j + nb */
#define EQ_BCOST(j) \
    (4 * ((int64_t)ptr[j] + (swiglu ? (int64_t)ptr[(j) + nbu] - ptr[nbu] : 0)) + (j))
    const int64_t total = EQ_BCOST(nb), goal = total * t / nt;
    int64_t lo = 0, hi = nb;  /* the first j with cost(j) >= goal */
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (EQ_BCOST(mid) < goal) lo = mid + 1; else hi = mid;
    }
#undef EQ_BCOST
    return lo;
}

/* C[M, N] (row stride ldc) = act(alpha * rowscale[m] * (A @ W) + sum_i e_i.scale * e_i), or
   when swiglu: C = silu(G) * U with G = alpha * rowscale * (A @ W[:, 0:N]), U likewise of
   W[:, N:2N] (addends and act not used then). A: float [M, K], row stride lda, unit column
   stride. rowscale may be NULL; e may be NULL (ne = 0). W [K, N or 2N] sparse:
   fmt 24 (sparse24): values float [K/2, *] and index uint8 [K/4, *], both with row stride
   ldw (elements, >= N, >= 2N for swiglu); any N, K % 4 == 0.
   fmt 16 (bsr16): values float [B, 16, 16], index int32 [NB + 1 + B] with NB = N/16 block
   columns (2 N/16 for swiglu: the up half's block column j + N/16): column pointers, then each
   block's block row; ldw unused; N % 16 == 0, K % 16 == 0.
   Threads split the output columns (parallel != 0). */
static __attribute__((noinline)) void eq_gemm_sparse(
        int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, int fmt,
        const float* values, const void* index, int64_t ldw, float* c, int64_t ldc,
        float alpha, const float* rowscale, const eq_addend* e, int ne, int act, int swiglu,
        int parallel) {
    if (M <= 0 || N <= 0) return;
    if (fmt == 16) {
        const int64_t nb = N / 16;
        const int32_t* ptr = (const int32_t*)index;
        const int32_t* brow = ptr + (swiglu ? 2 : 1) * nb + 1;
        a = eq_unaliased(a, &lda, M, K);
#pragma omp parallel if(parallel)
        {
            int nt = 1, t = 0;
#ifdef _OPENMP
            nt = omp_get_num_threads(); t = omp_get_thread_num();
#endif
            const int64_t j0 = eq_bsplit(ptr, nb, t, nt, swiglu);
            const int64_t j1 = eq_bsplit(ptr, nb, t + 1, nt, swiglu);
            eq_bcols(M, N, a, lda, values, ptr, brow, j0, j1, c, ldc, alpha, rowscale, e, ne,
                     act, swiglu);
        }
        return;
    }
    const uint8_t* ix = (const uint8_t*)index;
    const int gemv = M <= EQ_SGEMV_M;
    /* GEMV: blocks of 64 columns, the last thread also the tail; else panels of 32 */
    const int64_t nblk = N / 64, np = (N + 31) / 32;
    if (!gemv) a = eq_unaliased(a, &lda, M, K);
#pragma omp parallel if(parallel)
    {
        int nt = 1, t = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads(); t = omp_get_thread_num();
#endif
        if (gemv) {
            const int64_t n0 = nblk * t / nt * 64;
            const int64_t n1 = t == nt - 1 ? N : nblk * (t + 1) / nt * 64, nc = n1 - n0;
            float* tg = nc ? eq_grow(&eq_sacc, &eq_sacc_n, (swiglu ? 2 : 1) * M * nc) : 0;
            if (nc && !tg) EQ_INDEX_ERROR();  /* out of memory */
            else if (nc) {
                float* tu = tg + M * nc;
                eq_s24gemv(M, K, a, lda, values, ix, ldw, n0, n1, tg, nc);
                if (swiglu) eq_s24gemv(M, K, a, lda, values, ix, ldw, N + n0, N + n1, tu, nc);
                eq_gemv_store(M, tg, tu, nc, c, ldc, n0, nc, alpha, rowscale, e, ne, act, swiglu);
            }
        } else {
            const int64_t p0 = np * t / nt, p1 = np * (t + 1) / nt;
            for (int64_t p = p0; p < p1; p += EQ_SSP) {
                const int64_t pe = p + EQ_SSP < p1 ? p + EQ_SSP : p1;
                const int ncols = (int)((pe * 32 < N ? pe * 32 : N) - p * 32);
                eq_s24panels(M, N, K, a, lda, values, ix, ldw, p * 32, ncols, c, ldc, alpha,
                             rowscale, e, ne, act, swiglu);
            }
        }
    }
}
"""
