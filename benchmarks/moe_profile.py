"""Where a mixture of experts' time goes, kernel by kernel: the two profiles behind docs/moe.md's
decisions not to fuse (the shared expert with the routed ones; the experts' SwiGLU into their
GEMM).

    .venv/bin/python benchmarks/moe_profile.py [--calls 300] [--prefill-calls 5] [--write]

1. A Qwen2-MoE shape at one token (d 1024, 16 experts of 704 chosen 4, a shared expert of
   2816, 2 layers, vocab 32000; random weights): the shared expert's GEMVs (the dense mm/gemm
   nodes whose weight has its 2816 side), the routed experts' `expert_mm` calls, and the small
   kernels a fused shared expert would remove (its SwiGLU and its gate's sigmoid, product and
   sum), per layer; GB/s = the weights' bytes over the kernels' time.
2. The large Mixtral (model_matrix.mixtral_large, 4 layers) at a 128-token prefill: the
   experts' `swiglu` kernels against their `expert_mm` GEMMs and the whole call.

`eqsat_llm.profile.profile_program` times every kernel of the C program (median over the
calls). --write puts both tables in benchmarks/RESULTS.md ("Mixture-of-experts profiles")."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_time import cpu_name, write_section

from eqsat_llm import optimize
from eqsat_llm.ir import Graph
from eqsat_llm.models.model_matrix import Logits, mixtral_large
from eqsat_llm.profile import profile_program

SHARED = 2816  # the Qwen2-MoE shape's shared expert width


def qwen2_moe() -> torch.nn.Module:
    import transformers

    cfg = transformers.Qwen2MoeConfig(
        hidden_size=1024, intermediate_size=SHARED, shared_expert_intermediate_size=SHARED,
        moe_intermediate_size=704, num_experts=16, num_experts_per_tok=4,
        num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=256)
    torch.manual_seed(0)
    return Logits(transformers.Qwen2MoeForCausalLM(cfg).eval(), "logits").eval()


MOVES = ("permute", "view", "transpose", "reshape", "contiguous")  # (no copy of the weight)
WEIGHTED = ("gemm", "mm", "expert_mm")


def weight_bytes(graph: Graph, node_id: int) -> tuple[tuple[int, ...], int]:
    """(shape, bytes) of the constant weight a product node reads (input 1, through views)."""
    w = graph.node(graph.node(node_id).inputs[1])
    while w.op in MOVES:
        w = graph.node(w.inputs[0])
    if w.op not in ("const", "param") or w.attrs.get("name") not in graph.constants:
        return (), 0
    t = graph.constants[w.attrs["name"]]
    return tuple(t.shape), t.numel() * t.element_size()


def kind(graph: Graph, entry: dict[str, Any]) -> str:
    """Which part of a Qwen2-MoE layer a profiled kernel is."""
    ops = [graph.node(i).op for i in entry["node_ids"]]
    if "expert_mm" in ops:
        return "routed experts (expert_mm)"
    for i in entry["node_ids"]:
        if graph.node(i).op in ("gemm", "mm"):
            shape, _ = weight_bytes(graph, i)
            if SHARED in shape or 2 * SHARED in shape:
                return "shared expert GEMVs"
    return "other"


def profile(model: torch.nn.Module, ids: torch.Tensor, calls: int) -> tuple[Any, dict]:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        compiled = optimize(model, (ids,), measure_eager=False)
        return compiled, profile_program(compiled, (ids,), repeats=calls)


def shared_expert_table(calls: int) -> list[str]:
    ids = torch.randint(0, 32000, (1, 1), generator=torch.Generator().manual_seed(0))
    compiled, result = profile(qwen2_moe(), ids, calls)
    graph, layers = compiled.graph, 2
    parts: dict[str, list[float]] = {}
    for e in result["kernels"]:
        k = kind(graph, e)
        nbytes = sum(weight_bytes(graph, i)[1] for i in e["node_ids"]
                     if graph.node(i).op in WEIGHTED)
        us = e["measured_us"] or 0.0
        t = parts.setdefault(k, [0.0, 0.0, 0])
        t[0] += us
        t[1] += nbytes
        t[2] += 1
    total = sum(t[0] for t in parts.values())
    rows = ["| kernels (per layer) | calls | weight MB | us | GB/s |", "|---|---|---|---|---|"]
    for k in ("shared expert GEMVs", "routed experts (expert_mm)", "other"):
        us, nbytes, n = parts.get(k, [0.0, 0.0, 0])
        # (routed: the weights of the experts a token chooses, 4 of 16, as the kernel reads)
        read = nbytes * 4 / 16 if k.startswith("routed") else nbytes
        rate = f"{read / us / 1e3:.0f}" if us and read else ""
        rows.append(f"| {k} | {n / layers:.0f} | {read / layers / 1e6:.1f} | "
                    f"{us / layers:.0f} | {rate} |")
    rows.append(f"| whole call | | | {total:.0f} | |")
    return rows


def swiglu_table(calls: int) -> list[str]:
    ids = torch.randint(0, 32000, (1, 128), generator=torch.Generator().manual_seed(0))
    compiled, result = profile(mixtral_large(), ids, calls)
    graph = compiled.graph
    sums = {"experts' swiglu": 0.0, "expert GEMMs (expert_mm)": 0.0}
    for e in result["kernels"]:
        ops = {graph.node(i).op for i in e["node_ids"]}
        us = e["measured_us"] or 0.0
        if "expert_mm" in ops:
            sums["expert GEMMs (expert_mm)"] += us
        elif ops == {"swiglu"}:
            sums["experts' swiglu"] += us
    total = sum(e["measured_us"] or 0.0 for e in result["kernels"])
    rows = ["| kernels (4 layers) | ms | share |", "|---|---|---|"]
    rows += [f"| {k} | {v / 1e3:.1f} | {100 * v / total:.1f}% |" for k, v in sums.items()]
    rows.append(f"| whole call | {total / 1e3:.1f} | 100% |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--prefill-calls", type=int, default=5)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(2)
    start = time.time()
    one = shared_expert_table(args.calls)
    print("\n".join(one))
    pre = swiglu_table(args.prefill_calls)
    print("\n".join(pre))
    if args.write:
        head = (f"Command: `.venv/bin/python benchmarks/moe_profile.py {' '.join(sys.argv[1:])}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(start))}, {cpu_name()}, "
                f"2 threads; torch {torch.__version__}). Median kernel times of "
                "`profile_program`.")
        body = (head + "\n\nQwen2-MoE shape, one token (the shared expert beside the routed "
                f"ones; {args.calls} calls):\n\n" + "\n".join(one) +
                "\n\nLarge Mixtral, 128-token prefill (the experts' SwiGLU beside their GEMMs; "
                f"{args.prefill_calls} calls):\n\n" + "\n".join(pre))
        write_section(body, "## Mixture-of-experts profiles (benchmarks/moe_profile.py)")


if __name__ == "__main__":
    main()
