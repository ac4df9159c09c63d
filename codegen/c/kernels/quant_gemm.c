
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
/* the prefetches' locality hints (2: into L2, 3: into L1), byte formats and half ones: L2
   but for the byte formats on AVX2. Measured, `quant_kernels.py --sequence 6` (a token's
   GEMVs of 6 TinyLlama layers), two runs each, GB/s with 2 / 3: AVX-512 bf16 31.0 / 29.0,
   int8 29.4 / 28.0, fp8 29.6 / 27.7, int4 25.5 / 23.9; AVX2 bf16 25.5 / 18.5 (its 16-byte
   loads and L1 prefetches contend, a guess from the effect), int8 26.5 / 27.7, fp8 22.3 /
   23.5, int4 20.6 / 21.3 */
#ifndef EQ_QPFL
#if defined(__AVX512F__)
#define EQ_QPFL 2
#else
#define EQ_QPFL 3
#endif
#endif
#ifndef EQ_QPFLH
#define EQ_QPFLH 2
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
#if ((EQ_QV == 16 && defined(__AVX512BW__)) || (EQ_QV == 8 && defined(__AVX2__) && \
     defined(__F16C__))) && !defined(EQ_NO_Q8EO)  /* (-DEQ_NO_Q8EO: benchmarks' A/B) */
#define EQ_Q8EO 1
/* 4 * EQ_QV float8 bytes (one load) widened to four float vectors, by pairs of bytes: each
   16-bit lane's high byte becomes a float16 where it lies (e4m3: an arithmetic shift by 1 and
   the mask of eq_qwiden8f; e5m2: the mask), its low byte once shifted up by 8. No sign
   extension to 16 bits: f[0] holds columns 0, 2, .. 2 EQ_QV - 2 of the bytes, f[1] columns
   2 EQ_QV, .. 4 EQ_QV - 2, f[2] and f[3] the odd ones (eq_qunpair restores the order of the
   sums). Measured against the sign-extending form (benchmarks/quant_kernels.py, -DEQ_NO_Q8EO;
   docs/quantization.md): a token's GEMVs of 6 TinyLlama layers 7-10% faster with AVX2 and
   with AVX-512. */
typedef uint16_t eq_qw __attribute__((vector_size(EQ_QV * 4)));  /* 2 EQ_QV 16-bit lanes */
typedef int16_t eq_qws __attribute__((vector_size(EQ_QV * 4)));
/* f[0], f[1]: the float16 lanes of h, first half then second */
static inline __attribute__((always_inline)) void eq_qhalves(const eq_qw h, eq_qf* f) {
#if EQ_QV == 16
    f[0] = (eq_qf)_mm512_cvtph_ps(_mm512_castsi512_si256((__m512i)h));
    f[1] = (eq_qf)_mm512_cvtph_ps(_mm512_extracti64x4_epi64((__m512i)h, 1));
#else
    f[0] = (eq_qf)_mm256_cvtph_ps(_mm256_castsi256_si128((__m256i)h));
    f[1] = (eq_qf)_mm256_cvtph_ps(_mm256_extracti128_si256((__m256i)h, 1));
#endif
}
static inline __attribute__((always_inline)) void eq_qwiden8eo(const uint8_t* p, const int fmt,
                                                               eq_qf f[4]) {
    eq_qw l;
    memcpy(&l, p, sizeof l);
    const eq_qw m = (eq_qw){0} + (uint16_t)(fmt == 10 ? 0xff00 : 0xbf80), lo = l << 8;
    /* (e4m3: the shift is arithmetic, the sign landing in bits 14 and 15) */
    const eq_qw ev = fmt == 10 ? lo : (eq_qw)((eq_qws)lo >> 1) & m;
    const eq_qw od = (fmt == 10 ? l : (eq_qw)((eq_qws)l >> 1)) & m;
    eq_qhalves(ev, f);
    eq_qhalves(od, f + 2);
}
/* sums over eq_qwiden8eo's vectors x[0..3] put back in column order: x[0] and x[2] hold the
   even and odd columns of the first 2 EQ_QV, x[1] and x[3] those of the next */
static inline __attribute__((always_inline)) void eq_qunpair(eq_qf* x) {
    eq_qi lo, hi;
    for (int j = 0; j < EQ_QV / 2; j++) {
        lo[2 * j] = j, lo[2 * j + 1] = EQ_QV + j;
        hi[2 * j] = EQ_QV / 2 + j, hi[2 * j + 1] = EQ_QV + EQ_QV / 2 + j;
    }
    const eq_qf e0 = x[0], e1 = x[1], o0 = x[2], o1 = x[3];
    x[0] = __builtin_shuffle(e0, o0, lo);
    x[1] = __builtin_shuffle(e0, o0, hi);
    x[2] = __builtin_shuffle(e1, o1, lo);
    x[3] = __builtin_shuffle(e1, o1, hi);
}
#endif
/* the formats whose GEMV tiles this build compiles: those a program defines EQ_QFMT_<fmt> for
   (quant_gemm.py: format_library; int4_dynamic's more rows take int4's panels, its GEMV
   eq_qgemv4i), every one when it defines none (the tests); a format left out flags an error.
   Each format's tiles are inlined apart: the LLaMA block's quantized programs compile
   0.42-0.52 s faster with their own formats only (RESULTS, "C compile time of quantized
   programs"). */
#if defined(EQ_QFMT_4) || defined(EQ_QFMT_5) || defined(EQ_QFMT_8) || defined(EQ_QFMT_9) || \
    defined(EQ_QFMT_10) || defined(EQ_QFMT_16) || defined(EQ_QFMT_17)
#define EQ_QSOME 1
#endif
/* the bytes of a panel row: int8 (8) and float8 (9, 10) weights */
#define EQ_QBYTES(fmt) ((fmt) >= 8 && (fmt) <= 10)

/* int4: x[r][v] = the sums of rows [k0, k1) of the nibble rows w against a's pairs (as
   eq_qtile takes them) */
