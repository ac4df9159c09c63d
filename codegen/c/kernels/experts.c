/* ---- expert GEMM (codegen/c/emit_routing.py): out[s, :] = x[s, :] @ W[ids[s]] ----------
   Each expert's weight is packed as PackedWeight packs a dense one (packed_gemm.py): panels of
   EQ_XP = 32 columns, each K x 32 contiguous, the last zero-padded; expert e's panels start at
   w + e * lde. Rows are grouped by expert (a counting sort of the ids), so each expert's
   weight is read once per call whatever its rows: at decode only the chosen experts are read,
   as contiguous panels; at prefill an expert's panels serve all its tokens from cache. Tasks
   (expert, EQ_XNB panels) are shared by the threads; a task multiplies EQ_XR rows by two
   panels at a time (one row, decode: four panels, four streams), each k a broadcast of x times
   a panel row (GCC vector extensions: a vector is one AVX-512 register, or one AVX2 one, or
   two SSE). An expert with EQ_XGEMM_M rows or more (prefill) instead runs the dense packed
   GEMM (its 14 x 32 tiles) on its rows gathered into a buffer of the calling thread. */
#ifndef EQ_XNB
#define EQ_XNB 8
#endif
#define EQ_XP 32
#ifdef __AVX512F__
#define EQ_XV 16
#define EQ_XR 4
#else
#define EQ_XV 8
#define EQ_XR 2
#endif
#define EQ_XVP (EQ_XP / EQ_XV)
typedef float eq_xv __attribute__((vector_size(EQ_XV * 4)));
/* rows of one expert from which it runs the dense packed GEMM on its gathered rows */
#ifndef EQ_XGEMM_M
#define EQ_XGEMM_M 8
#endif
static __thread float* eq_xa = 0;  /* the calling thread's gathered rows and results, grown */
static __thread int64_t eq_xa_n = 0;  /* when needed and kept (eq_grow: packed_gemm.c) */
static __thread float* eq_xc = 0;
static __thread int64_t eq_xc_n = 0;

