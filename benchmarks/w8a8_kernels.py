"""The w8a8 GEMM (codegen/c/w8a8_gemm.py: eq_gemm_w8a8, activations quantized per row and
call, integer products) against the weight-only int8 kernel (quant_gemm.py: eq_gemm_q, the
weight dequantized into float panels at prefill), the fp32 packed kernel (packed_gemm.py:
eq_gemm_packed, or eq_gemm_packed_swiglu) and ONNX Runtime's int8 GEMM on the same shape: a
one-MatMul float model run through onnxruntime.quantization.quantize_dynamic with its
defaults (per-tensor int8 weight; activations u8 per tensor and call: DynamicQuantizeLinear +
MatMulInteger, which ORT_ENABLE_ALL fuses into com.microsoft DynamicQuantizeMatMul),
intra_op_num_threads=2. Our kernels are built as benchmarks/quant_kernels.py builds them
(the backend's CFLAGS, 2 OpenMP threads) and called through ctypes.

    .venv/bin/python benchmarks/w8a8_kernels.py [--rows 128 32 512] [--rounds 5] [--calls 5]
        [--shapes 2048x2560 2048x11264s 5632x2048 2048x32000] [--systems ...] [--flags ...]

Shapes K x N (TinyLlama's: qkv, gate|up, down, lm_head); a trailing "s" is a SwiGLU weight
[K, 2 N'] (N = 2 N'): our kernels compute silu(G) * U (N' outputs, swiglu=1), ORT the plain
[K, N] product (its quantized model has no fused SwiGLU; the same multiply-adds). GOP/s =
2 M K N / time. Per shape each system is checked against float64 first (max |error| /
max |C|: weight and activation quantization included). Timing: rounds interleaved across the
systems (rotated), per round `calls` calls back to back, the median per round, then the
median over rounds; spread = max / min of the rounds' medians. "GOP/s by CPU time": the
operations over the process's CPU time per call (median likewise) times the threads: the
rate on dedicated cores, robust to other processes taking a core (with --passive, where an
idle thread sleeps instead of spinning, it counts the work only). Also printed: the
quantization's share of eq_gemm_w8a8's time (the same quantization alone, 2 threads), and the
machine's vpmaddubsw peak (8 independent vpmaddubsw + vpmaddwd + vpaddd chains per thread,
2 threads: the kernel's inner loop without loads)."""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# (before torch loads libgomp, whose copy our kernels share: it reads the policy once)
PASSIVE = "--passive" in sys.argv
if PASSIVE:
    os.environ["OMP_WAIT_POLICY"] = "passive"

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_kernels import FLUSH, QGEMM, build

from eqsat_llm.codegen.c.packed_gemm import PACKED_GEMM_C
from eqsat_llm.codegen.c.prelude import PRELUDE
from eqsat_llm.codegen.c.quant_gemm import QUANT_GEMM_C, QuantPanels
from eqsat_llm.codegen.c.tiles import PACKED_PANEL as NR
from eqsat_llm.codegen.c.w8a8_gemm import W8A8_GEMM_C, W8A8Panels
from eqsat_llm.formats.quant_formats import quantize

