
#include <stdint.h>
#include <string.h>

static inline float eq_pack_value(const void* w, int bf16, int64_t at) {
    if (!bf16) return ((const float*)w)[at];
    const uint32_t b = (uint32_t)((const uint16_t*)w)[at] << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

#define EQ_PKB 64  /* rows of K a tile: a panel's tile [EQ_PKB][P] stays in L1 */

/* t[i][j] = the view's element (kb + i, n0 + j), i < rows, j < cols; each column a run down
   K: contiguous in w where rs and w's column stride are 1 and the run stays in one row of w
   (a transposed nn.Linear weight), else stepped through w's flat indices */
static void eq_pack_tile(const void* w, int bf16, int64_t C, int64_t s0, int64_t s1,
                         int64_t offset, int64_t rs, int64_t cs, int64_t kb, int64_t rows,
                         int64_t n0, int64_t cols, int64_t P, float* t) {
    for (int64_t j = 0; j < cols; j++) {
        const int64_t f = offset + kb * rs + (n0 + j) * cs;
        int64_t r = f / C, c = f % C;
        if (rs == 1 && s1 == 1 && c + rows <= C) {
            const int64_t at = r * s0 + c;
            if (bf16) {
                const uint16_t* q = (const uint16_t*)w + at;
                for (int64_t i = 0; i < rows; i++) {
                    const uint32_t b = (uint32_t)q[i] << 16;
                    memcpy(t + i * P + j, &b, 4);
                }
            } else {
                const float* q = (const float*)w + at;
                for (int64_t i = 0; i < rows; i++) t[i * P + j] = q[i];
            }
            continue;
        }
        const int64_t dr = rs / C, dc = rs % C;
        for (int64_t i = 0; i < rows; i++) {
            t[i * P + j] = eq_pack_value(w, bf16, r * s0 + c * s1);
            r += dr;
            c += dc;
            if (c >= C) { c -= C; r += 1; }
        }
    }
}

/* out [ceil(n / P)][k][P] = the view (k x n) of the 2-D constant w [R, C] (element strides
   s0, s1; float32 or bf16 bits) that starts at row-major flat index `offset` with flat
   strides rs (down K) and cs (across N), columns past n zero. Element (kk, nn) is w's flat
   index f = offset + kk rs + nn cs, at (f / C, f % C). The threads take panels; a panel is
   made EQ_PKB rows at a time in a local tile, then stored whole. */
void eq_pack(const void* w, int bf16, int64_t C, int64_t s0, int64_t s1, int64_t offset,
             int64_t k, int64_t n, int64_t rs, int64_t cs, int64_t P, float* out) {
    const int64_t panels = (n + P - 1) / P;
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        float t[EQ_PKB * 64] __attribute__((aligned(64)));  /* (P <= 64) */
        const int64_t n0 = p * P, cols = n - n0 < P ? n - n0 : P;
        if (cols < P) memset(t, 0, sizeof t);
        for (int64_t kb = 0; kb < k; kb += EQ_PKB) {
            const int64_t rows = k - kb < EQ_PKB ? k - kb : EQ_PKB;
            eq_pack_tile(w, bf16, C, s0, s1, offset, rs, cs, kb, rows, n0, cols, P, t);
            memcpy(out + (p * k + kb) * P, t, (size_t)(rows * P) * 4);
        }
    }
}