static inline __attribute__((always_inline)) void eq_q4sums(
        const int rows, const int nv, int64_t k0, int64_t k1, const float* a, int64_t lda,
        const uint8_t* w, int64_t ldw, const int64_t pf, eq_qf x[EQ_QR][8]) {
#if EQ_QV == 16 && defined(__AVX512F__)
    /* the low nibble's float looked up (vpermps reads an index's low 4 bits): one
       instruction instead of a mask and a conversion, both on the FMA ports */
    const __m512 nibbles = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                          14, 15);
#endif
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++) x[r][v] = (eq_qf){0};
    for (int64_t k = k0; k < k1; k += 2) {
        if (pf) __builtin_prefetch(w + k / 2 * ldw + pf, 0, EQ_QPFL);
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            const eq_qi q = eq_qwiden(w + k / 2 * ldw + v * EQ_QV, 0);
#if EQ_QV == 16 && defined(__AVX512F__)
            const eq_qf lo = (eq_qf)_mm512_permutexvar_ps((__m512i)q, nibbles);
#else
            const eq_qf lo = __builtin_convertvector(q & 15, eq_qf);
#endif
            const eq_qf xf = __builtin_convertvector(q, eq_qf);
#pragma GCC unroll 4
            for (int r = 0; r < rows; r++) {
                x[r][v] += a[r * lda + k] * lo;
                x[r][v] += a[r * lda + k + 1] * xf;
            }
        }
    }
}
/* t[rows, nv * EQ_QV] (row stride ldt) += (A[rows, kc] @ W[kc, nv * EQ_QV] + o[rows]) * sg[..],
   the partial sums in registers for the chunk.
   fmt 8: w int8 rows, a the rows of A, o none. fmt 9, 10: w float8 e4m3 / e5m2 rows, else as 8.
   fmt 4: w nibble rows, a byte x = 16 hi + lo for rows k, k + 1 of A. a holds, per pair,
   b = A[k] - A[k + 1] / 16 and c = A[k + 1] / 16, so that b lo + c x = A[k] lo + A[k + 1] hi:
   two conversions and FMAs, no shift; o = -8 * (the group's sum of A), the nibbles' offset.
   fmt 16, 17: w float16 / bfloat16 rows (ldw in values), a the rows of A; no scale, no o.
   sg: int8's scales float, int4's float16 bits. int4's chunk may hold several groups of gs
   rows (one row of A: the whole panel): group g's scales then at sg + 64 g, its offsets at
   o[r * ldo + g] (gs: unused by the other formats). */