CALLS = r"""
void w8(int64_t M, int64_t N, int64_t K, const float* a, const int8_t* wq, const float* s,
        const int32_t* cs, float* c, int swiglu) {
    eq_gemm_w8a8(M, N, K, a, K, wq, s, cs, c, N, 1.0f, 0, 0, 0, 0, swiglu, 1);
}
void qsw(int64_t M, int64_t N, int64_t K, const float* a, const void* wq, const float* s,
         float* c, int swiglu) {
    eq_gemm_q(M, N, K, a, K, 8, 0, wq, s, c, N, 1.0f, 0, 0, 0, 0, swiglu, 1);
}
void dsw(int64_t M, int64_t N, int64_t K, const float* a, const float* bg, const float* bu,
         float* c) {
    eq_gemm_packed_swiglu(M, N, K, a, K, bg, bu, c, N, 1);
}
/* eq_gemm_w8a8's first phase alone: A quantized into the same buffer, rows split */
void w8quant(int64_t M, int64_t K, const float* a) {
    const int64_t K4 = (K + 3) / 4, ldq = (4 * K4 + 63) / 64 * 64 + 64;
    const int64_t head = (2 * M + 15) / 16 * 16;
    float* buf = eq_grow(&eq_w8a, &eq_w8a_n, head + (M * ldq + 3) / 4);
    uint8_t* qa = (uint8_t*)(buf + head);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++)
        eq_w8_quantize_row(K, a + m * K, qa + m * ldq, ldq, buf + m, (int32_t*)(buf + M) + m);
}
void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}
/* 8 chains of vpmaddubsw + vpmaddwd + vpaddd per thread, iters times: the inner loop's
   arithmetic without its loads (returns the threads) */
int peak(int64_t iters) {
    int threads = 1;
#if defined(__AVX2__) && defined(__GNUC__)
#pragma omp parallel
    {
#ifdef _OPENMP
#pragma omp single
        threads = omp_get_num_threads();
#endif
        for (int64_t i = 0; i < iters; i++)
            __asm__ volatile(
#define EQ_PK(t, x) "vpmaddubsw %%ymm15, %%ymm14, %%ymm" #t "\n vpmaddwd %%ymm" #t \
    ", %%ymm13, %%ymm" #t "\n vpaddd %%ymm" #t ", %%ymm" #x ", %%ymm" #x "\n"
                EQ_PK(8, 0) EQ_PK(9, 1) EQ_PK(10, 2) EQ_PK(11, 3)
                EQ_PK(8, 4) EQ_PK(9, 5) EQ_PK(10, 6) EQ_PK(11, 7)
#undef EQ_PK
                ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                "xmm9", "xmm10", "xmm11");
    }
#else
    (void)iters;
    threads = 0;
#endif
    return threads;
}
"""

THREADS = 2
SHAPES = ["2048x2560", "2048x11264s", "5632x2048", "2048x32000"]
SYSTEMS = ["w8a8", "int8 weight-only (eq_gemm_q)", "fp32 packed", "ORT int8 (quantize_dynamic)"]


def load(flags: list[str], path: Path) -> ctypes.CDLL:
    dll = build(PRELUDE + PACKED_GEMM_C + QUANT_GEMM_C + W8A8_GEMM_C + FLUSH + QGEMM + CALLS,
                flags, path)
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    dll.w8.argtypes = [i64, i64, i64, ptr, ptr, ptr, ptr, ptr, i32]
    dll.qsw.argtypes = [i64, i64, i64, ptr, ptr, ptr, ptr, i32]
    dll.dsw.argtypes = [i64, i64, i64, ptr, ptr, ptr, ptr]
    dll.w8quant.argtypes = [i64, i64, ptr]
    dll.peak.argtypes = [i64]
    dll.peak.restype = ctypes.c_int
    dll.set_threads.argtypes = [ctypes.c_int]
    return dll


