
/* ---- GEMM against a packed constant weight (codegen/c/packed_gemm.py) ---- */
static inline float eq_act(int act, float v) {
    switch (act) {
/*EQ_ACT_CASES*/
    default: return v;
    }
}
/* the epilogue on a stored tile (rows x ncols at c, still in L1) */
static __attribute__((noinline)) void eq_tile_epilogue(
        int rows, float* c, int64_t ldc, int64_t m0, int64_t n0, int ncols,
        const float* rowscale, const eq_addend* e, int ne, int act) {
    for (int r = 0; r < rows; r++) {
        float* cr = c + r * ldc;
        const float s = rowscale ? rowscale[m0 + r] : 1.0f;
        if (rowscale) {
#pragma omp simd
            for (int j = 0; j < ncols; j++) cr[j] *= s;
        }
        for (int i = 0; i < ne; i++) {
            const float* q = e[i].p + (m0 + r) * e[i].rs + n0 * e[i].cs;
            const int64_t cs = e[i].cs;
            const float sc = e[i].scale;
#pragma omp simd
            for (int j = 0; j < ncols; j++) cr[j] += sc * q[j * cs];
        }
        /* one loop per activation, its code a constant: each loop vectorises */
#define EQ_ACT_LOOP(A) { _Pragma("omp simd") \
            for (int j = 0; j < ncols; j++) cr[j] = eq_act(A, cr[j]); }
        switch (act) {
/*EQ_ACT_LOOPS*/
        default: break;
        }
#undef EQ_ACT_LOOP
    }
}
#if defined(__AVX512F__)
#include <immintrin.h>
/* one tile: C[rows, 32] = alpha * A[rows, K] @ Bpanel[K, 32], ncols of the 32 stored; A in
   tile order (eq_tile_order: a[k rows + r]); pf (unless NULL): pfk bytes a k of what the
   caller streams next, prefetched (eq_panel) */
static inline __attribute__((always_inline)) void eq_tile(
        const int rows, int64_t K, const float* a, const float* bp, float* c, int64_t ldc,
        int ncols, float alpha, const char* pf, int64_t pfk, const int acc) {
    __m512 x0[14], x1[14];
#pragma GCC unroll 14
    for (int r = 0; r < rows; r++) { x0[r] = _mm512_setzero_ps(); x1[r] = _mm512_setzero_ps(); }
    for (int64_t k = 0; k < K; k++) {
        if (pf) __builtin_prefetch(pf + ((k * pfk) & ~(int64_t)63), 0, 2);
        const __m512 b0 = _mm512_load_ps(bp + k * 32), b1 = _mm512_load_ps(bp + k * 32 + 16);
#pragma GCC unroll 14
        for (int r = 0; r < rows; r++) {
            const __m512 av = _mm512_set1_ps(a[k * rows + r]);
            x0[r] = _mm512_fmadd_ps(av, b0, x0[r]);
            x1[r] = _mm512_fmadd_ps(av, b1, x1[r]);
        }
    }
    const __mmask16 k0 = ncols >= 16 ? 0xFFFF : (__mmask16)((1u << ncols) - 1);
    const __mmask16 k1 = ncols >= 32 ? 0xFFFF
                         : ncols > 16 ? (__mmask16)((1u << (ncols - 16)) - 1) : 0;
    const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 14
    for (int r = 0; r < rows; r++) {
        __m512 y0 = _mm512_mul_ps(x0[r], va), y1 = _mm512_mul_ps(x1[r], va);
        if (acc) {  /* a later block of K: added to the earlier blocks' sums */
            y0 = _mm512_add_ps(y0, _mm512_maskz_loadu_ps(k0, c + r * ldc));
            y1 = _mm512_add_ps(y1, _mm512_maskz_loadu_ps(k1, c + r * ldc + 16));
        }
        _mm512_mask_storeu_ps(c + r * ldc, k0, y0);
        _mm512_mask_storeu_ps(c + r * ldc + 16, k1, y1);
    }
}
/* decode: one row a times np panels b[0..np) (K x 32 each), read side by side: np streams
   in flight and 2 np independent FMA chains; the np * 32 sums stored at t. (One panel at a
   time, eq_tile's 2 chains, a 6-layer TinyLlama's one-token program took 48.0 ms against
   40.7 with four: benchmarks/cflags_ab.py --add=-DEQ_NO_ROW_PANELS) */