static inline __attribute__((always_inline)) void eq_qtile(
        const int rows, const int nv, const int fmt, int64_t kc, const float* a, int64_t lda,
        const uint8_t* w, int64_t ldw, const void* sg, const float* o, int64_t ldo, float* t,
        int64_t ldt, const int64_t pf, const int64_t gs) {
    eq_qf x[EQ_QR][8];
    int scaled = 0;  /* (int4, one row: x already scaled group by group) */
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++) x[r][v] = (eq_qf){0};
    if (EQ_QBYTES(fmt)) {
#if defined(EQ_Q8EO)
        if (fmt != 8 && nv % 4 == 0) {  /* float8: four vectors a load, by pairs of bytes */
            for (int64_t k = 0; k < kc; k++) {
                if (pf) __builtin_prefetch(w + k * ldw + pf, 0, EQ_QPFL);
#pragma GCC unroll 2
                for (int v = 0; v < nv; v += 4) {
                    eq_qf f[4];
                    eq_qwiden8eo(w + k * ldw + v * EQ_QV, fmt, f);
#pragma GCC unroll 4
                    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
                        for (int i = 0; i < 4; i++) x[r][v + i] += a[r * lda + k] * f[i];
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < rows; r++)
                for (int v = 0; v < nv; v += 4) eq_qunpair(&x[r][v]);
        } else
#endif
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
                __builtin_prefetch((const uint8_t*)(wh + k * ldw) + pf, 0, EQ_QPFLH);
                __builtin_prefetch((const uint8_t*)(wh + k * ldw) + pf + 64, 0, EQ_QPFLH);
            }
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) {
                const eq_qf f = eq_qwidenh(wh + k * ldw + v * EQ_QV, fmt);
#pragma GCC unroll 4
                for (int r = 0; r < rows; r++) x[r][v] += a[r * lda + k] * f;
            }
        }
    } else if (rows == 1 && gs < kc) {
        /* int4, one row: the panel's groups one after another, each one's sums scaled and
           added in registers (no pass over t, no short loop a group) */
        for (int64_t g0 = 0; g0 < kc; g0 += gs) {
            eq_qf gx[EQ_QR][8];
            eq_q4sums(1, nv, g0, g0 + gs, a, lda, w, ldw, pf, gx);
            const uint16_t* sr = (const uint16_t*)sg + g0 / gs * 64;
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++)
                x[0][v] += (gx[0][v] + o[g0 / gs]) * eq_qwidenh(sr + v * EQ_QV, 16);
        }
        scaled = 1;
    } else {
        eq_q4sums(rows, nv, 0, kc, a, lda, w, ldw, pf, x);
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < nv; v++) {
            eq_qf y, sv;
            memcpy(&y, t + r * ldt + v * EQ_QV, sizeof y);
            if (fmt >= 16 || scaled) {
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
        const int64_t pf, const int64_t gs) {
    switch (rows) {
    case 1:
        for (int c = 0; c < 64; c += EQ_QNV1 * EQ_QV)
            eq_qtile(1, EQ_QNV1, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf, gs);
        break;
#if EQ_QR == 4
    case 2:
        for (int c = 0; c < 64; c += 4 * EQ_QV)
            eq_qtile(2, 4, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf, gs);
        break;
    case 3:
        for (int c = 0; c < 64; c += 4 * EQ_QV)
            eq_qtile(3, 4, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf, gs);
        break;
#endif
    default:
        for (int c = 0; c < 64; c += 4 * EQ_QV)
            eq_qtile(EQ_QR, 4, fmt, kc, a, lda, EQ_QCOL(w, c), ldw, EQ_QSCALE(sg, c), o, ldo,
                     t + c, ldt, pf, gs);
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
    /* chunks of a group where there are groups (a grouped float8's more rows: EQ_QKBM, a
       divisor of the group, each chunk scaled by its group's row) */
    /* int4 with AVX-512, one row: the whole panel one chunk, its groups scaled in registers
       (eq_qtile; AVX2's 16 registers hold one set of sums, not two) */
    const int64_t kc = fmt == 4 ? (onepass && EQ_QV == 16 ? K : group)
                                : group && onepass ? group : onepass ? EQ_QKB : EQ_QKBM,
                  nch = (K + kc - 1) / kc;
    /* bytes per weight row of a panel; scale rows per panel */
    const int64_t rb = EQ_QBYTES(fmt) ? 64 : fmt == 4 ? 32 : 128;
    const int64_t ng = group ? K / group : EQ_QBYTES(fmt) ? 1 : 0;
    const int64_t pf = onepass ? EQ_QGPF : 0;
    for (int64_t m = 0; m < M; m++) memset(t + m * ldt, 0, (size_t)(p1 - p0) * 64 * sizeof(float));
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t* wp = wq + p * K * rb;
        const float* sp0 = EQ_QBYTES(fmt) ? (const float*)s + p * ng * 64 : 0;
        const uint16_t* sh = fmt == 4 ? (const uint16_t*)s + p * ng * 64 : 0;
        float* tp = t + (p - p0) * 64;
        for (int64_t j = 0; j < nch; j++) {
            const int64_t k0 = j * kc, kn = K - k0 < kc ? K - k0 : kc;
            const uint8_t* w = wp + k0 * rb;
            const float* sp = group && sp0 ? sp0 + k0 / group * 64 : sp0;
            /* (past the panel: the next one's start, contiguous) */
            if (!onepass && EQ_QGPF)
                for (int64_t b = 0; b < kn * rb; b += 64)
                    __builtin_prefetch(w + EQ_QGPF + b);
            for (int64_t m = 0; m < M; m += EQ_QR) {
                const int rows = M - m < EQ_QR ? (int)(M - m) : EQ_QR;
                const float* ar = a + m * lda + k0;
                float* tm = tp + m * ldt;
                switch (fmt) {  /* (the formats this build takes: EQ_QSOME) */
#if !defined(EQ_QSOME) || defined(EQ_QFMT_8)
                case 8: eq_qblock(rows, 8, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf, kn); break;
#endif
#if !defined(EQ_QSOME) || defined(EQ_QFMT_9)
                case 9: eq_qblock(rows, 9, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf, kn); break;
#endif
#if !defined(EQ_QSOME) || defined(EQ_QFMT_10)
                case 10: eq_qblock(rows, 10, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf, kn); break;
#endif
#if !defined(EQ_QSOME) || defined(EQ_QFMT_16)
                case 16: eq_qblock(rows, 16, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf, kn); break;
#endif
#if !defined(EQ_QSOME) || defined(EQ_QFMT_17)
                case 17: eq_qblock(rows, 17, kn, ar, lda, w, 64, sp, 0, 0, tm, ldt, pf, kn); break;
#endif
#if !defined(EQ_QSOME) || defined(EQ_QFMT_4)
                case 4:
                    eq_qblock(rows, 4, kn, ar, lda, w, 64, sh + k0 / group * 64,
                              o + m * ng + k0 / group, ng, tm, ldt, pf, group);
                    break;
#endif
                default: EQ_INDEX_ERROR(); return;  /* a format this build left out */
                }
            }
        }
    }
}

/* ---- int4_dynamic (fmt 5): int4_g32 weights times activations coded per block of 32 ---- */
/* A's rows coded as quant_formats.code_blocks defines: per block of 32, s = max |a| / 127,
   codes rint(a * (1 / s)) in [-127, 127] (s = 0, codes 0 for a block below 1e-30; s = NaN,
   codes 0 for a block holding NaN or inf). codes [M][K] int8, each 8 of a block stored k + 0,
   2, 4, 6, then 1, 3, 5, 7 (the GEMV's lanes hold a column's low nibbles, then its high
   ones); scales [M][K / 32]; offs [M][K / 32] = -8 * the block's sum of codes (the nibbles
   hold q + 8); with interleave 0, in k's order (the GEMM's lanes hold 4 consecutive k).
   decoded (when not NULL): [M][K] float, s * code in k's order. */
static void eq_qcode4(int64_t M, int64_t K, const float* a, int64_t lda, int8_t* codes,
                      float* scales, int32_t* offs, float* decoded, int interleave) {
    const int64_t nb = K / 32;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            const float* x = a + m * lda + b * 32;
            float mx = 0.0f, bad = 0.0f;
#pragma omp simd reduction(max:mx) reduction(+:bad)
            for (int k = 0; k < 32; k++) {
                const float v = x[k] < 0.0f ? -x[k] : x[k];
                mx = v > mx ? v : mx;
                bad += x[k] * 0.0f;  /* NaN when a NaN or an inf is there */
            }
            float s = mx / 127.0f;
            int8_t q[32];
            int32_t sum = 0;
            if (bad != 0.0f || !(s >= 1e-30f)) {
                memset(q, 0, sizeof q);
                s = bad != 0.0f ? NAN : 0.0f;
            } else {
                const float inv = 1.0f / s;
#pragma omp simd reduction(+:sum)
                for (int k = 0; k < 32; k++) {
                    float v = rintf(x[k] * inv);
                    v = v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v;
                    q[k] = (int8_t)v;
                    sum += (int32_t)v;
                }
            }
            int8_t* c = codes ? codes + m * K + b * 32 : 0;
            if (c)
                for (int k = 0; k < 32; k++)
                    c[interleave ? (k & ~7) + (k & 1) * 4 + (k & 7) / 2 : k] = q[k];
            if (scales) { scales[m * nb + b] = s; offs[m * nb + b] = -8 * sum; }
            if (decoded)
                for (int k = 0; k < 32; k++) decoded[m * K + b * 32 + k] = s * (float)q[k];
        }
}
#if defined(__AVX512BW__) && defined(__AVX512F__)
/* bytes w (unsigned, <= 15) times bytes x (signed), summed per 4 into acc's int32 lanes */
static inline __attribute__((always_inline)) __m512i eq_q4dot(__m512i acc, __m512i w,
                                                              __m512i x) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, w, x);
