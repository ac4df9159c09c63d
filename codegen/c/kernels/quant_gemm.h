/* ---- quant_gemm.c's entry point ---- */
EQ_ENTRY void eq_gemm_q(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, int fmt,
                        int64_t group, const void* wq, const void* s, float* c, int64_t ldc,
                        float alpha, const float* rowscale, const eq_addend* e, int ne,
                        int act, int swiglu, int parallel);
