"""The decode step's attention over a long KV cache, against the machine's read bandwidth.

    .venv/bin/python benchmarks/decode_attention.py [--positions 128 1024 4095] [--write]

A decode step reads every key and value the token can see: at 4096 positions TinyLlama's
(4 KV heads of 64, float32) are 8.4 MB a layer, beside 27 MB of its int4 weights. The
attention kernel should stream them at the memory's rate. A TinyLlama-shaped LLaMA (2 of its
22 layers; int4 weights, which only make the program build faster: the attention does not
read them) gets a Generator with a cache of `--cache` positions, built twice: with the C
backend's flash kernel as it is (key-major scores for tiles of 4 or more query rows: a KV
head's group of query heads at decode, codegen/c/emit_attention.py) and with every tile on
the transposed key blocks it had before. The decode program runs at each position with the
mask showing the positions up to it; `profile_program` times its attention kernels (the
mean of the layers'), interleaved rounds, median of the rounds. GB/s = the keys' and values'
bytes the token sees over the kernel's time; the bound is the best read rate of the same
process (machine_limits.read_bandwidth: 4 streams a thread, 2 threads). The ISA is the
build's: `EQSAT_ISA=avx2` for the AVX2 kernels (their own RESULTS section).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_limits import read_bandwidth
from optimize_time import cpu_name, write_section

from eqsat_llm import Generator
from eqsat_llm.codegen.c import emit_attention
from eqsat_llm.models.model_matrix import TINYLLAMA, tinyllama
from eqsat_llm.profile import profile_program

KERNELS = {"transposed key blocks (before)": 10**9, "key-major (now)":
           emit_attention.KEY_MAJOR_ROWS}  # -> KEY_MAJOR_ROWS (`kernel`)


@contextlib.contextmanager
def kernel(key_major_rows: int) -> Iterator[None]:
    """emit_attention.KEY_MAJOR_ROWS while a program is built and while it is profiled
    (profile_program emits and builds a timed copy of its kernels)."""
    saved, emit_attention.KEY_MAJOR_ROWS = emit_attention.KEY_MAJOR_ROWS, key_major_rows
    try:
        yield
    finally:
        emit_attention.KEY_MAJOR_ROWS = saved


def decode_program(cache: int):
    model = tinyllama(2)
    model.config.max_position_embeddings = cache
    os.environ["EQSAT_PROGRAM_CACHE"] = "0"  # (a cached program would be the other kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Generator(model, cache, quantize="int4").decode_program


def attention_us(program, cache: int, pos: int, calls: int) -> float:
    """The mean of the program's attention kernels' median time (us) at position `pos`."""
    mask = torch.zeros(1, cache, dtype=torch.long)
    mask[:, :pos + 1] = 1
    args = (torch.tensor([[7]]), torch.tensor(pos), torch.tensor([[pos]]), mask,
            torch.zeros(1, dtype=torch.long))
    kernels = profile_program(program, args, repeats=calls)["kernels"]
    times = [k["measured_us"] for k in kernels if k["ops"] == "attention"]
    if not times:
        raise SystemExit("no attention kernel in the decode program")
    return statistics.mean(times)


def kv_bytes(pos: int) -> int:
    """The keys' and values' bytes a layer's attention reads at `pos`: float32."""
    return 2 * TINYLLAMA["kv"] * (pos + 1) * (TINYLLAMA["hidden"] // TINYLLAMA["heads"]) * 4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=int, default=4096)
    p.add_argument("--positions", type=int, nargs="+", default=[127, 1023, 2047, 4095])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    if max(args.positions) >= args.cache:
        raise SystemExit("--positions must be below --cache")
    t0 = time.time()
    programs = {}
    for name, rows in KERNELS.items():
        with kernel(rows):
            programs[name] = decode_program(args.cache)
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, program in programs.items():
            for pos in args.positions:
                with kernel(KERNELS[name]):
                    samples.setdefault((name, pos), []).append(
                        attention_us(program, args.cache, pos, args.calls))
    bound = read_bandwidth(1.0, 3, 2)
    lines = ["| keys visible | KV MB a layer | " + " | ".join(
        f"{name}: us, GB/s" for name in programs) + " | speed-up | now / read bound |",
        "|---|---|" + "---|" * len(programs) + "---|---|"]
    for pos in args.positions:
        us = [statistics.median(samples[(name, pos)]) for name in programs]
        rates = [kv_bytes(pos) / t / 1e3 for t in us]
        lines.append(f"| {pos + 1} | {kv_bytes(pos) / 1e6:.2f} | " + " | ".join(
            f"{t:.1f}, {r:.1f}" for t, r in zip(us, rates)) +
            f" | {us[0] / us[1]:.2f}x | {rates[1] / bound:.0%} |")
    table = "\n".join(lines)
    print(table)
    print(f"read bound: {bound:.1f} GB/s")
    if args.write:
        isa = os.environ.get("EQSAT_ISA", "native")
        head = (f"Command: `{'EQSAT_ISA=' + isa + ' ' if isa != 'native' else ''}"
                f".venv/bin/python benchmarks/decode_attention.py {' '.join(sys.argv[1:])}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, {cpu_name()}, "
                f"{platform.machine()}, {os.cpu_count()} cores, ISA {isa}; torch "
                f"{torch.__version__}). TinyLlama's attention (32 query heads over 4 KV "
                f"heads of 64, float32 cache of {args.cache} positions), 2 threads; the "
                f"decode program's attention kernels timed in place (profile_program, "
                f"{args.calls} calls, median of {args.rounds} interleaved rounds). Read "
                f"bound: {bound:.1f} GB/s (machine_limits.read_bandwidth, same process).")
        title = "## Decode attention over a long cache (benchmarks/decode_attention.py)"
        write_section(head + "\n\n" + table, title + ("" if isa == "native" else
                                                      f", EQSAT_ISA={isa}"))


if __name__ == "__main__":
    main()
