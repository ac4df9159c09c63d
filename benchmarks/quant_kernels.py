"""The weight-only quantized GEMM kernel (codegen/c/quant_gemm.py: eq_gemm_q, on the panels
QuantPanels prepares) against the dense packed fp32 kernel (codegen/c/packed_gemm.py:
eq_gemm_packed), and optionally against eq_gemm_q and eq_gemm_packed of an earlier git
revision (--baseline REV: that revision's quant_gemm.py and packed_gemm.py, built into their
own shared object and called with the operands its signature takes: the row-major integers
when it predates the panels), all called from Python through ctypes with the backend's
CFLAGS (2 OpenMP threads). --write SECTION puts the table in benchmarks/RESULTS.md under
"## SECTION" with the command.

    .venv/bin/python benchmarks/quant_kernels.py [--rounds 5] [--calls 21] [--shapes ...]
        [--formats int8 int4_g32] [--baseline HEAD~1] [--flags=-DEQ_QGPF=0]
        [--variants=-DEQ_QGPF=0,-DEQ_QPFL=2] [--write SECTION]

Per shape (M x K x N): each kernel checked against torch on the dequantized weight first.
Timing: rounds interleaved across the kernels; per round `calls` calls, each either cold
(twice the last-level cache read first, flush_bytes(), so the weight comes from memory and
the lines it evicts are clean: decode's case in a model, whose other GEMMs read their
weights; benchmarks/sparse_kernels.py writes
its buffer instead, whose dirty lines' write-back weighs more on a small weight: int8 took
0.30-0.35x fp32's time that way, 0.27-0.32x this way) or warm (back to back), the median per
round, then the median over rounds. GB/s = the weight's stored bytes (integers and scales) per
second. The spread (max / min of the rounds' medians) says the noise; the ratios between
kernels of one round survive it better than the times.

--sequence LAYERS: instead, decode's case as a program meets it: one token's GEMVs of a
TinyLlama-shaped model (per layer QKV 2048 x 2560, O 2048 x 2048, gate and up 2048 x 5632,
down 5632 x 2048), LAYERS layers of distinct weights called one after the other, each weight
read once a round (more bytes than the last-level cache: none is left from the round before),
on 2 MiB pages as a program's weights are (--small-pages: not), per format: the round's GB/s
and the median per shape; with --baseline, that revision's kernel on the same weights, the
two alternated round by round."""

from __future__ import annotations

import argparse
import ast
import ctypes
import datetime
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eqsat_llm.codegen.c.build import CFLAGS, compiler
from eqsat_llm.codegen.c.packed_gemm import PACKED_GEMM_C
from eqsat_llm.codegen.c.prelude import PRELUDE
from eqsat_llm.codegen.c.quant_gemm import QUANT_GEMM_C, QuantPanels, format_code
from eqsat_llm.codegen.c.tiles import PACKED_PANEL as NR
from eqsat_llm.formats.half_formats import WEIGHT_FORMATS as HALF_FORMATS
from eqsat_llm.formats.quant_formats import (
    DYNAMIC4,
    DYNAMIC_STORED,
    coded_blocks,
    format_group,
    quantize,
)
from eqsat_llm.memcheck import collapse_into_huge_pages

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_time import cpu_name, write_section


def flush_bytes() -> int:
    """Twice the last-level cache the OS reports (64 MiB where it reports none): what a cold
    call reads first. A fixed 64 MiB left a weight of a few MB in the 480 MiB L3 of the
    machine of 2026-12-04, and 'cold' figures 1.7x faster than the same GEMVs in a model."""
    caches = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for index in caches.glob("index*"):
        text = (index / "size").read_text().strip() if (index / "size").exists() else ""
        if text[:-1].isdigit() and text[-1] in "KM":
            sizes.append(int(text[:-1]) << (10 if text[-1] == "K" else 20))
    return max(64 << 20, 2 * max(sizes, default=0))


