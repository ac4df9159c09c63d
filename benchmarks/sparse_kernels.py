"""The sparse-weight GEMM kernel (codegen/c/sparse_gemm.py: eq_gemm_sparse) against the dense
packed fp32 kernel (codegen/c/packed_gemm.py: eq_gemm_packed, what a GEMM against a constant
float weight runs at every M), called from Python through ctypes on one shared object built
with the backend's CFLAGS (2 OpenMP threads).

    .venv/bin/python benchmarks/sparse_kernels.py [--rounds 5] [--calls 21] [--shapes ...]

Per shape (M x K x N): dense fp32, sparse24 (2:4, random positions) and bsr16 (16 x 16
blocks, each stored with probability 1/2), each checked against torch first. Timing: rounds
interleaved across the kernels; per round `calls` calls, each either cold (twice the
last-level cache read first, quant_kernels.flush_bytes(), so the weight comes from memory:
decode's case in a model) or warm (back to back),
the median per round, then the median over rounds. GB/s = the weight's stored bytes (values
and index) per second; GFLOP/s = the dense product's 2 M K N per second (the sparse kernels
skip half of it). The spread (max / min of the rounds' medians) says the noise."""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eqsat_llm.codegen.c.build import CFLAGS, compiler
from eqsat_llm.codegen.c.packed_gemm import PACKED_GEMM_C
from eqsat_llm.codegen.c.prelude import PRELUDE
from eqsat_llm.codegen.c.sparse_gemm import SPARSE_GEMM_C
from eqsat_llm.codegen.c.tiles import PACKED_PANEL as NR
from eqsat_llm.formats import sparse_formats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_kernels import FLUSH, time_round

# (the flush and the dense kernel's call: quant_kernels.py's)
WRAPPER = FLUSH + r"""
void sparse(int64_t M, int64_t N, int64_t K, const float* a, int fmt, const float* v,
            const void* ix, float* c) {
    eq_gemm_sparse(M, N, K, a, K, fmt, v, ix, N, c, N, 1.0f, 0, 0, 0, 0, 0, 1);
}
"""

SHAPES = [(1, 2048, 5632), (1, 5632, 2048), (128, 2048, 5632), (128, 5632, 2048)]


def build(flags: list[str], d: Path) -> ctypes.CDLL:
    src, so = d / "sparse_bench.c", d / "sparse_bench.so"
    src.write_text(PRELUDE + PACKED_GEMM_C + SPARSE_GEMM_C + WRAPPER)
    subprocess.run([compiler(), *CFLAGS, *flags, str(src), "-o", str(so), "-lm"], check=True)
    dll = ctypes.CDLL(str(so))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.dense.argtypes = [i64, i64, i64, ptr, ptr, ptr]
    dll.sparse.argtypes = [i64, i64, i64, ptr, ctypes.c_int, ptr, ptr, ptr]
    dll.flush.argtypes = [ctypes.c_size_t]
    return dll


def weights(k: int, n: int, gen: torch.Generator) -> dict[str, tuple]:
    """name -> (w as a dense matrix, arguments after a, stored bytes)."""
    w = torch.randn(k, n, generator=gen)
    keep = torch.rand(k // 4, 4, n, generator=gen).argsort(1) < 2
    w24 = w * keep.reshape(k, n)
    blocks = torch.rand(k // 16, n // 16, generator=gen) < 0.5
    w16 = w * blocks.repeat_interleave(16, 0).repeat_interleave(16, 1)
    packed = torch.nn.functional.pad(w, (0, -n % NR)).reshape(k, -1, NR).permute(1, 0, 2)
    out = {"dense fp32": (w, (packed.contiguous(),), k * n * 4)}
    for name, ws, fmt in (("sparse24", w24, 24), ("bsr16 50%", w16, 16)):
        v, ix = sparse_formats.pack(ws, "sparse24" if fmt == 24 else "bsr16")
        out[name] = (ws, (fmt, v, ix), v.numel() * 4 + ix.numel() * ix.element_size())
    return out


def caller(dll, m: int, k: int, n: int, args: tuple, a: torch.Tensor, c: torch.Tensor):
    if len(args) == 1:
        return lambda: dll.dense(m, n, k, a.data_ptr(), args[0].data_ptr(), c.data_ptr())
    fmt, v, ix = args
    return lambda: dll.sparse(m, n, k, a.data_ptr(), fmt, v.data_ptr(), ix.data_ptr(),
                              c.data_ptr())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=21)
    p.add_argument("--shapes", nargs="*", help="MxKxN, e.g. 1x2048x5632")
    p.add_argument("--flags", nargs="*", default=[], help="extra compiler flags")
    args = p.parse_args(argv)
    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes
              else SHAPES)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    load0 = os.getloadavg()[0]
    gen = torch.Generator().manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dll = build(args.flags, Path(tmp))
        for m, k, n in shapes:
            a = torch.randn(m, k, generator=gen)
            c = torch.empty(m, n)
            fns, nbytes = {}, {}
            for name, (w, wargs, nb) in weights(k, n, gen).items():
                fn = caller(dll, m, k, n, wargs, a, c)
                fn()
                err = (c - a @ w).abs().max().item()
                if err > 1e-3 * k ** 0.5:
                    raise AssertionError(f"{name} wrong on {m}x{k}x{n}: max error {err}")
                fns[name], nbytes[name] = fn, nb
            modes = (True, False) if m <= 8 else (False,)
            for cold in modes:
                samples = {name: [] for name in fns}
                names = list(fns)
                for r in range(args.rounds):
                    for name in names[r % 3:] + names[:r % 3]:
                        samples[name].append(time_round(dll, fns[name], args.calls, cold))
                for name, s in samples.items():
                    t = statistics.median(s)
                    rows.append((f"{m}x{k}x{n}", "cold" if cold else "warm", name, t * 1e3,
                                 nbytes[name] / t / 1e9, 2 * m * k * n / t / 1e9,
                                 max(s) / min(s)))
                    print(f"{rows[-1][0]:>15} {rows[-1][1]} {name:>10} {t * 1e3:8.3f} ms",
                          flush=True)
    print(f"\n1-minute load {load0:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{args.rounds} rounds x {args.calls} calls, median of rounds' medians")
    print("| M x K x N | weights | kernel | ms | vs dense | GB/s of weights | GFLOP/s (dense "
          "equivalent) | spread |")
    print("|---|---|---|---|---|---|---|---|")
    dense = {(r[0], r[1]): r[3] for r in rows if r[2] == "dense fp32"}
    for shape, mode, name, ms, gbs, gf, spread in rows:
        print(f"| {shape} | {mode} | {name} | {ms:.3f} | {ms / dense[shape, mode]:.2f} | "
              f"{gbs:.1f} | {gf:.0f} | {spread:.2f} |")


if __name__ == "__main__":
    main()
