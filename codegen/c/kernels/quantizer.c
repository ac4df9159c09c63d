
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EQ_QB 64     /* columns a block: a thread's unit, the vector loops run across them */
#define EQ_QROWS 128 /* rows of a block read into the local tile at a time (int4: a group) */

/* x rounded to the nearest float16 value, ties to even, as a float (inf past float16's range;
   x finite, not NaN): the mantissa cut to 10 bits, or below 2^-14 to multiples of 2^-24 */
static inline float eq_round_half(float x) {
    const float a = fabsf(x);
    if (a < 0x1p-14f) return copysignf(nearbyintf(a * 0x1p24f) * 0x1p-24f, x);
    uint32_t b;
    memcpy(&b, &x, 4);
    b = (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu;
    float r;
    memcpy(&r, &b, 4);
    return fabsf(r) > 65504.0f ? copysignf(INFINITY, x) : r;
}

static inline float eq_value(const void* w, int bf16, int64_t at) {
    if (!bf16) return ((const float*)w)[at];
    const uint32_t b = (uint32_t)((const uint16_t*)w)[at] << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* t[i][j] = w[k0 + i, n0 + j] for i < rows, j < cols (zero past cols), widened from bf16
   bits or copied: along whichever of the weight's strides is 1 */
static void eq_tile(const void* w, int bf16, int64_t k0, int64_t rows, int64_t n0,
                    int64_t cols, int64_t sk, int64_t sn, float t[EQ_QROWS][EQ_QB]) {
    if (cols < EQ_QB)
        for (int64_t i = 0; i < rows; i++) memset(t[i] + cols, 0, (EQ_QB - cols) * 4);
    if (sk == 1 && sn != 1 && bf16 && cols == EQ_QB) {
        /* a transposed nn.Linear weight, each column contiguous: 8 columns' runs read side
           by side, each row of the tile written whole */
        const uint16_t* p = (const uint16_t*)w + k0 + n0 * sn;
        for (int64_t j = 0; j < EQ_QB; j += 8)
            for (int64_t i = 0; i < rows; i++)
                for (int jj = 0; jj < 8; jj++) {
                    const uint32_t b = (uint32_t)p[(j + jj) * sn + i] << 16;
                    memcpy(&t[i][j + jj], &b, 4);
                }
    } else if (sk == 1 && sn != 1) {
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++) t[i][j] = eq_value(w, bf16, k0 + i + (n0 + j) * sn);
    } else {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                t[i][j] = eq_value(w, bf16, (k0 + i) * sk + (n0 + j) * sn);
    }
}

/* amax[j] = max(amax[j], |t[i][j]|) over the rows; nan[j] set where a value is NaN */
static void eq_amax(int64_t rows, float t[EQ_QROWS][EQ_QB], float* amax, int32_t* nan) {
    for (int64_t i = 0; i < rows; i++)
#pragma omp simd
        for (int j = 0; j < EQ_QB; j++) {
            const float a = fabsf(t[i][j]);
            nan[j] |= a != a;
            amax[j] = a > amax[j] ? a : amax[j];
        }
}

/* the scales of a block's columns from their max |w|: / top, int4's rounded to float16; a
   NaN's or zero's scale 1 */
static void eq_scales(float* s, const float* amax, const int32_t* nan, float top, int half) {
    for (int j = 0; j < EQ_QB; j++) {
        float x = nan[j] ? NAN : amax[j] / top;
        if (half && !nan[j] && x <= 3.0e38f) x = eq_round_half(x);
        s[j] = x > 0.0f ? x : 1.0f;
    }
}

/* t[i][j] / s[j] rounded half to even, clamped to [lo, hi], in place */
static void eq_round(int64_t rows, float t[EQ_QROWS][EQ_QB], const float* s, float lo,
                     float hi) {
    for (int64_t i = 0; i < rows; i++)
#pragma omp simd
        for (int j = 0; j < EQ_QB; j++) {
            const float x = nearbyintf(t[i][j] / s[j]);
            t[i][j] = x < lo ? lo : (x > hi ? hi : x);
        }
}

/* w [K, N] (element strides sk, sn). group 0: int8, one scale per column (q int8 [K, N],
   scale [N]); else int4 in groups of `group` rows (q uint8 [K / 2, N], two rows a byte, the
   even row low; scale [K / group, N], each rounded to float16). As
   quant_formats.quantize_in_torch: a NaN in a group makes its max NaN, so its scale 1, as
   torch's amax and where do. Blocks of EQ_QB columns, rows a tile at a time: int8 reads a
   block's rows twice (its max, then its integers; the block stays in L2), int4 once. */
void eq_quantize(const void* w, int bf16, int64_t K, int64_t N, int64_t sk, int64_t sn,
                 int64_t group, void* q, float* scale) {
    const int64_t G = group ? group : K, R = group ? group : EQ_QROWS;
    const float top = group ? 7.0f : 127.0f, lo = group ? -8.0f : -127.0f,
                hi = group ? 7.0f : 127.0f;
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += EQ_QB) {
        const int64_t cols = N - n0 < EQ_QB ? N - n0 : EQ_QB;
        float t[EQ_QROWS][EQ_QB] __attribute__((aligned(64)));
        float amax[EQ_QB], s[EQ_QB];
        int32_t nan[EQ_QB];
        for (int64_t g0 = 0; g0 < K; g0 += G) {
            memset(amax, 0, sizeof amax);
            memset(nan, 0, sizeof nan);
            if (!group)  /* int8: the column's max over all K first */
                for (int64_t k0 = 0; k0 < K; k0 += R) {
                    const int64_t rows = K - k0 < R ? K - k0 : R;
                    eq_tile(w, bf16, k0, rows, n0, cols, sk, sn, t);
                    eq_amax(rows, t, amax, nan);
                }
            for (int64_t k0 = g0; k0 < g0 + G; k0 += R) {
                const int64_t rows = g0 + G - k0 < R ? g0 + G - k0 : R;
                eq_tile(w, bf16, k0, rows, n0, cols, sk, sn, t);
                if (group) {  /* int4: the tile is the group */
                    eq_amax(rows, t, amax, nan);
                    eq_scales(s, amax, nan, top, 1);
                    memcpy(scale + (g0 / G) * N + n0, s, cols * 4);
                } else if (k0 == 0) {
                    eq_scales(s, amax, nan, top, 0);
                    memcpy(scale + n0, s, cols * 4);
                }
                eq_round(rows, t, s, lo, hi);
                if (!group) {
                    for (int64_t i = 0; i < rows; i++)
                        for (int64_t j = 0; j < cols; j++)
                            ((int8_t*)q)[(k0 + i) * N + n0 + j] = (int8_t)t[i][j];
                } else {
                    for (int64_t i = 0; i < rows; i += 2)  /* two rows a byte, the even one low */
                        for (int64_t j = 0; j < cols; j++)
                            ((uint8_t*)q)[((k0 + i) / 2) * N + n0 + j] = (uint8_t)(
                                (uint8_t)(t[i][j] + 8.0f) | ((uint8_t)(t[i + 1][j] + 8.0f) << 4));
                }
            }
        }
    }
}

