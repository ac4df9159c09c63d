
/* ---- w8a8 GEMM: activations quantized per row and call x int8 weights
        (codegen/c/w8a8_gemm.py) ---- */
#ifndef EQ_W8MR
#define EQ_W8MR 5        /* rows of A per register tile: 5 x 2 int32 accumulators + ones +
                            broadcast + 2 products = 14 of the 16 ymm (6 measured as fast, 7
                            and 8 spill) */
#endif
#define EQ_W8NP {NP}       /* columns per panel and per tile: 2 vectors of 8 int32 sums; a k
                            group of a panel (16 columns x 4 bytes) is one 64-byte line */
#define EQ_W8KG {KG}        /* k per group: one int32 lane holds a column's 4 weight bytes, the
                            4 activation bytes broadcast to all lanes */
#ifndef EQ_W8KMAX
#define EQ_W8KMAX 65536  /* k per int32 chunk (a multiple of 4): |sum| <= 65536 * 127 * 128
                            < 2^31; the chunks are summed in int64 */
#endif
#ifndef EQ_W8PF
#define EQ_W8PF 1         /* prefetch the next panel while a panel runs, with this locality
                             hint (0: none) */
#endif
#define EQ_W8AMAX 127    /* activation codes 0..127 (7 bits): a vpmaddubsw pair sum is at
                            most 2 * 127 * 128 = 32512 < 32767, never saturated */
#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* A's row a[0, K) quantized: codes q[k] = clamp(rint(a[k] / s) + z, 0, 127) (q[K, kp) = 0)
   with s = (max(a, 0) - min(a, 0)) / 127 and z = rint(-min(a, 0) / s), so that
   a[k] ~ s (q[k] - z), within s / 2. *sa = s, *zp = z. A zero row (or one below 1e-30):
   s = 0, all codes 0. NaN or inf in the row: s = NaN (the row's outputs are NaN). */
static void eq_w8_quantize_row(int64_t K, const float* a, uint8_t* q, int64_t kp, float* sa,
                               int32_t* zp) {
    float mn = 0.0f, mx = 0.0f, bad = 0.0f;
#pragma omp simd reduction(min:mn) reduction(max:mx) reduction(+:bad)
    for (int64_t k = 0; k < K; k++) {
        mn = a[k] < mn ? a[k] : mn;
        mx = a[k] > mx ? a[k] : mx;
        bad += a[k] * 0.0f;  /* NaN when a NaN or an inf is there (comparisons skip NaN) */
    }
    const float s = (mx - mn) / (float)EQ_W8AMAX;
    memset(q, 0, (size_t)kp);
    *zp = 0;
    if (bad != 0.0f || !(s <= 3.0e38f)) { *sa = NAN; return; }
    if (!(s >= 1e-30f)) { *sa = 0.0f; return; }
    const float inv = 1.0f / s;
    int z = (int)rintf(-mn * inv);
    z = z < 0 ? 0 : z > EQ_W8AMAX ? EQ_W8AMAX : z;
#pragma omp simd
    for (int64_t k = 0; k < K; k++) {
        const int v = (int)rintf(a[k] * inv) + z;  /* rounded, then shifted: no FMA contracts */
        q[k] = (uint8_t)(v < 0 ? 0 : v > EQ_W8AMAX ? EQ_W8AMAX : v);
    }
    *sa = s; *zp = z;
}

/* The micro-kernel. t[16 r + j] (r < rows, j < 16) = sum over k < 4 k4n of
   qa[r ldq + k] * w[k][j], int32, w the panel as W8A8Panels lays it out (k group g of
   column j: the 4 bytes at wp + 64 g + 4 j). Per k group: the 16-column row of the panel is
   2 vectors; per row of A its 4 codes are broadcast to the 8 lanes and each vector takes
   vpmaddubsw (u8 x s8 -> 16 int16 pair sums) + vpmaddwd with ones (-> 8 int32, the 4 k of a
   column) + vpaddd: 32 multiply-adds in 3 instructions, 2 of them on Zen 3's 2 integer
   multiply pipes (measured: 1 cycle per 32 multiply-adds, the bound). VNNI's vpdpbusd does
   all three in one (compile-only here: this machine has no VNNI). The same int32 sums on
   every path. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define EQ_W8_DOT(acc, b, w) acc = _mm256_dpbusd_epi32(acc, b, w)
#elif defined(__AVXVNNI__)
#define EQ_W8_DOT(acc, b, w) acc = _mm256_dpbusd_avx_epi32(acc, b, w)
#elif defined(__AVX2__)
#define EQ_W8_DOT(acc, b, w) \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(b, w), ones))
#endif
static inline __attribute__((always_inline)) void eq_w8_tile(
        const int rows, int64_t k4n, const uint8_t* qa, int64_t ldq, const int8_t* wp,
        int32_t* t) {
#if defined(EQ_W8_DOT)
    /* named accumulators: GCC kept an array of them in memory */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
            a6 = a0, a7 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0,
            b7 = a0;
    const __m256i ones = _mm256_set1_epi16(1);
    (void)ones;
    for (int64_t g = 0; g < k4n; g++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i*)(wp + 64 * g));
        const __m256i w1 = _mm256_loadu_si256((const __m256i*)(wp + 64 * g + 32));
