"""What a torch step costs inside a C program: `x -> mul -> softmax -> mul` on [4, 64], the
softmax generated in C or run in torch between two C segments (a fallback node calling
`aten._softmax`), and the same block repeated 8 times; beside them the torch op alone.

    .venv/bin/python benchmarks/torch_steps.py [--write] [--rounds 15]

One process, interleaved rounds (compare_cpu.interleaved_medians), median time per call."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cpu import interleaved_medians
from optimize_time import write_section

from eqsat_llm.capture.converter import Slot
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.ir import Graph, TensorType

SECTION = "## Torch steps between C segments"
SHAPE = (4, 64)


def _program(blocks: int, in_torch: bool) -> Graph:
    g = Graph()
    t = TensorType(SHAPE, "float32")
    x = g.append("input", (), {"name": "x", "index": 0}, t)
    for _ in range(blocks):
        y = g.add("mul", (x, g.add("scalar", value=1.5, kind="float")))
        if in_torch:
            y = g.append("fallback", (y,), {"target": "aten._softmax.default", "key": len(g.nodes),
                                            "fn": torch.ops.aten._softmax.default,
                                            "template": ((Slot(0), -1, False), {})}, t)
        else:
            y = g.add("softmax", (y,), dim=-1)
        x = g.add("mul", (y, g.add("scalar", value=2.0, kind="float")))
    g.outputs = [x]
    return g


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    x = torch.randn(*SHAPE)
    systems = {}
    for blocks in (1, 8):
        for in_torch in (False, True):
            rt = CRuntime(_program(blocks, in_torch))
            assert bool(rt.torch_steps) == in_torch
            name = f"{blocks} block(s), {'softmax in torch' if in_torch else 'all C'}"
            systems[name] = (lambda r=rt: r.run([x]))
    buf = torch.empty(*SHAPE)
    systems["aten._softmax + copy_ alone"] = lambda: buf.copy_(
        torch.ops.aten._softmax.default(x, -1, False))
    with torch.no_grad():
        med = interleaved_medians(systems, args.rounds, 0.05)
    rows = [f"| {name} | {s * 1e6:.1f} us |" for name, s in med.items()]
    per_step = (med["8 block(s), softmax in torch"] - med["8 block(s), all C"]) / 8 \
        - med["aten._softmax + copy_ alone"]
    text = "\n".join([
        SECTION, "",
        (f"Command: `.venv/bin/python benchmarks/torch_steps.py --write` "
        f"({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads). One process, "
        f"{args.rounds} interleaved rounds, median per call."), "",
        "| program | median per call |", "|---|---|", *rows, "",
        (f"A torch step costs its torch op and {per_step * 1e6:.1f} us more (8 blocks with the "
        "softmax in torch minus all C, per step, minus the op alone)."), ""])
    print(text)
    if args.write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
