"""Cost-model fidelity: predicted vs measured time of ~40 kernels at LLM shapes, and of every
backend kernel of whole compiled programs.

    .venv/bin/python benchmarks/cost_fidelity.py [--calibrate] [--threads 2]
        [--stat median|min] [--rounds 21] [--programs] [--families llama gpt2 ...]
        [--json out.json] [--write]

--calibrate first runs the quick calibration at --threads and caches it (as
`eqsat-llm calibrate --quick` does); without it the cached machine (or DEFAULT) is used.

Each kernel is a registry op at the LLaMA-style block's shapes (d=512, 8 heads of 64, FFN
1536, 128 keys) for seq 1 (decode) and seq 128 (prefill), timed with its reference semantics
(`eqsat_llm.ops.evaluate`, as the reference runtime runs it) and predicted with
`CostModel(machine())`. Prints Spearman's rank correlation and a table; with --write,
replaces the section in benchmarks/RESULTS.md.

Layout copies (permute, transpose) are views in torch; the IR materialises them, so they are
timed with `.contiguous()` after the reference.

Beside Spearman, the absolute error: the median and the worst ratio measured / predicted (the
worst as max(r, 1/r)) and the fraction of kernels within 1.5x.

--programs adds the whole-program mode: the LLaMA-style block (d=512) at prefill, decode and
decode with a KV cache, and the model matrix's families (eqsat_llm/models/model_matrix.py, small
size, seq 16, offline), each optimized for the C backend and profiled with
`eqsat_llm.profile.profile_program` (`--stat` over `--rounds` calls): every backend kernel
with its predicted and measured time, ratio, flag and reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eqsat_llm.extraction.calibrate import CpuShare, calibrate_checked, time_call
from eqsat_llm.extraction.costmodel import CostModel
from eqsat_llm.extraction.machine import Machine, cache_path, cpu_model, load, save
from eqsat_llm.extraction.machine import machine_of_this_host as machine
from eqsat_llm.ir import TensorType, dtype_of
from eqsat_llm.ops import WEAK_DTYPES, evaluate, get_op
from eqsat_llm.profile import FLAG_RATIO

SECTION = "## Cost-model fidelity"
D, H, HD, FFN, KV = 512, 8, 64, 1536, 128


@dataclass
class Kernel:
    label: str
    op: str
    attrs: dict[str, Any]
    inputs: list[TensorType]
    materialize: bool = False  # time .contiguous() of a view result (an IR copy)
    seq: int = 0


def f32(*shape: int) -> TensorType:
    return TensorType(tuple(shape), "float32")


PY_FLOAT = TensorType((), "py_float")


def suite() -> list[Kernel]:
    ks: list[Kernel] = []
    for s in (1, 128):
        x, h = f32(1, s, D), f32(1, s, FFN)
        q, kv = f32(1, H, s, HD), f32(1, H, KV, HD)
        scores = f32(1, H, s, KV)
        group = [
            Kernel(f"linear {D}->{3 * D}", "linear", {}, [x, f32(3 * D, D)]),
            Kernel(f"mm {D}x{D}", "mm", {"alpha": 1.0}, [f32(s, D), f32(D, D)]),
            Kernel(f"mm {FFN}x{D} (down)", "mm", {"alpha": 1.0}, [f32(s, FFN), f32(FFN, D)]),
            Kernel("rms_norm", "rms_norm", {"eps": 1e-6}, [x, f32(D)]),
            Kernel("layer_norm", "layer_norm", {"normalized_shape": [D], "eps": 1e-5},
                   [x, f32(D), f32(D)]),
            Kernel("attention (fused op)", "attention", {"scale": 0.125, "softcap": 0.0},
                   [q, kv, kv, f32(1, 1, s, KV)]),
            Kernel("sdpa_masked (torch's fused kernel)", "sdpa_masked", {"scale": 0.125},
                   [q, kv, kv, f32(1, 1, s, KV)]),
            Kernel("attn: q @ k^T", "matmul", {"alpha": 1.0}, [q, f32(1, H, HD, KV)]),
            Kernel("attn: * scale", "mul", {}, [scores, PY_FLOAT]),
            Kernel("attn: + bias", "add", {}, [scores, f32(1, 1, s, KV)]),
            Kernel("attn: softmax", "softmax", {"dim": -1}, [scores]),
            Kernel("attn: p @ v", "matmul", {"alpha": 1.0}, [scores, kv]),
            Kernel("permute k -> k^T", "permute", {"dims": [0, 1, 3, 2]}, [kv], True),
            Kernel("permute heads", "permute", {"dims": [0, 2, 1, 3]}, [f32(1, s, H, HD)],
                   True),
            Kernel("swiglu (fused op)", "swiglu", {}, [h, h]),
            Kernel("silu", "silu", {}, [h]),
            Kernel("mul", "mul", {}, [h, h]),
            Kernel("add (residual)", "add", {}, [x, x]),
            Kernel("mul by weight", "mul", {}, [x, f32(D)]),
            Kernel("exp", "exp", {}, [scores]),
            Kernel("cat kv cache", "cat", {"dim": 2}, [kv, q]),
            Kernel("view (free)", "view", {"shape": [1, s, H, HD]}, [x]),
        ]
        for k in group:
            k.seq = s
        ks += group
    return ks


def _value(t: TensorType, gen: torch.Generator) -> Any:
    if t.dtype in WEAK_DTYPES:
        return 0.125
    return torch.randn(t.shape, generator=gen, dtype=dtype_of(t.dtype))


def _closure(k: Kernel) -> Callable[[], object]:
    xs = [_value(t, torch.Generator().manual_seed(i)) for i, t in enumerate(k.inputs)]
    if k.materialize:
        return lambda: evaluate(k.op, xs, k.attrs).contiguous()
    return lambda: evaluate(k.op, xs, k.attrs)


def measure_all(kernels: list[Kernel], rounds: int, stat: str,
                batch_s: float = 2e-3) -> list[float]:
    """Seconds per call of each kernel: `stat` over `rounds` batches, the kernels taken in
    turn within each round so that interference from other processes spreads evenly."""
    fns = [_closure(k) for k in kernels]
    inner = []
    for fn in fns:  # warm-up, and the batch size that makes a batch last ~batch_s
        one = time_call(fn, repeats=3, batch_s=batch_s / 4)
        inner.append(max(1, min(10_000, int(batch_s / max(one, 1e-7)))))
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, n, ts in zip(fns, inner, times):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            ts.append((time.perf_counter() - t) / n)
    pick = min if stat == "min" else statistics.median
    return [pick(ts) for ts in times]


def ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1, ties given their average rank."""
    order = np.argsort(a, kind="stable")
    r = np.empty(len(a))
    r[order] = np.arange(len(a))
    for v in np.unique(a):
        tie = a == v
        r[tie] = r[tie].mean()
    return r


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
    return float(np.corrcoef(ra, rb)[0, 1])