FLUSH_BYTES = flush_bytes()
FLUSH = r"""
#include <stdlib.h>
static char* eq_flush_buf = 0;
static size_t eq_flush_n = 0;
volatile long eq_flush_sum;
/* evict the weights: read n bytes (twice the L3: flush_bytes()), their lines left clean */
void flush(size_t n) {
    if (eq_flush_n < n) {
        free(eq_flush_buf);
        eq_flush_buf = malloc(n);
        memset(eq_flush_buf, 1, n);
        eq_flush_n = n;
    }
    long s = 0;
    for (size_t i = 0; i < n; i += 64) s += eq_flush_buf[i];
    eq_flush_sum = s;
}
void dense(int64_t M, int64_t N, int64_t K, const float* a, const float* bp, float* c) {
    eq_gemm_packed(M, N, K, a, K, bp, c, N, 1.0f, 0, 0, 0, 0, 1);
}
"""
# the panels' signature (no row stride), and the row-major one's (ldw = N)
QGEMM = r"""
void qgemm(int64_t M, int64_t N, int64_t K, const float* a, int fmt, int64_t group,
           const void* wq, const float* s, float* c) {
    eq_gemm_q(M, N, K, a, K, fmt, group, wq, s, c, N, 1.0f, 0, 0, 0, 0, 0, 1);
}
"""
QGEMM_ROWS = r"""
void qgemm(int64_t M, int64_t N, int64_t K, const float* a, int fmt, int64_t group,
           const void* wq, const float* s, float* c) {
    eq_gemm_q(M, N, K, a, K, fmt, group, wq, s, N, c, N, 1.0f, 0, 0, 0, 0, 0, 1);
}
"""

SHAPES = [(1, 2048, 5632), (1, 5632, 2048), (1, 2048, 2560), (1, 2048, 32000)]


def build(source: str, flags: list[str], path: Path) -> ctypes.CDLL:
    path.with_suffix(".c").write_text(source)
    subprocess.run([compiler(), *CFLAGS, *flags, str(path.with_suffix(".c")), "-o", str(path),
                    "-lm"], check=True)
    dll = ctypes.CDLL(str(path))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.dense.argtypes = [i64, i64, i64, ptr, ptr, ptr]
    dll.qgemm.argtypes = [i64, i64, i64, ptr, ctypes.c_int, i64, ptr, ptr, ptr]
    dll.flush.argtypes = [ctypes.c_size_t]
    return dll


def baseline_source(rev: str) -> tuple[str, str]:
    """(the C of eq_gemm_q at git revision rev with its packed GEMM, the layout it reads:
    "rows", "panels", or "panels16": panels with int4's scales as float16)"""
    def show(path: str) -> str | None:
        out = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                             check=False, capture_output=True, text=True)
        return out.stdout if out.returncode == 0 else None

    def module(path: str) -> tuple[dict[str, str], str]:
        """(the module's top-level string constants, its text), read without running it"""
        text = show(path) or ""
        strings = {t.id: node.value.value for node in ast.parse(text).body
                   if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                   for t in node.targets if isinstance(t, ast.Name)}
        return strings, text
    q, text = module("codegen/c/quant_gemm.py")
    # since session 20 the kernels are C files (their activation cases left out: not called)
    packed = show("codegen/c/kernels/packed_gemm.c")
    if packed is not None:  # (since 2026-12-08 each with its header, kernels/<name>.h)
        q["QUANT_GEMM_C"] = (show("codegen/c/kernels/quant_gemm.h") or "") + \
            (show("codegen/c/kernels/quant_gemm.c") or "")
        packed = (show("codegen/c/kernels/packed_gemm.h") or "") + packed
        packed = packed.replace("/*EQ_ACT_CASES*/", "").replace("/*EQ_ACT_LOOPS*/", "")
    else:
        packed = module("codegen/c/packed_gemm.py")[0]["PACKED_GEMM_C"]
    layout = ("panels16" if "def of_scales" in text else "panels") \
        if "class QuantPanels" in text else "rows"
    return (PRELUDE + packed + q["QUANT_GEMM_C"] + FLUSH +
            (QGEMM if layout != "rows" else QGEMM_ROWS), layout)


