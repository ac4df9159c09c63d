"""Saturation limits under an explosive rule set: the opt-in associativity/commutativity family
(`algebra-ac`) with the library's rules on the LLaMA-style block stacked 32 deep. The optimizer
must stop at a limit with a correct program, in about the time limit, not run away.

    .venv/bin/python benchmarks/limits.py [--depth 32] [--write]

Prints the stop reason, the e-graph size after each round, time per phase, peak RSS and the
error against eager; with --write, replaces the section in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import torch

from eqsat_llm import Limits, optimize
from eqsat_llm.models.workloads import StackedLlamaBlocks

SECTION = "## Saturation limits under an explosive rule set"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = StackedLlamaBlocks(args.depth, d_model=64, n_heads=4, ffn=128).eval()
    x = torch.randn(1, 8, 64)
    limits = Limits()
    start = time.perf_counter()
    compiled = optimize(model, (x,), rules=["all", "algebra-ac"], limits=limits,
                        measure_eager=False, progress=print)
    total = time.perf_counter() - start
    with torch.no_grad():
        err = (compiled(x) - model(x)).abs().max().item()
    r = compiled.report
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    text = "\n".join([
        (f"Command: `.venv/bin/python benchmarks/limits.py --depth {args.depth} --write` "
        f"({platform.machine()}, torch {torch.__version__}). The block at d=64, 4 heads, FFN "
        f"128, prefill 1x8; rules: the library's and `algebra-ac`; limits: the defaults "
        f"({limits.iterations} rounds, {limits.enodes:,} e-graph entries, "
        f"{limits.seconds:g} s, {limits.memory_mb:g} MB)."), "",
        (f"- stopped: **{r.stop_reason}** after {r.iterations} rounds; e-graph entries per "
        f"round: {', '.join(f'{n:,}' for n in r.egraph_size_per_iteration)}"),
        f"- time: {total:.1f} s in all; " + ", ".join(
            f"{k} {v:.1f} s" for k, v in r.timings.items() if v >= 0.05),
        f"- peak RSS {peak_mb:,.0f} MB; max |optimized - eager| = {err:.1e}"])
    print(text)
    if args.write:
        from optimize_time import write_section
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