def run(stat: str, rounds: int) -> tuple[list[dict[str, Any]], CostModel]:
    model = CostModel(machine())
    ref_model = CostModel(model.machine, backend="reference")
    kernels = suite()
    with torch.no_grad():
        measured = measure_all(kernels, rounds, stat)
    rows = []
    for k, meas in zip(kernels, measured):
        out = get_op(k.op).infer_type(k.inputs, k.attrs)
        cost = model.kernel(k.op, k.attrs, k.inputs, out)
        ref = ref_model.kernel(k.op, k.attrs, k.inputs, out)
        rows.append({"kernel": k, "pred": cost.seconds, "bound": cost.bound,
                     "ref": ref.seconds, "meas": meas})
    return rows, model


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| seq | kernel | op | inputs | predicted us | bound | predicted us, reference "
            "backend | measured us | pred/meas |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        k = r["kernel"]
        ins = ", ".join(str(t.shape).replace(" ", "") for t in k.inputs if t.shape)
        ref = f"{r['ref'] * 1e6:.1f}" if r["ref"] != r["pred"] else "same"
        lines.append(f"| {k.seq} | {k.label} | {k.op} | {ins} | {r['pred'] * 1e6:.1f} | "
                     f"{r['bound']} | {ref} | {r['meas'] * 1e6:.1f} | "
                     f"{r['pred'] / r['meas']:.2f} |")
    return "\n".join(lines)