def operands(fmt: str, k: int, n: int, gen: torch.Generator, layout: str):
    """(q, s) of a random weight in fmt, as the kernel of `layout` reads them, and w
    dequantized."""
    from eqsat_llm.formats.quant_formats import dequantize

    if fmt in HALF_FORMATS:  # the values in panels, no scales (the kernel reads none)
        q = torch.randn(k, n, generator=gen).to(getattr(torch, HALF_FORMATS[fmt]))
        return QuantPanels("q", 0, k, n, n).prepare({"q": q}), torch.zeros(1), q.float()
    q, s = quantize(torch.randn(k, n, generator=gen), fmt)
    w = dequantize(q, s, fmt)
    if layout != "rows":
        group = format_group(fmt)
        q = QuantPanels("q", 0, q.shape[0], n, n).prepare({"q": q})
        rows = 1 if group == 0 else k // group
        s = QuantPanels.of_scales("s", 0, rows, n, n, 1, fmt).prepare({"s": s}) \
            if layout == "panels16" else QuantPanels("s", 0, rows, n, n).prepare({"s": s})
    return q, s, w


def group_of(fmt: str) -> int:
    """eq_gemm_q's group for a format: 0 for per-column scales and for the half formats."""
    return 0 if fmt in HALF_FORMATS else format_group(DYNAMIC_STORED.get(fmt, fmt))


def dense_call(dll, m: int, k: int, n: int, a, bp, c):
    return lambda: dll.dense(m, n, k, a.data_ptr(), bp.data_ptr(), c.data_ptr())


def quant_call(lib, m: int, k: int, n: int, a, code: int, group: int, q, s, c):
    return lambda: lib.qgemm(m, n, k, a.data_ptr(), code, group, q.data_ptr(), s.data_ptr(),
                             c.data_ptr())


