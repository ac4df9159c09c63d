"""The compiled programs of reference workloads built with the C backend's CFLAGS with and
without some flags, side by side in one process (rounds interleaved, median ms per call):
what a compiler flag in codegen/c/build.py is worth. Outputs are checked equal first.

    .venv/bin/python benchmarks/cflags_ab.py [--drop=-fno-trapping-math] [--rounds 9]
        [--workloads llama_block_prefill llama_block_decode gpt2]

The "without" build is CFLAGS less the --drop flags (one argument, comma-separated)."""

from __future__ import annotations

import argparse
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
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--workloads", nargs="+",
                   default=["llama_block_prefill", "llama_block_decode", "gpt2"])
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    drop = args.drop.split(",")
    full = list(build.CFLAGS)
    builds = {"with": full, "without": [f for f in full if f not in drop]}
    runs = {}
    try:
        for name in args.workloads:
            model, inputs = WORKLOADS[name]()
            outs = []
            for label, flags in builds.items():
                build.CFLAGS[:] = flags  # (the runtime reads CFLAGS when it builds)
                with warnings.catch_warnings(), torch.no_grad():
                    warnings.simplefilter("ignore")
                    c = optimize(model, inputs, measure_eager=False)
                    outs.append(c(*inputs))
                runs[f"{name}, {label} {args.drop}"] = (lambda c=c, i=inputs: c(*i))
            torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    finally:
        build.CFLAGS[:] = full
    with torch.no_grad():
        medians = interleaved_medians(runs, args.rounds, 0.3)
    for k, v in medians.items():
        print(f"{k}: {v * 1e3:.3f} ms")
    return medians


if __name__ == "__main__":
    main()