def fused_vs_parts(rows: list[dict[str, Any]]) -> str:
    out = []
    for seq in (1, 128):
        sel = [r for r in rows if r["kernel"].seq == seq]
        for fused, labels in (("attention (fused op)", ("attn: ", "permute k")),
                              ("swiglu (fused op)", ("silu", "mul"))):
            f = next(r for r in sel if r["kernel"].label == fused)
            parts = [r for r in sel if r["kernel"].label.startswith(labels)
                     and r["kernel"].label != "mul by weight"]
            pp, pm = sum(r["pred"] for r in parts), sum(r["meas"] for r in parts)
            out.append(f"- seq {seq}, {fused.split()[0]}: fused op predicted "
                       f"{f['pred'] * 1e6:.1f} us, measured {f['meas'] * 1e6:.1f} us (its "
                       f"reference is the decomposition); its {len(parts)} unfused ops "
                       f"({', '.join(r['kernel'].op for r in parts)}) predicted "
                       f"{pp * 1e6:.1f} us, measured {pm * 1e6:.1f} us")
    return "\n".join(out)


def correlations(rows: list[dict[str, Any]], key: str) -> str:
    def rho(sel: list[dict[str, Any]]) -> float:
        return spearman([r[key] for r in sel], [r["meas"] for r in sel])

    per_seq = [rho([r for r in rows if r["kernel"].seq == s]) for s in (1, 128)]
    return (f"{rho(rows):.3f} over {len(rows)} kernels (seq 1 alone {per_seq[0]:.3f}, "
            f"seq 128 alone {per_seq[1]:.3f})")


def error_summary(ratios: list[float]) -> dict[str, float]:
    """Absolute error of measured / predicted ratios: their median, the worst (max(r, 1/r))
    and the fraction within FLAG_RATIO."""
    if not ratios:
        return {"median": float("nan"), "worst": float("nan"), "within": float("nan")}
    within = sum(1 / FLAG_RATIO <= r <= FLAG_RATIO for r in ratios) / len(ratios)
    return {"median": statistics.median(ratios), "worst": max(max(r, 1 / r) for r in ratios),
            "within": within}


def describe_error(ratios: list[float]) -> str:
    e = error_summary(ratios)
    return (f"median ratio measured/predicted {e['median']:.2f}, worst {e['worst']:.2f}x, "
            f"{e['within']:.0%} of {len(ratios)} within {FLAG_RATIO}x")


# --- whole programs --------------------------------------------------------------------------
def program_cases(families: list[str]) -> list[tuple[str, Callable[[], Any]]]:
    """(name, builder of (model, inputs)): the block at its three shapes, then the families."""
    from eqsat_llm.models.model_matrix import build
    from eqsat_llm.models.workloads import LLAMA_BLOCK_SHAPES, llama_block_case

    cases: list[tuple[str, Callable[[], Any]]] = [
        (f"llama block {s}", lambda s=s: llama_block_case(s)) for s in LLAMA_BLOCK_SHAPES]
    cases += [(f"{f} (small, seq 16)", lambda f=f: build(f, seq=16)) for f in families]
    return cases


