/* ---- expert GEMM (codegen/c/emit_experts.py): out[s, :] = x[s, :] @ W[ids[s]] ----------
   Expert e's weight is K rows of N contiguous columns (w + e * lde + k * ldk: transformers'
   [E, N, K] storage, transposed once when the program is prepared). Rows are grouped by expert (a counting sort of the ids), so each expert's weight
   is read once per call whatever its rows: at decode only the chosen experts are read, at
   prefill an expert's columns serve all its tokens from cache. Tasks (expert, block of
   EQ_XNB columns) are shared by the threads; a task multiplies 4 rows x 4 vectors of columns
   at a time (one row, decode: 8 vectors), each k a broadcast of x times a row of W (GCC
   vector extensions: a vector is one AVX-512 register, or one AVX2 one, or two SSE). */
#ifndef EQ_XNB
#define EQ_XNB 256
#endif
#ifdef __AVX512F__
#define EQ_XV 16
#else
#define EQ_XV 8
#endif
typedef float eq_xv __attribute__((vector_size(EQ_XV * 4)));

static inline eq_xv eq_xv_load(const float* p) {
    eq_xv v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* rows xr[0..nr) (nr <= 4) times nv vectors of columns (nv <= 8) of one expert's weight
   (k-th row at w + k * ldk): stored at orow[r], whole vectors (the caller's tail is scalar) */
static inline __attribute__((always_inline)) void eq_expert_tile(
        int64_t K, const float* const* xr, int nr, const float* w, int64_t ldk, int nv,
        float* const* orow) {
    eq_xv acc[4][8];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nv; c++) acc[r][c] = (eq_xv){0};
    for (int64_t k = 0; k < K; k++) {
        eq_xv wv[8];
        for (int c = 0; c < nv; c++) wv[c] = eq_xv_load(w + k * ldk + c * EQ_XV);
        for (int r = 0; r < nr; r++) {
            const eq_xv xb = (eq_xv){0} + xr[r][k];
            for (int c = 0; c < nv; c++) acc[r][c] += xb * wv[c];
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nv; c++) memcpy(orow[r] + c * EQ_XV, &acc[r][c], sizeof(eq_xv));
}

/* S rows of x (row s at x + s * ldx, k contiguous; ldx 0: one row for all), ids[s] in
   [0, E) (others: an index error, their row NaN); expert e's weight row k at
   w + e * lde + k * ldk, columns contiguous; out row s at o + s * ldo, columns contiguous. */
static void eq_expert_mm(int64_t S, int64_t K, int64_t N, int64_t E, const float* x,
                         int64_t ldx, const float* w, int64_t lde, int64_t ldk,
                         const int64_t* ids, float* o, int64_t ldo, int parallel) {
    int64_t start[E + 1];
    int64_t order[S > 0 ? S : 1];
    for (int64_t e = 0; e <= E; e++) start[e] = 0;
    for (int64_t s = 0; s < S; s++) {
        if ((uint64_t)ids[s] < (uint64_t)E) start[ids[s] + 1]++;
        else {
            EQ_INDEX_ERROR();
            for (int64_t n = 0; n < N; n++) o[s * ldo + n] = NAN;
        }
    }
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    {
        int64_t fill[E];
        for (int64_t e = 0; e < E; e++) fill[e] = start[e];
        for (int64_t s = 0; s < S; s++)
            if ((uint64_t)ids[s] < (uint64_t)E) order[fill[ids[s]]++] = s;
    }
    const int64_t blocks = (N + EQ_XNB - 1) / EQ_XNB;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t task = 0; task < E * blocks; task++) {
        const int64_t e = task / blocks, n0 = (task % blocks) * EQ_XNB;
        const int64_t r0 = start[e], r1 = start[e + 1];
        const int64_t n1 = n0 + EQ_XNB < N ? n0 + EQ_XNB : N;
        if (r0 == r1) continue;
        const float* we = w + e * lde;
        for (int64_t r = r0; r < r1; r += 4) {
            const int nr = r1 - r < 4 ? (int)(r1 - r) : 4;
            const float* xr[4];
            float* orow[4];
            for (int i = 0; i < nr; i++) xr[i] = x + order[r + i] * ldx;
            int64_t n = n0;
            if (nr == 1)  /* decode: one row, 8 vectors of columns a tile */
                for (; n + 8 * EQ_XV <= n1; n += 8 * EQ_XV) {
                    orow[0] = o + order[r] * ldo + n;
                    eq_expert_tile(K, xr, 1, we + n, ldk, 8, orow);
                }
            for (; n + 4 * EQ_XV <= n1; n += 4 * EQ_XV) {
                for (int i = 0; i < nr; i++) orow[i] = o + order[r + i] * ldo + n;
                if (nr == 4) eq_expert_tile(K, xr, 4, we + n, ldk, 4, orow);
                else eq_expert_tile(K, xr, nr, we + n, ldk, 4, orow);
            }
            for (; n < n1; n++)  /* the columns short of a tile */
                for (int i = 0; i < nr; i++) {
                    float acc = 0.0f;
                    for (int64_t k = 0; k < K; k++) acc += xr[i][k] * we[k * ldk + n];
                    o[order[r + i] * ldo + n] = acc;
                }
        }
    }
}
