"""What gcc spends on a quantized program's C: the LLaMA block's programs (decode and
prefill, per weight format) compiled as the backend emits them (the GEMV tiles of their own
formats only: `#define EQ_QFMT_<code>`, quant_gemm.format_library) and with those defines
taken out (every format's tiles, as before), best of --rounds compiles each.

    .venv/bin/python benchmarks/compile_time.py [--formats int8 int4 fp8] [--rounds 3] [--write]

--write puts the table in benchmarks/RESULTS.md ("C compile time of quantized programs")."""

from __future__ import annotations

import argparse
import datetime
import re
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_time import cpu_name, write_section

from eqsat_llm import optimize
from eqsat_llm.codegen.c.build import CFLAGS, compiler
from eqsat_llm.models.workloads import llama_block_case

FORMAT_DEFINE = re.compile(r"#define EQ_QFMT_\d+ 1\n")


def compile_seconds(source: str, rounds: int) -> float:
    """The best of `rounds` compiles of `source` with the backend's compiler and CFLAGS."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "m.c", Path(tmp) / "m.so"
        src.write_text(source)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            subprocess.run([compiler(), *CFLAGS, str(src), "-o", str(out), "-lm"], check=True)
            best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> list[tuple[str, str, float, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", nargs="+", default=["int8", "int4", "fp8"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for fmt in args.formats:
        for case in ("decode", "prefill"):
            model, inputs = llama_block_case(case)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                source = optimize(model, inputs, quantize=fmt,
                                  measure_eager=False)._runtime.source
            own = compile_seconds(source, args.rounds)
            every = compile_seconds(FORMAT_DEFINE.sub("", source), args.rounds)
            rows.append((fmt, case, own, every))
            print(f"{fmt} {case}: its formats {own:.2f} s, every format {every:.2f} s")
    if args.write:
        table = ["| format | program | its formats' tiles, s | every format's, s |",
                 "|---|---|---|---|"]
        table += [f"| {f} | {c} | {a:.2f} | {b:.2f} |" for f, c, a, b in rows]
        now = datetime.datetime.now(datetime.UTC)
        head = (f"Command: `.venv/bin/python benchmarks/compile_time.py "
                f"{shlex.join(sys.argv[1:])}` ({now:%Y-%m-%d %H:%M} UTC, {cpu_name()}; gcc "
                f"with the backend's CFLAGS, best of {args.rounds} compiles). The LLaMA "
                "block's quantized programs.")
        write_section(head + "\n\n" + "\n".join(table),
                      "## C compile time of quantized programs (benchmarks/compile_time.py)")
    return rows


if __name__ == "__main__":
    main()