static inline eq_xv eq_xv_load(const float* p) {
    eq_xv v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* rows xr[0..nr) (nr <= 4) times np panels (np <= 4) from w (panel stride lp): columns
   [0, nc) of the result stored at orow[r] (nc <= np * EQ_XP; the padding is not stored) */
static inline __attribute__((always_inline)) void eq_expert_tile(
        int64_t K, const float* const* xr, int nr, const float* w, int64_t lp, int np,
        float* const* orow, int64_t nc) {
    eq_xv acc[4][4 * EQ_XVP];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < np * EQ_XVP; c++) acc[r][c] = (eq_xv){0};
    for (int64_t k = 0; k < K; k++) {
        eq_xv wv[4 * EQ_XVP];
        for (int p = 0; p < np; p++)
            for (int v = 0; v < EQ_XVP; v++)
                wv[p * EQ_XVP + v] = eq_xv_load(w + p * lp + k * EQ_XP + v * EQ_XV);
        for (int r = 0; r < nr; r++) {
            const eq_xv xb = (eq_xv){0} + xr[r][k];
            for (int c = 0; c < np * EQ_XVP; c++) acc[r][c] += xb * wv[c];
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < np * EQ_XVP; c++) {
            const int64_t n0 = (int64_t)c * EQ_XV;
            if (n0 + EQ_XV <= nc) memcpy(orow[r] + n0, &acc[r][c], sizeof(eq_xv));
            else for (int64_t i = 0; n0 + i < nc; i++) orow[r][n0 + i] = acc[r][c][i];
        }
}

/* the rows of each expert (a counting sort of ids): expert e's rows are order[start[e]],
   ..., order[start[e + 1] - 1], in their order; an id out of [0, E) is an index error and
   its row of out (at o + s * ldo, N columns) NaN */
static void eq_expert_rows(int64_t S, int64_t N, int64_t E, const int64_t* ids,
                           int64_t* start, int64_t* order, float* o, int64_t ldo) {
    for (int64_t e = 0; e <= E; e++) start[e] = 0;
    for (int64_t s = 0; s < S; s++) {
        if ((uint64_t)ids[s] < (uint64_t)E) start[ids[s] + 1]++;
        else {
            EQ_INDEX_ERROR();
            for (int64_t n = 0; n < N; n++) o[s * ldo + n] = NAN;
        }
    }
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    int64_t fill[E];
    for (int64_t e = 0; e < E; e++) fill[e] = start[e];
    for (int64_t s = 0; s < S; s++)
        if ((uint64_t)ids[s] < (uint64_t)E) order[fill[ids[s]]++] = s;
}

/* the rows order[0..rows) of x gathered into a [rows, K], contiguous (an expert's rows) */
static void eq_gather_rows(int64_t rows, int64_t K, const float* x, int64_t ldx,
                           const int64_t* order, float* a) {
    for (int64_t i = 0; i < rows; i++) memcpy(a + i * K, x + order[i] * ldx, K * 4);
}
/* the rows of c [rows, N] scattered back to out's rows order[0..rows) */
static void eq_scatter_rows(int64_t rows, int64_t N, const float* c, const int64_t* order,
                            float* o, int64_t ldo, int parallel) {
#pragma omp parallel for if (parallel && rows * N >= 32768)
    for (int64_t i = 0; i < rows; i++) memcpy(o + order[i] * ldo, c + i * N, N * 4);
}

/* S rows of x (row s at x + s * ldx, k contiguous; ldx 0: one row for all), ids[s] in
   [0, E) (others: an index error, their row NaN); the experts' packed panels at w (expert
   stride lde); out row s at o + s * ldo, columns contiguous. */
EQ_ENTRY void eq_expert_mm(int64_t S, int64_t K, int64_t N, int64_t E, const float* x,
                         int64_t ldx, const float* w, int64_t lde, const int64_t* ids,
                         float* o, int64_t ldo, int parallel) {
    int64_t start[E + 1];
    int64_t order[S > 0 ? S : 1];
    eq_expert_rows(S, N, E, ids, start, order, o, ldo);
    const int64_t panels = (N + EQ_XP - 1) / EQ_XP, lp = K * EQ_XP;
    const int64_t blocks = (panels + EQ_XNB - 1) / EQ_XNB;
    /* an expert with many rows (prefill): its rows gathered, the dense packed GEMM's tiles
       (packed_gemm.c: the panels are laid out as its own), the results scattered back */
    char gemm[E];
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = start[e], rows = start[e + 1] - r0;
        float* a = rows >= EQ_XGEMM_M ? eq_grow(&eq_xa, &eq_xa_n, rows * K) : NULL;
        float* c = a ? eq_grow(&eq_xc, &eq_xc_n, rows * N) : NULL;
        gemm[e] = c != NULL;  /* (out of memory: the tiles below take the expert) */
        if (!gemm[e]) continue;
        eq_gather_rows(rows, K, x, ldx, order + r0, a);
        eq_gemm_packed(rows, N, K, a, K, w + e * lde, c, N, 1.0f, NULL, NULL, 0, 0,
                       parallel);
        eq_scatter_rows(rows, N, c, order + r0, o, ldo, parallel);
    }
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t task = 0; task < E * blocks; task++) {
        const int64_t e = task / blocks, p0 = (task % blocks) * EQ_XNB;
        const int64_t r0 = start[e], r1 = start[e + 1];
        if (r0 == r1 || gemm[e]) continue;
        const int64_t p1 = p0 + EQ_XNB < panels ? p0 + EQ_XNB : panels;
        const float* we = w + e * lde;
        for (int64_t r = r0; r < r1; r += EQ_XR) {
            const int nr = r1 - r < EQ_XR ? (int)(r1 - r) : EQ_XR;
            const float* xr[4];
            float* orow[4];
            for (int i = 0; i < nr; i++) xr[i] = x + order[r + i] * ldx;
            int64_t p = p0;
            const int step = nr == 1 ? 4 : 2;  /* decode: four panel streams */
            for (; p < p1; p += step) {
                const int np = p1 - p < step ? (int)(p1 - p) : step;
                const int64_t n = p * EQ_XP, nc = N - n < np * EQ_XP ? N - n : np * EQ_XP;
                for (int i = 0; i < nr; i++) orow[i] = o + order[r + i] * ldo + n;
                if (nr == 1 && np == 4) eq_expert_tile(K, xr, 1, we + p * lp, lp, 4, orow, nc);
                else if (nr == EQ_XR && np == 2)
                    eq_expert_tile(K, xr, EQ_XR, we + p * lp, lp, 2, orow, nc);
                else eq_expert_tile(K, xr, nr, we + p * lp, lp, np, orow, nc);
            }
        }
    }
}
