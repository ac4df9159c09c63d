"""The C backend's GEMM kernels side by side, per shape class: the packed-weight kernel
(codegen/c/packed_gemm.py, what a GEMM against a constant weight runs), OpenBLAS with the
backend's column split (what a GEMM against a non-constant operand runs at M >= 8), the
generated row-streaming kernel (M < 8), ONNX Runtime's MatMul (MLAS) and torch.matmul.

    .venv/bin/python benchmarks/gemm_kernels.py [--write] [--rounds 9]

Every system computes the same [M, K] x [K, N] float32 product through the real backend
(one-node programs built by CRuntime), checked against torch first; then interleaved rounds,
median time per call. The shapes are the LLaMA-style block's GEMMs at prefill (M = 128),
the small transformers models' (M = 16) and decode (M = 1)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import interleaved_medians
from optimize_time import write_section

from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.ir import Graph, TensorType

SECTION = "## GEMM kernels of the C backend"
ROUND_S = 0.05
SHAPES = [(128, 512, 3072), (128, 512, 1536), (128, 1536, 512), (128, 512, 512),
          (128, 2048, 2048), (128, 2048, 5632), (128, 5632, 2048),
          (16, 128, 512), (16, 512, 128), (16, 128, 1000), (1, 512, 3072), (1, 1536, 512)]


def _program(m: int, k: int, n: int, weight: torch.Tensor | None) -> Graph:
    """x @ w with w a constant (packed) or, when weight is None, a second input."""
    g = Graph()
    x = g.append("input", (), {"name": "x", "index": 0}, TensorType((m, k), "float32"))
    if weight is None:
        w = g.append("input", (), {"name": "w", "index": 1}, TensorType((k, n), "float32"))
    else:
        g.constants["w"] = weight
        w = g.append("const", (), {"name": "w"}, TensorType((k, n), "float32"))
    g.outputs = [g.add("matmul", (x, w), alpha=1.0)]
    return g


def _ort(x: torch.Tensor, w: torch.Tensor) -> Callable[[], object] | None:
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    m, k = x.shape
    n = w.shape[1]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w.numpy(), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}
    return lambda: sess.run(None, feed)


def systems(m: int, k: int, n: int) -> dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    want = x @ w
    packed = CRuntime(_program(m, k, n, w), use_blas=False)
    blas = CRuntime(_program(m, k, n, None), use_blas=True)
    gen_kernel = CRuntime(_program(m, k, n, None), use_blas=False)
    out = {"packed weight": lambda: packed.run([x]),
           "OpenBLAS, column split" if m >= 8 else "generated GEMV": (
               (lambda: blas.run([x, w])) if m >= 8 else (lambda: gen_kernel.run([x, w]))),
           "torch.matmul": lambda: torch.matmul(x, w)}
    ort_fn = _ort(x, w)
    if ort_fn is not None:
        out["ONNX Runtime MatMul"] = ort_fn
    for name, fn in out.items():
        got = fn()
        got = torch.as_tensor(got[0] if isinstance(got, list) else got)
        err = (got - want).abs().max().item()
        if err > 1e-3 * k ** 0.5:
            raise AssertionError(f"{name} wrong on {m}x{k}x{n}: max error {err}")
    return out


def measure(m: int, k: int, n: int, rounds: int) -> dict[str, float]:
    return interleaved_medians(systems(m, k, n), rounds, ROUND_S)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    load0 = os.getloadavg()[0]
    lines = []
    for m, k, n in SHAPES:
        res = measure(m, k, n, args.rounds)
        flop = 2.0 * m * k * n
        cells = "; ".join(f"{s} {t * 1e6:.1f} us ({flop / t / 1e9:.0f} GFLOP/s)"
                          for s, t in res.items())
        lines.append(f"| {m}x{k}x{n} | {cells} |")
        print(lines[-1], flush=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/gemm_kernels.py --write` "
            f"({stamp}, {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
            f" with 2 threads, generated kernels on 2 OpenMP threads; 1-minute load "
            f"{load0:.2f} before, {os.getloadavg()[0]:.2f} after). One process, {args.rounds} "
            "interleaved rounds, median time per call (including the call from Python); "
            "every system checked against torch first.\n\n"
            "| M x K x N | median per call (GFLOP/s) |\n|---|---|\n" + "\n".join(lines))
    if args.write:
        write_section(text, SECTION)
    print(text)


if __name__ == "__main__":
    main()
