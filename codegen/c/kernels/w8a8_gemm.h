/* ---- w8a8_gemm.c's entry point ---- */
EQ_ENTRY void eq_gemm_w8a8(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                           const int8_t* wq, const float* s, const int32_t* colsum, float* c,
                           int64_t ldc, float alpha, const float* rowscale, const eq_addend* e,
                           int ne, int act, int swiglu, int parallel);
