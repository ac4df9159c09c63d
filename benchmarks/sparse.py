"""Sparse weights (optimize(sparsity="auto")) against the same pruned model compiled dense, on
the LLaMA-style block's decode step with a KV cache (WORKLOADS["llama_block_decode_kv"]) and
the TinyLlama-shaped model (benchmarks/models.py: 4 of its 22 layers, with its embedding and
LM head): one token and a 1 x 128 prefill, as plain forward calls.

    .venv/bin/python benchmarks/sparse.py [--rounds 7] [--write] [--quick]

Each nn.Linear weight is pruned two ways: 2:4 along K (the 2 smallest of every 4 inputs of an
output channel zeroed), and half of its 16 x 16 blocks zeroed (drawn at random: a stand-in for
block pruning). For each pruned model: eager, eqsat-llm without sparsity (dense kernels) and
with sparsity="auto" (the cost model picks the sparse kernel where it pays). One process, 2
threads; outputs checked against eager first; interleaved rounds, median ms per call
(compare_cpu.interleaved_medians). The weight bytes are the GEMMs' (values and positions for a
sparse weight): the decode step reads each once."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized import errors_and_medians, parse_args, weight_bytes, write_results

from eqsat_llm import optimize
from eqsat_llm.formats.pruning import prune_2_4, prune_blocks, prune_linears
from eqsat_llm.models.workloads import WORKLOADS

SECTION = "## Sparse weights: 2:4 and 16x16 blocks against the same model dense"


PRUNINGS = {"2:4": prune_2_4, "50% zero blocks": prune_blocks}


def measure(name: str, model: nn.Module, inputs: tuple, rounds: int) -> list:
    with torch.no_grad():
        want = model(*inputs)
    want = want[0] if isinstance(want, (tuple, list)) else want
    runs, weights, notes = {"eager": lambda: model(*inputs)}, {}, {}
    for label, mode in (("eqsat dense", None), ("eqsat sparsity=auto", "auto")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = optimize(model, inputs, sparsity=mode, measure_eager=False)
        runs[label] = (lambda c=c: c(*inputs))
        weights[label] = weight_bytes(c)
        notes[label] = ", ".join(f"{n} {fmt}" for fmt, n in c.report.sparse_gemms.items()) + (
            f"; ran in torch: {c.report.torch_ops}" if c.report.torch_ops else "")
    errors, medians = errors_and_medians(runs, want, rounds)
    return [(name, k, medians[k] * 1e3, errors[k], weights.get(k), notes.get(k, ""))
            for k in runs]


def table(rows: list) -> str:
    head = ("| workload | pruning | system | ms per call | vs eqsat dense | max error / max output "
            "| GEMM weight MiB | GB/s of weights | sparse GEMMs |")
    lines = [head, "|" + "---|" * 9]
    by = {(r[0], r[1]): r[2] for r in rows}
    for name, k, ms, err, wb, note in rows:
        workload, pruning = name.rsplit(", ", 1)  # (the pruning is named last)
        dense = by[(name, "eqsat dense")]
        bw = f"{wb / ms / 1e6:.1f}" if wb else "-"
        lines.append(f"| {workload} | {pruning} | {k} | {ms:.3f} | {ms / dense:.2f} | {err:.1e} | "
                     f"{f'{wb / 2**20:.1f}' if wb else '-'} | {bw} | {note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args, load_ok = parse_args(argv, __doc__)
    from models import build_tinyllama

    tiny = f"TinyLlama 4 layers{' (quick)' if args.quick else ''}"
    prefill = 8 if args.quick else 128
    cases = {"LLaMA-style block, decode with KV cache": WORKLOADS["llama_block_decode_kv"],
             f"{tiny}, one token": lambda: build_tinyllama(1, args.quick),
             f"{tiny}, prefill 1x{prefill}": lambda: build_tinyllama(prefill, args.quick)}
    rows = []
    for name, make in cases.items():
        for pruning, how in PRUNINGS.items():
            print(f"{name}, {pruning} ...", flush=True)
            model, inputs = make()
            rows += measure(f"{name}, {pruning}", prune_linears(model, how), inputs, args.rounds)
    text = table(rows)
    print(text)
    if args.write:
        write_results("sparse.py", argv, text, load_ok, SECTION)

if __name__ == "__main__":
    main()
