/* ---- topk.c's entry point and its pairs ---- */
typedef struct { double v; int64_t i; } eq_pair;
/* the first k of q[0, n) in torch.topk's order (largest or smallest first) */
EQ_ENTRY void eq_topk(eq_pair* q, int64_t n, int64_t k, int largest);