#else  /* pair sums <= 2 * 15 * 127: vpmaddubsw never saturates */
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x),
                                                   _mm512_set1_epi16(1)));
#endif
}
/* v[m] block L <-> v[L] block m (4 x 4 blocks of 128 bits) */
static inline __attribute__((always_inline)) void eq_q4t(__m512* v) {
    const __m512 a = _mm512_shuffle_f32x4(v[0], v[1], 0x44), b = _mm512_shuffle_f32x4(v[0], v[1], 0xEE),
                 c = _mm512_shuffle_f32x4(v[2], v[3], 0x44), d = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
    v[0] = _mm512_shuffle_f32x4(a, c, 0x88); v[1] = _mm512_shuffle_f32x4(a, c, 0xDD);
    v[2] = _mm512_shuffle_f32x4(b, d, 0x88); v[3] = _mm512_shuffle_f32x4(b, d, 0xDD);
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static inline __attribute__((always_inline)) __m256i eq_q4dot(__m256i acc, __m256i w,
                                                              __m256i x) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x),
                                                   _mm256_set1_epi16(1)));
#endif
}
#endif
/* One step of 8 k: the four 64-byte rows at r (P: the intrinsics' prefix, T the vector
   type, SI its integer suffix) interleaved by byte and word unpacks so that 32-bit lane i of
   128-bit block L of u_m holds column 16 L + 4 m + i's 4 bytes; their low nibbles times the
   codes x[0..3] and their high ones times x[4..7] added into i0..i3. */
#define EQ_Q4STEP(P, T, SI, r, x, low, i0, i1, i2, i3) do { \
    const T r0 = P##loadu_##SI((const T*)(r)), r1 = P##loadu_##SI((const T*)((r) + 64)), \
            r2 = P##loadu_##SI((const T*)((r) + 128)), r3 = P##loadu_##SI((const T*)((r) + 192)); \
    const T t0 = P##unpacklo_epi8(r0, r1), t1 = P##unpackhi_epi8(r0, r1), \
            t2 = P##unpacklo_epi8(r2, r3), t3 = P##unpackhi_epi8(r2, r3); \
    const T u[4] = {P##unpacklo_epi16(t0, t2), P##unpackhi_epi16(t0, t2), \
                    P##unpacklo_epi16(t1, t3), P##unpackhi_epi16(t1, t3)}; \
    int32_t xl, xh; \
    memcpy(&xl, (x), 4); \
    memcpy(&xh, (x) + 4, 4); \
    const T vl = P##set1_epi32(xl), vh = P##set1_epi32(xh); \
    T* acc[4] = {&(i0), &(i1), &(i2), &(i3)}; \
    for (int v = 0; v < 4; v++) { \
        *acc[v] = eq_q4dot(*acc[v], P##and_##SI(u[v], low), vl); \
        *acc[v] = eq_q4dot(*acc[v], P##and_##SI(P##srli_epi16(u[v], 4), low), vh); \
    } \
} while (0)
/* t[m][64 (p - p0) + j] = the int4_dynamic product of row m with column j of panels [p0, p1)
   (QuantPanels' int4 layout: [P][K / 2][64] nibble pairs, [P][K / 32][64] float16 scales),
   from eq_qcode4's codes, scales and offs. Four byte rows (8 k of 64 columns) are
   interleaved so that a 32-bit lane holds one column's 4 bytes (low nibbles k + 0, 2, 4, 6,
   high nibbles k + 1, 3, 5, 7): two byte products per lane and 8 k, summed in int32 over a
   block of 32, then scaled in float by the block's activation scale times the column's
   weight scale. The lanes hold the columns in a fixed order (16 L + 4 m + i for lane i of
   128-bit block L of vector m), the scales brought into it and the sums out of it by 128-bit
   block shuffles. Every path computes the same int32 sums and the same float steps (one
   fused multiply-add per block). */
static __attribute__((noinline)) void eq_qgemv4i(
        int64_t M, int64_t K, const int8_t* codes, const float* xs, const int32_t* offs,
        const uint8_t* wq, const uint16_t* sh, int64_t p0, int64_t p1, float* t, int64_t ldt) {
    const int64_t nb = K / 32;
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t* wp = wq + p * (K / 2) * 64;
        const uint16_t* sp = sh + p * nb * 64;
        for (int64_t m = 0; m < M; m++) {
            const int8_t* xq = codes + m * K;
            float* out = t + m * ldt + (p - p0) * 64;
#if defined(__AVX512BW__) && defined(__AVX512F__)
            const __m512i low = _mm512_set1_epi8(15);
            __m512 f[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                           _mm512_setzero_ps()};
            for (int64_t b = 0; b < nb; b++) {
                const __m512i o = _mm512_set1_epi32(offs[m * nb + b]);
                __m512i i0 = o, i1 = o, i2 = o, i3 = o;
                const uint8_t* w = wp + b * 16 * 64;
                for (int c = 0; c < 4; c++) {
                    const uint8_t* r = w + c * 4 * 64;
                    if (EQ_QGPF)
                        for (int j = 0; j < 4; j++)
                            __builtin_prefetch(r + j * 64 + EQ_QGPF, 0, EQ_QPFL);
                    EQ_Q4STEP(_mm512_, __m512i, si512, r, xq + b * 32 + c * 8, low, i0, i1, i2, i3);
                }
                __m512 sv[4];
                for (int L = 0; L < 4; L++)
                    sv[L] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sp + b * 64 + 16 * L)));
                eq_q4t(sv);
                const __m512 x = _mm512_set1_ps(xs[m * nb + b]);
                f[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(sv[0], x), f[0]);
                f[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(sv[1], x), f[1]);
                f[2] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i2), _mm512_mul_ps(sv[2], x), f[2]);
                f[3] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i3), _mm512_mul_ps(sv[3], x), f[3]);
            }
            eq_q4t(f);
            for (int L = 0; L < 4; L++) _mm512_storeu_ps(out + 16 * L, f[L]);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
            const __m256i low = _mm256_set1_epi8(15);
            __m256 f[2][4];  /* per 32-column half h */
            for (int h = 0; h < 2; h++)
                for (int v = 0; v < 4; v++) f[h][v] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const __m256i o = _mm256_set1_epi32(offs[m * nb + b]);
                const __m256 x = _mm256_set1_ps(xs[m * nb + b]);
                const uint8_t* w = wp + b * 16 * 64;
                if (EQ_QGPF)
                    for (int j = 0; j < 16; j++) __builtin_prefetch(w + j * 64 + EQ_QGPF, 0, EQ_QPFL);
                for (int h = 0; h < 2; h++) {  /* columns 32 h .. 32 h + 31 */
                    __m256i i0 = o, i1 = o, i2 = o, i3 = o;
                    for (int c = 0; c < 4; c++) {
                        const uint8_t* r = w + c * 4 * 64 + 32 * h;
                        EQ_Q4STEP(_mm256_, __m256i, si256, r, xq + b * 32 + c * 8, low, i0, i1, i2, i3);
                    }
                    /* the half's scales, n[j] = columns 32 h + 8 j .. + 7, into the lanes'
                       order: vector m, 128-bit block L = columns 32 h + 16 L + 4 m .. + 3 */
                    __m256 n[4];
                    for (int j = 0; j < 4; j++)
                        n[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sp + b * 64 + 32 * h + 8 * j)));
                    const __m256 s0 = _mm256_permute2f128_ps(n[0], n[2], 0x20),
                                 s1 = _mm256_permute2f128_ps(n[0], n[2], 0x31),
                                 s2 = _mm256_permute2f128_ps(n[1], n[3], 0x20),
                                 s3 = _mm256_permute2f128_ps(n[1], n[3], 0x31);
                    f[h][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(s0, x), f[h][0]);
                    f[h][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(s1, x), f[h][1]);
                    f[h][2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i2), _mm256_mul_ps(s2, x), f[h][2]);
                    f[h][3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i3), _mm256_mul_ps(s3, x), f[h][3]);
                }
            }
            for (int h = 0; h < 2; h++) {
                float* oh = out + 32 * h;
                _mm256_storeu_ps(oh, _mm256_permute2f128_ps(f[h][0], f[h][1], 0x20));
                _mm256_storeu_ps(oh + 8, _mm256_permute2f128_ps(f[h][2], f[h][3], 0x20));
                _mm256_storeu_ps(oh + 16, _mm256_permute2f128_ps(f[h][0], f[h][1], 0x31));
                _mm256_storeu_ps(oh + 24, _mm256_permute2f128_ps(f[h][2], f[h][3], 0x31));
            }
