"""Optimization time per phase for the LLaMA-style block stacked 1..32 deep (prefill 1x16).

    .venv/bin/python benchmarks/optimize_time.py [--depths 1 2 4 8 16 32] [--write]

Prints one row per depth; with --write, replaces the section in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from eqsat_llm import optimize
from eqsat_llm.models.workloads import stacked_llama_blocks

PHASES = ("capture", "encode", "saturate", "serialize", "extract", "decode", "fold", "plan",
          "codegen")
SECTION = "## Optimization time, stacked LLaMA-style blocks"


def measure(depth: int) -> dict[str, float]:
    model = stacked_llama_blocks(depth).eval()
    x = torch.randn(1, 16, 512, generator=torch.Generator().manual_seed(0))
    t = time.perf_counter()
    compiled = optimize(model, (x,), measure_eager=False)
    total = time.perf_counter() - t
    with torch.no_grad():
        err = (compiled(x) - model(x)).abs().max().item()
    r = compiled.report
    return {"depth": depth, "total": total, **{p: r.timings.get(p, 0.0) for p in PHASES},
            "ops_before": sum(r.op_counts_before.values()),
            "ops_after": sum(r.op_counts_after.values()), "iterations": r.iterations,
            "stop": r.stop_reason, "enodes": r.enodes, "max_err": err}


def table(rows: list[dict]) -> str:
    head = ("| depth | ops before -> after | e-nodes | iterations (stop) | "
            + " | ".join(f"{p} s" for p in PHASES) + " | total s | max err |")
    sep = "|" + "---|" * (head.count("|") - 1)
    lines = [head, sep]
    for r in rows:
        lines.append(f"| {r['depth']} | {r['ops_before']} -> {r['ops_after']} | {r['enodes']} | "
                     f"{r['iterations']} ({r['stop']}) | "
                     + " | ".join(f"{r[p]:.2f}" for p in PHASES)
                     + f" | {r['total']:.2f} | {r['max_err']:.1e} |")
    return "\n".join(lines)


def cpu_name() -> str:
    """The CPU's model name and its widest vector ISA, with VNNI and BF16 where it has them
    (/proc/cpuinfo): what a RESULTS.md heading says a figure ran on."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.platform()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), platform.processor())
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                      if ln.startswith("flags")), []))
    if "avx512f" in flags:
        isa = " ".join(["AVX-512"] + [n for f, n in (("avx512_vnni", "VNNI"),
                                                     ("avx512_bf16", "BF16")) if f in flags])
    else:
        isa = "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {isa}"


def write_section(text: str, section: str = SECTION) -> None:
    """Replace the section titled `section` in benchmarks/RESULTS.md where it stands (its
    reading too: a new run's figures need a new one), or append it; `text` is its body, the
    heading line included or not."""
    if not text.startswith(section):
        text = f"{section}\n\n{text}"
    path = Path(__file__).with_name("RESULTS.md")
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if section in old:
        start = old.index(section)
        nxt = old.find("\n## ", start + len(section))
        rest = old[nxt + 1:] if nxt != -1 else ""
        path.write_text(old[:start] + text.rstrip() + "\n" + ("\n" + rest if rest else ""))
        return
    path.write_text(old.rstrip() + "\n\n" + text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    for d in args.depths:
        rows.append(measure(d))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/optimize_time.py --write` "
            f"({platform.machine()}, {torch.get_num_threads()} threads, torch "
            f"{torch.__version__}; defaults: all rule families, ILP extraction, C backend). "
            "Capture is torch.export + core-aten decompositions; codegen includes the C "
            "compile (uncached on the first run of a program).\n\n"
            + table(rows))
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