static inline __attribute__((always_inline)) void eq_row_panels(
        int64_t K, const float* a, const float* const* b, const int np, float* t) {
    __m512 x[8];
    for (int j = 0; j < 2 * np; j++) x[j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 av = _mm512_set1_ps(a[k]);
        for (int p = 0; p < np; p++) {
            x[2 * p] = _mm512_fmadd_ps(av, _mm512_load_ps(b[p] + k * 32), x[2 * p]);
            x[2 * p + 1] = _mm512_fmadd_ps(av, _mm512_load_ps(b[p] + k * 32 + 16), x[2 * p + 1]);
        }
    }
    for (int j = 0; j < 2 * np; j++) _mm512_store_ps(t + 16 * j, x[j]);
}
#ifndef EQ_NO_ROW_PANELS  /* (benchmarks: the same program a panel at a time) */
#define EQ_ROW_PANELS 4
#endif
#define EQ_MR 14  /* the tallest tile (28 zmm accumulators) */
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* AVX2 (16 ymm registers): a tile is rows <= 6 of one 16-column half of the panel, 12
   accumulators + 2 B vectors + 1 broadcast; the panel's two halves run one after the other
   (the A rows are re-read from L1). C[rows, 16] = alpha * A[rows, K] @ Bpanel[K, 16 of 32],
   ncols (<= 16) of the 16 stored; A in tile order (a[k rows + r]). */
static inline __attribute__((always_inline)) void eq_tile_half(
        const int rows, int64_t K, const float* a, const float* bp, float* c, int64_t ldc,
        int ncols, float alpha, const char* pf, int64_t pfk, const int acc) {
    __m256 x0[6], x1[6];
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) { x0[r] = _mm256_setzero_ps(); x1[r] = _mm256_setzero_ps(); }
    /* k unrolled by 4 (benchmarks/gemm_kernels.py shows no gain over the rolled loop's
       figures in RESULTS.md; a one-off comparison did: see docs/c-backend.md) */
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++) {
        if (pf) __builtin_prefetch(pf + ((k * pfk) & ~(int64_t)63), 0, 2);
        const __m256 b0 = _mm256_loadu_ps(bp + k * 32), b1 = _mm256_loadu_ps(bp + k * 32 + 8);
#pragma GCC unroll 6
        for (int r = 0; r < rows; r++) {
            const __m256 av = _mm256_broadcast_ss(a + k * rows + r);
            x0[r] = _mm256_fmadd_ps(av, b0, x0[r]);
            x1[r] = _mm256_fmadd_ps(av, b1, x1[r]);
        }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i k0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(ncols), lane);
    const __m256i k1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(ncols - 8), lane);
    const __m256 va = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++) {
        __m256 y0 = _mm256_mul_ps(x0[r], va), y1 = _mm256_mul_ps(x1[r], va);
        if (acc) {  /* a later block of K: added to the earlier blocks' sums */
            y0 = _mm256_add_ps(y0, _mm256_maskload_ps(c + r * ldc, k0));
            y1 = _mm256_add_ps(y1, _mm256_maskload_ps(c + r * ldc + 8, k1));
        }
        _mm256_maskstore_ps(c + r * ldc, k0, y0);
        _mm256_maskstore_ps(c + r * ldc + 8, k1, y1);
    }
}
/* one row (decode): all 32 columns at once and k unrolled by 2, 8 independent chains to hide
   the FMA latency (a 1 x 16 half has 2, and ran at half the generated GEMV's speed) */
static inline __attribute__((always_inline)) void eq_row32(
        int64_t K, const float* a, const float* bp, float* c, int ncols, float alpha,
        const int acc) {
    __m256 x[8];
    for (int j = 0; j < 8; j++) x[j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 1 < K; k += 2) {
        const __m256 a0 = _mm256_broadcast_ss(a + k), a1 = _mm256_broadcast_ss(a + k + 1);
        for (int j = 0; j < 4; j++) {
            x[j] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(bp + k * 32 + 8 * j), x[j]);
            x[4 + j] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(bp + (k + 1) * 32 + 8 * j), x[4 + j]);
        }
    }
    for (; k < K; k++) {
        const __m256 a0 = _mm256_broadcast_ss(a + k);
        for (int j = 0; j < 4; j++)
            x[j] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(bp + k * 32 + 8 * j), x[j]);
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 va = _mm256_set1_ps(alpha);
    for (int j = 0; j < 4; j++) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(ncols - 8 * j), lane);
        __m256 y = _mm256_mul_ps(_mm256_add_ps(x[j], x[4 + j]), va);
        if (acc) y = _mm256_add_ps(y, _mm256_maskload_ps(c + 8 * j, mask));
        _mm256_maskstore_ps(c + 8 * j, mask, y);
    }
}
/* decode: one row a times np panels b[0..np) read side by side (as the AVX-512 kernel's),
   4 ymm accumulators a panel; the np * 32 sums stored at t */
