"""Weight-only quantization side by side with ONNX Runtime's quantize_dynamic int8,
on the LLaMA-style block's decode step with a KV cache (WORKLOADS["llama_block_decode_kv"])
and on the TinyLlama-shaped model (benchmarks/models.py: 4 of its 22 layers, with its
embedding and LM head): one token (a forward of one position: every weight read once) and a
1 x 128 prefill, all as plain forward calls. (Generation with a KV cache, quantized:
benchmarks/generate.py --systems all.)

    .venv/bin/python benchmarks/quantized.py [--rounds 7] [--write] [--quick]

Systems: eager fp32, ONNX Runtime fp32 and int8 (the same export through
onnxruntime.quantization.quantize_dynamic with its defaults: int8 weights, activations
quantized per call), eqsat-llm fp32, int8, fp8, int4 (int4_g32) and int8_dynamic (int8 weights,
activations coded per row where the integer product pays: prefill). One process, 2 threads; outputs
checked against eager first (the quantized systems' error is reported, not a pass/fail);
interleaved rounds, median ms per call (compare_cpu.interleaved_medians). The rows name the
GEMMs' bytes: the decode step reads every weight once, so its time over the weight bytes is
the bandwidth it reached."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import add_write_options, interleaved_medians, ort_runner, wait_for_load
from optimize_time import cpu_name, write_section

from eqsat_llm import optimize
from eqsat_llm.models.workloads import WORKLOADS

SECTION = "## Quantized weights: eqsat-llm int8 / int4 against ONNX Runtime int8"
ROUND_S = 0.3


def tinyllama_cases(quick: bool) -> dict[str, tuple[torch.nn.Module, tuple]]:
    """TinyLlama's shape (4 of 22 layers, d=2048, FFN 5632, 32 heads / 4 KV) as the model
    of benchmarks/models.py: one token, and a 128-token prefill."""
    from models import build_tinyllama

    out = {}
    for seq in (1, 8 if quick else 128):
        model, inputs = build_tinyllama(seq=seq, quick=quick)
        label = "one token" if seq == 1 else f"prefill 1x{seq}"
        out[f"TinyLlama 4 layers{' (quick)' if quick else ''}, {label}"] = (model, inputs)
    return out


def ort_systems(model: torch.nn.Module, inputs: tuple, tmp: Path, name: str) -> dict:
    from onnxruntime.quantization import quantize_dynamic

    path = tmp / f"{name}.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True)
    qpath = tmp / f"{name}.int8.onnx"
    quantize_dynamic(str(path), str(qpath))
    return {"ort fp32": ort_runner(path, len(inputs)), "ort int8": ort_runner(qpath, len(inputs))}


def weight_bytes(compiled) -> int:
    """The bytes of the constant GEMM weights (and their scales or positions) of a program."""
    g = compiled.graph
    return sum(g.constants[g.node(i).attrs["name"]].nbytes
               for n in g.nodes if n.op in ("gemm", "matmul")
               and g.node(n.inputs[1]).op == "const" for i in n.inputs[1:3]
               if g.node(i).op == "const")


def measure(name: str, model: torch.nn.Module, inputs: tuple, rounds: int, tmp: Path) -> list:
    with torch.no_grad():
        want = model(*inputs)
    want = want[0] if isinstance(want, (tuple, list)) else want
    runs, notes = {"eager fp32": lambda: model(*inputs)}, {}
    try:
        for k, run in ort_systems(model, inputs, tmp, name.split()[0].lower()).items():
            runs[k] = (lambda r=run: r(inputs))
    except Exception as exc:  # noqa: BLE001 - a row says why
        notes["ort"] = f"ONNX Runtime failed: {str(exc)[:200]}"
    weights = {}
    for q in (None, "int8", "fp8", "int4", "int8_dynamic"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = optimize(model, inputs, quantize=q, measure_eager=False)
        label = f"eqsat {q or 'fp32'}"
        runs[label] = (lambda c=c: c(*inputs))
        weights[label] = weight_bytes(c)
        notes[label] = f"backend {c.report.backend}" + (
            f", ran in torch: {c.report.torch_ops}" if c.report.torch_ops else "")
    errors, medians = errors_and_medians(runs, want, rounds)
    rows = []
    for k in runs:
        ms = medians[k] * 1e3
        wb = weights.get(k)
        bw = f"{wb / medians[k] / 1e9:.1f}" if wb else "-"
        rows.append((name, k, ms, errors[k], wb, bw, notes.get(k, "")))
    return rows


def errors_and_medians(runs: dict, want: torch.Tensor, rounds: int) -> tuple[dict, dict]:
    """Each system's max error relative to the largest eager output (its first output), then
    the median seconds per call over interleaved rounds."""
    errors = {}
    with torch.no_grad():
        for k, fn in runs.items():
            got = fn()
            got = got[0] if isinstance(got, (tuple, list)) else got
            errors[k] = float((got - want).abs().max() / want.abs().max())
        calls = {k: (lambda f=f: torch.no_grad()(f)()) for k, f in runs.items()}
        medians = interleaved_medians(calls, rounds, ROUND_S)
    return errors, medians


def table(rows: list) -> str:
    head = ("| workload | system | ms per call | vs eqsat fp32 | vs ort int8 | max error / max "
            "output | GEMM weight MiB | GB/s of weights |")
    lines = [head, "|" + "---|" * 8]
    by = {(r[0], r[1]): r[2] for r in rows}
    for name, k, ms, err, wb, bw, note in rows:
        fp = by.get((name, "eqsat fp32"))
        ort = by.get((name, "ort int8"))
        lines.append(f"| {name} | {k} | {ms:.3f} | {ms / fp:.2f} | "
                     f"{f'{ms / ort:.2f}' if ort else '-'} | {err:.2e} | "
                     f"{f'{wb / 2**20:.1f}' if wb else '-'} | {bw} |"
                     + (f" {note}" if note and 'torch' in note else ""))
    return "\n".join(lines)


def parse_args(argv: list[str] | None, doc: str) -> tuple[argparse.Namespace, bool]:
    """--rounds, --quick and the write options; 2 threads; with --write, wait for a quiet
    machine (the bool: whether it was quiet). Shared with benchmarks/sparse.py."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="scaled-down TinyLlama, 1 round")
    add_write_options(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 1
    torch.set_num_threads(2)
    return args, wait_for_load(args.max_load, args.wait_load) if args.write else True


def write_results(script: str, argv: list[str] | None, text: str, load_ok: bool,
                  section: str) -> None:
    """The table `text` as RESULTS.md's `section`, with the date and the command."""
    cmd = f"    .venv/bin/python benchmarks/{script} " + " ".join(argv or sys.argv[1:])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = (f"{when}, {cpu_name()}, 2 threads, torch {torch.__version__}"
            f"{'' if load_ok else ' (the machine was busy: load above --max-load)'}:\n\n"
            f"{cmd}\n\n{text}\n")
    write_section(body, section)


def main(argv: list[str] | None = None) -> None:
    args, load_ok = parse_args(argv, __doc__)
    cases = {"LLaMA-style block, decode with KV cache": WORKLOADS["llama_block_decode_kv"](),
             **tinyllama_cases(args.quick)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, inputs) in cases.items():
            print(f"{name} ...", flush=True)
            rows += measure(name, model, inputs, args.rounds, Path(tmp))
    text = table(rows)
    print(text)
    if args.write and not any(r[1] == "ort int8" for r in rows):
        raise SystemExit("not written: ONNX Runtime, the peer these rows are measured against, "
                         "did not run (the bench extra: pip install -e '.[bench]')")
    if args.write:
        write_results("quantized.py", argv, text, load_ok, SECTION)


if __name__ == "__main__":
    main()
