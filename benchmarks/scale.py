"""Optimization time per phase and peak memory for LLaMA-7B's layers on the meta device.

    .venv/bin/python benchmarks/scale.py [--depths 1 2 4 8 16 32] [--seq 128] [--write]

LLaMA-7B's block shapes (d=4096, FFN 11008, 32 heads of 128; workloads.LLAMA_7B) stacked 1..32 deep,
built on the meta device: no weight has storage, so every phase up to the memory plan runs and
nothing is generated (eqsat_llm/weights/meta.py). Each depth runs in a fresh process, so its peak
RSS is its own. Prints one row per depth; with --write, replaces the section in
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

PHASES = ("capture", "encode", "saturate", "serialize", "extract", "decode", "fold", "explain",
          "plan")
SECTION = "## Scale: LLaMA-7B's layers on the meta device (benchmarks/scale.py)"


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def measure(depth: int, seq: int) -> dict:
    """One depth, in this process: optimize the meta model, return the report's figures."""
    from eqsat_llm import optimize

    model, x = _meta_model(depth, seq)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rss_before, cpu = _rss_mib(), _cpu_seconds()
    t = time.perf_counter()
    # the phases are what is measured: not a program an earlier depth or run left in the cache
    with mock.patch.dict(os.environ, {"EQSAT_PROGRAM_CACHE": "0"}):
        compiled = optimize(model, (x,))
    total, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
    r = compiled.report
    assert all(p.is_meta for p in model.parameters())  # nothing was materialised
    return {"depth": depth, "total": total, "cpu": cpu,
            **{p: r.timings.get(p, 0.0) for p in PHASES},
            "ops_before": sum(r.op_counts_before.values()),
            "ops_after": sum(r.op_counts_after.values()), "enodes": r.enodes,
            "iterations": r.iterations, "stop": r.stop_reason,
            "stamped": r.stamped_calls,
            "arena_mib": compiled.plan.arena_bytes / 2**20, "weights_gib": weights / 2**30,
            "rss_before_mib": rss_before,
            # ru_maxrss is KiB on Linux: this process's peak
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_full_trace(depth: int, seq: int) -> float:
    """Seconds of the same capture with every layer traced (no stamping), for comparison."""
    from eqsat_llm.capture.converter import capture_plain

    model, x = _meta_model(depth, seq)
    t = time.perf_counter()
    capture_plain(model, (x,))
    return time.perf_counter() - t


def _meta_model(depth: int, seq: int) -> tuple:
    import torch

    from eqsat_llm.models.workloads import LLAMA_7B, stacked_llama_blocks

    torch.set_num_threads(2)
    model = stacked_llama_blocks(depth, **LLAMA_7B, device="meta")
    return model, torch.empty(1, seq, LLAMA_7B["d_model"], device="meta")


def measure_fresh(depth: int, seq: int) -> dict:
    """One depth in a fresh interpreter, so the peak RSS is that depth's alone; the full-trace
    capture in another one, so that both start cold."""
    def child(*args: str) -> Any:
        out = subprocess.run([sys.executable, __file__, *args, str(depth), "--seq", str(seq)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
        return json.loads(out.stdout.strip().splitlines()[-1])
    return {**child("--one"), "full_trace": child("--full-trace")}


def table(rows: list[dict]) -> str:
    head = ("| depth | weights (meta) GiB | ops before -> after | e-nodes | iterations | "
            "layers stamped | " + " | ".join(f"{p} s" for p in PHASES)
            + " | total s | CPU s | peak RSS MiB (before optimize) | arena MiB | "
            "capture, every layer traced s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['depth']} | {r['weights_gib']:.1f} | {r['ops_before']} -> "
                     f"{r['ops_after']} | {r['enodes']} | {r['iterations']} ({r['stop']}) | "
                     f"{r['stamped']} | " + " | ".join(f"{r[p]:.2f}" for p in PHASES)
                     + f" | {r['total']:.2f} | {r['cpu']:.2f} | {r['peak_rss_mib']:.0f} "
                     f"({r['rss_before_mib']:.0f}) | {r['arena_mib']:.1f} | "
                     f"{r['full_trace']:.2f} |")
    return "\n".join(lines)


def growth(rows: list[dict]) -> str:
    """Seconds per layer between the two deepest runs, per phase: linear growth keeps it
    flat as depth doubles."""
    if len(rows) < 3:
        return ""
    a, b, c = rows[-3], rows[-2], rows[-1]

    def per_layer(p: str, lo: dict, hi: dict) -> float:
        return (hi[p] - lo[p]) / (hi["depth"] - lo["depth"])
    cells = ", ".join(f"{p} {per_layer(p, a, b):.3f} -> {per_layer(p, b, c):.3f}"
                      for p in (*PHASES, "total"))
    after = sum(c[p] for p in PHASES[1:])
    return (f"Seconds per added layer, depth {a['depth']}->{b['depth']} then "
            f"{b['depth']}->{c['depth']} (flat = linear): {cells}. At depth {c['depth']}, "
            f"capture takes {c['capture']:.1f} s of {c['total']:.1f} s; the phases after it "
            f"{after:.1f} s; tracing every layer would take {c['full_trace']:.1f} s instead of "
            f"{c['capture']:.1f}.")


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one depth
    parser.add_argument("--full-trace", type=int, help=argparse.SUPPRESS)  # a child: capture
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.seq)))
        return
    if args.full_trace is not None:
        print(json.dumps(measure_full_trace(args.full_trace, args.seq)))
        return
    load_before, rows = _load(), []
    for d in args.depths:
        rows.append(measure_fresh(d, args.seq))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    import torch

    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/scale.py --write` "
            f"({platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; load "
            f"average (1/5/15 min) {load_before} at the start, {_load()} at the end). "
            f"LLaMA-7B's block shapes (d 4096, FFN 11008, 32 heads of 128) stacked 1..32 deep "
            f"on the meta device, prefill 1x{args.seq}; defaults: all rule families, ILP "
            "extraction. No weight has storage: every phase up to the memory plan runs, no "
            "code is generated (docs/memory.md). *layers stamped*: layer calls traced once and "
            "spliced (eqsat_llm/capture/stamping.py); *capture, every layer traced*: the same "
            "capture without stamping (converter.capture_plain) in another fresh process, for "
            "comparison. Each depth in a fresh process: *peak RSS* is "
            "that process's ru_maxrss (imports included), *before optimize* its RSS once "
            "torch, egglog and the meta model were loaded. *total* is optimize()'s wall time, "
            "*CPU* its process CPU time.\n\n" + table(rows) + "\n\n" + growth(rows))
    print(text)
    if args.write:
        sys.path.insert(0, str(Path(__file__).parent))
        from optimize_time import write_section

        write_section(text, SECTION)


if __name__ == "__main__":
    main()