static inline __attribute__((always_inline)) void eq_row_panels(
        int64_t K, const float* a, const float* const* b, const int np, float* t) {
    __m256 x[16];
    for (int j = 0; j < 4 * np; j++) x[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m256 av = _mm256_broadcast_ss(a + k);
        for (int p = 0; p < np; p++)
            for (int j = 0; j < 4; j++)
                x[4 * p + j] = _mm256_fmadd_ps(av, _mm256_loadu_ps(b[p] + k * 32 + 8 * j),
                                               x[4 * p + j]);
    }
    for (int j = 0; j < 4 * np; j++) _mm256_storeu_ps(t + 8 * j, x[j]);
}
#ifndef EQ_NO_ROW_PANELS
#define EQ_ROW_PANELS 2
#endif
static inline __attribute__((always_inline)) void eq_tile(
        const int rows, int64_t K, const float* a, const float* bp, float* c, int64_t ldc,
        int ncols, float alpha, const char* pf, int64_t pfk, const int acc) {
    if (rows == 1) {  /* (decode: its GEMV streams the panel itself) */
        eq_row32(K, a, bp, c, ncols, alpha, acc);
        return;
    }
    eq_tile_half(rows, K, a, bp, c, ldc, ncols < 16 ? ncols : 16, alpha, pf, pfk, acc);
    if (ncols > 16)
        eq_tile_half(rows, K, a, bp + 16, c + 16, ldc, ncols - 16, alpha, 0, 0, acc);
}
#define EQ_MR 6  /* the tallest tile (12 ymm accumulators) */
#else
#define EQ_MR 1  /* (portable: one row at a time) */
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/* the rows of a tile that starts `left` rows before the end: EQ_MR, else 8 (when smaller than
   EQ_MR), 4, 2, 1 */
static inline int eq_tile_rows(int64_t left) {
    return left >= EQ_MR ? EQ_MR : (EQ_MR > 8 && left >= 8) ? 8 : left >= 4 ? 4
           : left >= 2 ? 2 : 1;
}
/* K in blocks of at most EQ_KC rows, each block's tiles adding to the sums of the block
   before. TinyLlama's down projection (K 5632: A 1.4 MB and a 0.7 MB panel, past a core's 2
   MB L2) ran at 150 GFLOP/s with AVX2 where the K-2048 GEMMs beside it ran at 180-190, and
   at 211 against ~270 with AVX-512. A panel's blocks one after the other (AVX2, first) took a
   6-layer 64-token prefill 3.3% lower; the blocks outermost in eq_gemm_packed, a block of A
   kept in L2 across the thread's panels, took the down and o projections of a 4-layer chunk
   49-51 -> 43-44 ms with AVX2 and 38.6 -> 29.9 ms with AVX-512 (profile_program, ad hoc;
   RESULTS "The packed GEMM with K in blocks", with AVX-512 and with AVX2). Blocks of 1024
   or 512 measured the same. */
#ifndef EQ_KC
#define EQ_KC 2048
#endif
/* the rows of K taken at once: blocks of at most EQ_KC, as even as they go */
static inline int64_t eq_kblock(int64_t K) {
    const int64_t blocks = (K + EQ_KC - 1) / EQ_KC;
    return (K + blocks - 1) / blocks;
}
/* eq_panel's rows [k0, k0 + kn) of K: the tiles add them to C's sums when k0 > 0, the
   epilogue follows the last block; a: A[M, K] in tile order (eq_tile_order); pf (unless
   NULL): kn * pfk bytes to prefetch, a share of them by each tile */
static __attribute__((noinline)) void eq_panel_rows(
        int64_t M, int64_t K, int64_t k0, int64_t kn, const float* a,
        const float* bpan, float* c, int64_t ldc, int64_t n0, int ncols, float alpha,
        const float* rowscale, const eq_addend* e, int ne, int act, const char* pf,
        int64_t pfk) {
    const int epi = rowscale || ne || act, acc = k0 > 0;
    int64_t tiles = 0;  /* (counted only when there is something to prefetch) */
    if (pf)
        for (int64_t m = 0; m < M; m += eq_tile_rows(M - m)) tiles++;
    const int64_t share = pf ? pfk / tiles : 0;  /* bytes a k that each tile prefetches */
    const float* bk = bpan + k0 * 32;
    const char* tpf = share ? pf : 0;  /* (tile t: kn * share bytes from t kn share on) */
    for (int64_t m = 0; m < M;) {
        const int rows = eq_tile_rows(M - m);
        const float* ar = a + m * K + k0 * rows;  /* (the tile's block of K) */
        float* cr = c + m * ldc + n0;
        switch (rows) {
        case EQ_MR:
            eq_tile(EQ_MR, kn, ar, bk, cr, ldc, ncols, alpha, tpf, share, acc); break;
#if EQ_MR > 8
        case 8: eq_tile(8, kn, ar, bk, cr, ldc, ncols, alpha, tpf, share, acc); break;
#endif
        case 4: eq_tile(4, kn, ar, bk, cr, ldc, ncols, alpha, tpf, share, acc); break;
        case 2: eq_tile(2, kn, ar, bk, cr, ldc, ncols, alpha, tpf, share, acc); break;
        default: eq_tile(1, kn, ar, bk, cr, ldc, ncols, alpha, tpf, share, acc); break;
        }
        if (epi && k0 + kn == K)
            eq_tile_epilogue(rows, cr, ldc, m, n0, ncols, rowscale, e, ne, act);
        if (tpf) tpf += kn * share;
        m += rows;
    }
}
/* C[0:M, n0:n0 + ncols] = A @ the panel, with the epilogue, in tiles of eq_tile_rows rows.
   pf (unless NULL): K * pfk bytes the caller reads next (the next panel), prefetched while
   this one runs, a share of them by each tile, evenly down K: the first tile would otherwise
   stream a panel from memory at the FMA rate (more than a core's bandwidth) while the others
   find it in L2 (measured, TinyLlama's 64 x 2048 x 5632: 225 -> 301 GFLOP/s on two cores).
   Callers pass it only when a panel takes more than one tile: a single tile (decode) streams
   its panel at the memory's rate anyway, and the hardware prefetcher keeps up.
   a: A[M, K] in tile order (eq_tile_order). */
