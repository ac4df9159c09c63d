"""The machine's limits: sustained read bandwidth from memory and peak multiply-add rates.

    .venv/bin/python benchmarks/machine_limits.py [--gib 2] [--rounds 5] [--write]

What a decode step's weights can stream at and what a prefill's GEMMs can compute at, measured
rather than assumed (the bounds in RESULTS.md's tables use them).

- **Read bandwidth**: a C loop (built with the backend's flags) sums a buffer of `--gib` GiB,
  far larger than any last-level cache, with 1 and 2 OpenMP threads, each thread its own
  contiguous range (as a GEMV's threads split the weight panels) or the threads interleaved
  in 64 KiB blocks; plain loads, or with a software prefetch into L1 1 or 4 KiB ahead (the
  hardware prefetchers stop at each 4 KiB page; the quantized GEMV prefetches 4 KiB ahead).
  Threads unplaced, and placed with
  `OMP_PROC_BIND=close OMP_PLACES=cores` (OpenMP reads these once per process: each placement
  runs in its own process). Best and median of `--rounds` passes, GB/s = 1e9 bytes a second.
- **Peak rates**: 12 independent chains of the widest vector FMA the build has (float32),
  of `vpdpbusd` (AVX512-VNNI: u8 x s8, 4 products a lane) and of `vdpbf16ps` (AVX512-BF16: 2
  products a lane) where the CPU has them; 1 and 2 threads. A multiply-add counts 2 ops.
--write puts the table in benchmarks/RESULTS.md ("Machine limits")."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LIMITS_C = r"""
#include <stdint.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#define EQ_V 16
#elif defined(__AVX__)
#include <immintrin.h>
#define EQ_V 8
#else
#define EQ_V 4
#endif
typedef float eq_v __attribute__((vector_size(EQ_V * 4)));

int eq_vector_floats(void) { return EQ_V; }
void eq_threads(int n) { omp_set_num_threads(n); }

static inline eq_v eq_load(const float* p) { eq_v v; memcpy(&v, p, sizeof v); return v; }

/* the sum of p[0, n) (n a multiple of 4 EQ_V); mode 0: each thread a contiguous range,
   1: the same with a prefetch (into L1) 4 KiB ahead, 3: 1 KiB ahead, 2: the threads
   interleaved in 64 KiB blocks, 4: each thread's range read as 4 streams side by side (its
   four quarters, a vector of each in turn: as the fp32 decode GEMV reads 4 panels) */
double eq_read(const float* p, int64_t n, int mode) {
    double total = 0.0;
#pragma omp parallel reduction(+:total)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t step = 4 * EQ_V, block = 16384;  /* floats: 64 KiB */
        eq_v a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        if (mode == 4) {
            const int64_t step = 4 * EQ_V;
            const int64_t lo = n / step * t / nt * step, hi = n / step * (t + 1) / nt * step;
            const int64_t len = (hi - lo) / 4;  /* (a multiple of EQ_V) */
            for (int64_t i = lo; i < lo + len; i += EQ_V) {
                a0 += eq_load(p + i); a1 += eq_load(p + i + len);
                a2 += eq_load(p + i + 2 * len); a3 += eq_load(p + i + 3 * len);
            }
        } else if (mode == 2) {
            for (int64_t b = (int64_t)t * block; b < n; b += (int64_t)nt * block) {
                const int64_t e = b + block < n ? b + block : n;
                for (int64_t i = b; i < e; i += step) {
                    a0 += eq_load(p + i); a1 += eq_load(p + i + EQ_V);
                    a2 += eq_load(p + i + 2 * EQ_V); a3 += eq_load(p + i + 3 * EQ_V);
                }
            }
        } else {
            const int64_t lo = n / step * t / nt * step, hi = n / step * (t + 1) / nt * step;
            for (int64_t i = lo; i < hi; i += step) {
                if (mode == 1) __builtin_prefetch(p + i + 1024, 0, 3);
                if (mode == 3) __builtin_prefetch(p + i + 256, 0, 3);
                a0 += eq_load(p + i); a1 += eq_load(p + i + EQ_V);
                a2 += eq_load(p + i + 2 * EQ_V); a3 += eq_load(p + i + 3 * EQ_V);
            }
        }
        const eq_v s = a0 + a1 + a2 + a3;
        for (int j = 0; j < EQ_V; j++) total += s[j];
    }
    return total;
}

/* iters x 12 chains of vector FMAs per thread; returns a value that depends on them all */
double eq_fma(int64_t iters) {
    double total = 0.0;
#pragma omp parallel reduction(+:total)
    {
        eq_v x[12], m, c;
        for (int j = 0; j < 12; j++) x[j] = (eq_v){0} + 0.001f * (float)j;
        m = (eq_v){0} + 0.9999f; c = (eq_v){0} + 0.0001f;
        for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++) x[j] = x[j] * m + c;
        }
        eq_v s = {0};
        for (int j = 0; j < 12; j++) s += x[j];
        for (int j = 0; j < EQ_V; j++) total += s[j];
    }
    return total;
}

/* the same with vpdpbusd (int8: 64 products a zmm) and vdpbf16ps (bf16: 32 a zmm); -1 where
   the build has no such instruction */
double eq_dpbusd(int64_t iters) {
#if defined(__AVX512VNNI__)
    double total = 0.0;
#pragma omp parallel reduction(+:total)
    {
        __m512i x[12];
        const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(2);
        for (int j = 0; j < 12; j++) x[j] = _mm512_set1_epi32(j);
        for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++) x[j] = _mm512_dpbusd_epi32(x[j], a, b);
        }
        __m512i s = x[0];
        for (int j = 1; j < 12; j++) s = _mm512_add_epi32(s, x[j]);
        total += (double)_mm512_reduce_add_epi32(s);
    }
    return total;
