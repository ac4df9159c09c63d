/* ---- expert GEMM on stored experts (codegen/c/emit_routing.py): out[s, :] = x[s, :] @
   W[ids[s]], W's experts stored (int8, fp8, int4 groups; bf16, fp16 values) side by side and
   laid out by QuantPanels as one [K, E N] weight: expert e is panels [e P, (e + 1) P)
   (P = N / 64), its integers at wq + e * lwe bytes, its scales (none for half) at
   s + e * lse bytes. The rows are grouped by expert (experts.c: eq_expert_rows,
   eq_gather_rows, eq_scatter_rows) and each expert used runs the quantized GEMM (eq_gemm_q,
   quant_gemm.c) once on its rows: at decode one row each, read in place, the expert's panels
   streamed once (threads over its panels); at prefill its rows gathered into a buffer of the
   calling thread and the results scattered back. */
EQ_ENTRY void eq_expert_mm_q(int64_t S, int64_t K, int64_t N, int64_t E, const float* x,
                           int64_t ldx, int fmt, int64_t group, const char* wq, int64_t lwe,
                           const char* s, int64_t lse, const int64_t* ids, float* o,
                           int64_t ldo, int parallel) {
    int64_t start[E + 1];
    int64_t order[S > 0 ? S : 1];
    eq_expert_rows(S, N, E, ids, start, order, o, ldo);
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = start[e], rows = start[e + 1] - r0;
        const char* we = wq + e * lwe;
        const char* se = s ? s + e * lse : NULL;  /* (half weights: no scales) */
        if (rows == 1) {  /* decode: the row where it lies, the result where it goes */
            eq_gemm_q(1, N, K, x + order[r0] * ldx, K, fmt, group, we, se, o + order[r0] * ldo,
                      ldo, 1.0f, NULL, NULL, 0, 0, 0, parallel);
            continue;
        }
        if (rows == 0) continue;
        float* a = eq_grow(&eq_xa, &eq_xa_n, rows * K);
        float* c = a ? eq_grow(&eq_xc, &eq_xc_n, rows * N) : NULL;
        if (!c) { EQ_INDEX_ERROR(); return; }  /* out of memory: flag it rather than crash */
        eq_gather_rows(rows, K, x, ldx, order + r0, a);
        eq_gemm_q(rows, N, K, a, K, fmt, group, we, se, c, N, 1.0f, NULL, NULL, 0, 0, 0,
                  parallel);
        eq_scatter_rows(rows, N, c, order + r0, o, ldo, parallel);
    }
}