#else
            for (int j = 0; j < 64; j++) {
                float f = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    int32_t acc = offs[m * nb + b];
                    for (int k = 0; k < 32; k += 2) {
                        const uint8_t byte = wp[(b * 16 + k / 2) * 64 + j];
                        const int base = (k & ~7), pos = (k & 7) / 2;  /* k even */
                        acc += (int32_t)(byte & 15) * xq[b * 32 + base + pos];
                        acc += (int32_t)(byte >> 4) * xq[b * 32 + base + 4 + pos];
                    }
                    const float sw = eq_h2f(sp[b * 64 + j], 16);
                    f = fmaf((float)acc, sw * xs[m * nb + b], f);
                }
                out[j] = f;
            }
#endif
        }
    }
}

#if defined(__AVX512BW__) && defined(__AVX512F__)
#define EQ_Q4GEMM 1  /* int4_dynamic's prefill multiplies bytes (else: fmt 4 on decoded codes) */
#ifndef EQ_Q4MR
#define EQ_Q4MR 4    /* rows per register tile: 4 x 4 int32 sums, 4 weight vectors */
#endif
/* panel p of int4's layout ([K / 2][64] nibble pairs at wp) as bytes wb[K / 4][64][4]: the
   4 bytes of column j at [g][j] are its nibbles k = 4 g .. 4 g + 3 (0..15, q + 8) */
static void eq_q4unpack(int64_t K, const uint8_t* wp, uint8_t* wb) {
    const __m512i low = _mm512_set1_epi32(15);
    for (int64_t g = 0; g < K / 4; g++)
        for (int j = 0; j < 64; j += 16) {
            const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wp + 2 * g * 64 + j)));
            const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wp + (2 * g + 1) * 64 + j)));
            const __m512i v = _mm512_or_si512(
                _mm512_or_si512(_mm512_and_si512(b0, low), _mm512_slli_epi32(_mm512_srli_epi32(b0, 4), 8)),
                _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(b1, low), 16),
                                _mm512_slli_epi32(_mm512_srli_epi32(b1, 4), 24)));
            _mm512_storeu_si512(wb + g * 256 + 4 * j, v);
        }
}
/* t[r][0..64) = rows r < R (codes, xs, offs: eq_qcode4's in k's order, rows m0..) times the
   unpacked panel wb, its scales sp ([K / 32][64] float16): per block of 32, the int32 sums
   (started at -8 x the block's codes' sum) scaled by the block's activation scale times the
   columns' weight scales, as eq_qgemv4i does */
