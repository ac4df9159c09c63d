"""The C source the backend generates for a fixed set of programs, one file each,
OUTDIR/<name>.c: for changes to the C backend that must not change what it generates, run it
before and after and compare the folders (`diff -r`).

    .venv/bin/python scripts/c_sources.py OUTDIR

The programs:
- the GEMM tests' graphs (tests/test_*.py builders): the matmul ops on strided, batched and
  broadcast operands, the gemm op's residual, bias and activation epilogues, its rms_norm
  prologue (fused and row by row), its SwiGLU epilogue (packed and streamed), ropes in a
  projection's epilogue; each emitted without and with BLAS (`..._blas.c`);
- the reference workloads optimized for the C backend (eqsat_llm.models.workloads.WORKLOADS), and
  the LLaMA-style block at decode and prefill quantized (int8, int4, int8_dynamic), pruned (2:4,
  16 x 16 blocks) and in half precision (bf16, fp16: the small llama of the model matrix),
  each emitted as optimize plans it, without and with BLAS.
Emitting compiles nothing; optimize itself builds each program once (the compile cache keeps
it). About two minutes on two cores."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch

from eqsat_llm import optimize
from eqsat_llm.codegen.c.emit import emit_program
from eqsat_llm.formats.pruning import prune_2_4, prune_blocks, prune_linears
from eqsat_llm.ir import Graph
from eqsat_llm.models.model_matrix import build
from eqsat_llm.models.workloads import WORKLOADS, llama_block_case
from eqsat_llm.ops import add_gemm
from eqsat_llm.plan import MemoryPlan, plan_memory
from tests import (
    test_epilogue,
    test_linear_act,
    test_matmul_swiglu,
    test_norm_matmul,
    test_rope_epilogue,
)
from tests.conftest import const, inp


def matmul_ops(m: int) -> Graph:
    """Every matmul op on views: batched, broadcast, transposed, strided (test_c_backend's
    graph, and a batch of b broadcast against a)."""
    g = Graph()
    x = inp(g, (1, m, 37))
    w, wt, b = const(g, torch.zeros(37, 19)), const(g, torch.zeros(19, 37)), const(
        g, torch.zeros(19))
    x2 = g.add("view", (x,), shape=[m, 37])
    q, k = inp(g, (2, m, 3, 8)), inp(g, (2, 11, 3, 8))
    qp = g.add("permute", (q,), dims=[0, 2, 1, 3])
    kt = g.add("permute", (k,), dims=[0, 2, 3, 1])
    a3, b3 = inp(g, (3, m, 5)), inp(g, (3, 5, 7))
    a4, b2 = inp(g, (2, 3, m, 5)), inp(g, (3, 5, 7))
    xt = g.add("transpose", (inp(g, (37, m)),), dim0=0, dim1=1)
    g.outputs = [g.add("matmul", (x, w), alpha=1.0), g.add("matmul", (x, w), alpha=0.5),
                 g.add("mm", (x2, w), alpha=1.0), g.add("matmul", (qp, kt), alpha=0.125),
                 g.add("bmm", (a3, b3), alpha=1.0), g.add("matmul", (a4, b2), alpha=1.0),
                 g.add("mm", (xt, w), alpha=1.0),
                 g.add("addmm", (b, x2, w), beta=1.0, alpha=1.0),
                 g.add("addmm", (inp(g, (m, 19)), x2, w), beta=0.5, alpha=2.0),
                 g.add("linear", (x, wt)), g.add("linear_bias", (x, wt, b))]
    return g


def act_after_a_full_bias(m: int) -> Graph:
    """gemm[bias+act] with a batched [b, m, N] bias: the bias and the activation as loops
    after a batched GEMM."""
    g = Graph()
    x, w, b = inp(g, (2, m, 19)), const(g, torch.zeros(19, 37)), inp(g, (2, m, 37))
    g.outputs = [add_gemm(g, x, w, addend=b, epilogue="bias", act="silu")]
    return g


def graphs() -> Iterator[tuple[str, Graph]]:
    for m in (1, 5, 8, 33):
        yield f"matmul_ops_m{m}", matmul_ops(m)
        yield f"bias_act_m{m}", test_linear_act._graph(m)
        yield f"bias_act_w_input_m{m}", test_linear_act._graph(m, w_input=True)
        yield f"bias_2d_act_m{m}", test_linear_act._graph(m, bias_2d=True, beta=0.5, alpha=1.5)
        yield f"bias_act_batched_m{m}", act_after_a_full_bias(m)
    for i, (xs, rs) in enumerate(test_epilogue.SHAPES):
        yield f"residual_{i}", test_epilogue._graph(xs, rs)
        yield f"residual_w_input_{i}", test_epilogue._graph(xs, rs, alpha=0.5, w_input=True)
        yield f"residual_w_t_{i}", test_epilogue._graph(xs, rs, w_transposed=True)
    for m, lead in ((1, (1,)), (33, (2,)), (300, (2,))):
        for w_const, g_const in ((True, True), (True, False), (False, True)):
            yield (f"rms_norm_m{m}_w{int(w_const)}_g{int(g_const)}",
                   test_norm_matmul._graph(m, 48, 70, lead, w_const=w_const, g_const=g_const,
                                           alpha=0.5))
    for m in (1, 7, 40):
        for constant in (True, False):
            yield f"swiglu_m{m}_c{int(constant)}", test_matmul_swiglu._graph(m, 24, 70, constant)
    yield "swiglu_batched", test_matmul_swiglu._graph(5, 24, 40, True, (2, 3))
    for b, s, kw in ((1, 1, {}), (2, 5, {}), (1, 20, {"norm": True}), (2, 3, {"cs_4d": True}),
                     (1, 4, {"permuted": False})):
        yield f"rope_b{b}_s{s}_{'_'.join(kw) or 'plain'}", test_rope_epilogue.qkv_graph(
            b, s, 2, 32, **kw)


def models() -> Iterator[tuple[str, Callable[[], object]]]:
    for name in WORKLOADS:
        yield name, lambda n=name: optimize(*WORKLOADS[n](), measure_eager=False)
    for case in ("decode", "prefill"):
        for fmt in ("int8", "int4", "int8_dynamic"):
            yield f"block_{case}_{fmt}", lambda c=case, f=fmt: optimize(
                *llama_block_case(c), quantize=f, measure_eager=False)
        for pruned, prune in (("sparse24", lambda w: prune_2_4(w, 1)), ("bsr16", prune_blocks)):
            def sparse(c: str = case, p: Callable = prune) -> object:
                model, inputs = llama_block_case(c)
                prune_linears(model, p)
                return optimize(model, inputs, sparsity="auto", measure_eager=False)
            yield f"block_{case}_{pruned}", sparse
    for dtype in (torch.bfloat16, torch.float16):
        def half(d: torch.dtype = dtype) -> object:
            model, inputs = build("llama", seq=16, size="small")
            inputs = tuple(x.to(d) if x.is_floating_point() else x for x in inputs)
            return optimize(model.to(d), inputs, measure_eager=False)
        yield f"llama_small_{str(dtype)[6:]}", half


def write(out: Path, name: str, graph: Graph, plan: MemoryPlan) -> None:
    for blas in (False, True):
        source = emit_program(graph, plan, blas=blas).source
        (out / f"{name}{'_blas' if blas else ''}.c").write_text(source)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    for name, g in graphs():
        write(out, name, g, plan_memory(g))
    with torch.no_grad():
        for name, make in models():
            compiled = make()
            write(out, name, compiled.graph, compiled.plan)  # type: ignore[attr-defined]
    print(f"{len(list(out.glob('*.c')))} sources in {out}")


if __name__ == "__main__":
    main()
