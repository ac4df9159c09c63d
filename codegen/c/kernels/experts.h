/* ---- experts.c's entry point ---- */
EQ_ENTRY void eq_expert_mm(int64_t S, int64_t K, int64_t N, int64_t E, const float* x,
                           int64_t ldx, const float* w, int64_t lde, const int64_t* ids,
                           float* o, int64_t ldo, int parallel);