static inline __attribute__((always_inline)) void eq_q4tile(
        const int R, int64_t K, const int8_t* codes, const float* xs, const int32_t* offs,
        const uint8_t* wb, const uint16_t* sp, float* t) {
    const int64_t nb = K / 32;
    __m512 f[EQ_Q4MR][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) f[r][v] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i acc[EQ_Q4MR][4];
        for (int r = 0; r < R; r++)
            for (int v = 0; v < 4; v++) acc[r][v] = _mm512_set1_epi32(offs[r * nb + b]);
        for (int g = 0; g < 8; g++) {
            const uint8_t* w = wb + (b * 8 + g) * 256;
            const __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64),
                          w2 = _mm512_loadu_si512(w + 128), w3 = _mm512_loadu_si512(w + 192);
            for (int r = 0; r < R; r++) {
                int32_t x4;
                memcpy(&x4, codes + r * K + b * 32 + 4 * g, 4);
                const __m512i x = _mm512_set1_epi32(x4);
                acc[r][0] = eq_q4dot(acc[r][0], w0, x);
                acc[r][1] = eq_q4dot(acc[r][1], w1, x);
                acc[r][2] = eq_q4dot(acc[r][2], w2, x);
                acc[r][3] = eq_q4dot(acc[r][3], w3, x);
            }
        }
        __m512 sw[4];
        for (int v = 0; v < 4; v++)
            sw[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sp + b * 64 + 16 * v)));
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(xs[r * nb + b]);
            for (int v = 0; v < 4; v++)
                f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][v]), _mm512_mul_ps(sw[v], x),
                                          f[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(t + r * 64 + 16 * v, f[r][v]);
}
/* t[M][64] = the coded rows times panel p (unpacked into wb first) */
static void eq_q4panel(int64_t M, int64_t K, const int8_t* codes, const float* xs,
                       const int32_t* offs, const uint8_t* wq, const uint16_t* sh, int64_t p,
                       uint8_t* wb, float* t) {
    const int64_t nb = K / 32;
    eq_q4unpack(K, wq + p * (K / 2) * 64, wb);
    const uint16_t* sp = sh + p * nb * 64;
    for (int64_t m = 0; m < M; m += EQ_Q4MR) {
        const int64_t R = M - m < EQ_Q4MR ? M - m : EQ_Q4MR;
        const int8_t* c = codes + m * K;
        const float* x = xs + m * nb;
        const int32_t* o = offs + m * nb;
        switch (R) {  /* the row count a constant: the tile's sums stay in registers */
        case 1: eq_q4tile(1, K, c, x, o, wb, sp, t + m * 64); break;
        case 2: eq_q4tile(2, K, c, x, o, wb, sp, t + m * 64); break;
        case 3: eq_q4tile(3, K, c, x, o, wb, sp, t + m * 64); break;
        default: eq_q4tile(EQ_Q4MR, K, c, x, o, wb, sp, t + m * 64); break;
        }
    }
}
#endif
/* the calling thread's buffers (GEMV sums, int4's A, dequantized panels), grown by eq_grow */
static __thread float* eq_qacc = 0;
static __thread int64_t eq_qacc_n = 0;
static __thread float* eq_qa = 0;
static __thread int64_t eq_qa_n = 0;
static __thread float* eq_qpan = 0;
static __thread int64_t eq_qpan_n = 0;
/* int4: one byte row wk (64 columns, rows k and k + 1 as low and high nibbles) as floats (q - 8)
   times the columns' scales sk: columns 0-31 at r0 (row k) and r0 + 32 (row k + 1), 32-63 at
   r1 alike. Each nibble's q - 8 is looked up (vpermps reads an index's low 4 bits) with
   AVX-512; AVX2 converts it and takes q s - 8 s in one FMA (rounded once, as (q - 8) s).
   (GCC's vectorization of the byte loop went through 16-bit lanes and 128-bit extracts: the
   prefill's dequantization took 13-16% of an int4 GEMM beside fp32's, docs/quantization.md.) */
static inline __attribute__((always_inline)) void eq_qdequant4_rows(
        const uint8_t* wk, const float* sk, float* r0, float* r1) {
#if defined(__AVX512F__)
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int j = 0; j < 64; j += 16) {
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wk + j)));
        const __m512 sv = _mm512_load_ps(sk + j);
        float* r = (j < 32 ? r0 : r1) + (j & 31);
        _mm512_storeu_ps(r, _mm512_mul_ps(_mm512_permutexvar_ps(q, table), sv));
        _mm512_storeu_ps(r + 32, _mm512_mul_ps(
            _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table), sv));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256i low = _mm256_set1_epi32(15);
    for (int j = 0; j < 64; j += 8) {
        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(wk + j)));
        const __m256 sv = _mm256_load_ps(sk + j), m8 = _mm256_mul_ps(sv, _mm256_set1_ps(-8.0f));
        float* r = (j < 32 ? r0 : r1) + (j & 31);
        _mm256_storeu_ps(r, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, low)), sv, m8));
        _mm256_storeu_ps(r + 32, _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), sv, m8));
    }
#else
#pragma omp simd
    for (int j = 0; j < 32; j++) {
        r0[j] = (float)((wk[j] & 15) - 8) * sk[j];
        r0[32 + j] = (float)((wk[j] >> 4) - 8) * sk[j];
        r1[j] = (float)((wk[32 + j] & 15) - 8) * sk[32 + j];
        r1[32 + j] = (float)((wk[32 + j] >> 4) - 8) * sk[32 + j];
    }
#endif
}
/* bp[2][K][32]: rows [k0, k0 + kn) of quantized panel p (64 columns, QuantPanels' layout)
   dequantized into two float panels as PackedWeight lays them out, read as one sequential
   stream (k0 and kn whole groups of scales; int4: even) */
