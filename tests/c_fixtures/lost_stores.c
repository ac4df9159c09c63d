/* A kernel shape GCC 12 miscompiles at -O1 and above with -fopenmp (found as wrong logits
   in GLM-4 and six other families from 24 tokens on): in a strided copy under `omp simd`,
   induction-variable optimization rewrites both addresses from one integer IV (the read as
   `0 + 2*iv - ...`), the late local pure-const / mod-ref analysis then finds the function
   free of side effects, and a caller drops the call: the copy never happens. codegen/c/build.py
   compiles with -fno-ipa-pure-const -fno-ipa-modref so that no caller trusts such a summary;
   tests/test_c_compiler.py builds this file with the backend's flags and runs it. */
#include <stdint.h>
#include <stdio.h>
#define COPY_BODY(A, OFF) { \
    float* restrict o = (float*)(A + 8192) + OFF; \
    const float* x = (const float*)A + OFF; \
    for (int64_t i0 = 0; i0 < 4; i0++) \
    for (int64_t i1 = 0; i1 < 32; i1++) \
    _Pragma("omp simd") \
    for (int64_t i2 = 0; i2 < 16; i2++) \
        o[i0*1024 + i1*32 + i2] = x[i0*16 + i1*64 + i2]; }
static void copy_a(char* restrict A) COPY_BODY(A, 0)
static void copy_b(char* restrict A) COPY_BODY(A, 16)
void run(int k, char* A) { switch (k) { case 0: copy_a(A); break; case 1: copy_b(A); break; } }
static float arena[8192];
int main(void) {
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 8192; i++) arena[i] = i < 2048 ? 1.0f : 0.0f;
        run(k, (char*)arena);
        if (arena[2048 + 16 * k] != 1.0f) { printf("copy_%c: stores lost\n", 'a' + k); return 1; }
    }
    printf("ok\n");
    return 0;
}
