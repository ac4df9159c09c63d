/* ---- quant_experts.c's entry point ---- */
EQ_ENTRY void eq_expert_mm_q(int64_t S, int64_t K, int64_t N, int64_t E, const float* x,
                             int64_t ldx, int fmt, int64_t group, const char* wq, int64_t lwe,
                             const char* s, int64_t lse, const int64_t* ids, float* o,
                             int64_t ldo, int parallel);
