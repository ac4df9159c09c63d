"""The C text every generated program starts with: includes, BLAS declarations and the
vectorizable math helpers the kernels share."""

PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
/* in a parallel region: this thread's number t of nt, the kernels' work split by it */
#define EQ_THREAD_IDS int nt = omp_get_num_threads(), t = omp_get_thread_num()
#else
#define EQ_THREAD_IDS int nt = 1, t = 0
#endif

#ifdef EQ_USE_BLAS
#ifndef EQ_SGEMM
#define EQ_SGEMM scipy_cblas_sgemm
#endif
void EQ_SGEMM(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
              int lda, const float *b, int ldb, float beta, float *c, int ldc);
#endif

/* the kernel libraries' entry points (declared in their headers, kernels/<name>.h): static
   where a program includes the libraries' text; exported by the shared kernel library,
   extern in the programs built against it (kernel_library.py sets EQ_ENTRY and EQ_LINKED) */
#ifndef EQ_ENTRY
#define EQ_ENTRY static
#endif

/* Set by a kernel that met an index out of range (it reads nothing there); the runtime checks
   it after each call and raises, as torch does. A program built against the shared kernel
   library sets the library's. */
#ifdef EQ_LINKED
extern int eq_index_error;
#else
__attribute__((visibility("default"))) int eq_index_error = 0;
#endif
#define EQ_INDEX_ERROR() __atomic_store_n(&eq_index_error, 1, __ATOMIC_RELAXED)

/* exp in float32, branch-free so that loops vectorize (Cephes polynomial, ~1 ulp);
   0 below the normal range, inf above, NaN kept. */
static inline float eq_expf(float x) {
    const float hi = 88.3762626647949f, lo = -88.3762626647949f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    /* round to nearest by the 1.5 * 2^23 trick (floorf blocks GCC's vectorizer) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float r2 = r * r;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r2 + r + 1.0f;
    union { float f; int32_t i; } u;
    u.i = ((int32_t)n + 127) << 23;
    float y = p * u.f;
    y = x < lo ? 0.0f : y;
    y = x > hi ? INFINITY : y;
    return x != x ? x : y;
}
static inline float eq_sigmoidf(float x) { return 1.0f / (1.0f + eq_expf(-x)); }
/* tanh through the vectorised exp (libm's tanhf does not vectorise); absolute error ~1e-7 */
static inline float eq_tanhf(float x) {
    float t = eq_expf(-2.0f * fabsf(x));
    float r = (1.0f - t) / (1.0f + t);
    return x < 0.0f ? -r : r;
}
static inline double eq_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
"""
