"""What gcc spends on a quantized program's C: the LLaMA block's programs (decode and
prefill, per weight format) compiled as the backend builds them (the libraries' headers only,
linked against the shared kernel library: codegen/c/kernel_library.py), and as a standalone
project's whole text (the libraries included: the GEMV tiles of the program's own formats,
`#define EQ_QFMT_<code>`, then with those defines taken out, every format's), best of
--rounds compiles each; and the shared kernel library's own compile, made once per flag set.

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
from eqsat_llm.codegen.c.build import CFLAGS, compiler, kernel_library_for
from eqsat_llm.codegen.c.emit import emit_program
from eqsat_llm.codegen.c.kernel_library import SOURCE as LIBRARY_SOURCE
from eqsat_llm.models.workloads import llama_block_case

FORMAT_DEFINE = re.compile(r"#define EQ_QFMT_\d+ 1\n")


def compile_seconds(source: str, rounds: int, flags: list[str], link: list[str] = ()) -> float:
    """The best of `rounds` compiles of `source` with the backend's compiler and `flags`."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "m.c", Path(tmp) / "m.so"
        src.write_text(source)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            subprocess.run([compiler(), *flags, str(src), "-o", str(out), *link, "-lm"],
                           check=True)
            best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> list[tuple[str, str, float, float, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", nargs="+", default=["int8", "int4", "fp8"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    lib, lib_path = kernel_library_for(list(CFLAGS))
    library = compile_seconds(LIBRARY_SOURCE, args.rounds, lib.flags)
    print(f"the shared kernel library: {library:.2f} s")
    linked_flags = [*CFLAGS, *lib.program_defines()]
    link = lib.link_flags(lib_path)  # (the library the first optimize below puts there)
    rows = []
    for fmt in args.formats:
        for case in ("decode", "prefill"):
            model, inputs = llama_block_case(case)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rt = optimize(model, inputs, quantize=fmt, measure_eager=False)._runtime
            assert rt.program.linked, "the backend's program calls the shared library"
            linked = compile_seconds(rt.source, args.rounds, linked_flags, link)
            whole = emit_program(rt.graph, rt.plan, blas=rt.uses_blas).source
            own = compile_seconds(whole, args.rounds, list(CFLAGS))
            every = compile_seconds(FORMAT_DEFINE.sub("", whole), args.rounds, list(CFLAGS))
            rows.append((fmt, case, linked, own, every))
            print(f"{fmt} {case}: linked {linked:.2f} s; whole text, its formats {own:.2f} s, "
                  f"every format {every:.2f} s")
    if args.write:
        table = [("| format | program | linked to the shared library, s | whole text, its "
                  "formats' tiles, s | whole text, every format's, s |"), "|---|---|---|---|---|"]
        table += [f"| {f} | {c} | {a:.2f} | {b:.2f} | {d:.2f} |" for f, c, a, b, d in rows]
        now = datetime.datetime.now(datetime.UTC)
        head = (f"Command: `.venv/bin/python benchmarks/compile_time.py "
                f"{shlex.join(sys.argv[1:])}` ({now:%Y-%m-%d %H:%M} UTC, {cpu_name()}; gcc "
                f"with the backend's CFLAGS, best of {args.rounds} compiles). The LLaMA "
                f"block's quantized programs. The shared kernel library itself: {library:.2f} "
                "s, once per flag set.")
        write_section(head + "\n\n" + "\n".join(table),
                      "## C compile time of quantized programs (benchmarks/compile_time.py)")
    return rows


if __name__ == "__main__":
    main()