EQ_ENTRY void eq_panel(int64_t M, int64_t K, const float* a, const float* bpan,
                     float* c, int64_t ldc, int64_t n0, int ncols, float alpha,
                     const float* rowscale, const eq_addend* e, int ne, int act,
                     const void* pf, int64_t pfk) {
    const int64_t kc = eq_kblock(K);
    for (int64_t k0 = 0; k0 < K; k0 += kc)
        eq_panel_rows(M, K, k0, K - k0 < kc ? K - k0 : kc, a, bpan, c, ldc, n0, ncols,
                      alpha, rowscale, e, ne, act, pf ? (const char*)pf + k0 * pfk : 0, pfk);
}
#else
/* portable: the same panels and epilogue, one row of 32 accumulators at a time (no prefetch;
   tiles of one row, so A's tile order is its rows side by side) */
static inline int eq_tile_rows(int64_t left) { (void)left; return 1; }
EQ_ENTRY __attribute__((noinline)) void eq_panel(int64_t M, int64_t K, const float* a,
                     const float* bpan, float* c, int64_t ldc, int64_t n0, int ncols, float alpha,
                     const float* rowscale, const eq_addend* e, int ne, int act,
                     const void* pf, int64_t pfk) {
    (void)pf, (void)pfk;
    for (int64_t m = 0; m < M; m++) {
        float acc[32] = {0};
        for (int64_t k = 0; k < K; k++) {
            const float av = a[m * K + k];
#pragma omp simd
            for (int j = 0; j < 32; j++) acc[j] += av * bpan[k * 32 + j];
        }
        float* cr = c + m * ldc + n0;
        for (int j = 0; j < ncols; j++) cr[j] = acc[j] * alpha;
        if (rowscale || ne || act) eq_tile_epilogue(1, cr, ldc, m, n0, ncols, rowscale, e, ne, act);
    }
}
static inline int64_t eq_kblock(int64_t K) { return K; }
static void eq_panel_rows(int64_t M, int64_t K, int64_t k0, int64_t kn, const float* a,
                          const float* bpan, float* c, int64_t ldc, int64_t n0,
                          int ncols, float alpha, const float* rowscale, const eq_addend* e,
                          int ne, int act, const char* pf, int64_t pfk) {
    (void)k0, (void)kn;  /* (one block: eq_kblock) */
    eq_panel(M, K, a, bpan, c, ldc, n0, ncols, alpha, rowscale, e, ne, act, pf, pfk);
}
#endif
/* A's tile order, what eq_panel reads: the tile of rows [m, m + r) (r = eq_tile_rows(M - m))
   as r-row columns, a[(m + i) lda + k] at out[m K + k r + i]. A tile's broadcasts then read
   one stream: with A's rows in place a 14-row tile kept 14 row offsets in registers beside
   its 28 accumulators, and GCC spilled three of them at every k (measured, the copy
   included: M 64 GEMMs 3-7% faster with AVX-512, 4-8% with AVX2; RESULTS "The packed GEMM
   with A in tile order"). Rows a multiple of 4 KiB apart, which evicted each other from L1
   in place, are contiguous here too. */
static inline __attribute__((always_inline)) void eq_tile_copy(
        const int rows, int64_t K, const float* a, int64_t lda, float* d) {
    for (int64_t k = 0; k < K; k++)
#pragma GCC unroll 16
        for (int i = 0; i < rows; i++) d[k * rows + i] = a[i * lda + k];
}
static void eq_tile_order(int64_t M, int64_t K, const float* a, int64_t lda, float* out) {
    for (int64_t m = 0; m < M;) {
        const int rows = eq_tile_rows(M - m);
        const float* s = a + m * lda;
        float* d = out + m * K;
        /* each size its own unrolled copy (30-60% faster than one loop, ad hoc) */
        switch (rows) {
        case EQ_MR: eq_tile_copy(EQ_MR, K, s, lda, d); break;
#if EQ_MR > 8
        case 8: eq_tile_copy(8, K, s, lda, d); break;
#endif
        case 4: eq_tile_copy(4, K, s, lda, d); break;
        case 2: eq_tile_copy(2, K, s, lda, d); break;
        default: eq_tile_copy(1, K, s, lda, d); break;
        }
        m += rows;
    }
}
static __thread float* eq_apad = 0;
static __thread int64_t eq_apad_n = 0;
/* A in tile order in a buffer of the calling thread, grown when needed and kept (so a call
   allocates nothing once the first has run). The GEMMs call it in each thread of their
   parallel region: each thread its own copy, none waiting on another's, and no copy read from
   the other core's cache (one copy made before the region took a 16 x 512 x 128 GEMM from
   0.009 to 0.024 ms, ad hoc). One row is its own tile order (A itself); NULL when out of
   memory, the error flagged. */
