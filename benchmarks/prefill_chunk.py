"""The Generator's two design numbers, measured: which prefill chunk to compile, and what a
decode step costs as the cache grows (it should follow the tokens so far, not the cache size).

    .venv/bin/python benchmarks/prefill_chunk.py [--chunks 16 32 64 128] [--layers 4] [--write]

Part 1: per chunk size, the compile time of the Generator and the prefill time of prompts of
several lengths (TinyLlama-shaped LLaMA). Part 2: the decode step's time at a few positions
with caches of 256 and 2048 positions. Medians of interleaved rounds; with --write, replaces
its section in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_time import write_section

from eqsat_llm import Generator
from eqsat_llm.models.model_matrix import tinyllama

SECTION = "## Prefill chunk and decode cost against cache length (benchmarks/prefill_chunk.py)"


def median_ms(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def prefill_rows(model, chunks: list[int], prompts: list[int], rounds: int) -> list[str]:
    """All Generators built first, then every (chunk, prompt) cell timed in interleaved
    rounds, so that the machine's drift hits every chunk size alike."""
    vocab = model.config.vocab_size
    gens, compile_s = {}, {}
    for c in chunks:
        t = time.perf_counter()
        gens[c] = Generator(model, 256, prefill_chunk=c)
        compile_s[c] = time.perf_counter() - t
    ids = {p: torch.randint(3, vocab - 1, (1, p), generator=torch.Generator().manual_seed(p))
           for p in prompts}
    samples: dict[tuple[int, int], list[float]] = {(c, p): [] for c in chunks for p in prompts}
    for _ in range(rounds):
        for (c, p), times in samples.items():
            times.append(median_ms(lambda g=gens[c], x=ids[p]: g.generate(x, 1), 1))
    rows = [f"| {c} | {compile_s[c]:.1f} | " + " | ".join(
        f"{statistics.median(samples[c, p]):.0f}" for p in prompts) + " |" for c in chunks]
    print("\n".join(rows), flush=True)
    del gens
    gc.collect()
    return rows


def decode_rows(model, sizes: list[int], positions: list[int], rounds: int) -> list[str]:
    """The decode program of a Generator per cache size, every (size, position) cell timed
    in interleaved rounds."""
    vocab = model.config.vocab_size
    progs = {size: Generator(model, size, prefill_chunk=64).decode_program for size in sizes}
    calls = {}
    for size in sizes:
        for pos in positions:
            mask = torch.zeros(1, size, dtype=torch.long)
            mask[:, :pos + 1] = 1
            calls[size, pos] = (torch.randint(3, vocab - 1, (1, 1)), torch.tensor(pos),
                                torch.tensor([[pos]]), mask, torch.zeros(1, dtype=torch.long))
    samples: dict[tuple[int, int], list[float]] = {key: [] for key in calls}
    for _ in range(rounds):
        for (size, pos), args in calls.items():
            samples[size, pos].append(median_ms(lambda p=progs[size], a=args: p(*a), 3))
    rows = [f"| {size} | " + " | ".join(f"{statistics.median(samples[size, p]):.2f}"
                                        for p in positions) + " |" for size in sizes]
    print("\n".join(rows), flush=True)
    del progs
    gc.collect()
    return rows


def attention_rows(sizes: list[int], visible: list[int], rounds: int) -> list[str]:
    """The decode attention kernel alone (TinyLlama's heads: 32 query heads over 4 KV heads
    of 64), its mask a run-time input that shows `visible` keys of a cache of `size`."""
    from eqsat_llm.codegen.c import CRuntime
    from eqsat_llm.ir import Graph, TensorType

    rows = []
    for size in sizes:
        g = Graph()
        shapes = [(1, 32, 1, 64), (1, 4, size, 64), (1, 4, size, 64), (1, 1, 1, size)]
        ins = [g.append("input", (), {"name": f"x{i}", "index": i}, TensorType(sh, "float32"))
               for i, sh in enumerate(shapes)]
        no_sink = g.add("scalar", value=float("-inf"), kind="float")
        g.outputs = [g.add("attention", (*ins, no_sink), scale=0.125, softcap=0.0)]
        rt = CRuntime(g)
        cells = []
        for n in visible:
            xs = [torch.randn(sh) for sh in shapes]
            xs[3] = torch.full(shapes[3], float("-inf"))
            xs[3][..., :n] = 0.0
            per_100 = median_ms(lambda rt=rt, xs=xs: [rt.run(xs) for _ in range(100)], rounds)
            cells.append(f"{per_100 * 10:.1f}")  # ms per 100 calls -> us per call
        rows.append(f"| {size} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--prompts", type=int, nargs="+", default=[17, 64, 128, 200])
    parser.add_argument("--positions", type=int, nargs="+", default=[16, 128, 255])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model = tinyllama(args.layers)
    head = "| chunk | compile s | " + " | ".join(f"prompt {p} ms" for p in args.prompts) + " |"
    part1 = [head, "|" + "---|" * (len(args.prompts) + 2)]
    print(part1[0], flush=True)
    part1 += prefill_rows(model, args.chunks, args.prompts, args.rounds)
    head = "| cache positions | " + " | ".join(f"step at {p} ms" for p in args.positions) + " |"
    part2 = [head, "|" + "---|" * (len(args.positions) + 1)]
    print(part2[0], flush=True)
    part2 += decode_rows(model, [256, 2048], args.positions, args.rounds)
    visible = [17, 129, 256]
    head = "| cache positions | " + " | ".join(f"{n} keys visible, us" for n in visible) + " |"
    part3 = [head, "|" + "---|" * (len(visible) + 1)]
    print(part3[0], flush=True)
    part3 += attention_rows([256, 2048], visible, args.rounds)
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/prefill_chunk.py {argv_text}`"
            f" ({time.strftime('%Y-%m-%d')}, {platform.machine()}, "
            f"{torch.get_num_threads()} threads; TinyLlama-shaped LLaMA, {args.layers} layers, "
            "fp32, batch 1, medians of interleaved rounds).\n\n"
            "Prefill: the Generator's compile time (both programs) and the time of a "
            "`generate(ids, 1)` (prefill + one token) per prompt length, per chunk size:\n\n"
            + "\n".join(part1) + "\n\nOne decode step (the whole program) at a cache "
            "position, with caches of two sizes: the attention reads the valid prefix only, so "
            "the cache's size should not show:\n\n" + "\n".join(part2) + "\n\nThe decode "
            "step's attention kernel alone (32 query heads over 4 KV heads, one token), its "
            "mask a run-time input showing the first keys of the cache:\n\n" + "\n".join(part3))
    print(text)
    if args.write:
        write_section(text, SECTION)
    return text


if __name__ == "__main__":
    main()