/* x (finite, |x| below the format's largest value plus half a step) as a float8 byte,
   rounded to nearest even: e5m2 (5 exponent bits, 2 mantissa bits) or e4m3fn (4, 3), as
   torch converts (c10's fp8 conversions, in-range branch): below the smallest normal the
   magic addition rounds in the float unit, above it the mantissa is rounded on the bits */
static inline uint8_t eq_fp8(float x, int e5m2) {
    uint32_t f;
    memcpy(&f, &x, 4);
    const uint32_t sign = f & 0x80000000u;
    f ^= sign;
    const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    uint32_t r;
    if (f < ((uint32_t)(127 - bias + 1) << 23)) {  /* subnormal or zero */
        /* the float whose ulp is the format's least subnormal step, 2^(1 - bias - mbits) */
        const uint32_t denorm = (uint32_t)(151 - bias - mbits) << 23;
        float a, m;
        memcpy(&a, &f, 4);
        memcpy(&m, &denorm, 4);
        a += m;
        uint32_t b;
        memcpy(&b, &a, 4);
        r = b - denorm;
    } else {
        const uint32_t odd = (f >> (23 - mbits)) & 1u;
        f += ((uint32_t)(bias - 127) << 23) + ((1u << (22 - mbits)) - 1u);
        f += odd;
        r = f >> (23 - mbits);
    }
    return (uint8_t)(r | (sign >> 24));
}

/* w [K, N] (element strides sk, sn) as float8 e4m3 (e5m2): scale [N] = max_k |w| / top (an
   all-zero column's 1), q [K, N] = w / scale as float8 bytes, as quant_formats'
   quantize_in_torch. Returns how many values are not finite (then q and scale are not set:
   the caller refuses the weight). Blocks of EQ_QB columns, rows a tile at a time, each block
   read twice (its max, then its bytes). */
int64_t eq_quantize_fp8(const void* w, int bf16, int64_t K, int64_t N, int64_t sk, int64_t sn,
                        int e5m2, uint8_t* q, float* scale) {
    const float top = e5m2 ? 57344.0f : 448.0f;
    int64_t bad = 0;
    #pragma omp parallel for schedule(static) reduction(+:bad)
    for (int64_t n0 = 0; n0 < N; n0 += EQ_QB) {
        const int64_t cols = N - n0 < EQ_QB ? N - n0 : EQ_QB;
        float t[EQ_QROWS][EQ_QB] __attribute__((aligned(64)));
        float amax[EQ_QB], s[EQ_QB];
        int32_t nan[EQ_QB];
        memset(amax, 0, sizeof amax);
        memset(nan, 0, sizeof nan);
        for (int64_t k0 = 0; k0 < K; k0 += EQ_QROWS) {
            const int64_t rows = K - k0 < EQ_QROWS ? K - k0 : EQ_QROWS;
            eq_tile(w, bf16, k0, rows, n0, cols, sk, sn, t);
            eq_amax(rows, t, amax, nan);
        }
        for (int j = 0; j < cols; j++) bad += nan[j] || !(amax[j] <= 3.4028234663852886e38f);
        eq_scales(s, amax, nan, top, 0);
        memcpy(scale + n0, s, cols * 4);
        for (int64_t k0 = 0; k0 < K; k0 += EQ_QROWS) {
            const int64_t rows = K - k0 < EQ_QROWS ? K - k0 : EQ_QROWS;
            eq_tile(w, bf16, k0, rows, n0, cols, sk, sn, t);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++)
                    q[(k0 + i) * N + n0 + j] = eq_fp8(t[i][j] / s[j], e5m2);
        }
    }
    return bad;
}