EQ_ENTRY const float* eq_tiled(int64_t M, int64_t K, const float* a, int64_t lda) {
    if (M == 1) return a;
    float* out = eq_grow(&eq_apad, &eq_apad_n, M * K);
    if (!out) { EQ_INDEX_ERROR(); return 0; }
    eq_tile_order(M, K, a, lda, out);
    return out;
}
/* Rows of A that lie a multiple of 4 KiB apart (hidden size 2048, 4096...) all map to one L1
   set: a tile reading many rows in place evicts its own lines at every k (the packed tiles
   read A in tile order instead; the sparse kernel's row tiles read it in place). Such an A is
   copied once per GEMM with its rows 64 bytes further apart, into the thread's buffer. */
static const float* eq_unaliased(const float* a, int64_t* lda, int64_t M, int64_t K) {
#ifdef EQ_NO_UNALIAS  /* (tests: the same program without the copy) */
    return a;
#endif
    if (M < 8 || (*lda * 4) % 4096) return a;
    const int64_t ld = *lda + 16;
    float* pad = eq_grow(&eq_apad, &eq_apad_n, M * ld);
    if (!pad) return a;
    for (int64_t m = 0; m < M; m++) memcpy(pad + m * ld, a + m * *lda, (size_t)K * 4);
    *lda = ld;
    return pad;
}
/* a buffer of the calling thread (*buf, *have floats), grown to n floats when needed and
   kept: a kernel allocates nothing once its first call has run; NULL when out of memory */
EQ_ENTRY float* eq_grow(float** buf, int64_t* have, int64_t n) {
    n = n > 16 ? n : 16;  /* never 0: NULL means out of memory */
    if (*have < n) {
        free(*buf);
        *buf = (float*)aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
        *have = *buf ? n : 0;
    }
    return *buf;
}
/* decode: one row's columns of panels [p, p1) (K x 32 each at bp) with the epilogue, up to
   EQ_ROW_PANELS panels side by side (eq_row_panels); a panel at a time elsewhere */
static void eq_row_range(int64_t N, int64_t K, const float* a, const float* bp, float* c,
                         int64_t p, int64_t p1, float alpha, const float* rowscale,
                         const eq_addend* e, int ne, int act) {
#ifdef EQ_ROW_PANELS
    float t[32 * EQ_ROW_PANELS] __attribute__((aligned(64)));
    while (p < p1) {
        const int q = p1 - p < EQ_ROW_PANELS ? (int)(p1 - p) : EQ_ROW_PANELS;
        const float* b[EQ_ROW_PANELS];
        for (int i = 0; i < q; i++) b[i] = bp + (p + i) * K * 32;
        switch (q) {  /* (each count its own unrolled loop) */
#if EQ_ROW_PANELS == 4
        case 4: eq_row_panels(K, a, b, 4, t); break;
        case 3: eq_row_panels(K, a, b, 3, t); break;
#endif
        case 2: eq_row_panels(K, a, b, 2, t); break;
        default: eq_row_panels(K, a, b, 1, t); break;
        }
        const int64_t n0 = p * 32;
        const int ncols = (int)(N - n0 < 32 * q ? N - n0 : 32 * q);
#pragma omp simd
        for (int j = 0; j < ncols; j++) c[n0 + j] = alpha * t[j];
        if (rowscale || ne || act)
            eq_tile_epilogue(1, c + n0, 0, 0, n0, ncols, rowscale, e, ne, act);
        p += q;
    }
#else
    for (; p < p1; p++) {
        const int64_t n0 = p * 32;
        eq_panel(1, K, a, bp + p * K * 32, c, 0, n0, (int)(N - n0 < 32 ? N - n0 : 32),
                 alpha, rowscale, e, ne, act, 0, 0);
    }
#endif
}
/* C[M, N] (row stride ldc) = act(alpha * rowscale[m] * (A @ B) + sum_i scale_i * e_i);
   A [M, K] with row stride lda and unit column stride; bp: B packed by PackedWeight. */
