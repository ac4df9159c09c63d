/* ---- sparse_gemm.c's entry point ---- */
EQ_ENTRY void eq_gemm_sparse(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                             int fmt, const float* values, const void* index, int64_t ldw,
                             float* c, int64_t ldc, float alpha, const float* rowscale,
                             const eq_addend* e, int ne, int act, int swiglu, int parallel);