static void eq_qdequant(int64_t K, int64_t k0, int64_t kn, int fmt, int64_t group,
                        const uint8_t* wq, const void* s, int64_t p, float* bp) {
    float* b0 = bp;
    float* b1 = bp + K * 32;
    if (fmt >= 16) {
        const uint16_t* w = (const uint16_t*)wq + p * K * 64;
        for (int64_t k = k0; k < k0 + kn; k++)
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
        const int64_t gk = group ? group : K;  /* rows per scale row */
        const float* sp = (const float*)s + p * (K / gk) * 64;
        eq_qf sv[64 / EQ_QV];  /* the columns' scales (e4m3's times 2^8), per group */
        for (int64_t k = k0; k < k0 + kn; k++) {
            if (k == k0 || k % gk == 0)
                for (int j = 0; j < 64; j += EQ_QV) {
                    memcpy(&sv[j / EQ_QV], sp + k / gk * 64 + j, sizeof sv[0]);
                    if (fmt == 9) sv[j / EQ_QV] *= 256.0f;
                }
            for (int j = 0; j < 64; j += EQ_QV) {
                const eq_qf f = eq_qwiden8f(w + k * 64 + j, fmt) * sv[j / EQ_QV];
                memcpy((j < 32 ? b0 + k * 32 + j : b1 + k * 32 + j - 32), &f, sizeof f);
            }
        }
        return;
    }
    if (fmt == 8) {
        const uint8_t* w = wq + p * K * 64;
        const float* sp = (const float*)s + p * 64;
        /* (one sign extension a vector: GCC's vectorization of the byte loop went through
           16-bit lanes and 128-bit extracts, as int4's did: eq_qdequant4_rows) */
        for (int64_t k = k0; k < k0 + kn; k++)
            for (int j = 0; j < 64; j += EQ_QV) {
                eq_qf sv;
                memcpy(&sv, sp + j, sizeof sv);
                const eq_qf f = __builtin_convertvector(eq_qwiden(w + k * 64 + j, 1), eq_qf) * sv;
                memcpy((j < 32 ? b0 + k * 32 + j : b1 + k * 32 + j - 32), &f, sizeof f);
            }
        return;
    }
    const uint8_t* w = wq + p * (K / 2) * 64;
    const uint16_t* sp = (const uint16_t*)s + p * (K / group) * 64;
    float sk[64] __attribute__((aligned(64)));  /* the group's scales, widened as each group starts */
    for (int64_t k = k0; k < k0 + kn; k += 2) {
        const uint8_t* wk = w + k / 2 * 64;
        if (k == k0 || k % group == 0)
            for (int j = 0; j < 64; j += EQ_QV) {
                const eq_qf f = eq_qwidenh(sp + k / group * 64 + j, 16);
                memcpy(sk + j, &f, sizeof f);
            }
        eq_qdequant4_rows(wk, sk, b0 + k * 32, b1 + k * 32);
    }
}
/* the rows of K a dequantized panel takes at once: eq_kblock's, in whole groups of scales
   (int4: of row pairs) */
static inline int64_t eq_qkblock(int64_t K, int fmt, int64_t group) {
    const int64_t g = group ? group : fmt == 4 ? 2 : 1, kc = eq_kblock(K);
    return (kc + g - 1) / g * g;
}
/* rows [k0, k0 + kn) of K for the columns [64 p, 64 p + 64) (those below N) of C through a
   dequantized panel (eq_panel_rows: added to the sums of the blocks before, the epilogue
   after the last); a: A in tile order (eq_tiled) */
static void eq_qpanel_rows(int64_t M, int64_t N, int64_t K, int64_t k0, int64_t kn,
                           const float* a, int fmt, int64_t group,
                           const uint8_t* wq, const void* s, int64_t p, float* c, int64_t ldc,
                           float alpha, const float* rowscale, const eq_addend* e, int ne,
                           int act) {
    const int64_t n0 = 64 * p;
    const int ncols = (int)(N - n0 < 64 ? N - n0 : 64);
    float* bp = eq_grow(&eq_qpan, &eq_qpan_n, 2 * K * 32);
    if (!bp) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
    eq_qdequant(K, k0, kn, fmt, group, wq, s, p, bp);
    for (int q = 0; 32 * q < ncols; q++)
        eq_panel_rows(M, K, k0, kn, a, bp + q * K * 32, c, ldc, n0 + 32 * q,
                      ncols - 32 * q < 32 ? ncols - 32 * q : 32, alpha, rowscale, e, ne, act,
                      0, 0);
}
/* swiglu's columns [64 p, 64 p + 64) of C (those below N) through dequantized panels, the
   gate's p and the up half's pu (eq_expanded_panels); a: A in tile order */
static void eq_qpanels_swiglu(int64_t M, int64_t N, int64_t K, const float* a, int fmt,
                              int64_t group, const uint8_t* wq, const void* s,
                              int64_t p, int64_t pu, float* c, int64_t ldc, float alpha,
                              const float* rowscale) {
    const int64_t n0 = 64 * p;
    const int ncols = (int)(N - n0 < 64 ? N - n0 : 64);
    float* bp = eq_grow(&eq_qpan, &eq_qpan_n, 2 * 2 * K * 32);
    if (!bp) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
    float* bu = bp + 2 * K * 32;
    eq_qdequant(K, 0, K, fmt, group, wq, s, p, bp);
    eq_qdequant(K, 0, K, fmt, group, wq, s, pu, bu);
    eq_expanded_panels(M, K, a, bp, bu, n0, ncols, c, ldc, alpha, rowscale, 0, 0, 0, 1);
}
/* C[M, N] (row stride ldc) = act(alpha * rowscale[m] * (A @ W) + sum_i e_i.scale * e_i), or
   when swiglu: C[M, N] = silu(G) * U with G = alpha*rowscale*(A @ W[:, 0:N]),
   U = alpha*rowscale*(A @ W[:, N:2N]) (addends and act not used then).
   A: float [M, K], row stride lda, unit column stride. rowscale may be NULL; e may be NULL
   (ne = 0).
   W as QuantPanels (codegen/c/quant_gemm.py) prepares it: P = ceil(N / 64) panels of 64
   columns (with swiglu 2 P: the gate's, then the up half's), the last of each half zero-padded.
   fmt 8: wq int8 [P][K][64], s float [P][64] (per column); fmt 9, 10: wq float8 e4m3 / e5m2
   bytes, else as 8; with group > 0 (fp8_e4m3_g128), s float [P][K / group][64], a scale per
   group of rows of a column.
   fmt 4: wq uint8 [P][K / 2][64] (two rows per byte), s float16 bits [P][K / group][64].
   fmt 5 (int4_dynamic): as 4 with group 32, and A coded per block of 32 first (eq_qcode4):
   the GEMV multiplies bytes (eq_qgemv4i); more rows too with AVX-512 (eq_q4panel: each panel
   unpacked to bytes once for all rows), else fmt 4 on A's decoded codes.
   fmt 16, 17: wq float16 / bfloat16 [P][K][64], s unused (NULL). */