EQ_ENTRY __attribute__((noinline)) void eq_gemm_packed(int64_t M, int64_t N, int64_t K,
                           const float* a, int64_t lda, const float* bp, float* c,
                           int64_t ldc, float alpha, const float* rowscale,
                           const eq_addend* e, int ne, int act, int parallel) {
    const int64_t np = (N + 31) / 32;
#pragma omp parallel if(parallel)
    {
        EQ_THREAD_IDS;
        const int64_t p0 = np * t / nt, p1 = np * (t + 1) / nt;
        const int64_t kc = eq_kblock(K);
        const float* at = p1 > p0 ? eq_tiled(M, K, a, lda) : 0;  /* (eq_tiled: NULL flagged) */
        /* K blocks outermost: a block of A's rows stays in L2 from one panel to the next
           (each panel's block prefetching the next one's, the last panel the first's next
           block) */
        if (!at) {}
        else if (M == 1) eq_row_range(N, K, at, bp, c, p0, p1, alpha, rowscale, e, ne, act);
        else for (int64_t k0 = 0; k0 < K; k0 += kc) {
            const int64_t kn = K - k0 < kc ? K - k0 : kc;
            for (int64_t p = p0; p < p1; p++) {
                const int64_t n0 = p * 32;
                const int ncols = (int)(N - n0 < 32 ? N - n0 : 32);
                const float* next = p + 1 < p1 ? bp + (p + 1) * K * 32 + k0 * 32
                    : k0 + kn < K ? bp + p0 * K * 32 + (k0 + kn) * 32 : 0;
                eq_panel_rows(M, K, k0, kn, at, bp + p * K * 32, c, ldc, n0, ncols, alpha,
                              rowscale, e, ne, act, M > EQ_MR ? (const char*)next : 0, 128);
            }
        }
    }
}
/* rows a block of eq_panel_swiglu and of the rope's heads: whole tiles (AVX2's two of 6 rows:
   14 left a tile of 2, latency-bound, and the SwiGLU GEMM ran ~13% below the plain one's
   rate) */
#ifndef EQ_SW_ROWS  /* (-DEQ_SW_ROWS=14: AVX2's former blocks, for benchmarks/cflags_ab.py) */
#if EQ_MR == 6
#define EQ_SW_ROWS 12
#else
#define EQ_SW_ROWS 14
#endif
#endif
/* C[0:M, n0:n0 + ncols] = silu(G) * U for one pair of K x 32 panels, gate bg and up bu, G and
   U times alpha and the row scale: per block of EQ_SW_ROWS rows the two tiles land in local
   buffers (L1) and are joined as they are stored; neither product is written out. a: A in
   tile order; a block of whole tiles starts where a tile does, so a + m K is its tile order
   (the rope's blocks alike). */
_Static_assert(EQ_SW_ROWS % EQ_MR == 0, "a block of rows is whole tiles");
static void eq_panel_swiglu(int64_t M, int64_t K, const float* a, const float* bg,
                            const float* bu, float* c, int64_t ldc, int64_t n0, int ncols,
                            float alpha, const float* rowscale, const float* ng,
                            const float* nu) {
    float tg[EQ_SW_ROWS * 32] __attribute__((aligned(64)));
    float tu[EQ_SW_ROWS * 32] __attribute__((aligned(64)));
    /* the next pair of panels ng, nu (unless NULL) prefetched a share per block of rows */
    const int64_t blocks = (M + EQ_SW_ROWS - 1) / EQ_SW_ROWS, share = 128 / blocks;
    for (int64_t m = 0, i = 0; m < M; m += EQ_SW_ROWS, i++) {
        const int rows = M - m < EQ_SW_ROWS ? (int)(M - m) : EQ_SW_ROWS;
        const float* rs = rowscale ? rowscale + m : 0;
        const int64_t at = i * K * share / 4;  /* (floats) */
        eq_panel(rows, K, a + m * K, bg, tg, 32, 0, 32, alpha, rs, 0, 0, 0,
                 ng && share ? ng + at : 0, share);
        eq_panel(rows, K, a + m * K, bu, tu, 32, 0, 32, alpha, rs, 0, 0, 0,
                 nu && share ? nu + at : 0, share);
        for (int r = 0; r < rows; r++) {
            float* cr = c + (m + r) * ldc + n0;
            const float* gr = tg + r * 32;
            const float* ur = tu + r * 32;
#pragma omp simd
            for (int j = 0; j < ncols; j++) cr[j] = gr[j] * eq_sigmoidf(gr[j]) * ur[j];
        }
    }
}
/* C's columns [n0, n0 + nc) from a GEMV's sums (the quantized and sparse kernels): t and, for
   swiglu, tu hold M rows of nc sums (row stride ldt); times alpha and the row scale, then the
   epilogue (addends, activation), or swiglu's silu(G) * U */
