"""Rotary embedding in the Q/K projection's epilogue (codegen/c/fuse_rope.py): a rope
that reads a head split of a packed GEMM's output is computed by the GEMM's kernel and its own
kernel is dropped. Checked against the reference runtime on the layouts the pattern allows
(batch > 1, head dims 32/64/128, rows not a multiple of the 14-row tile, cos/sin [S, D] or
[1, 1, S, D], the rope on (b, s, h, d) or (b, h, s, d)), on the cases it must refuse, and on
the LLaMA-style block and HF LLaMA."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.models.workloads import llama_block_case, llama_case
from eqsat_llm.ops import add_gemm
from eqsat_llm.plan import MemoryPlan, plan_memory

from .conftest import max_error
from .eager_oracle import run_eager

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def _const(g: Graph, name: str, shape: tuple[int, ...], seed: int) -> int:
    gen = torch.Generator().manual_seed(seed)
    g.constants[name] = torch.randn(shape, generator=gen) / shape[0] ** 0.5
    return g.append("const", (), {"name": name}, TensorType(shape, "float32"))


def qkv_graph(b: int, s: int, heads: int, d: int, *, norm: bool = False, cs_4d: bool = False,
              permuted: bool = True, k_model: int = 64) -> Graph:
    """x [b, s, k_model] -> (norm +) one GEMM against [Wq | Wk | Wv] -> q, k head split ->
    rope each; outputs rope(q), rope(k) and v (a head split of the GEMM's last columns)."""
    g = Graph()
    n = heads * d
    x = g.append("input", (), {"name": "x", "index": 0}, TensorType((b, s, k_model), "float32"))
    w = _const(g, "w", (k_model, 3 * n), 1)
    cs_shape = (1, 1, s, d) if cs_4d and permuted else (s, 1, d) if not permuted else (s, d)
    cos, sin = _const(g, "cos", cs_shape, 2), _const(g, "sin", cs_shape, 3)
    if norm:
        gain = _const(g, "g", (k_model,), 4)
        t = add_gemm(g, x, w, norm=gain, eps=1e-6, prologue="rms_norm")
    else:
        t = g.add("matmul", (x, w), alpha=1.0)
    outs = []
    for i in range(3):
        part = g.add("slice", (t,), dim=2, start=i * n, end=(i + 1) * n, step=1)
        split = g.add("view", (part,), shape=[b, s, heads, d])
        if permuted:
            split = g.add("permute", (split,), dims=[0, 2, 1, 3])
        outs.append(g.add("rope", (split, cos, sin)) if i < 2 else split)
    g.outputs = outs
    return g


def _run(g: Graph, **kw) -> tuple[CRuntime, list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(g.node(i).type.shape, generator=gen) for i in g.input_ids]
    rt = CRuntime(g, **kw)
    return rt, tuple(rt.run(inputs)), tuple(run_eager(g, inputs))  # torch eager's answer


def _in_epilogue(rt: CRuntime) -> tuple[int, ...]:
    return tuple(r for k in rt.program.kernels for r in k.epilogue)


@needs_cc
@pytest.mark.parametrize("b,s,heads,d,kw", [
    (1, 16, 4, 32, {}), (1, 37, 2, 64, {}), (2, 15, 3, 64, {"norm": True}),
    (1, 1, 4, 64, {"norm": True}), (1, 1, 3, 128, {}), (2, 9, 2, 128, {"cs_4d": True}),
    (2, 20, 3, 32, {"permuted": False}), (3, 1, 2, 32, {"norm": True, "cs_4d": True}),
])
def test_fused_rope_matches_reference(b, s, heads, d, kw):
    g = qkv_graph(b, s, heads, d, **kw)
    rt, got, want = _run(g)
    ropes = tuple(n.id for n in g.nodes if n.op == "rope")
    assert _in_epilogue(rt) == ropes  # both ropes in the GEMM's kernel ...
    assert not any(k.op == "rope" for k in rt.program.kernels)  # ... and no rope kernel
    assert "eq_gemm_packed_rope(" in rt.source
    assert max_error(want, got) <= 1e-5
    # the same program with each rope its own kernel gives the same values
    off, got_off, _ = _run(g, fuse_rope=False)
    assert not _in_epilogue(off) and sum(k.op == "rope" for k in off.program.kernels) == 2
    assert max_error(got_off, got) <= 1e-5


@needs_cc
@pytest.mark.parametrize("d", [16, 48])
def test_head_dim_off_the_panel_grid_is_not_fused(d):
    # a rope pairs column j with j + d/2; the kernel visits heads of whole 32-column panels
    g = qkv_graph(1, 12, 4, d)
    rt, got, want = _run(g)
    assert not _in_epilogue(rt) and sum(k.op == "rope" for k in rt.program.kernels) == 2
    assert max_error(want, got) <= 1e-5


@needs_cc
def test_rope_of_a_gemm_that_is_not_packed_is_not_fused():
    # the weight is an input, not a constant: no packed kernel, so the rope keeps its kernel
    g = Graph()
    x = g.append("input", (), {"name": "x", "index": 0}, TensorType((1, 8, 32), "float32"))
    w = g.append("input", (), {"name": "w", "index": 1}, TensorType((32, 64), "float32"))
    cos, sin = _const(g, "cos", (8, 32), 2), _const(g, "sin", (8, 32), 3)
    t = g.add("matmul", (x, w), alpha=1.0)
    split = g.add("permute", (g.add("view", (t,), shape=[1, 8, 2, 32]),), dims=[0, 2, 1, 3])
    g.outputs = [g.add("rope", (split, cos, sin))]
    rt, got, want = _run(g)
    assert not _in_epilogue(rt) and [k.op for k in rt.program.kernels].count("rope") == 1
    assert max_error(want, got) <= 1e-5


def _reuse_graph() -> tuple[Graph, dict[str, int]]:
    """T = x @ W; e = exp(z); f = softmax(e); r = rope(head split of T[:, :, :64]);
    out = r * (head split of T[:, :, 64:]) + f."""
    g = Graph()
    x = g.append("input", (), {"name": "x", "index": 0}, TensorType((1, 8, 64), "float32"))
    z = g.append("input", (), {"name": "z", "index": 1}, TensorType((1, 2, 8, 32), "float32"))
    w = _const(g, "w", (64, 128), 1)
    cos, sin = _const(g, "cos", (8, 32), 2), _const(g, "sin", (8, 32), 3)
    t = g.add("matmul", (x, w), alpha=1.0)
    e = g.add("exp", (z,))
    f = g.add("softmax", (e,), dim=3)

    def heads(start: int) -> int:
        part = g.add("slice", (t,), dim=2, start=start, end=start + 64, step=1)
        return g.add("permute", (g.add("view", (part,), shape=[1, 8, 2, 32]),), dims=[0, 2, 1, 3])

    r = g.add("rope", (heads(0), cos, sin))
    prod = g.add("mul", (r, heads(64)))
    g.outputs = [g.add("add", (prod, f))]
    return g, {"t": t, "e": e, "f": f, "r": r, "prod": prod}


def _plan_with(g: Graph, ids: dict[str, int], offsets: dict[str, int]) -> MemoryPlan:
    """The planner's plan, run in the graph's own node order (GEMM, exp, softmax, then the
    rope: exp and softmax between the GEMM and the rope), with the given arena offsets (a
    valid plan: every buffer is dead where reused)."""
    plan = plan_memory(g)
    buffers = {nid: dataclasses.replace(plan.buffers[nid], offset=offsets[k])
               for k, nid in ids.items()}
    return dataclasses.replace(plan, order=sorted(plan.order), buffers=buffers,
                               arena_bytes=max(offsets.values()) + 4096)


@needs_cc
def test_rope_whose_output_reuses_bytes_still_in_use_is_not_fused():
    # exp's buffer is dead once softmax has read it, so the plan may give it to the rope's
    # output. Written at the GEMM's place, that output would be overwritten by exp before the
    # rope's place: this rope must keep its own kernel. With a buffer of its own it is fused.
    g, ids = _reuse_graph()
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(g.node(i).type.shape, generator=gen) for i in g.input_ids]
    want = tuple(run_eager(g, inputs))
    base = {"t": 0, "e": 4096, "f": 6144, "prod": 8192}
    for rope_offset, fused in ((4096, False), (10240, True)):
        plan = _plan_with(g, ids, base | {"r": rope_offset})
        rt = CRuntime(g, plan)
        assert (ids["r"] in _in_epilogue(rt)) == fused
        assert max_error(want, tuple(rt.run(inputs))) <= 1e-5


@needs_cc
@pytest.mark.parametrize("case", ["prefill", "decode", "llama"])
def test_workloads_compute_rope_in_the_projection(case):
    model, inputs = llama_case() if case == "llama" else llama_block_case(case)
    compiled = optimize(model, inputs, measure_eager=False)
    rt = CRuntime(compiled.graph)
    ropes = {n.id for n in compiled.graph.nodes if n.op == "rope"}
    assert ropes and set(_in_epilogue(rt)) == ropes
    assert all(k.op == "gemm[rms_norm]"
               for k in rt.program.kernels if k.epilogue)
    with torch.no_grad():
        want = model(*inputs)
    got = rt.run(list(inputs))
    assert max_error(want[0] if isinstance(want, tuple) else want, next(iter(got))) <= 1e-5