def profile_programs(families: list[str], rounds: int, stat: str, idle_wait: float = 60.0,
                     baseline: Machine | None = None) -> list[dict[str, Any]]:
    """Each case optimized for the C backend and profiled: {"program", "profile"}; with a
    `baseline` machine, also "baseline_ratios": the same measurements against its prices."""
    import eqsat_llm
    from eqsat_llm.profile import node_costs, profile_program

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = []
    for name, make in program_cases(families):
        model, inputs = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = eqsat_llm.optimize(model, inputs, backend="c", measure_eager=False)
        waited = wait_idle(idle_wait)
        result = profile_program(compiled, inputs, repeats=rounds, statistic=stat)
        busy = result["other_cpu"] or 0.0
        print(f"{name}: {describe_error(program_ratios([result]))} (waited {waited:.0f} s for "
              f"an idle machine; others used {busy:.0%} of the CPUs meanwhile)", flush=True)
        run = {"program": name, "profile": result}
        if baseline is not None:
            model = CostModel(baseline)
            run["baseline_ratios"] = [
                k["measured_us"] / p for k in result["kernels"]
                if (p := sum(c.micros for c in node_costs(compiled.graph, model, k["node_ids"])))
                > 0 and k["measured_us"]]
        out.append(run)
    return out


def wait_idle(limit_s: float = 120.0, below: float = 0.1, probe_s: float = 0.5) -> float:
    """Wait (up to `limit_s`) until other processes use less than `below` of the CPUs over
    `probe_s`: on a shared 2-core machine a kernel's 2-thread parallel region otherwise waits
    for a scheduler slice. Returns the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        share = CpuShare()
        time.sleep(probe_s)
        if (share.others() or 0.0) < below:
            break
    return time.perf_counter() - start


def program_ratios(profiles: list[dict[str, Any]]) -> list[float]:
    return [k["ratio"] for p in profiles for k in p["kernels"] if k["ratio"] is not None]


def program_table(runs: list[dict[str, Any]]) -> str:
    lines = ["| program | kernel | ops | predicted us | measured us | ratio | flag | reason |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for k in run["profile"]["kernels"]:
            ratio = f"{k['ratio']:.2f}" if k["ratio"] is not None else "-"
            lines.append(f"| {run['program']} | {k['name']} | {k['ops']} | "
                         f"{k['predicted_us']:.1f} | {k['measured_us']:.1f} | {ratio} | "
                         f"{'**off**' if k['flagged'] else ''} | {k['reason'] or ''} |")
    return "\n".join(lines)


def programs_text(runs: list[dict[str, Any]], stat: str, rounds: int) -> str:
    per = "\n".join(f"- {r['program']}: {describe_error(program_ratios([r['profile']]))}, "
                    f"{r['profile']['flagged']} flagged; total predicted "
                    f"{r['profile']['total_predicted_us']:.0f} us, measured "
                    f"{r['profile']['total_measured_us']:.0f} us; other processes used "
                    f"{r['profile']['other_cpu'] or 0:.0%} of the CPUs meanwhile" for r in runs)
    every = program_ratios([r["profile"] for r in runs])
    base = [x for r in runs for x in r.get("baseline_ratios", [])]
    if base:
        per += (f"\n\nThe same measurements against the baseline machine's prices "
                f"({runs[0]['baseline']}): {describe_error(base)}; per program: "
                + "; ".join(f"{r['program']} {describe_error(r['baseline_ratios'])}"
                            for r in runs) + ".")
    return (f"### Whole programs on the C backend (`--programs`)\n\nEach program optimized "
            "for the C backend and profiled with `eqsat_llm.profile.profile_program`: a "
            "`-DEQ_PROFILE` build of its C source times every generated kernel (torch steps "
            f"alone); {stat} of {rounds} calls per kernel. **All kernels: "
            f"{describe_error(every)}.**\n\n{per}\n\n{program_table(runs)}")


def program_flags(args: argparse.Namespace) -> str:
    if not args.programs:
        return ""
    fams = "" if args.families is None else " ".join(["--families", *args.families]) + " "
    base = f"--baseline {args.baseline} " if args.baseline else ""
    return f"--programs {fams}--idle-wait {args.idle_wait:g} {base}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stat", choices=("median", "min"), default="median")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calibrate", action="store_true",
                        help="first calibrate (quick) at --threads and cache the result")
    parser.add_argument("--programs", action="store_true",
                        help="also profile whole compiled programs on the C backend")
    parser.add_argument("--families", nargs="*", default=None,
                        help="model-matrix families for --programs (default: all)")
    parser.add_argument("--idle-wait", type=float, default=60.0,
                        help="seconds to wait for an idle machine before each program")
    parser.add_argument("--baseline", help="a machine JSON file (eqsat-llm calibrate's) to "
                        "price the programs' kernels with too, for comparison")
    parser.add_argument("--json", help="write the raw rows and profiles here")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.calibrate:
        fresh, problem = calibrate_checked(quick=True)
        if problem:
            print(f"calibration not saved ({problem}); using the cached machine or DEFAULT")
        else:
            save(fresh)
    calibrated = load() is not None
    share = CpuShare()
    rows, model = run(args.stat, args.rounds)
    runs: list[dict[str, Any]] = []
    if args.programs:
        from eqsat_llm.models.model_matrix import FAMILIES

        baseline = Machine.from_dict(json.loads(Path(args.baseline).read_text())) \
            if args.baseline else None

        runs = profile_programs(args.families if args.families is not None
                                else sorted(FAMILIES), args.rounds, args.stat, args.idle_wait,
                                baseline)
        for r in runs:
            r["baseline"] = args.baseline
    warning = share.warning()
    mc = model.machine
    source = f"calibrated ({cache_path().name})" if calibrated else "DEFAULT (not calibrated)"
    env = f"XDG_CACHE_HOME={os.environ['XDG_CACHE_HOME']} " if "XDG_CACHE_HOME" in os.environ \
        else ""
    text = (f"{SECTION}\n\nCommand: `{env}.venv/bin/python benchmarks/cost_fidelity.py "
            f"{'--calibrate ' if args.calibrate else ''}--threads {args.threads} "
            f"--stat {args.stat} --rounds {args.rounds} {program_flags(args)}--write` "
            f"({platform.machine()}, {cpu_model()}, "
            f"{args.threads} threads, torch {torch.__version__}). Machine: {source}: GEMM "
            f"{mc.gemm_flops / 1e9:.0f} GFLOP/s, GEMV {mc.gemv_flops / 1e9:.0f} GFLOP/s, "
            f"vector {mc.vector_flops / 1e9:.0f} GFLOP/s, L2/L3/DRAM {mc.l2_bw / 1e9:.0f}/"
            f"{mc.l3_bw / 1e9:.0f}/{mc.dram_bw / 1e9:.0f} GB/s, call overhead "
            f"{mc.call_overhead * 1e6:.1f} us ({mc.gemm_overhead * 1e6:.1f} us per GEMM). "
            f"Measured: {args.stat} of {args.rounds} "
            "batches (kernels interleaved), each kernel run by its reference semantics "
            "(`ops.evaluate`) in torch; permutes are materialised (`.contiguous()`).\n\n"
            f"**Spearman rank correlation, predicted vs measured: "
            f"{correlations(rows, 'pred')}** with `CostModel(machine())` (fused ops priced as "
            "one kernel, as extraction uses it). With `backend=\"reference\"` (fused ops "
            f"priced as the decomposition their reference runs): {correlations(rows, 'ref')}."
            "\n\n**Absolute error** (the default model): "
            f"{describe_error([r['meas'] / r['pred'] for r in rows if r['pred'] > 0])}; "
            "with the reference backend's prices: "
            f"{describe_error([r['meas'] / r['ref'] for r in rows if r['ref'] > 0])}."
            + (f"\n\n{warning}." if warning else "")
            + "\n\n" + fused_vs_parts(rows) + "\n\n" + table(rows)
            + ("\n\n" + programs_text(runs, args.stat, args.rounds) if runs else ""))
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"kernels": [
            {"label": r["kernel"].label, "seq": r["kernel"].seq, "pred": r["pred"],
             "ref": r["ref"], "meas": r["meas"]} for r in rows], "programs": runs}, indent=1))
    if args.write:
        from optimize_time import write_section

        write_section(text, SECTION)


if __name__ == "__main__":
    main()
