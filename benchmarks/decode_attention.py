"""The decode step's attention over a long KV cache, against the machine's read bandwidth.

    .venv/bin/python benchmarks/decode_attention.py [--positions 127 1023 4095] [--write]

A decode step reads every key and value the token can see: at 4096 positions TinyLlama's
(4 KV heads of 64, float32) are 8.4 MB a layer, beside 27 MB of its int4 weights. The
attention kernel should stream them at the memory's rate. Two LLaMAs of TinyLlama's width
(2 layers; int4 weights, which only make the programs build faster: the attention does not
read them): TinyLlama's grouped-query attention (32 query heads over 4 KV heads: a KV head's
8 query heads one tile of the C flash kernel, codegen/c/emit_attention.py) and multi-head
attention (32 over 32: a row a tile). Each gets a Generator with a cache of `--cache`
positions; the decode program runs at each position with the mask showing the positions up
to it, and `profile_program` times its attention kernels (the mean of the layers'),
interleaved rounds, median of the rounds. GB/s = the keys' and values' bytes the token sees
over the kernel's time; the bound is the best read rate of the same process
(machine_limits.read_bandwidth: 4 streams a thread, 2 threads). The ISA is the build's:
`EQSAT_ISA=avx2` for the AVX2 kernels (their own RESULTS section).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_limits import read_bandwidth
from optimize_time import cpu_name, write_section

from eqsat_llm import Generator
from eqsat_llm.models.model_matrix import TINYLLAMA
from eqsat_llm.profile import profile_program

SHAPES = {"GQA, 32 query heads over 4 KV heads": 4, "MHA, 32 over 32": 32}  # -> KV heads
HEAD_DIM = TINYLLAMA["hidden"] // TINYLLAMA["heads"]


def decode_program(cache: int, kv_heads: int):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=TINYLLAMA["vocab"], hidden_size=TINYLLAMA["hidden"],
        intermediate_size=TINYLLAMA["ffn"], num_hidden_layers=2,
        num_attention_heads=TINYLLAMA["heads"], num_key_value_heads=kv_heads,
        max_position_embeddings=cache, attn_implementation="sdpa", use_cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlamaForCausalLM(config).eval()
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


def kv_bytes(pos: int, kv_heads: int) -> int:
    """The keys' and values' bytes a layer's attention reads at `pos`: float32."""
    return 2 * kv_heads * (pos + 1) * HEAD_DIM * 4


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
    programs = {name: decode_program(args.cache, kv) for name, kv in SHAPES.items()}
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, program in programs.items():
            for pos in args.positions:
                samples.setdefault((name, pos), []).append(
                    attention_us(program, args.cache, pos, args.calls))
    bound = read_bandwidth(1.0, 3, 2)
    lines = ["| attention | keys visible | KV MB a layer | us | GB/s | of the read bound |",
             "|---|---|---|---|---|---|"]
    for name, kv in SHAPES.items():
        for pos in args.positions:
            us = statistics.median(samples[(name, pos)])
            rate = kv_bytes(pos, kv) / us / 1e3
            lines.append(f"| {name} | {pos + 1} | {kv_bytes(pos, kv) / 1e6:.2f} | {us:.1f} | "
                         f"{rate:.1f} | {rate / bound:.0%} |")
    table = "\n".join(lines)
    print(table)
    print(f"read bound: {bound:.1f} GB/s")
    if args.write:
        isa = os.environ.get("EQSAT_ISA", "native")
        head = (f"Command: `{'EQSAT_ISA=' + isa + ' ' if isa != 'native' else ''}"
                f".venv/bin/python benchmarks/decode_attention.py {' '.join(sys.argv[1:])}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, {cpu_name()}, "
                f"{platform.machine()}, {os.cpu_count()} cores, ISA {isa}; torch "
                f"{torch.__version__}). TinyLlama's width (heads of {HEAD_DIM}, float32 cache "
                f"of {args.cache} positions), 2 threads; the decode program's attention "
                f"kernels timed in place (profile_program, {args.calls} calls, median of "
                f"{args.rounds} interleaved rounds). Read bound: {bound:.1f} GB/s "
                "(machine_limits.read_bandwidth, same process).")
        title = "## Decode attention over a long cache (benchmarks/decode_attention.py)"
        write_section(head + "\n\n" + table, title + ("" if isa == "native" else
                                                      f", EQSAT_ISA={isa}"))


if __name__ == "__main__":
    main()
