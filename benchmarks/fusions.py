"""What each fusion rule buys, measured: every workload optimized twice, with all rules and
with all rules but one fusion's, both checked against eager, then timed side by side.

    .venv/bin/python benchmarks/fusions.py [--write] [--rounds 9]

One process, C backend, 2 threads; interleaved rounds with `settle` before each (as
compare_cpu.py), median ms per call. A ratio < 1: the fusion makes the forward faster."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import interleaved_medians
from optimize_time import write_section

from eqsat_llm import optimize
from eqsat_llm.rulebook import resolve
from eqsat_llm.workloads import WORKLOADS

SECTION = "## Fusions, each against the program without it"
# (workload, the fusion's rules by name prefix, what it fuses)
CASES = [
    ("llama_block_prefill", ("matmul-swiglu",), "gate/up GEMM + SwiGLU on its tiles"),
    ("llama_block_decode", ("matmul-swiglu",), "gate/up GEMM + SwiGLU on its tiles"),
    ("llama_block_prefill", ("rms-norm-matmul",), "RMSNorm + the matmul it feeds"),
    ("llama_block_decode", ("rms-norm-matmul",), "RMSNorm + the matmul it feeds"),
    ("llama_block_prefill", ("matmul-add", "add-matmul"), "residual add in the GEMM epilogue"),
    ("gpt2", ("addmm-",), "linear + bias + activation"),
]
CALLS_S = 0.1


def measure(workload: str, prefixes: tuple[str, ...], rounds: int) -> tuple[float, float, str]:
    model, inputs = WORKLOADS[workload]()
    every = resolve(None)
    without = [r for r in every if not r.name.startswith(prefixes)]
    with torch.no_grad():
        want = model(*inputs)
    want = want[0] if isinstance(want, tuple) else want
    built = {}
    for name, rules in (("with", every), ("without", without)):
        compiled = optimize(model, inputs, rules=rules, measure_eager=False)
        got = compiled(*inputs)
        got = got[0] if isinstance(got, tuple) else got
        err = float((got - want).abs().max())
        if err > 1e-5:
            raise AssertionError(f"{workload} {name} {prefixes}: error {err}")
        built[name] = (compiled, sum(compiled.graph.op_counts().values()))
    fused = {o for o in built["with"][0].graph.op_counts()} - {
        o for o in built["without"][0].graph.op_counts()}
    ins = list(inputs)
    t = interleaved_medians({n: (lambda c=c: c(*ins)) for n, (c, _) in built.items()},
                            rounds, CALLS_S)
    return t["with"] * 1e3, t["without"] * 1e3, ", ".join(sorted(fused)) or "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    load0 = os.getloadavg()[0]
    rows = []
    for workload, prefixes, what in CASES:
        on, off, ops = measure(workload, prefixes, args.rounds)
        rows.append(f"| {workload} | {what} (`{'`, `'.join(prefixes)}`) | {ops} | {off:.3f} | "
                    f"{on:.3f} | {on / off:.2f} |")
        print(rows[-1], flush=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/fusions.py --write` ({stamp}, "
            f"2 threads, C backend; 1-minute load {load0:.2f} before, {os.getloadavg()[0]:.2f} "
            f"after). Each workload optimized with all rules and with all but the named ones "
            f"(rules whose names start so), both within 1e-5 of eager; {args.rounds} "
            "interleaved rounds, 60 ms of untimed calls before each, median ms per call.\n\n"
            "| workload | fusion (rules) | ops only with it | without, ms | with, ms | ratio |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows))
    if args.write:
        write_section(text, SECTION)
    print(text)


if __name__ == "__main__":
    main()