#else
    (void)iters;
    return -1.0;
#endif
}

double eq_dpbf16(int64_t iters) {
#if defined(__AVX512BF16__)
    double total = 0.0;
#pragma omp parallel reduction(+:total)
    {
        __m512 x[12];
        const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80),
                       b = (__m512bh)_mm512_set1_epi16(0x3c00);
        for (int j = 0; j < 12; j++) x[j] = _mm512_set1_ps((float)j);
        for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
            for (int j = 0; j < 12; j++) x[j] = _mm512_dpbf16_ps(x[j], a, b);
        }
        __m512 s = x[0];
        for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, x[j]);
        total += (double)_mm512_reduce_add_ps(s);
    }
    return total;
#else
    (void)iters;
    return -1.0;
#endif
}
"""

PLACEMENTS = {"unplaced": {}, "OMP_PROC_BIND=close OMP_PLACES=cores":
              {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}}


def _best_and_median(fn, rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def _library():
    import ctypes

    from eqsat_llm.codegen.c.build import helper_library

    lib = helper_library(LIMITS_C)
    if lib is None:
        raise SystemExit("no C compiler")
    for name in ("eq_read", "eq_fma", "eq_dpbusd", "eq_dpbf16"):
        getattr(lib, name).restype = ctypes.c_double
    lib.eq_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    for name in ("eq_fma", "eq_dpbusd", "eq_dpbf16"):
        getattr(lib, name).argtypes = [ctypes.c_int64]
    return lib


def _buffer(lib, gib: float):
    import numpy as np

    width = lib.eq_vector_floats()
    n = int(gib * 2**30) // 4 // (64 * width) * (64 * width)
    return np.full(n, 1.0, dtype=np.float32)  # touched: every page is in memory


STREAMS = 4  # eq_read's mode: 4 streams a thread, the best read on the machines here


def read_bandwidth(gib: float, rounds: int, threads: int) -> float:
    """The best read rate (GB/s) of 4 streams a thread on `threads` threads: the bound a
    benchmark's streaming kernel is held against in the same run."""
    lib = _library()
    buf = _buffer(lib, gib)
    lib.eq_threads(threads)
    lib.eq_read(buf.ctypes.data, buf.size, STREAMS)
    best, _ = _best_and_median(lambda: lib.eq_read(buf.ctypes.data, buf.size, STREAMS), rounds)
    return buf.size * 4 / best / 1e9


def measure(gib: float, rounds: int) -> list[dict]:
    """This process's measurements (its OpenMP placement fixed by its environment)."""
    lib = _library()
    width = lib.eq_vector_floats()
    buf = _buffer(lib, gib)
    n = buf.size
    rows = []
    for threads in (1, 2):
        lib.eq_threads(threads)
        for mode, what in enumerate(("contiguous ranges", "contiguous + prefetch 4 KiB ahead",
                                     "interleaved 64 KiB blocks",
                                     "contiguous + prefetch 1 KiB ahead",
                                     "4 streams a thread")):
            if threads == 1 and mode == 2:
                continue
            lib.eq_read(buf.ctypes.data, n, mode)  # warm-up (and the check below)
            best, med = _best_and_median(lambda m=mode: lib.eq_read(buf.ctypes.data, n, m),
                                         rounds)
            rows.append({"kind": "read", "what": what, "threads": threads,
                         "best": n * 4 / best / 1e9, "median": n * 4 / med / 1e9})
        iters = 20_000_000
        for name, ops in (("fp32 FMA", 2 * width * 12), ("vpdpbusd (int8)", 2 * 64 * 12),
                          ("vdpbf16ps (bf16)", 2 * 32 * 12)):
            fn = {"fp32 FMA": lib.eq_fma, "vpdpbusd (int8)": lib.eq_dpbusd,
                  "vdpbf16ps (bf16)": lib.eq_dpbf16}[name]
            if fn(1) < 0:
                continue
            best, med = _best_and_median(lambda f=fn, i=iters: f(i), rounds)
            work = ops * iters * threads
            rows.append({"kind": "peak", "what": name, "threads": threads,
                         "best": work / best / 1e9, "median": work / med / 1e9})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--write", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.gib, args.rounds)))
        return
    lines = ["| measure | threads | placement | best | median |", "|---|---|---|---|---|"]
    for placement, env in PLACEMENTS.items():
        out = subprocess.run([sys.executable, __file__, "--child", "--gib", str(args.gib),
                              "--rounds", str(args.rounds)], capture_output=True, text=True,
                             env=os.environ | env, check=True)
        for r in json.loads(out.stdout.strip().splitlines()[-1]):
            unit = "GB/s" if r["kind"] == "read" else "GOP/s"
            lines.append(f"| {r['kind']}: {r['what']} | {r['threads']} | {placement} | "
                         f"{r['best']:.1f} {unit} | {r['median']:.1f} {unit} |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.write:
        from optimize_time import cpu_name, write_section

        head = (f"Command: `.venv/bin/python benchmarks/machine_limits.py {' '.join(sys.argv[1:])}`"
                f" ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_name()}, "
                f"{platform.machine()}, {os.cpu_count()} cores; the backend's "
                f"CFLAGS). Read: a {args.gib:g} GiB buffer summed; peaks: 12 independent "
                f"chains per thread; best and median of {args.rounds} passes. A multiply-add "
                "counts 2 ops.")
        write_section(head + "\n\n" + table,
                      "## Machine limits (benchmarks/machine_limits.py)")


if __name__ == "__main__":
    main()
