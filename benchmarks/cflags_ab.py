"""The compiled programs of reference workloads built with the C backend's CFLAGS with and
without some flags, side by side in one process (rounds interleaved, median ms per call):
what a compiler flag in codegen/c/build.py is worth, or a kernel's macro switch. Outputs are
checked equal first.

    .venv/bin/python benchmarks/cflags_ab.py [--drop=-fno-trapping-math] [--add=-DX]
        [--rounds 9] [--workloads llama_block_prefill llama_block_decode gpt2
        tinyllama_decode] [--write]

The other build is CFLAGS less the --drop flags and with the --add flags (each one argument,
comma-separated). `tinyllama_decode`: one token through a TinyLlama-shaped model of 6 layers
(d 2048, FFN 5632, vocab 32000; 1.3 GB of fp32 weights read a call, more than the
last-level cache); `tinyllama_prefill`: 64 tokens through it (a prefill chunk's GEMMs).
--write puts the table in benchmarks/RESULTS.md ("C compiler flags and kernel switches side
by side", or the section --section names), e.g. the decode GEMV's panels side by side:
`--drop= --add=-DEQ_NO_ROW_PANELS --workloads tinyllama_decode llama_block_decode`."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import interleaved_medians

from eqsat_llm import optimize
from eqsat_llm.codegen.c import build
from eqsat_llm.models.workloads import WORKLOADS


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drop", default="-fno-trapping-math")
    p.add_argument("--add", default="")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--workloads", nargs="+",
                   default=["llama_block_prefill", "llama_block_decode", "gpt2"])
    p.add_argument("--write", action="store_true")
    p.add_argument("--section", help="the RESULTS section --write replaces (default: the "
                   "flags section)")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    drop, add = [f for f in args.drop.split(",") if f], [f for f in args.add.split(",") if f]
    change = " ".join([*(f"-{f}" for f in drop), *(f"+{f}" for f in add)])
    full = list(build.CFLAGS)
    builds = {"CFLAGS": full, f"CFLAGS {change}": [f for f in full if f not in drop] + add}
    runs = {}
    try:
        for name in args.workloads:
            model, inputs = WORKLOADS[name]() if name in WORKLOADS else \
                _tinyllama(64 if name == "tinyllama_prefill" else 1)
            outs = []
            for label, flags in builds.items():
                build.CFLAGS[:] = flags  # (the runtime reads CFLAGS when it builds)
                with warnings.catch_warnings(), torch.no_grad():
                    warnings.simplefilter("ignore")
                    c = optimize(model, inputs, measure_eager=False)
                    outs.append(c(*inputs))
                runs[f"{name}, {label}"] = (lambda c=c, i=inputs: c(*i))
            # the same program up to float rounding (a switch may change the summation order)
            scale = float(outs[0].abs().max())
            torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-5 * max(scale, 1.0))
    finally:
        build.CFLAGS[:] = full
    with torch.no_grad():
        medians = interleaved_medians(runs, args.rounds, 0.3)
    for k, v in medians.items():
        print(f"{k}: {v * 1e3:.3f} ms")
    if args.write:
        _write(args, medians, change)
    return medians


def _tinyllama(tokens: int) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """`tokens` tokens through a TinyLlama-shaped model of 6 layers (the module docstring)."""
    from eqsat_llm.models.model_matrix import Logits, tinyllama

    ids = torch.randint(3, 31000, (1, tokens), generator=torch.Generator().manual_seed(0))
    return Logits(tinyllama(layers=6), "logits").eval(), (ids,)


def _write(args: argparse.Namespace, medians: dict[str, float], change: str) -> None:
    import datetime

    from optimize_time import cpu_name, write_section

    rows = [f"| workload | CFLAGS, ms | CFLAGS {change}, ms | ratio |", "|---|---|---|---|"]
    for name in args.workloads:
        a, b = medians[f"{name}, CFLAGS"], medians[f"{name}, CFLAGS {change}"]
        rows.append(f"| {name} | {a * 1e3:.2f} | {b * 1e3:.2f} | {a / b:.2f} |")
    isa = os.environ.get("EQSAT_ISA")
    head = (f"Command: `{'EQSAT_ISA=' + isa + ' ' if isa else ''}.venv/bin/python "
            f"benchmarks/cflags_ab.py {shlex.join(sys.argv[1:])}` "
            f"({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
            f"{cpu_name()}, 2 threads; {args.rounds} interleaved rounds, median ms a call). "
            "Ratio: CFLAGS' time over the other build's (below 1: CFLAGS faster).")
    write_section(head + "\n\n" + "\n".join(rows), args.section or
                  "## C compiler flags and kernel switches side by side "
                  "(benchmarks/cflags_ab.py)")


if __name__ == "__main__":
    main()