def time_round(dll, fn, calls: int, cold: bool) -> float:
    ts = []
    for _ in range(calls):
        if cold:
            dll.flush(FLUSH_BYTES)
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=21)
    p.add_argument("--shapes", nargs="*", help="MxKxN, e.g. 1x2048x5632")
    p.add_argument("--formats", nargs="*", default=["int8", "int4_g32"])
    p.add_argument("--baseline", help="a git revision whose eq_gemm_q runs alongside")
    p.add_argument("--warm", action="store_true", help="warm rounds too at M <= 8")
    p.add_argument("--flags", nargs="*", default=[], action="extend",
                   help="extra compiler flags (this tree's; --flags=-DA --flags=-DB)")
    p.add_argument("--variants", default="",
                   help="this tree's kernel again with each of these flags, comma-separated "
                        "(--variants=-DEQ_QGPF=0,-DEQ_QPFL=2)")
    p.add_argument("--sequence", type=int, metavar="LAYERS",
                   help="a token's GEMVs of LAYERS TinyLlama layers in sequence (docstring)")
    p.add_argument("--small-pages", action="store_true",
                   help="--sequence: leave the weights on 4 KiB pages")
    p.add_argument("--write", metavar="SECTION",
                   help='the table into benchmarks/RESULTS.md under "## SECTION"')
    args = p.parse_args(argv)
    if args.sequence:
        return sequence(args.sequence, args.formats, args.rounds, args.flags,
                        not args.small_pages, args.baseline)
    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes
              else SHAPES)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    load0 = os.getloadavg()[0]
    gen = torch.Generator().manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"": (build(PRELUDE + PACKED_GEMM_C + QUANT_GEMM_C + FLUSH + QGEMM, args.flags,
                           Path(tmp) / "new.so"), "panels16")}
        for i, v in enumerate(x for x in args.variants.split(",") if x):
            libs[f"[{v}] "] = (build(PRELUDE + PACKED_GEMM_C + QUANT_GEMM_C + FLUSH + QGEMM,
                                     args.flags + v.split(), Path(tmp) / f"v{i}.so"),
                                 "panels16")
        if args.baseline:
            src, layout = baseline_source(args.baseline)
            libs[f"{args.baseline} "] = (build(src, [], Path(tmp) / "old.so"), layout)
        dll = libs[""][0]
        for m, k, n in shapes:
            a = torch.randn(m, k, generator=gen)
            c = torch.empty(m, n)
            w = torch.randn(k, n, generator=gen)
            bp = torch.nn.functional.pad(w, (0, -n % NR)).reshape(k, -1, NR).permute(1, 0, 2)
            bp = bp.contiguous()
            fns = {"fp32 packed": dense_call(dll, m, k, n, a, bp, c)}
            nbytes, refs = {"fp32 packed": k * n * 4}, {"fp32 packed": (a, w)}
            if args.baseline:  # (the revision's own packed fp32 kernel beside this tree's)
                name = f"{args.baseline} fp32 packed"
                fns[name] = dense_call(libs[f"{args.baseline} "][0], m, k, n, a, bp, c)
                nbytes[name], refs[name] = k * n * 4, (a, w)
            for fmt in args.formats:
                stored = DYNAMIC_STORED.get(fmt, fmt)  # int4_dynamic: int4_g32's operands
                group = group_of(fmt)
                code = format_code(fmt)
                for tag, (lib, layout) in libs.items():
                    if tag and fmt == DYNAMIC4 and layout != "panels16":
                        continue  # (a revision before int4_dynamic's kernel)
                    q, s, wd = operands(stored, k, n, torch.Generator().manual_seed(k + n),
                                        layout)
                    name = f"{tag}{fmt}"
                    fns[name] = quant_call(lib, m, k, n, a, code, group, q, s, c)
                    nbytes[name] = (2 * k * n if fmt in HALF_FORMATS else
                                    k * n // (1 if group == 0 else 2) +
                                    (n * 4 if group == 0 else k // group * n * s.element_size()))
                    refs[name] = (coded_blocks(a) if fmt == DYNAMIC4 else a, wd)
            for name, fn in fns.items():
                fn()
                err = (c - refs[name][0] @ refs[name][1]).abs().max().item()
                if err > 1e-3 * k ** 0.5:
                    raise AssertionError(f"{name} wrong on {m}x{k}x{n}: max error {err}")
            modes = ((True, False) if args.warm else (True,)) if m <= 8 else (False,)
            for cold in modes:
                samples = {name: [] for name in fns}
                names = list(fns)
                for r in range(args.rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        samples[name].append(time_round(dll, fns[name], args.calls, cold))
                for name, s in samples.items():
                    t = statistics.median(s)
                    rows.append((f"{m}x{k}x{n}", "cold" if cold else "warm", name, t * 1e3,
                                 nbytes[name] / t / 1e9, max(s) / min(s)))
                    print(f"{rows[-1][0]:>15} {rows[-1][1]} {name:>22} {t * 1e3:8.3f} ms "
                          f"{rows[-1][4]:6.1f} GB/s", flush=True)
    lines = [(f"1-minute load {load0:.2f} before, {os.getloadavg()[0]:.2f} after; "
              f"{args.rounds} rounds x {args.calls} calls, median of rounds' medians"), "",
             "| M x K x N | weights | kernel | ms | vs fp32 | GB/s | spread |",
             "|---|---|---|---|---|---|---|"]
    dense = {(r[0], r[1]): r[3] for r in rows if r[2] == "fp32 packed"}
    for shape, mode, name, ms, gbs, spread in rows:
        lines.append(f"| {shape} | {mode} | {name} | {ms:.3f} | {ms / dense[shape, mode]:.2f} | "
                     f"{gbs:.1f} | {spread:.2f} |")
    print("\n" + "\n".join(lines))
    if args.write:
        write_section(_provenance(argv) + "\n\n" + "\n".join(lines), f"## {args.write}")


def _provenance(argv: list[str] | None) -> str:
    """The command and the machine, as the other sections of RESULTS.md give them."""
    isa = os.environ.get("EQSAT_ISA")
    now = datetime.datetime.now(datetime.UTC)
    args = shlex.join(argv if argv is not None else sys.argv[1:])
    return (f"Command: `{'EQSAT_ISA=' + isa + ' ' if isa else ''}.venv/bin/python "
            f"benchmarks/quant_kernels.py {args}` "
            f"({now:%Y-%m-%d %H:%M} UTC, {cpu_name()}, {os.cpu_count()} cores; the C built "
            f"{'with EQSAT_ISA=' + isa if isa else 'for this CPU'}, 2 OpenMP threads). Each "
            "kernel checked against torch first; rounds interleaved across the kernels.")


LAYER_SHAPES = [(2048, 2560), (2048, 2048), (2048, 5632), (2048, 5632), (5632, 2048)]


def sequence(layers: int, formats: list[str], rounds: int, flags: list[str],
             huge: bool, baseline: str | None = None) -> None:
    """--sequence: each format's GEMVs of `layers` layers called in turn, each weight once;
    `huge`: the weights on 2 MiB pages first, as a program's are; `baseline`: that
    revision's kernel too, alternated with this tree's round by round."""
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {"": build(PRELUDE + PACKED_GEMM_C + QUANT_GEMM_C + FLUSH + QGEMM, flags,
                             Path(tmp) / "seq.so")}
        if baseline:
            src, layout = baseline_source(baseline)
            if layout != "panels16":
                raise SystemExit(f"--sequence --baseline: {baseline} reads another layout")
            kernels[f"{baseline} "] = build(src, [], Path(tmp) / "old.so")
        a = {k: torch.randn(1, k) for k in (2048, 5632)}
        c = torch.empty(1, 5632)
        for fmt in formats:
            stored = DYNAMIC_STORED.get(fmt, fmt)
            group = group_of(fmt)
            code = format_code(fmt)
            weights = []
            for layer in range(layers):
                for k, n in LAYER_SHAPES:
                    q, s, _ = operands(stored, k, n, torch.Generator().manual_seed(layer),
                                       "panels16")
                    weights.append(((k, n), q.numel() * q.element_size() +
                                    s.numel() * s.element_size(), q, s))
            if huge:  # as a program's weights lie (memcheck.collapse_in_background)
                collapse_into_huge_pages([t for *_, q, s in weights for t in (q, s)])
            calls = {name: [(shape, quant_call(dll, 1, shape[0], shape[1], a[shape[0]], code,
                                               group, q, s, c)) for shape, _, q, s in weights]
                     for name, dll in kernels.items()}
            per_shape: dict[str, dict[tuple[int, int], list[float]]] = {n: {} for n in calls}
            totals: dict[str, list[float]] = {n: [] for n in calls}
            for _ in range(rounds):
                for name, fns in calls.items():
                    t0 = time.perf_counter()
                    for shape, fn in fns:
                        t = time.perf_counter()
                        fn()
                        per_shape[name].setdefault(shape, []).append(time.perf_counter() - t)
                    totals[name].append(time.perf_counter() - t0)
            nbytes = sum(w[1] for w in weights)
            for name in calls:
                med = statistics.median(totals[name])
                print(f"{name}{fmt}: {len(weights)} GEMVs, {nbytes / 1e6:.0f} MB a round, "
                      f"median {med * 1e3:.2f} ms = {nbytes / med / 1e9:.1f} GB/s")
                for (k, n), ts in per_shape[name].items():
                    b = next(w[1] for w in weights if w[0] == (k, n))
                    t = statistics.median(ts)
                    print(f"    1x{k}x{n}: {b / 1e6:.2f} MB, {t * 1e6:.0f} us, "
                          f"{b / t / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
