"""Calls from several threads: one Compiled shared (its calls take turns on one arena) against
one Compiled per thread (an arena each: what per-thread arenas would give), on the LLaMA-style
block at decode and prefill.

    .venv/bin/python benchmarks/threads.py [--threads 1 2 4] [--seconds 3] [--write]

Each row runs N Python threads calling for a fixed time and counts the calls; torch's and
OpenMP's own threads stay at the machine's default (the kernels already use every core).
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time

import torch

from eqsat_llm import optimize
from eqsat_llm.models.workloads import llama_block_case

SECTION = "## Calls from several threads"


def calls_per_second(programs: list, inputs: tuple, seconds: float) -> float:
    """Calls completed per second by len(programs) threads, thread k calling programs[k]."""
    counts = [0] * len(programs)
    stop = time.perf_counter() + seconds

    def worker(k: int) -> None:
        while time.perf_counter() < stop:
            programs[k](*inputs)
            counts[k] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(programs))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = []
    for shape in ("decode_kv", "prefill"):
        model, inputs = llama_block_case(shape)
        compiled = optimize(model, inputs, measure_eager=False)
        copies = [compiled] + [compiled.on_backend("c") for _ in range(max(args.threads) - 1)]
        with torch.no_grad():
            for n in args.threads:
                shared = calls_per_second([compiled] * n, inputs, args.seconds)
                own = calls_per_second(copies[:n], inputs, args.seconds)
                rows.append((shape, n, shared, own))
                print(f"{shape:9} {n} threads: shared {shared:8.1f} calls/s, arena per "
                      f"thread {own:8.1f} calls/s ({own / shared:.2f}x)", flush=True)
    lines = [(f"Command: `.venv/bin/python benchmarks/threads.py --threads "
             f"{' '.join(map(str, args.threads))} --seconds {args.seconds:g} --write` "
             f"({platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
             f"{torch.get_num_threads()} torch threads)."), "",
             ("| shape | Python threads | one Compiled shared, calls/s | one per thread, calls/s "
             "| per-thread / shared |"), "|---|---|---|---|---|"]
    lines += [f"| {s} | {n} | {a:.1f} | {b:.1f} | {b / a:.2f} |" for s, n, a, b in rows]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from optimize_time import write_section
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