#define EQ_W8_ROW(r) if (rows > r) { \
            int32_t v; \
            memcpy(&v, qa + r * ldq + 4 * g, 4); \
            const __m256i b = _mm256_set1_epi32(v); \
            EQ_W8_DOT(a##r, b, w0); \
            EQ_W8_DOT(b##r, b, w1); }
        EQ_W8_ROW(0) EQ_W8_ROW(1) EQ_W8_ROW(2) EQ_W8_ROW(3)
        EQ_W8_ROW(4) EQ_W8_ROW(5) EQ_W8_ROW(6) EQ_W8_ROW(7)
#undef EQ_W8_ROW
    }
#define EQ_W8_ST(r) if (rows > r) { \
        _mm256_storeu_si256((__m256i*)(t + 16 * r), a##r); \
        _mm256_storeu_si256((__m256i*)(t + 16 * r + 8), b##r); }
    EQ_W8_ST(0) EQ_W8_ST(1) EQ_W8_ST(2) EQ_W8_ST(3) EQ_W8_ST(4) EQ_W8_ST(5) EQ_W8_ST(6)
    EQ_W8_ST(7)
#undef EQ_W8_ST
#else
    /* portable: the same sums, one row of 16 columns at a time */
    for (int r = 0; r < rows; r++) {
        int32_t x[16] = {0};
        for (int64_t g = 0; g < k4n; g++)
            for (int j = 0; j < 16; j++)
                for (int i = 0; i < 4; i++)
                    x[j] += (int32_t)qa[r * ldq + 4 * g + i] * wp[64 * g + 4 * j + i];
        memcpy(t + 16 * r, x, sizeof x);
    }
#endif
}
/* one copy per row count, compiled on its own (noipa: inlined into its caller, or
   specialised by GCC 12's interprocedural constant propagation, the same loop kept
   accumulators on the stack: 40 instructions per k group instead of 32 at 4 rows) */
#if defined(__GNUC__) && !defined(__clang__)
#define EQ_W8_ALONE __attribute__((noipa))
#else
#define EQ_W8_ALONE __attribute__((noinline))
#endif
#define EQ_W8_TILE_FN(R) static EQ_W8_ALONE void eq_w8_tile##R( \
        int64_t k4n, const uint8_t* qa, int64_t ldq, const int8_t* wp, int32_t* t) { \
    eq_w8_tile(R, k4n, qa, ldq, wp, t); }
EQ_W8_TILE_FN(1) EQ_W8_TILE_FN(2) EQ_W8_TILE_FN(3) EQ_W8_TILE_FN(4)
#if EQ_W8MR > 4
EQ_W8_TILE_FN(5)
#endif
#if EQ_W8MR > 5
EQ_W8_TILE_FN(6)
#endif
#if EQ_W8MR > 6
EQ_W8_TILE_FN(7)
#endif
#if EQ_W8MR > 7
EQ_W8_TILE_FN(8)
#endif
#undef EQ_W8_TILE_FN
/* the tile of `rows` rows (a switch: each a constant) */
static inline void eq_w8_tiles(int rows, int64_t k4n, const uint8_t* qa, int64_t ldq,
                               const int8_t* wp, int32_t* t) {
    switch (rows) {
#if EQ_W8MR > 7
    case 8: eq_w8_tile8(k4n, qa, ldq, wp, t); break;
#endif
#if EQ_W8MR > 6
    case 7: eq_w8_tile7(k4n, qa, ldq, wp, t); break;
#endif
#if EQ_W8MR > 5
    case 6: eq_w8_tile6(k4n, qa, ldq, wp, t); break;
#endif
#if EQ_W8MR > 4
    case 5: eq_w8_tile5(k4n, qa, ldq, wp, t); break;
#endif
    case 4: eq_w8_tile4(k4n, qa, ldq, wp, t); break;
    case 3: eq_w8_tile3(k4n, qa, ldq, wp, t); break;
    case 2: eq_w8_tile2(k4n, qa, ldq, wp, t); break;
    default: eq_w8_tile1(k4n, qa, ldq, wp, t); break;
    }
}
/* y[16 r + j] = sa[r] s[j] sum_k (qa[r][k] - zp[r]) w[k][j] (r < rows) for one tile of panel
   wp (its scales s, column sums cs). One K chunk: in int32 (the sum less zp[r] cs[j] wraps
   to the exact result, which fits), converted 8 at a time; more: the chunks' int32 sums
   added in int64 (no vector conversion: scalar, but the chunks are long). */
static void eq_w8_scaled(int rows, int64_t K4, const uint8_t* qa, int64_t ldq, const float* sa,
                         const int32_t* zp, const int8_t* wp, const float* s,
                         const int32_t* cs, float* y) {
    int32_t t[EQ_W8MR * 16];
    if (K4 <= EQ_W8KMAX / 4) {
        eq_w8_tiles(rows, K4, qa, ldq, wp, t);
        for (int r = 0; r < rows; r++) {
            const uint32_t z = (uint32_t)zp[r];
            const float f = sa[r];
#pragma omp simd
            for (int j = 0; j < 16; j++)
                y[16 * r + j] = (f * s[j]) *
                    (float)(int32_t)((uint32_t)t[16 * r + j] - z * (uint32_t)cs[j]);
        }
        return;
    }
    int64_t x[EQ_W8MR * 16] = {0};
    for (int64_t g0 = 0; g0 < K4; g0 += EQ_W8KMAX / 4) {
        const int64_t gn = K4 - g0 < EQ_W8KMAX / 4 ? K4 - g0 : EQ_W8KMAX / 4;
        eq_w8_tiles(rows, gn, qa + 4 * g0, ldq, wp + 64 * g0, t);
        for (int i = 0; i < rows * 16; i++) x[i] += t[i];
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 16; j++)
            y[16 * r + j] = (sa[r] * s[j]) * (float)(x[16 * r + j] - (int64_t)zp[r] * cs[j]);
}
/* t[M][16] = the products of panel p (before alpha), EQ_W8MR rows at a time; pn: the panel
   the thread takes next, prefetched into L2 a share per tile (-1: none) */
static void eq_w8_panel(int64_t M, int64_t K4, const uint8_t* qa, int64_t ldq,
                        const float* sa, const int32_t* zp, const int8_t* wq, const float* s,
                        const int32_t* cs, int64_t p, int64_t pn, float* t) {
    const int64_t bytes = K4 * 64, tiles = (M + EQ_W8MR - 1) / EQ_W8MR;
    const int64_t share = (bytes / 64 + tiles - 1) / tiles * 64;
    const char* next = pn >= 0 ? (const char*)(wq + pn * K4 * 64) : 0;
    for (int64_t m = 0, i = 0; m < M; m += EQ_W8MR, i++) {
        const int rows = M - m < EQ_W8MR ? (int)(M - m) : EQ_W8MR;
#if EQ_W8PF
        if (pn >= 0)
            for (int64_t b = i * share; b < (i + 1) * share && b < bytes; b += 64)
                __builtin_prefetch(next + b, 0, EQ_W8PF);
#endif
        eq_w8_scaled(rows, K4, qa + m * ldq, ldq, sa + m, zp + m, wq + p * K4 * 64,
                     s + 16 * p, cs + 16 * p, t + 16 * m);
    }
}
/* the calling thread's quantized A (row scales, zero points, codes), shared by the threads of
   a call; each thread's products of a panel (swiglu: the gate's, then the up's) */
static __thread float* eq_w8a = 0;
static __thread int64_t eq_w8a_n = 0;
static __thread float* eq_w8t = 0;
static __thread int64_t eq_w8t_n = 0;
/* C[M, N] (row stride ldc) = act(alpha * rowscale[m] * (A @ W) + sum_i e_i.scale * e_i), or
   when swiglu: C[M, N] = silu(G) * U with G = alpha*rowscale*(A @ W[:, 0:N]),
   U = alpha*rowscale*(A @ W[:, N:2N]) (addends and act not used then): eq_gemm_q's contract
   (quant_gemm.py), with A quantized per row and call (eq_w8_quantize_row) and the products
   in integers. A: float [M, K], row stride lda, unit column stride. rowscale may be NULL;
   e may be NULL (ne = 0). W as W8A8Panels (codegen/c/w8a8_gemm.py) prepares the int8 q
   [K, N] (2N with swiglu) and its scales [N]: P = ceil(N / 16) panels (with swiglu 2 P: the
   gate's, then the up half's); wq int8 [P][ceil(K / 4)][16][4], s float [P][16], colsum int32
   [P][16] (the column sums of q). Panels are split between the threads (OpenMP, when
   parallel); each computes all M rows of a panel, then stores them with eq_gemv_store
   (packed_gemm.py: alpha, row scale, addends, activation or swiglu's join). */
EQ_ENTRY __attribute__((noinline)) void eq_gemm_w8a8(
        int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const int8_t* wq,
        const float* s, const int32_t* colsum, float* c, int64_t ldc, float alpha,
        const float* rowscale, const eq_addend* e, int ne, int act, int swiglu, int parallel) {
    if (M <= 0 || N <= 0) return;
    /* the codes' row stride: whole lines, plus one so that rows 4 KiB apart do not share
       an L1 set (as eq_unaliased does for float A) */
    const int64_t K4 = (K + 3) / 4, ldq = (4 * K4 + 63) / 64 * 64 + 64, np = (N + 15) / 16;
    const int64_t head = (2 * M + 15) / 16 * 16;  /* floats: sa, zp, then the codes */
    float* buf = eq_grow(&eq_w8a, &eq_w8a_n, head + (M * ldq + 3) / 4);
    if (!buf) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
    float* sa = buf;
    int32_t* zp = (int32_t*)(buf + M);
    uint8_t* qa = (uint8_t*)(buf + head);
#pragma omp parallel if(parallel)
    {
        EQ_THREAD_IDS;
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++)
            eq_w8_quantize_row(K, a + m * lda, qa + m * ldq, ldq, sa + m, zp + m);
        /* (the loop's barrier: every row quantized before any panel) */
        const int64_t p0 = np * t / nt, p1 = np * (t + 1) / nt;
        float* tg = p1 > p0 ? eq_grow(&eq_w8t, &eq_w8t_n, (swiglu ? 2 : 1) * 16 * M) : 0;
        if (p1 > p0 && !tg) EQ_INDEX_ERROR();  /* out of memory */
        else
            for (int64_t p = p0; p < p1; p++) {
                const int64_t n0 = 16 * p, nc = N - n0 < 16 ? N - n0 : 16;
                float* tu = tg + 16 * M;
                eq_w8_panel(M, K4, qa, ldq, sa, zp, wq, s, colsum, p,
                            swiglu ? np + p : p + 1 < p1 ? p + 1 : -1, tg);
                if (swiglu)
                    eq_w8_panel(M, K4, qa, ldq, sa, zp, wq, s, colsum, np + p,
                                p + 1 < p1 ? p + 1 : -1, tu);
                eq_gemv_store(M, tg, tu, 16, c, ldc, n0, nc, alpha, rowscale, e, ne, act,
                              swiglu);
            }
    }
}