static void eq_gemv_store(int64_t M, const float* t, const float* tu, int64_t ldt, float* c,
                          int64_t ldc, int64_t n0, int64_t nc, float alpha,
                          const float* rowscale, const eq_addend* e, int ne, int act,
                          int swiglu) {
    for (int64_t m = 0; m < M; m++) {
        const float f = rowscale ? alpha * rowscale[m] : alpha;
        float* cr = c + m * ldc + n0;
        const float* g = t + m * ldt;
        const float* u = swiglu ? tu + m * ldt : 0;
        if (swiglu) {
#pragma omp simd
            for (int64_t j = 0; j < nc; j++) {
                const float gv = f * g[j];
                cr[j] = gv * eq_sigmoidf(gv) * (f * u[j]);
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < nc; j++) cr[j] = f * g[j];
        }
    }
    if (!swiglu && (ne || act))
        eq_tile_epilogue((int)M, c + n0, ldc, 0, n0, (int)nc, 0, e, ne, act);
}
/* C's columns [n0, n0 + ncols) from ceil(ncols / 32) consecutive K x 32 panels bp prepared
   per call (dequantized or expanded: quant_gemm.py, sparse_gemm.py) through eq_panel, which
   applies the epilogue; swiglu: bu holds the up half's panels, joined by eq_panel_swiglu */
static void eq_expanded_panels(int64_t M, int64_t K, const float* a,
                               const float* bp, const float* bu, int64_t n0, int ncols,
                               float* c, int64_t ldc, float alpha, const float* rowscale,
                               const eq_addend* e, int ne, int act, int swiglu) {
    for (int q = 0; 32 * q < ncols; q++) {
        const int nq = ncols - 32 * q < 32 ? ncols - 32 * q : 32;
        if (swiglu)  /* (panels prepared per call: in cache already, nothing to prefetch) */
            eq_panel_swiglu(M, K, a, bp + q * K * 32, bu + q * K * 32, c, ldc, n0 + 32 * q,
                            nq, alpha, rowscale, 0, 0);
        else
            eq_panel(M, K, a, bp + q * K * 32, c, ldc, n0 + 32 * q, nq, alpha, rowscale,
                     e, ne, act, 0, 0);
    }
}
#ifdef EQ_ROW_PANELS
/* decode: silu(a @ Bg) * (a @ Bu) for panels [p, p1), EQ_ROW_PANELS / 2 gate panels and as
   many up panels side by side */
static void eq_row_swiglu(int64_t N, int64_t K, const float* a, const float* bg,
                          const float* bu, float* c, int64_t p, int64_t p1) {
    float t[32 * EQ_ROW_PANELS] __attribute__((aligned(64)));
    while (p < p1) {
        const int q = p1 - p < EQ_ROW_PANELS / 2 ? 1 : EQ_ROW_PANELS / 2;
        const float* b[EQ_ROW_PANELS];
        for (int i = 0; i < q; i++) {
            b[i] = bg + (p + i) * K * 32;
            b[q + i] = bu + (p + i) * K * 32;
        }
#if EQ_ROW_PANELS == 4
        if (q == 2) eq_row_panels(K, a, b, 4, t);
        else
#endif
        eq_row_panels(K, a, b, 2, t);
        const int64_t n0 = p * 32;
        const int ncols = (int)(N - n0 < 32 * q ? N - n0 : 32 * q);
#pragma omp simd
        for (int j = 0; j < ncols; j++) c[n0 + j] = t[j] * eq_sigmoidf(t[j]) * t[32 * q + j];
        p += q;
    }
}
#endif
/* C[M, N] = swiglu(A @ Bg, A @ Bu) = g * sigmoid(g) * u, Bg and Bu packed alike: per panel,
   eq_panel_swiglu (one row: eq_row_swiglu where built). */