def ort_int8(w: torch.Tensor, tmp: Path):
    """(run(x) -> y, the op types ORT runs) for x @ w through quantize_dynamic's model."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import quantize_dynamic

    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w.numpy(), "w")])
    path, qpath = tmp / f"mm{k}x{n}.onnx", tmp / f"mm{k}x{n}.int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    quantize_dynamic(str(path), str(qpath))
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if PASSIVE:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.optimized_model_filepath = str(tmp / f"mm{k}x{n}.opt.onnx")
    sess = ort.InferenceSession(str(qpath), so, providers=["CPUExecutionProvider"])
    ops = sorted({f"{nd.domain + '.' if nd.domain else ''}{nd.op_type}"
                  for nd in onnx.load(so.optimized_model_filepath, load_external_data=False)
                  .graph.node})
    return (lambda x: sess.run(None, {"x": x})[0]), ops


def prepared(k: int, n: int, swiglu: bool, gen: torch.Generator, tmp: Path,
             names: list[str]) -> dict:
    """A float weight w [K, N] and each system's form of it (ours: its int8 per-column
    quantization; ORT: its own quantize_dynamic of w)."""
    w = torch.randn(k, n, generator=gen) * 0.05
    nout, halves = (n // 2, 2) if swiglu else (n, 1)
    q, s = quantize(w, "int8")
    pw = {"w": w}
    if "w8a8" in names:
        pq = W8A8Panels("q", 0, k, nout, n, halves)
        pw["w8a8"] = (pq.prepare({"q": q}),
                      W8A8Panels("s", 0, 1, nout, 0, halves, "scale").prepare({"s": s}),
                      W8A8Panels("q", 0, k, nout, n, halves, "colsum").prepare({"q": q}))
    if "int8 weight-only (eq_gemm_q)" in names:
        pw["q"] = (QuantPanels("q", 0, k, nout, n, halves).prepare({"q": q}),
                   QuantPanels("s", 0, 1, nout, 0, halves).prepare({"s": s}))
    if "fp32 packed" in names:
        def panels(x):
            return torch.nn.functional.pad(x, (0, -x.shape[1] % NR)).reshape(
                k, -1, NR).permute(1, 0, 2).contiguous()
        pw["fp32"] = (panels(w[:, :nout]), panels(w[:, nout:])) if swiglu else (panels(w),)
    if "ORT int8 (quantize_dynamic)" in names:
        pw["ort"] = ort_int8(w, tmp)
        print(f"  {k}x{n}: ORT runs {' + '.join(pw['ort'][1])}", flush=True)
    return pw


def systems(dll, m: int, k: int, n: int, swiglu: bool, pw: dict, gen: torch.Generator):
    """{name: (call, its output, float64 reference)} for M = m rows of a random A."""
    a = torch.randn(m, k, generator=gen)
    w = pw["w"]
    nout = n // 2 if swiglu else n
    y64 = a.double() @ w.double()
    want = torch.nn.functional.silu(y64[:, :nout]) * y64[:, nout:] if swiglu else y64
    c = torch.empty(m, nout)
    p = lambda t: t.data_ptr()
    out = {}
    if "w8a8" in pw:
        wp, sp, cs = pw["w8a8"]
        out["w8a8"] = (lambda: dll.w8(m, nout, k, p(a), p(wp), p(sp), p(cs), p(c), int(swiglu)),
                       c, want)
        out["w8a8: quantizing A only"] = (lambda: dll.w8quant(m, k, p(a)), None, None)
    if "q" in pw:
        qq, qs = pw["q"]
        out["int8 weight-only (eq_gemm_q)"] = (
            lambda: dll.qsw(m, nout, k, p(a), p(qq), p(qs), p(c), int(swiglu)), c, want)
    if "fp32" in pw:
        b = pw["fp32"]
        if swiglu:
            fn = lambda: dll.dsw(m, nout, k, p(a), p(b[0]), p(b[1]), p(c))
        else:
            fn = lambda: dll.dense(m, n, k, p(a), p(b[0]), p(c))
        out["fp32 packed"] = (fn, c, want)
    if "ort" in pw:
        run, x, res = pw["ort"][0], a.numpy(), {}

        def ort_call():
            res["y"] = run(x)
        out["ORT int8 (quantize_dynamic)"] = (ort_call, res, y64)
    return out


def error(out, want) -> float:
    got = torch.as_tensor(out["y"] if isinstance(out, dict) else out).double()
    return ((got - want).abs().max() / want.abs().max()).item()


def peak_gops(dll) -> tuple[float, int]:
    iters = 20_000_000
    dll.peak(iters // 10)
    ts = []
    threads = 0
    for _ in range(5):
        t = time.perf_counter()
        threads = dll.peak(iters)
        ts.append(time.perf_counter() - t)
    return (threads * iters * 8 * 64 / min(ts) / 1e9 if threads else float("nan")), threads


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="*", type=int, default=[128, 32, 512])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--shapes", nargs="*", default=SHAPES, help="KxN, a trailing s: swiglu")
    p.add_argument("--systems", nargs="*", default=SYSTEMS, choices=SYSTEMS)
    p.add_argument("--flags", nargs="*", default=[], help="extra compiler flags (ours)")
    p.add_argument("--threads", type=int, default=2, help="OpenMP threads and ORT intra-op")
    p.add_argument("--passive", action="store_true",
                   help="idle threads sleep (OMP_WAIT_POLICY=passive, ORT without spinning): "
                        "on a machine whose cores other processes share, a spinning OpenMP "
                        "thread that lost its core makes the next parallel region wait for "
                        "the scheduler's tick (4 ms)")
    args = p.parse_args(argv)
    global THREADS
    THREADS = args.threads
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        dll = load(args.flags, tmp / "w8.so")
        dll.set_threads(args.threads)
        pk, threads = peak_gops(dll)
        print(f"vpmaddubsw + vpmaddwd + vpaddd, 8 chains per thread: {pk:.0f} GOP/s on "
              f"{threads} threads", flush=True)
        for shape in args.shapes:
            swiglu = shape.endswith("s")
            k, n = (int(x) for x in shape.rstrip("s").split("x"))
            gen = torch.Generator().manual_seed(k + n)
            pw = prepared(k, n, swiglu, gen, tmp, args.systems)
            for m in args.rows:
                fns = systems(dll, m, k, n, swiglu, pw, gen)
                errs = {}
                for name, (fn, out, want) in fns.items():
                    fn()
                    if out is not None:
                        errs[name] = error(out, want)
                samples = {name: [] for name in fns}
                cpu = {name: [] for name in fns}
                names = list(fns)
                for r in range(args.rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        ts, cs = [], []
                        for _ in range(args.calls):
                            t, c = time.perf_counter(), time.process_time()
                            fns[name][0]()
                            ts.append(time.perf_counter() - t)
                            cs.append(time.process_time() - c)
                        samples[name].append(statistics.median(ts))
                        cpu[name].append(statistics.median(cs))
                ops = 2 * m * k * n
                for name, s in samples.items():
                    t, c = statistics.median(s), statistics.median(cpu[name])
                    rows.append((m, shape, name, t * 1e3, ops / t / 1e9, max(s) / min(s),
                                 errs.get(name), ops / c / 1e9 * args.threads))
                    print(f"{m:>4} {shape:>12} {name:>30} {t * 1e3:9.3f} ms "
                          f"{rows[-1][4]:6.1f} GOP/s  spread {rows[-1][5]:.2f}  "
                          f"{rows[-1][7]:6.1f} GOP/s by CPU time", flush=True)
    print(f"\n1-minute load {load0:.2f} before, {os.getloadavg()[0]:.2f} after; {args.threads} "
          f"threads{', passive' if PASSIVE else ''}; "
          f"{args.rounds} rounds x {args.calls} calls, median of the rounds' medians; "
          f"vpmaddubsw peak {pk:.0f} GOP/s ({threads} threads)")
    print("| M | K x N | system | ms | GOP/s | vs ORT | GOP/s by CPU time | vs ORT | spread "
          "| max err / max abs C |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ort = {(r[0], r[1]): r for r in rows if r[2].startswith("ORT")}
    wq = {(r[0], r[1]): r[3] for r in rows if r[2] == "w8a8"}
    for m, shape, name, ms, gops, spread, err, cgops in rows:
        if name.endswith("only"):  # the quantization: its share of the kernel's time
            vs = f"{ms / wq[m, shape]:.1%} of w8a8" if (m, shape) in wq else ""
            print(f"| {m} | {shape} | {name} | {ms:.3f} | | {vs} | | | {spread:.2f} | |")
            continue
        o = ort.get((m, shape))
        vs = f"{o[3] / ms:.2f}x" if o else ""
        vc = f"{cgops / o[7]:.2f}x" if o else ""
        e = f"{err:.1e}" if err is not None else ""
        print(f"| {m} | {shape} | {name} | {ms:.3f} | {gops:.1f} | {vs} | {cgops:.1f} | {vc} | "
              f"{spread:.2f} | {e} |")

if __name__ == "__main__":
    main()
