"""Memory of the static plan against eager PyTorch, per reference workload, before and after
optimization.

    .venv/bin/python benchmarks/memory_plan.py [--write] [--no-stack]

Prints one row per workload and stage; with --write, replaces the "## Memory plan" section of
benchmarks/RESULTS.md. Peaks are measured with torch.profiler memory events (the running sum of
allocated minus freed bytes during one call, weights excluded).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from optimize_time import write_section

from eqsat_llm.api import optimize_graph
from eqsat_llm.capture import capture
from eqsat_llm.codegen import ReferenceRuntime
from eqsat_llm.codegen.planned import PlannedRuntime, memory_events, peak_bytes
from eqsat_llm.models.workloads import WORKLOADS, stacked_llama_blocks
from eqsat_llm.plan import check_plan, plan_memory
from eqsat_llm.rulebook import resolve

SECTION = "## Memory plan"


def kib(n: int) -> str:
    return f"{n / 1024:,.1f}"


def measure(name: str, stage: str, graph, inputs: list, eager_peak: int) -> dict:
    t = time.perf_counter()
    plan = plan_memory(graph)
    plan_s = time.perf_counter() - t
    check_plan(graph, plan)
    runtime = PlannedRuntime(graph, plan)
    with torch.no_grad():
        runtime.run(inputs)  # warm up (lazy kernels, thread pools)
        events = memory_events(lambda: runtime.run(inputs))
        reference_peak = peak_bytes(lambda: ReferenceRuntime(graph).run(inputs))
    total = call_peak = allocated = 0
    for _, size, _ in events:
        total += size
        call_peak = max(call_peak, total)
        allocated += max(size, 0)
    return {"name": name, "stage": stage, "eager": eager_peak, "reference": reference_peak,
            "arena": plan.arena_bytes, "lower": plan.lower_bound_bytes,
            "naive": plan.naive_bytes, "call_peak": call_peak, "allocated": allocated,
            "planned": plan.arena_bytes + call_peak, "buffers": len(plan.buffers),
            "inplace": plan.inplace_count, "views": plan.alias_count,
            "schedule": plan.schedule, "copy_in": ", ".join(runtime.copy_in_ops) or "-",
            "plan_s": plan_s}


def table(rows: list[dict]) -> str:
    head = ("| workload | stage | eager peak KiB | reference runtime peak KiB | arena KiB | "
            "lower bound KiB | arena / bound | naive sum KiB | per-call peak KiB (outputs + "
            "copy-in) | planned total KiB | in place / views | schedule | copy-in ops | "
            "plan s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['stage']} | {kib(r['eager'])} | {kib(r['reference'])} | "
            f"{kib(r['arena'])} | {kib(r['lower'])} | {r['arena'] / max(r['lower'], 1):.3f} | "
            f"{kib(r['naive'])} | {kib(r['call_peak'])} | {kib(r['planned'])} | "
            f"{r['inplace']} / {r['views']} | {r['schedule']} | {r['copy_in']} | "
            f"{r['plan_s']:.2f} |")
    return "\n".join(lines)


def stack_line(depth: int = 32) -> str:
    x = torch.randn(1, 16, 512, generator=torch.Generator().manual_seed(0))
    graph = capture(stacked_llama_blocks(depth).eval(), (x,)).graph
    t = time.perf_counter()
    plan = plan_memory(graph)
    plan_s = time.perf_counter() - t
    t = time.perf_counter()
    check_plan(graph, plan)
    check_s = time.perf_counter() - t
    return (f"Stacked LLaMA-style blocks, depth {depth}, prefill 1x16 (captured, "
            f"{len(plan.order)} live nodes): plan {plan_s:.2f} s, check {check_s:.3f} s, "
            f"arena {kib(plan.arena_bytes)} KiB = {plan.arena_bytes / plan.lower_bound_bytes:.3f}"
            f" x lower bound, naive sum {kib(plan.naive_bytes)} KiB.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--no-stack", action="store_true", help="skip the depth-32 timing")
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    rows = []
    for name, build in WORKLOADS.items():
        model, inputs = build()
        captured = capture(model, inputs)
        with torch.no_grad():
            model(*inputs)
            eager = peak_bytes(lambda: model(*inputs))  # noqa: B023 (called right here)
        graphs = {"captured": captured.graph,
                  "optimized": optimize_graph(captured.graph, resolve(None))}
        for stage, graph in graphs.items():
            rows.append(measure(name, stage, graph, list(inputs), eager))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/memory_plan.py --write` "
            f"({platform.machine()}, {torch.get_num_threads()} threads, torch "
            f"{torch.__version__}). Peaks are torch.profiler memory events (running sum of "
            "allocated - freed bytes over one call; weights excluded, outputs included). "
            "*eager*: the model itself; *reference runtime*: the IR graph run node by node, "
            "freeing each value after its last use; *arena*: the planned arena (allocated once, "
            "at construction); *lower bound*: max over schedule steps of the bytes of buffers "
            "live at that step (64-byte rounded, views 0, in-place once); *naive sum*: every "
            "intermediate in its own buffer; *per-call peak*: what a planned call still "
            "allocates (the outputs, and the temporaries of copy-in ops); *planned total* = "
            "arena + per-call peak. *optimized* = `optimize_graph(graph, resolve(None))`.\n\n"
            + table(rows))
    if not args.no_stack:
        text += "\n\n" + stack_line()
    print(text)
    if args.write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