EQ_ENTRY __attribute__((noinline)) void eq_gemm_packed_swiglu(
        int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* bg,
        const float* bu, float* c, int64_t ldc, int parallel) {
    const int64_t np = (N + 31) / 32;
#pragma omp parallel if(parallel)
    {
        EQ_THREAD_IDS;
        const int64_t p0 = np * t / nt, p1 = np * (t + 1) / nt;
        const float* at = p1 > p0 ? eq_tiled(M, K, a, lda) : 0;  /* (eq_tiled: NULL flagged) */
        if (!at) {}
#ifdef EQ_ROW_PANELS
        else if (M == 1) eq_row_swiglu(N, K, at, bg, bu, c, p0, p1);
#endif
        else for (int64_t p = p0; p < p1; p++) {
            const int64_t n0 = p * 32;
            const int ncols = (int)(N - n0 < 32 ? N - n0 : 32);
            const int more = M > EQ_SW_ROWS && p + 1 < p1;  /* (more than one block of rows) */
            eq_panel_swiglu(M, K, at, bg + p * K * 32, bu + p * K * 32, c, ldc, n0, ncols,
                            1.0f, 0, more ? bg + (p + 1) * K * 32 : 0,
                            more ? bu + (p + 1) * K * 32 : 0);
        }
    }
}
static void eq_rope_rows(const eq_rope* r, const float* c, int64_t ldc, int64_t m_local,
                         int64_t m_abs, int rows, int64_t n0) {
    const int64_t h = (n0 - r->n0) / r->d, half = r->d / 2, cj = r->cj, sj = r->sj;
    for (int i = 0; i < rows; i++) {
        const int64_t m = m_abs + i, b = m / r->rows_per_b, s = m % r->rows_per_b;
        const float* x = c + (m_local + i) * ldc + n0;
        float* o = r->o + b * r->ob + h * r->oh + s * r->os;
        const float* co = r->cos + b * r->cb + h * r->ch + s * r->cs;
        const float* si = r->sin + b * r->sb + h * r->sh + s * r->ss;
        /* as the rope kernel rounds it: x * cos + rotate_half(x) * sin; unit strides apart,
           so that the common case vectorises without gathers */
#define EQ_ROPE_LOOP(CJ, SJ) { for (int64_t j = 0; j < half; j++) { \
            const float a = x[j], bb = x[j + half]; \
            o[j] = a * co[j * (CJ)] + (-bb) * si[j * (SJ)]; \
            o[j + half] = bb * co[(j + half) * (CJ)] + a * si[(j + half) * (SJ)]; } }
        if (cj == 1 && sj == 1) EQ_ROPE_LOOP(1, 1) else EQ_ROPE_LOOP(cj, sj)
#undef EQ_ROPE_LOOP
    }
}
/* eq_gemm_packed whose columns are processed a head (d = 32 * gp columns) at a time; for the
   heads inside a rope's columns, per block of EQ_SW_ROWS rows: the head's tiles, then the rope
   on those rows, written to the rope's output. C itself still receives the product (and the epilogue).
   m_base: the absolute row of a's first row (for the rope's position). */
EQ_ENTRY __attribute__((noinline)) void eq_gemm_packed_rope(
        int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* bp, float* c,
        int64_t ldc, float alpha, const float* rowscale, const eq_addend* e, int ne, int act,
        int parallel, int64_t m_base, const eq_rope* ropes, int nrope, int gp) {
    const int64_t np = (N + 31) / 32, ng = (np + gp - 1) / gp;
#pragma omp parallel if(parallel)
    {
        EQ_THREAD_IDS;
        eq_addend es[4];
        const int64_t g0 = ng * t / nt, g1 = ng * (t + 1) / nt;
        const float* at = g1 > g0 ? eq_tiled(M, K, a, lda) : 0;  /* (eq_tiled: NULL flagged) */
        for (int64_t g = g0; at && g < g1; g++) {
            const int64_t pa = g * gp, pb = pa + gp < np ? pa + gp : np, n0 = pa * 32;
            const eq_rope* r = 0;
            for (int i = 0; i < nrope; i++)
                if (ropes[i].n0 <= n0 && n0 < ropes[i].n1) r = ropes + i;
            /* a rope's head runs in blocks of rows, its panels kept in L2 from one block to
               the next; each block prefetches its share of the next head's panels (as
               eq_panel_swiglu does), all rows at once the next panel (as eq_gemm_packed).
               (Without it, each head's first block waited on memory for its panels: a 6-layer
               TinyLlama 64-token chunk 2.6-2.8% slower, RESULTS "The rope GEMM prefetching
               its next head", -DEQ_NO_ROPE_PREFETCH.) */
            const int64_t step = r ? EQ_SW_ROWS : M, blocks = (M + step - 1) / step;
            const int64_t ahead = r ? gp : 1, share = 128 / blocks;
            const int64_t pend = g1 * gp < np ? g1 * gp : np;
            for (int64_t m = 0, i = 0; m < M; m += step, i++) {
                const int rows = M - m > step ? (int)step : (int)(M - m);
                for (int j = 0; j < ne; j++) { es[j] = e[j]; es[j].p += m * e[j].rs; }
                if (M == 1)  /* (decode: the head's panels side by side) */
                    eq_row_range(N, K, at, bp, c, pa, pb, alpha, rowscale, es, ne, act);
                else for (int64_t p = pa; p < pb; p++) {
                    const int ncols = (int)(N - p * 32 < 32 ? N - p * 32 : 32);
#ifdef EQ_NO_ROPE_PREFETCH  /* (benchmarks: a rope head's blocks prefetching nothing) */
                    const int next = !r && M > EQ_MR && share && p + ahead < pend;
#else
                    const int next = M > EQ_MR && share && p + ahead < pend;
#endif
                    eq_panel(rows, K, at + m * K, bp + p * K * 32, c + m * ldc, ldc, p * 32,
                             ncols, alpha, rowscale ? rowscale + m : 0, es, ne, act,
                             next ? bp + (p + ahead) * K * 32 + i * K * share / 4 : 0, share);
                }
                if (r) eq_rope_rows(r, c, ldc, m, m_base + m, rows, n0);
            }
        }
    }
}
