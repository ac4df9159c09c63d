"""Real transformers models as users load them: eqsat-llm against eager PyTorch and ONNX Runtime.

    .venv/bin/python benchmarks/models.py [--families llama,qwen3] [--shapes prefill,decode]
        [--size small|medium] [--rounds N] [--no-tinyllama] [--no-mixtral-large] [--quick]
        [--write]

Rows: every family of eqsat_llm.models.model_matrix (random weights, the library's defaults: sdpa
attention, use_cache=False) at prefill 1x128 and one token (1x1), size "medium" by default;
and a TinyLlama-1.1B-shaped LLaMA (hidden 2048, 32 heads, 4 KV heads, FFN 5632, 4 layers,
vocab 32000; ~1.2 GB of fp32 weights) and a Mixtral whose experts dominate its bytes
(model_matrix.MIXTRAL_LARGE: hidden 1024, 8 experts of FFN 3584, 2 per token, 4 layers, vocab
32000; ~1.7 GB, of which a token reads ~0.5 GB) at both shapes. Systems: eager (torch.no_grad),
eqsat-llm (`eqsat_llm.optimize(model, inputs)`) and ONNX Runtime (dynamo export,
ORT_ENABLE_ALL, intra_op 2, inter_op 1, sequential). Each system's output is checked against
eager (max abs error on the example inputs and on fresh ones); a system that fails to build
or is wrong is reported in its row and not timed. Timing: compare_cpu.interleaved_medians
(rotated order, a settle before each timed round, median time per call).

The bound column: max(FLOPs / GEMM rate, weight bytes read / read bandwidth), both rates
measured at the start and at the end, the faster kept (a GEMV and a sum over 256 MiB for the
bandwidth; the C backend's packed GEMM and torch.mm at 128x2048x2048 for the GEMM rate).
How to read it: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import io
import logging
import os
import platform
import re
import shlex
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import (
    add_write_options,
    blas_info,
    busy_cpu_s,
    fresh_inputs,
    interleaved_medians,
    max_abs_err,
    ort_runner,
    others_cpu,
    short,
    wait_for_load,
)
from optimize_time import write_section

from eqsat_llm import optimize
from eqsat_llm.api import BackendFallbackWarning
from eqsat_llm.models import model_matrix

SECTION = "## Models as users load them (benchmarks/models.py)"
SYSTEMS = ("eager", "eqsat", "ort")
LABEL = {"eager": "eager", "eqsat": "eqsat-llm", "ort": "ONNX Runtime"}
SHAPES = {"prefill": 128, "decode": 1}
QUICK_PREFILL = 16
ROUND_S = 0.15  # about the time one system spends per timed round


# ---------------------------------------------------------------- models

def build_tinyllama(seq: int, quick: bool = False, seed: int = 0
                    ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A TinyLlama-1.1B-shaped LLaMA with 4 layers (of 22), random weights, sdpa, no cache;
    `quick`: the same structure scaled down (a smoke test, not a measurement)."""
    return _with_prompt(model_matrix.tinyllama(4, quick, seed), seq, seed)