EQ_ENTRY __attribute__((noinline)) void eq_gemm_q(
        int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, int fmt, int64_t group,
        const void* wq, const void* s, float* c, int64_t ldc, float alpha,
        const float* rowscale, const eq_addend* e, int ne, int act, int swiglu, int parallel) {
    if (M <= 0 || N <= 0) return;
    const uint8_t* w = (const uint8_t*)wq;
    const int gemv = M <= EQ_QGEMV_M;
    const int64_t np = (N + 63) / 64;
    /* int4_dynamic: A's codes (GEMV) or their decoded values (more rows, then int4's path),
       shared by the threads */
    const int8_t* codes = 0;
    const float* xs = 0;
    const int32_t* offs = 0;
#if defined(EQ_Q4GEMM)
    const int bytes = 1;  /* every row count multiplies bytes */
#else
    const int bytes = gemv;
#endif
    if (fmt == 5) {
        float* buf = eq_grow(&eq_qa, &eq_qa_n, bytes ? M * K / 4 + 2 * M * (K / 32) : M * K);
        if (!buf) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
        if (bytes) {
            float* sc = buf + M * K / 4;
            eq_qcode4(M, K, a, lda, (int8_t*)buf, sc, (int32_t*)(sc + M * (K / 32)), 0, gemv);
            codes = (const int8_t*)buf; xs = sc; offs = (const int32_t*)(sc + M * (K / 32));
        } else {
            eq_qcode4(M, K, a, lda, 0, 0, 0, buf, 0);
            a = buf; lda = K; fmt = 4;
        }
    }
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
        EQ_THREAD_IDS;
        const int64_t p0 = np * t / nt, p1 = np * (t + 1) / nt;
        const int64_t n0 = 64 * p0, nc = (64 * p1 < N ? 64 * p1 : N) - n0, ldt = 64 * (p1 - p0);
        if (gemv && p1 > p0) {
            float* tg = eq_grow(&eq_qacc, &eq_qacc_n, (swiglu ? 2 : 1) * M * ldt);
            if (!tg) EQ_INDEX_ERROR();  /* out of memory */
            else {
                float* tu = tg + M * ldt;
                if (fmt == 5) {
                    eq_qgemv4i(M, K, codes, xs, offs, w, (const uint16_t*)s, p0, p1, tg, ldt);
                    if (swiglu)
                        eq_qgemv4i(M, K, codes, xs, offs, w, (const uint16_t*)s, np + p0,
                                   np + p1, tu, ldt);
                } else {
                    eq_qgemv(M, K, ga, glda, go, fmt, group, w, s, p0, p1, tg, ldt);
                    if (swiglu)
                        eq_qgemv(M, K, ga, glda, go, fmt, group, w, s, np + p0, np + p1, tu,
                                 ldt);
                }
                eq_gemv_store(M, tg, tu, ldt, c, ldc, n0, nc, alpha, rowscale, e, ne, act,
                              swiglu);
            }
        }
#if defined(EQ_Q4GEMM)
        if (!gemv && fmt == 5 && p1 > p0) {
            float* tg = eq_grow(&eq_qacc, &eq_qacc_n, (swiglu ? 2 : 1) * M * 64 + K * 16);
            if (!tg) EQ_INDEX_ERROR();  /* out of memory */
            else {
                float* tu = tg + M * 64;
                uint8_t* wb = (uint8_t*)(tg + (swiglu ? 2 : 1) * M * 64);  /* K x 64 bytes */
                for (int64_t p = p0; p < p1; p++) {
                    eq_q4panel(M, K, codes, xs, offs, w, (const uint16_t*)s, p, wb, tg);
                    if (swiglu)
                        eq_q4panel(M, K, codes, xs, offs, w, (const uint16_t*)s, np + p, wb, tu);
                    eq_gemv_store(M, tg, tu, 64, c, ldc, 64 * p, N - 64 * p < 64 ? N - 64 * p : 64,
                                  alpha, rowscale, e, ne, act, swiglu);
                }
            }
        } else
#endif
        {
            /* the float panels read A in tile order, each thread its own copy (eq_tiled) */
            const float* at = !gemv && fmt != 5 && p1 > p0 ? eq_tiled(M, K, a, lda) : 0;
            if (!at) {}  /* (the GEMV, int4_dynamic's bytes, no panels, or flagged) */
            else if (swiglu)
                for (int64_t p = p0; p < p1; p++)
                    eq_qpanels_swiglu(M, N, K, at, fmt, group, w, s, p, np + p, c, ldc, alpha,
                                      rowscale);
            else {
                /* K blocks outermost, as eq_gemm_packed: a block of A stays in L2 while the
                   thread's panels are dequantized and multiplied block by block (TinyLlama's
                   down projection: A 1.4 MB, a whole dequantized panel 1.4 MB) */
                const int64_t kc = eq_qkblock(K, fmt, group);
                for (int64_t k0 = 0; k0 < K; k0 += kc)
                    for (int64_t p = p0; p < p1; p++)
                        eq_qpanel_rows(M, N, K, k0, K - k0 < kc ? K - k0 : kc, at, fmt, group,
                                       w, s, p, c, ldc, alpha, rowscale, e, ne, act);
            }
        }
    }
}
