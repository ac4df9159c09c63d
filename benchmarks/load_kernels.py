"""The load-time C helpers against torch's form of the same work, side by side in one run.

    .venv/bin/python benchmarks/load_kernels.py [--repeats 7] [--write]

On a bf16 nn.Linear weight [N, K] read transposed (the GEMM's [K, N], as a checkpoint's weight
is quantized at load): codegen/c/quantizer.py's `quantize_in_c` against quant_formats'
`quantize_in_torch` (the definition; the two are bit-equal: tests/test_quantizer.py), int8,
int4_g32 and fp8_e4m3 (`quantize_fp8_in_c`); and codegen/c/packer.py's `pack_in_c` against
`PackedWeight.prepare_in_torch` (bit-equal: tests/test_packer.py) on the same view widened to
float32 (as a float32 program's recipe gives it: transposed strides), into 32-column panels.
(A C layout of bf16 panels was measured here too and removed: torch's strided copy
of the same view was as fast, 2.2-4.5 against 2.2-3.5 GB/s, and a warm bf16 start loaded in
1.42 s with it against 1.77 s with the C one.) GB/s = the weight's bf16 bytes per second;
best of `repeats` calls each. --write puts the table in benchmarks/RESULTS.md ("Load-time
kernels")."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from optimize_time import write_section

from eqsat_llm.codegen.c.packed_gemm import PackedWeight
from eqsat_llm.codegen.c.packer import pack_in_c
from eqsat_llm.codegen.c.quantizer import quantize_fp8_in_c, quantize_in_c
from eqsat_llm.extraction.machine import cpu_model
from eqsat_llm.formats.quant_formats import format_group, quantize_in_torch

SHAPES = [(5632, 2048), (2048, 5632), (32000, 2048)]  # nn.Linear [N, K]: gate, down, LM head


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def rows_for(n: int, k: int, repeats: int) -> list[tuple[str, str, float, float]]:
    linear = (torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * 0.02).bfloat16()
    w = linear.t()  # [K, N], transposed strides
    gb = w.numel() * 2 / 1e9
    rows = []
    for fmt in ("int8", "int4_g32"):
        group = format_group(fmt)
        c = best(lambda g=group: quantize_in_c(w, g), repeats)
        t = best(lambda f=fmt: quantize_in_torch(w, f), repeats)
        rows.append((f"quantize {fmt}", f"{k}x{n}", gb / c, gb / t))
    c = best(lambda: quantize_fp8_in_c(w, "fp8_e4m3"), repeats)
    t = best(lambda: quantize_in_torch(w, "fp8_e4m3"), repeats)
    rows.append(("quantize fp8_e4m3", f"{k}x{n}", gb / c, gb / t))
    wide = w.float()  # [K, N] float32, transposed strides
    packed = PackedWeight("w", 0, k, n, 1, k)  # the view of the [N, K] constant's flat values
    c = best(lambda: pack_in_c(wide.t(), 0, k, n, 1, k), repeats)
    t = best(lambda: packed.prepare_in_torch(wide.t()), repeats)
    rows.append(("pack fp32 panels", f"{k}x{n}", gb / c, gb / t))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    lines = ["| work | weight [K, N] (transposed bf16) | C GB/s | torch GB/s | C / torch |",
             "|---|---|---|---|---|"]
    for n, k in SHAPES:
        for work, shape, c, t in rows_for(n, k, args.repeats):
            lines.append(f"| {work} | {shape} | {c:.2f} | {t:.2f} | {c / t:.1f}x |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.write:
        head = (f"Command: `.venv/bin/python benchmarks/load_kernels.py {' '.join(sys.argv[1:])}` "
                f"({cpu_model()}, {platform.machine()}, {os.cpu_count()} cores, torch "
                f"{torch.__version__} with {torch.get_num_threads()} threads; best of "
                f"{args.repeats} calls each). The weight's bf16 bytes per second.")
        write_section(head + "\n\n" + table, "## Load-time kernels (benchmarks/load_kernels.py)")


if __name__ == "__main__":
    main()
