"""GPU: eqsat-llm's Triton backend against eager PyTorch and torch.compile (inductor, modes
"default" and "max-autotune-no-cudagraphs"), side by side in one process.

    python benchmarks/gpu.py [--rounds 20] [--dtype bfloat16] [--write]   # on a CUDA machine
    python benchmarks/gpu.py --quick                      # tiny bf16 shapes, any machine

Rows: the LLaMA-style block (workloads.LlamaBlock) at d=4096, 32 heads (8 KV heads), FFN
14336: prefill 1 x 2048, and decode of one token with a KV cache of 2048 passed as inputs;
and the TinyLlama-shaped model of the generation benchmark (4 of its layers, embedding and LM
head) at prefill 1 x 128. Each system is timed in interleaved rounds (CUDA events, after
warm-up), median ms per call; printed with its ratio to inductor's best mode, and the
achieved TFLOP/s (GEMM and attention FLOPs) and TB/s (weights, KV cache, activations read
once) against the device's peaks. Every system's output is checked against eager first.

`--quick` (what the test suite runs, under Triton's interpreter when there is no GPU) uses
the same rows at tiny shapes (bf16 by default, as on a GPU), and leaves inductor out on a
CPU (its C++ build takes minutes and measures nothing about GPUs)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import eqsat_llm
from eqsat_llm.models.model_matrix import tinyllama
from eqsat_llm.models.workloads import LlamaBlock

SECTION = "## GPU: the Triton backend against inductor"
# dense bf16 tensor-core TFLOP/s and HBM TB/s by device name (vendor data sheets)
PEAKS = {"H200": (989.0, 4.8), "H100": (989.0, 3.35), "A100": (312.0, 2.0),
         "L40S": (362.0, 0.864), "L4": (121.0, 0.3)}


@dataclass
class Shapes:
    d: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    prefill: int = 2048
    cache: int = 2048
    tiny_prefill: int = 128


QUICK = Shapes(d=64, heads=4, kv_heads=2, ffn=96, prefill=16, cache=40, tiny_prefill=8)


@dataclass
class Row:
    name: str
    model: torch.nn.Module
    inputs: tuple
    flops: float
    bytes: float


def block_rows(s: Shapes, dtype: torch.dtype, dev: str) -> list[Row]:
    block = LlamaBlock(d_model=s.d, n_heads=s.heads, n_kv_heads=s.kv_heads, ffn=s.ffn,
                       max_seq=s.prefill + s.cache).eval().to(dev, dtype)
    hd = s.d // s.heads
    kv = s.kv_heads * hd
    weights = sum(p.numel() for p in block.parameters()) * block.attn_norm.weight.itemsize
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dev, dtype)

    def gemm_flops(rows: int) -> float:
        return 2.0 * rows * s.d * (2 * s.d + 2 * kv + 3 * s.ffn)

    p = s.prefill
    prefill = Row(f"block prefill 1x{p}", block, (rand(1, p, s.d),),
                  gemm_flops(p) + 2.0 * s.heads * p * p * hd,  # causal: half of QK^T and PV
                  weights + 4.0 * p * s.d * block.attn_norm.weight.itemsize)
    t = s.cache
    cache_bytes = 2.0 * t * kv * block.attn_norm.weight.itemsize
    decode = Row(f"block decode, KV cache {t}", block,
                 (rand(1, 1, s.d), rand(1, s.kv_heads, t, hd), rand(1, s.kv_heads, t, hd)),
                 gemm_flops(1) + 4.0 * s.heads * (t + 1) * hd, weights + 2 * cache_bytes)
    return [prefill, decode]


def tinyllama_row(s: Shapes, dtype: torch.dtype, dev: str, quick: bool) -> Row:
    model = tinyllama(layers=4, quick=quick).eval().to(dev, dtype)
    ids = torch.randint(0, model.config.vocab_size, (1, s.tiny_prefill),
                        generator=torch.Generator().manual_seed(0)).to(dev)
    params = sum(p.numel() for p in model.parameters())
    layers = model.config.num_hidden_layers
    return Row(f"TinyLlama-shaped, {layers} layers, prefill 1x{s.tiny_prefill}", model, (ids,),
               2.0 * params * s.tiny_prefill, params * next(model.parameters()).itemsize)


def systems(row: Row, with_inductor: bool) -> dict[str, Callable[[], object]]:
    runs: dict[str, Callable[[], object]] = {"eager": lambda: row.model(*row.inputs)}
    if with_inductor:
        for mode in ("default", "max-autotune-no-cudagraphs"):
            fn = torch.compile(row.model, mode=mode)
            runs[f"inductor {mode}"] = lambda fn=fn: fn(*row.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = eqsat_llm.optimize(row.model, row.inputs, backend="triton",
                                      measure_eager=False)
    torch_ops = compiled.report.torch_ops
    runs["eqsat-llm triton"] = lambda: compiled(*row.inputs)
    if torch_ops:
        print(f"  (eqsat-llm ran in torch: {torch_ops})")
    return runs


def first(out: object) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return first(out[0])
    return first(out.logits)


def timed(fn: Callable[[], object], cuda: bool) -> float:
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def measure(row: Row, rounds: int, cuda: bool, with_inductor: bool) -> dict[str, float]:
    runs = systems(row, with_inductor)
    with torch.no_grad():
        eager = first(row.model(*row.inputs))
        want = eager.float()
        scale = want.abs().max().item() or 1.0
        # (a half model's output is compared at its dtype's resolution: the systems round
        # their intermediates differently)
        tol = 1e-4 if eager.dtype == torch.float32 else 2e-2
        for name, fn in runs.items():  # correctness first, and warm-up (compiles, autotunes)
            err = (first(fn()).float() - want).abs().max().item() / scale
            if err > tol:
                raise SystemExit(f"{row.name}: {name} differs from eager by {err:.2e} "
                                 f"(relative to the largest output)")
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, fn in runs.items():
                times[name].append(timed(fn, cuda))
    return {name: statistics.median(ts) for name, ts in times.items()}


def device_peaks() -> tuple[str, float | None, float | None]:
    if not torch.cuda.is_available():
        return "cpu (Triton interpreter)", None, None
    name = torch.cuda.get_device_name()
    for key, (tflops, tbs) in PEAKS.items():
        if key in name:
            return name, tflops, tbs
    return name, None, None


def table(results: list[tuple[Row, dict[str, float]]], peaks: tuple, dtype: torch.dtype) -> str:
    name, tflops, tbs = peaks
    lines = [f"Device: {name}" + (f" (peaks {tflops:.0f} TFLOP/s bf16 dense, {tbs:.2f} TB/s)"
                                  if tflops else "") + f"; models in {str(dtype)[6:]}", "",
             "| row | system | ms | vs inductor best | TFLOP/s | TB/s |",
             "|---|---|---|---|---|---|"]
    for row, ms in results:
        inductor = [v for k, v in ms.items() if k.startswith("inductor")]
        best = min(inductor) if inductor else None
        for system, t in ms.items():
            ratio = f"{t / best:.2f}x" if best else "n/a"
            lines.append(f"| {row.name} | {system} | {t:.3f} | {ratio} | "
                         f"{row.flops / t / 1e9:.1f} | {row.bytes / t / 1e9:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (any machine)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                    help="the models' dtype")
    ap.add_argument("--write", action="store_true", help="write the table to RESULTS.md")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        raise SystemExit("no CUDA device: run with --quick (tiny shapes, Triton's interpreter)")
    shapes, dtype = (QUICK if args.quick else Shapes()), getattr(torch, args.dtype)
    dev = "cuda" if cuda else "cpu"
    rows = block_rows(shapes, dtype, dev) + [tinyllama_row(shapes, dtype, dev, args.quick)]
    results = []
    for row in rows:
        print(row.name, flush=True)
        results.append((row, measure(row, args.rounds, cuda, with_inductor=cuda)))
    text = table(results, device_peaks(), dtype)
    print(text)
    if args.write:
        from optimize_time import write_section

        cmd = "python benchmarks/gpu.py" + (" --quick" if args.quick else "") + \
            f" --dtype {args.dtype} --rounds {args.rounds} --write"
        write_section(f"{SECTION}\n\n`{cmd}`\n\n{text}\n")
    return text


if __name__ == "__main__":
    main()
