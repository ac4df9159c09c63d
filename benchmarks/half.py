"""Half-precision models: a bf16 / fp16 TinyLlama-shaped model (benchmarks/models.py: 4 of its
22 layers, with its embedding and LM head) compiled to C, its GEMM weights held in the
model's dtype (rules/half_weights.py, widened in registers by eq_gemm_q) against the same
program with its weights widened to float32 at compile time (the half-weights family left
out: what the C backend did before), eager PyTorch in the model's dtype, and the float32
model (eager and eqsat-llm): one token (a forward of one position: every weight read once)
and a 1 x 128 prefill, plain forward calls.

    .venv/bin/python benchmarks/half.py [--rounds 7] [--write] [--quick]

One process, 2 threads, interleaved rounds, median ms per call. Error: the max difference
from eager in the system's own dtype (eager fp32 for the float32 systems), relative to its
largest output."""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import interleaved_medians
from quantized import ROUND_S, parse_args, tinyllama_cases, weight_bytes, write_results

from eqsat_llm import optimize, rulebook

SECTION = "## Half-precision models: GEMM weights kept bf16 / fp16"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def systems(model: torch.nn.Module, inputs: tuple) -> tuple[dict, dict, dict]:
    """The calls to time by label, the eager reference each is checked against, and the GEMM
    weight bytes of the compiled ones."""
    widened = [f for f in rulebook.load_library() if not rulebook.opt_in(f)
               and f != "half-weights"]
    runs, ref, weights = {"eager fp32": lambda: model(*inputs)}, {}, {}
    models = {"fp32": model, **{k: copy.deepcopy(model).to(dt) for k, dt in DTYPES.items()}}
    for label, m in models.items():
        if label != "fp32":
            runs[f"eager {label}"] = (lambda m=m: m(*inputs))
        variants = {f"eqsat {label}": None}
        if label == "bf16":
            variants["eqsat bf16, weights widened"] = widened
        for name, rules in variants.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c = optimize(m, inputs, rules=rules, measure_eager=False)
            runs[name], weights[name] = (lambda c=c: c(*inputs)), weight_bytes(c)
        for name in (f"eager {label}", *variants):
            ref[name] = f"eager {label}"
    ref["eager fp32"] = "eager fp32"
    return runs, ref, weights


def measure(name: str, model: torch.nn.Module, inputs: tuple, rounds: int) -> list:
    runs, ref, weights = systems(model, inputs)
    with torch.no_grad():
        outs = {k: fn().float() for k, fn in runs.items()}
        medians = interleaved_medians({k: (lambda f=f: torch.no_grad()(f)()) for k, f in
                                       runs.items()}, rounds, ROUND_S)
    rows = []
    for k in runs:
        want = outs[ref[k]]
        err = float((outs[k] - want).abs().max() / want.abs().max())
        rows.append((name, k, medians[k] * 1e3, err, weights.get(k)))
    return rows


def table(rows: list) -> str:
    lines = [("| workload | system | ms per call | vs eqsat fp32 | vs eager in its dtype | max "
              "error / max output | GEMM weight MiB | GB/s of weights |"), "|" + "---|" * 8]
    by = {(r[0], r[1]): r[2] for r in rows}
    for name, k, ms, err, wb in rows:
        eager = by[(name, "eager " + k.split()[1].rstrip(","))]
        bw = f"{wb / ms / 1e6:.1f}" if wb else "-"
        lines.append(f"| {name} | {k} | {ms:.3f} | {ms / by[(name, 'eqsat fp32')]:.2f} | "
                     f"{ms / eager:.2f} | {err:.1e} | "
                     f"{f'{wb / 2**20:.1f}' if wb else '-'} | {bw} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list:
    args, load_ok = parse_args(argv, __doc__)
    rows = []
    for name, (model, inputs) in tinyllama_cases(args.quick).items():
        print(f"{name} ...", flush=True)
        rows += measure(name, model, inputs, args.rounds)
    text = table(rows)
    print(text)
    if args.write:
        write_results("half.py", argv, text, load_ok, SECTION)
    return rows


if __name__ == "__main__":
    main()
