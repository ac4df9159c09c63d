"""What each fusion buys, measured: every workload optimized twice, with all rules and with
all rules but one fusion's, both checked against eager, then timed side by side. Fusions the
C backend makes on the extracted program (the rope in the Q/K GEMM's epilogue) are measured
the same way: one optimized program, built with and without that fusion.

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
from eqsat_llm.models.workloads import WORKLOADS
from eqsat_llm.rulebook import resolve

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
# (workload, the CRuntime switch, what it fuses): backend fusions, no rule involved
BACKEND_CASES = [
    ("llama_block_prefill", "fuse_rope", "rope in the Q/K GEMM's epilogue"),
    ("llama_block_decode", "fuse_rope", "rope in the Q/K GEMM's epilogue"),
    ("llama", "fuse_rope", "rope in the Q/K GEMM's epilogue"),
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


def measure_backend(workload: str, switch: str, rounds: int) -> tuple[float, float, str]:
    """One optimized program, its C runtime built with the switch on and off."""
    from eqsat_llm.codegen.c import CRuntime

    model, inputs = WORKLOADS[workload]()
    graph = optimize(model, inputs, measure_eager=False).graph
    with torch.no_grad():
        want = model(*inputs)
    want = want[0] if isinstance(want, tuple) else want
    ins = list(inputs)
    built = {}
    for name, on in (("with", True), ("without", False)):
        rt = CRuntime(graph, **{switch: on})
        err = float((next(iter(rt.run(ins))) - want).abs().max())
        if err > 1e-5:
            raise AssertionError(f"{workload} {name} {switch}: error {err}")
        built[name] = rt
    moved = sum(len(k.epilogue) for k in built["with"].program.kernels)
    t = interleaved_medians({n: (lambda r=r: r.run(ins)) for n, r in built.items()}, rounds,
                            CALLS_S)
    return t["with"] * 1e3, t["without"] * 1e3, f"{moved} kernels fewer"


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
    for workload, switch, what in BACKEND_CASES:
        on, off, ops = measure_backend(workload, switch, args.rounds)
        rows.append(f"| {workload} | {what} (C backend, `{switch}`) | {ops} | {off:.3f} | "
                    f"{on:.3f} | {on / off:.2f} |")
        print(rows[-1], flush=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/fusions.py --write` ({stamp}, "
            f"2 threads, C backend; 1-minute load {load0:.2f} before, {os.getloadavg()[0]:.2f} "
            f"after). Each workload optimized with all rules and with all but the named ones "
            f"(rules whose names start so), both within 1e-5 of eager; backend fusions: one "
            f"program built with the switch on and off (time of the C runtime's call); "
            f"{args.rounds} interleaved rounds, 60 ms of untimed calls before each, median ms "
            "per call.\n\n"
            "| workload | fusion (rules) | ops only with it (or kernels fewer) | without, ms "
            "| with, ms | ratio |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows))
    if args.write:
        write_section(text, SECTION)
    print(text)


if __name__ == "__main__":
    main()