def build_mixtral_large(seq: int, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """model_matrix.MIXTRAL_LARGE: experts dominate a token's weight bytes."""
    return _with_prompt(model_matrix.mixtral_large(seed), seq, seed)


def _with_prompt(lm: nn.Module, seq: int, seed: int) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The causal LM as a row's model (logits only, no cache) and random ids [1, seq]."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, lm.config.vocab_size - 1, (1, seq), generator=gen)
    return model_matrix.Logits(lm).eval(), (ids,)


@dataclass
class Work:
    """What bounds a row: FLOPs and the weight bytes one call reads (see weight_work)."""
    flops: float
    weight_bytes: float
    note: str = ""


def weight_work(model: nn.Module, tokens: int) -> Work:
    """FLOPs of one call (2 x tokens x every matmul weight, plus attention's two products at
    full T x T) and the weight bytes it reads (every parameter, except embedding tables only
    gathered from: one row per token; MoE experts scaled by top-k / experts at one token)."""
    inner = getattr(model, "model", model)
    cfg = getattr(inner, "config", None)
    gathered = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    used_whole = {id(p) for m in model.modules() if not isinstance(m, nn.Embedding)
                  for p in m.parameters(recurse=False)}  # a tied LM head reads the table whole
    experts = next((getattr(cfg, k) for k in ("num_local_experts", "num_experts",
                                               "n_routed_experts") if getattr(cfg, k, None)),
                   None)
    topk = getattr(cfg, "num_experts_per_tok", None)
    moe = topk / experts if experts and topk else 1.0
    flops, nbytes, seen = 0.0, 0.0, set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        frac = moe if ".experts." in name else 1.0
        if id(p) in gathered and id(p) not in used_whole:
            nbytes += tokens * p.shape[-1] * p.element_size()
            continue
        nbytes += p.numel() * p.element_size() * (frac if tokens == 1 else 1.0)
        if p.dim() >= 2:
            flops += 2.0 * tokens * p.numel() * frac
    note = f"MoE: experts x {moe:g}" if moe != 1.0 else ""
    if cfg is not None:
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        flops += 4.0 * cfg.num_hidden_layers * heads * head_dim * tokens * tokens
    return Work(flops, nbytes, note)


# ---------------------------------------------------------------- machine rates

@dataclass
class Rates:
    read_bw: float  # bytes/s
    gemm_flops: float  # FLOP/s
    bw_text: str
    gemm_text: str

    @property
    def text(self) -> str:
        return f"{self.bw_text}; {self.gemm_text}"


def _best(fn: Callable[[], Any], n: int) -> float:
    fn()
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_rates(quick: bool = False) -> Rates:
    """Read bandwidth (best of a GEMV streaming a 256 MiB matrix and torch.sum over 256 MiB)
    and GEMM rate (best of the C backend's packed-weight kernel and torch.mm at 128x2048x2048;
    the fastest time of several calls: the bound is a lower bound)."""
    n = 8192 if not quick else 2048
    with torch.no_grad():
        big, v = torch.rand(n, n), torch.rand(1, n)
        nbytes = big.numel() * 4
        gemv_bw = nbytes / _best(lambda: v @ big, 5)
        sum_bw = nbytes / _best(big.sum, 5)
        big = torch.empty(0)  # free the 256 MiB
        m, k, nn_ = (128, 2048, 2048) if not quick else (64, 256, 256)
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(m, k, generator=gen), torch.randn(k, nn_, generator=gen)
        flop = 2.0 * m * k * nn_
        rates = {"torch.mm": flop / _best(lambda: torch.mm(a, b), 10)}
        packed_note = ""
        if not quick:
            try:
                from gemm_kernels import _program

                from eqsat_llm.codegen.c import CRuntime

                rt = CRuntime(_program(m, k, nn_, b), use_blas=False)
                got = rt.run([a])
                got = torch.as_tensor(got[0] if isinstance(got, (list, tuple)) else got)
                if (got - a @ b).abs().max().item() > 1e-2:
                    raise AssertionError("packed GEMM disagrees with torch.mm")
                rates["packed GEMM"] = flop / _best(lambda: rt.run([a]), 10)
            except Exception as exc:  # noqa: BLE001 - torch.mm's rate is enough
                packed_note = f" (packed GEMM not measured: {short(exc)[:120]})"
    read_bw = max(gemv_bw, sum_bw)
    gemm = max(rates.values())
    bw_text = (f"read bandwidth {read_bw / 1e9:.1f} GB/s (best of a 1x{n}x{n} GEMV, "
               f"{gemv_bw / 1e9:.1f} GB/s, and torch.sum, {sum_bw / 1e9:.1f} GB/s, over "
               f"{nbytes >> 20} MiB)")
    gemm_text = (f"GEMM rate {gemm / 1e9:.0f} GFLOP/s (best of "
                 + ", ".join(f"{k_} {r / 1e9:.0f}" for k_, r in rates.items())
                 + f" GFLOP/s at {m}x{k}x{nn_}){packed_note}")
    return Rates(read_bw, gemm, bw_text, gemm_text)


def best_rates(a: Rates, b: Rates) -> Rates:
    bw = a if a.read_bw >= b.read_bw else b
    gemm = a if a.gemm_flops >= b.gemm_flops else b
    return Rates(bw.read_bw, gemm.gemm_flops, bw.bw_text, gemm.gemm_text)


# ---------------------------------------------------------------- systems

@dataclass
class System:
    name: str
    fn: Callable[[], Any] | None = None
    fresh: Callable[[], Any] | None = None
    setup_s: float = 0.0
    note: str = ""
    error: str | None = None
    err: float | None = None  # max abs error vs eager, example and fresh inputs
    wrong: bool = False
    ms: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.fn is not None and self.error is None and not self.wrong


def make_eager(model: nn.Module, inputs: tuple, fresh: tuple) -> System:
    def run(args: tuple) -> Any:
        with torch.no_grad():
            return model(*args)
    return System("eager", lambda: run(inputs), lambda: run(fresh))


def make_eqsat(model: nn.Module, inputs: tuple, fresh: tuple) -> System:
    s = System("eqsat")
    try:
        t = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = optimize(model, inputs, measure_eager=False)
        s.setup_s = time.perf_counter() - t
        r = compiled.report
        torch_ops = getattr(r, "torch_ops", None)
        s.info = {"backend": r.backend, "attention": r.op_counts_after.get("attention", 0),
                  "torch_ops": (dict(torch_ops) if isinstance(torch_ops, dict)
                                else list(torch_ops) if torch_ops else []),
                  "fallback_ops": list(r.fallback_ops)}
        for w in caught:  # FallbackWarning names the fallback_ops: recorded above
            if issubclass(w.category, BackendFallbackWarning):
                s.note += f"{w.category.__name__}: {' '.join(str(w.message).split())[:160]}; "
        s.fn, s.fresh = (lambda: compiled(*inputs)), (lambda: compiled(*fresh))
    except Exception as exc:  # noqa: BLE001 - reported in the row
        s.error = short(exc)
    return s


def root_cause(exc: BaseException) -> str:
    """The innermost exception of a chain (torch.onnx's ConversionError wraps the useful one),
    in short, without terminal colour codes."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return re.sub(r"\x1b\[[0-9;]*m", "", short(exc))


def _export(model: nn.Module, inputs: tuple, path: Path) -> None:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, str(path), dynamo=True)


BATCHED_GATHER_LIMIT = 2e9


def batched_gather_bytes(model: nn.Module, tokens: int) -> float:
    """What transformers' batched_mm experts gather in one layer: each token-expert pair's
    expert weights (gate_up_proj[ids] and down_proj[ids])."""
    cfg = getattr(getattr(model, "model", model), "config", None)
    top_k = getattr(cfg, "num_experts_per_tok", None) or 1
    for m in model.modules():
        up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
        if isinstance(up, torch.Tensor) and isinstance(down, torch.Tensor) and up.dim() == 3:
            per_expert = (up[0].numel() + down[0].numel()) * up.element_size()
            return float(tokens * top_k * per_expert)
    return 0.0


def batched_refusal(model: nn.Module, tokens: int) -> str | None:
    """Why the model is not exported with batched_mm experts at this many tokens (they would
    gather more than BATCHED_GATHER_LIMIT a layer), or None."""
    gathered = batched_gather_bytes(model, tokens)
    if gathered <= BATCHED_GATHER_LIMIT:
        return None
    return (f"not exported with experts 'batched_mm': it gathers each token-expert pair's "
            f"weights, {gathered / 1e9:.1f} GB a layer here")


@contextlib.contextmanager
def batched_experts(model: nn.Module) -> Any:
    """The model's experts as transformers' batched_mm implementation for the time of the
    block: what torch.onnx can export (its default grouped_mm calls the custom op
    transformers.grouped_mm_fallback, which it has no translation for; transformers' own ONNX
    exporter swaps it the same way), the default restored after."""
    inner = getattr(model, "model", model)
    own = inner.get_experts_implementation()
    inner.set_experts_implementation("batched_mm")
    try:
        yield
    finally:
        inner.set_experts_implementation(own)


def make_ort(model: nn.Module, inputs: tuple, fresh: tuple, path: Path) -> System:
    s = System("ort")
    try:
        import onnxruntime  # noqa: F401 - missing: say so before exporting
    except ImportError as exc:
        s.error = short(exc)
        return s
    t = time.perf_counter()
    try:
        _export(model, inputs, path)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        s.error = f"dynamo export: {root_cause(exc)}"
        inner = getattr(model, "model", None)
        if not getattr(inner, "_can_set_experts_implementation", lambda: False)():
            s.info["export_s"] = time.perf_counter() - t
            return s
        # an MoE model: exported with its experts as batched_mm (batched_experts)
        refusal = batched_refusal(model, inputs[0].numel())
        if refusal:  # (the run would end killed for memory)
            s.error += f"; {refusal}"
            s.info["export_s"] = time.perf_counter() - t
            return s
        own = inner.get_experts_implementation()
        own_s = own.get("", own) if isinstance(own, dict) and len(own) == 1 else own
        try:
            with batched_experts(model):
                _export(model, inputs, path)
            s.note = (f"exported with experts_implementation 'batched_mm' (with '{own_s}': "
                      f"{s.error}); ")
            s.error = None
        except Exception as exc2:  # noqa: BLE001 - reported in the row
            s.error += f"; with experts 'batched_mm': {root_cause(exc2)}"
            s.info["export_s"] = time.perf_counter() - t
            return s
    s.info["export_s"] = time.perf_counter() - t
    try:
        run = ort_runner(path, len(inputs), sequential=True)
        s.setup_s = time.perf_counter() - t
        s.fn, s.fresh = (lambda: run(inputs)), (lambda: run(fresh))
    except Exception as exc:  # noqa: BLE001 - reported in the row
        s.error = f"session: {short(exc)}"
    return s


# ---------------------------------------------------------------- one row

@dataclass
class Row:
    name: str
    shape: str
    systems: dict[str, System]
    work: Work
    tokens: int
    others_cpu: float = float("nan")
    error: str | None = None  # the model itself failed to build or run


def row_specs(args: argparse.Namespace) -> list[tuple[str, str, Callable[[int], tuple]]]:
    """(name, shape, builder(seq)) for every row asked for."""
    size = "small" if args.quick else args.size
    specs = []
    for fam in args.families:
        for shape in args.shapes:
            specs.append((fam, shape, lambda seq, fam=fam: model_matrix.build(
                fam, attn="sdpa", seq=seq, size=size)))
    if args.tinyllama:
        for shape in args.shapes:
            specs.append(("tinyllama" + (" (quick: scaled down)" if args.quick else ""), shape,
                          lambda seq: build_tinyllama(seq, quick=args.quick)))
    if args.mixtral_large and not args.quick:
        for shape in args.shapes:
            specs.append(("mixtral_large", shape, build_mixtral_large))
    return specs


def run_row(name: str, shape: str, builder: Callable[[int], tuple], args: argparse.Namespace,
            tmp: Path) -> Row:
    seq = SHAPES[shape] if not (args.quick and shape == "prefill") else QUICK_PREFILL
    model, inputs = builder(seq)
    tokens = inputs[0].numel()
    row = Row(name, "x".join(map(str, inputs[0].shape)), {}, weight_work(model, tokens), tokens)
    fresh = fresh_inputs(inputs)
    with torch.no_grad():
        want, want_fresh = model(*inputs), model(*fresh)
    row.systems["eager"] = make_eager(model, inputs, fresh)
    row.systems["eqsat"] = make_eqsat(model, inputs, fresh)
    row.systems["ort"] = make_ort(model, inputs, fresh, tmp / "model.onnx")
    for s in row.systems.values():
        if s.fn is None or s.error:
            continue
        try:
            s.err = max(max_abs_err(s.fn(), want), max_abs_err(s.fresh(), want_fresh))
        except Exception as exc:  # noqa: BLE001 - reported in the row
            s.error = f"call failed: {short(exc)}"
            continue
        s.wrong = not s.err <= args.tol
    timed = {k: s.fn for k, s in row.systems.items() if s.timed}
    busy0, mine0, wall0 = busy_cpu_s(), time.process_time(), time.perf_counter()
    medians = interleaved_medians(timed, args.rounds, args.round_s)
    row.others_cpu = others_cpu(busy0, mine0, wall0)
    for k, sec in medians.items():
        row.systems[k].ms = sec * 1e3
    for s in row.systems.values():  # the closures hold the model, the program, the session
        s.fn = s.fresh = None
    return row


# ---------------------------------------------------------------- reporting

def bound_ms(row: Row, rates: Rates) -> tuple[float, str]:
    compute = row.work.flops / rates.gemm_flops * 1e3
    memory = row.work.weight_bytes / rates.read_bw * 1e3
    return (compute, "GEMM") if compute >= memory else (memory, "weights")


def cell(s: System | None) -> str:
    if s is None:
        return "-"
    if s.error:
        return f"failed: {s.error[:90].replace('|', '/')}"
    if s.wrong:
        return f"WRONG (err {s.err:.1e})"
    return f"{s.ms:.3f}" if s.ms is not None else "-"


def ratio(a: System | None, b: System | None) -> str:
    if a is None or b is None or a.ms is None or b.ms is None:
        return "n/a"
    return f"{a.ms / b.ms:.2f}"


def table(rows: list[Row], rates: Rates) -> str:
    head = ("| model | shape | eager ms | eqsat-llm ms | ORT ms | eqsat/eager | eqsat/ORT "
            "| bound ms (what) | eqsat/bound | eqsat backend, attention fused | "
            "max abs err eqsat / ORT | eqsat compile s | ORT export s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.error:
            lines.append(f"| {r.name} | {r.shape} | failed: {r.error[:120]} |"
                         + " |" * (head.count("|") - 4))
            continue
        e, q, o = (r.systems.get(k) for k in SYSTEMS)
        b, what = bound_ms(r, rates)
        eq_info = "-"
        if q is not None and q.info:
            eq_info = f"{q.info['backend']}, {'yes' if q.info['attention'] else 'no'}"
            if q.info["attention"]:
                eq_info += f" ({q.info['attention']})"
        errs = " / ".join("-" if s is None or s.err is None else f"{s.err:.1e}" for s in (q, o))
        over = "n/a" if q is None or q.ms is None else f"{q.ms / b:.1f}"
        compile_s = "-" if q is None or q.error else f"{q.setup_s:.1f}"
        export_s = f"{o.info['export_s']:.1f}" if o is not None and "export_s" in o.info else "-"
        lines.append(f"| {r.name} | {r.shape} | {cell(e)} | {cell(q)} | {cell(o)} | "
                     f"{ratio(q, e)} | {ratio(q, o)} | {b:.3f} ({what}) | {over} | {eq_info} | "
                     f"{errs} | {compile_s} | {export_s} |")
    return "\n".join(lines)


def notes(rows: list[Row]) -> list[str]:
    """Per row: eqsat-llm's torch ops and fallback warnings, failures in full, the load."""
    out = []
    for r in rows:
        bits = []
        if r.error:
            bits.append(f"row failed: {r.error}")
        for k in SYSTEMS:
            s = r.systems.get(k)
            if s is None:
                continue
            if s.error and len(s.error) > 90:
                bits.append(f"{LABEL[k]} failed: {s.error}")
            if k == "eqsat" and s.info:
                ops = s.info["torch_ops"]
                if ops:
                    bits.append("ran in torch: " + (", ".join(
                        f"{k} x{v}" for k, v in ops.items()) if isinstance(ops, dict)
                        else ", ".join(map(str, ops))))
                if s.info["fallback_ops"]:
                    bits.append(f"ops not in the registry: {', '.join(s.info['fallback_ops'])}")
            if s.note:
                bits.append(s.note.rstrip("; "))
        if r.work.note:
            bits.append(r.work.note)
        if not r.others_cpu < 0.1:
            bits.append(f"other processes used {r.others_cpu:.2f} cores while timed")
        if bits:
            out.append(f"- {r.name} {r.shape}: " + "; ".join(bits))
    return out


def main(argv: list[str] | None = None) -> list[Row]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join(model_matrix.FAMILIES),
                   help="comma-separated model_matrix families (default: all; '' for none: "
                   "the TinyLlama rows only)")
    p.add_argument("--shapes", default="prefill,decode", help="prefill (1x128), decode (1x1)")
    p.add_argument("--size", default="medium", choices=list(model_matrix.SIZES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-tinyllama", dest="tinyllama", action="store_false")
    p.add_argument("--no-mixtral-large", dest="mixtral_large", action="store_false",
                   help="leave out the Mixtral row whose experts dominate its bytes")
    p.add_argument("--quick", action="store_true",
                   help="size small, prefill 1x16, scaled-down TinyLlama, 1 round: a smoke run")
    p.add_argument("--tol", type=float, default=1e-3,
                   help="max abs error vs eager above which a system is WRONG (not timed)")
    add_write_options(p)
    args = p.parse_args(argv)
    args.families = [f for f in args.families.split(",") if f]
    args.shapes = [s for s in args.shapes.split(",") if s]
    for f in args.families:
        if f not in model_matrix.FAMILIES:
            p.error(f"unknown family {f!r}; known: {', '.join(model_matrix.FAMILIES)}")
    for s in args.shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; known: {', '.join(SHAPES)}")
    args.round_s = ROUND_S
    if args.quick:
        args.rounds, args.round_s = 1, 0.02

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    torch.set_num_threads(2)
    load_ok = wait_for_load(args.max_load, args.wait_load) if args.write else True
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    rates = measure_rates(args.quick)
    print(f"measured: {rates.text}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench_models_") as tmp:
        for name, shape, builder in row_specs(args):
            t = time.perf_counter()
            try:
                rows.append(run_row(name, shape, builder, args, Path(tmp)))
            except Exception as exc:  # noqa: BLE001 - the other rows still run
                traceback.print_exc()
                rows.append(Row(name, shape, {}, Work(0.0, 0.0), 0, error=short(exc)))
            gc.collect()
            print(f"[{time.perf_counter() - t:.0f} s] " + table(rows[-1:], rates).splitlines()[-1],
                  flush=True)
    # measured again at the end, the faster of the two kept: load from other processes only
    # ever lowers a rate, and a bound from a rate measured too low would flatter eqsat-llm
    rates = best_rates(rates, measure_rates(args.quick))
    print(f"measured (best of start and end): {rates.text}", flush=True)
    total = time.perf_counter() - t0
    load_end = os.getloadavg()

    import onnxruntime as ort

    cmd = ".venv/bin/python benchmarks/models.py" + (
        " " + shlex.join(argv if argv is not None else sys.argv[1:])
        if (argv if argv is not None else sys.argv[1:]) else "")
    date = f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    load = (f"load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load_start)} at the "
            f"start, {'/'.join(f'{x:.2f}' for x in load_end)} at the end")
    if args.write and not load_ok:
        load += f" **(the 1-minute load did not fall below {args.max_load}: figures noisy)**"
    head = (f"{SECTION}\n\nCommand: `{cmd}` ({date}, {platform.machine()}, {os.cpu_count()} "
            f"cores, {platform.processor() or platform.platform()}, torch {torch.__version__} "
            f"with {torch.get_num_threads()} threads, onnxruntime {ort.__version__} "
            "(dynamo export, ORT_ENABLE_ALL, intra_op 2, inter_op 1, sequential), Python "
            f"{platform.python_version()}; run took {total:.0f} s; {load}).\n\n"
            f"Method: random-weight models from eqsat_llm.models.model_matrix (size "
            f"{'small' if args.quick else args.size}, sdpa, use_cache=False) and a "
            "TinyLlama-1.1B-shaped LLaMA (4 layers); per row, each system built once "
            "(compile/export time apart), checked against eager (max abs error, example and "
            f"fresh inputs; above {args.tol:g}: WRONG, not timed), then "
            f"{args.rounds} interleaved rounds (compare_cpu.interleaved_medians: rotated order, "
            "untimed settle calls before each round, about "
            f"{args.round_s * 1e3:.0f} ms of calls per system per round); figure = median ms "
            "per call. Bound = max(FLOPs / GEMM rate, weight bytes read / read bandwidth), the "
            "rates measured at the start and the end of the run, the faster kept: "
            f"{rates.text}. eqsat/bound = how far eqsat-llm is from that floor "
            "(docs/benchmarks.md).\n\n"
            "BLAS and thread pools loaded (threadpoolctl, after all systems ran):\n\n"
            + "\n".join(f"- {ln}" for ln in blas_info()))
    nts = notes(rows)
    text = head + "\n\n" + table(rows, rates) + ("\n\nNotes:\n\n" + "\n".join(nts) if nts else "")
    print(text)
    if args.write:
        write_section(text, SECTION)
        print(f"\nwrote the section {SECTION!r} of benchmarks/RESULTS.md")
    return rows


if __name__ == "__main__":
    main()
