/* ---- packed_gemm.c's entry points and types: what a program sees of it ---- */
/* an addend of the GEMM's epilogue: C += scale * p[m * rs + n * cs] */
typedef struct { const float* p; int64_t rs, cs; float scale; } eq_addend;
/* A rotary embedding in a GEMM's epilogue (codegen/c/fuse_rope.py): the GEMM's columns
   [n0, n1) are heads of d columns; row m (m_base + local row) is position s = m % rows_per_b of
   batch b = m / rows_per_b. out[b, h, s, j] = x[j] cos[.., j] - x[j + d/2] sin[.., j] and
   out[.., j + d/2] = x[j + d/2] cos[.., j + d/2] + x[j] sin[.., j + d/2], x the head's d
   columns of the stored row (still in L1); cos and sin broadcast by strides. */
typedef struct {
    int64_t n0, n1, d, rows_per_b;
    float* o; int64_t ob, oh, os;
    const float* cos; int64_t cb, ch, cs, cj;
    const float* sin; int64_t sb, sh, ss, sj;
} eq_rope;
/* C[M, N] (row stride ldc) = act(alpha * rowscale[m] * (A @ B) + sum_i scale_i * e_i); A
   [M, K] with row stride lda, bp: B packed by PackedWeight; parallel: split over the threads */
EQ_ENTRY void eq_gemm_packed(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                             const float* bp, float* c, int64_t ldc, float alpha,
                             const float* rowscale, const eq_addend* e, int ne, int act,
                             int parallel);
/* C = silu(A @ bg) * (A @ bu), the two weights packed alike */
EQ_ENTRY void eq_gemm_packed_swiglu(int64_t M, int64_t N, int64_t K, const float* a,
                                    int64_t lda, const float* bg, const float* bu, float* c,
                                    int64_t ldc, int parallel);
/* eq_gemm_packed, then the rotary embeddings ropes[0, nrope) of its columns */
EQ_ENTRY void eq_gemm_packed_rope(int64_t M, int64_t N, int64_t K, const float* a,
                                  int64_t lda, const float* bp, float* c, int64_t ldc,
                                  float alpha, const float* rowscale, const eq_addend* e,
                                  int ne, int act, int parallel, int64_t m_base,
                                  const eq_rope* ropes, int nrope, int gp);
/* C[0:M, n0:n0 + ncols] = A @ one 32-column panel, with the epilogue; a: A[M, K] in tile
   order (eq_tiled); pf (unless NULL): K * pfk bytes read next, prefetched meanwhile */
EQ_ENTRY void eq_panel(int64_t M, int64_t K, const float* a, const float* bpan, float* c,
                       int64_t ldc, int64_t n0, int ncols, float alpha,
                       const float* rowscale, const eq_addend* e, int ne, int act,
                       const void* pf, int64_t pfk);
/* A[M, K] in tile order, in a buffer of the calling thread (NULL: out of memory, flagged) */
EQ_ENTRY const float* eq_tiled(int64_t M, int64_t K, const float* a, int64_t lda);
/* *buf holding at least n floats, grown (and *have updated) when needed; NULL: out of memory */
EQ_ENTRY float* eq_grow(float** buf, int64_t* have, int64_t n);
