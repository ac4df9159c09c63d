
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
   (eq_expanded_panels); a: A in tile order (eq_tiled) */
static void eq_s24panels(int64_t M, int64_t N, int64_t K, const float* a,
                         const float* values, const uint8_t* index, int64_t ldw, int64_t n0,
                         int ncols, float* c, int64_t ldc, float alpha, const float* rowscale,
                         const eq_addend* e, int ne, int act, int swiglu) {
    const int np = (ncols + 31) / 32;
    float* bp = eq_grow(&eq_span, &eq_span_n, (swiglu ? 2 : 1) * np * K * 32);
    if (!bp) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
    float* bu = bp + np * K * 32;
    eq_s24expand(K, values, index, ldw, n0, ncols, bp);
    if (swiglu) eq_s24expand(K, values, index, ldw, N + n0, ncols, bu);
    eq_expanded_panels(M, K, a, bp, bu, n0, ncols, c, ldc, alpha, rowscale, e, ne, act,
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
EQ_ENTRY __attribute__((noinline)) void eq_gemm_sparse(
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
            EQ_THREAD_IDS;
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
#pragma omp parallel if(parallel)
    {
        EQ_THREAD_IDS;
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
            /* the panels read A in tile order, each thread its own copy (NULL: flagged) */
            const float* at = p1 > p0 ? eq_tiled(M, K, a, lda) : 0;
            for (int64_t p = p0; at && p < p1; p += EQ_SSP) {
                const int64_t pe = p + EQ_SSP < p1 ? p + EQ_SSP : p1;
                const int ncols = (int)((pe * 32 < N ? pe * 32 : N) - p * 32);
                eq_s24panels(M, N, K, at, values, ix, ldw, p * 32, ncols, c, ldc, alpha,
                             rowscale, e, ne, act, swiglu);
            }
        }
    }
}
