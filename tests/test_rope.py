"""Rotary embedding as one op: `rope(x, cos, sin)` = x * cos + rotate_half(x) * sin,
one elementwise kernel. Its reference against the decomposition, the C kernel and the planned
runtime on odd shapes (h odd, cos/sin broadcast, x a strided view, in place), its shape rule
and cost, and the rules that recognise it on the LLaMA-style block and HF LLaMA."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.codegen import PlannedRuntime, ReferenceRuntime
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.egraph.analysis import analysis
from eqsat_llm.egraph.encode import encode
from eqsat_llm.egraph.language import shape
from eqsat_llm.extraction.costmodel import CostModel
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.models.workloads import llama_block_case, llama_case
from eqsat_llm.ops import evaluate

from .conftest import max_error
from .eager_oracle import run_eager

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")
H = 9  # half the head dim: odd
D = 2 * H


def _decomposed(x, cos, sin):
    s1, s2 = x[..., :H], x[..., H:]
    return x * cos + torch.cat([torch.neg(s2), s1], -1) * sin


def _inp(g: Graph, shape_: tuple[int, ...], dtype: str = "float32") -> int:
    k = sum(n.op == "input" for n in g.nodes)
    return g.append("input", (), {"name": f"x{k}", "index": k}, TensorType(shape_, dtype))


def _graph(x_shape, cs_shape, dtype="float32", x_view=False, in_place=False, const_cs=False):
    """rope(x, cos, sin); x optionally a permuted view of an input, or an arena value that dies
    at rope (so the plan may write rope's result over it)."""
    g = Graph()
    if x_view:  # an input [B, S, Hd, D] seen as [B, Hd, S, D]
        b, hd, s, d = x_shape
        x = g.add("permute", (_inp(g, (b, s, hd, d), dtype),), dims=[0, 2, 1, 3])
    else:
        x = _inp(g, x_shape, dtype)
    if in_place:
        x = g.add("neg", (x,))
    if const_cs:
        gen = torch.Generator().manual_seed(2)
        g.constants["cos"] = torch.randn(cs_shape, generator=gen, dtype=getattr(torch, dtype))
        g.constants["sin"] = torch.randn(cs_shape, generator=gen, dtype=getattr(torch, dtype))
        cos = g.append("const", (), {"name": "cos"}, TensorType(cs_shape, dtype))
        sin = g.append("const", (), {"name": "sin"}, TensorType(cs_shape, dtype))
    else:
        cos, sin = _inp(g, cs_shape, dtype), _inp(g, cs_shape, dtype)
    y = g.add("rope", (x, cos, sin))
    g.outputs = [g.add("mul", (y, y)) if in_place else y]
    return g


def _inputs(g: Graph) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(g.node(i).type.shape, generator=gen,
                        dtype=getattr(torch, g.node(i).type.dtype)) for i in g.input_ids]


def test_reference_is_the_decomposition_it_replaces():
    x, cos, sin = torch.randn(2, 3, 5, D), torch.randn(5, D), torch.randn(1, 1, 5, D)
    assert torch.equal(evaluate("rope", [x, cos, sin], {}), _decomposed(x, cos, sin))


CASES = [  # (x, cos/sin): cos/sin [S, D] and [1, 1, S, D], odd sizes; decode (S = 1)
    ((2, 3, 5, D), (5, D)), ((2, 3, 5, D), (1, 1, 5, D)), ((1, 3, 1, D), (1, D)),
    ((3, 7, D), (7, D)), ((1, 2, 33, 2), (33, 2)),
]


@needs_cc
@pytest.mark.parametrize("x_shape,cs_shape", CASES)
def test_c_kernel_matches_reference(x_shape, cs_shape):
    variants: list[dict] = [{}, {"in_place": True, "const_cs": True}, {"dtype": "float64"}]
    if len(x_shape) == 4:
        variants.append({"x_view": True})
    for kw in variants:
        g = _graph(x_shape, cs_shape, **kw)
        inputs = _inputs(g)
        want = ReferenceRuntime(g).run(inputs)[0]
        rt = CRuntime(g)
        assert sum(k.op == "rope" for k in rt.program.kernels) == 1
        got = rt.run(inputs)[0]
        assert got.shape == want.shape and got.dtype == want.dtype
        assert max_error(want, got) <= 1e-5, (x_shape, cs_shape, kw)
        assert max_error(run_eager(g, inputs)[0], got) <= 1e-5, "torch eager"
        # the planned (torch) runtime runs the reference itself: bit-identical
        assert torch.equal(PlannedRuntime(g, check=True).run(inputs)[0], want)


def test_shape_rule_and_cost():
    g = _graph((2, 3, 5, D), (5, D))
    y = g.outputs[0]
    assert g.type_of(y).shape == (2, 3, 5, D)
    enc = encode(g)
    enc.egraph.run(analysis.saturate())
    got = enc.egraph.extract(shape(enc.exprs[y]))
    assert tuple(int(d) for d in got.value) == (2, 3, 5, D)
    cm = CostModel()
    f32 = lambda *s: TensorType(s, "float32")
    x, cs, half = f32(1, 8, 128, 64), f32(128, 64), f32(1, 8, 128, 32)
    fused = cm.micros("rope", {}, [x, cs, cs], x)
    seven = (cm.micros("neg", {}, [half], half) + cm.micros("cat", {"dim": 3}, [half, half], x)
             + 2 * cm.micros("mul", {}, [x, cs], x) + cm.micros("add", {}, [x, x], x))
    assert fused < seven
    # the reference backend is charged the decomposition
    assert CostModel(backend="reference").micros("rope", {}, [x, cs, cs], x) > fused


def _rotary_leftovers(graph) -> list[int]:
    """neg nodes, and cats along the last dim (rotate_half's) still in the program."""
    return [n.id for n in graph.nodes if n.id in graph.live_ids() and (
        n.op == "neg" or (n.op == "cat" and n.attrs["dim"] % len(n.type.shape)
                          == len(n.type.shape) - 1))]


def _check(model, inputs, backend):
    compiled = optimize(model, inputs, backend=backend)
    assert compiled.report.backend == backend  # no fallback
    ops = compiled.graph.op_counts()
    assert ops["rope"] == 2 * ops["attention"] and ops["rope"] > 0, ops  # q and k, per layer
    assert not _rotary_leftovers(compiled.graph), ops
    fired = {r.name for r in compiled.report.rules if r.used}
    assert fired & {"rope", "rope-sin-first", "rope-cos-first", "rope-rot-first"}, fired
    with torch.no_grad():
        assert max_error(model(*inputs), compiled(*inputs)) <= 1e-5
        if all(x.dtype.is_floating_point for x in inputs):
            fresh = tuple(torch.randn_like(x) for x in inputs)
            assert max_error(model(*fresh), compiled(*fresh)) <= 1e-5
    return ops


@pytest.mark.parametrize("case", ["prefill", "decode_kv"])
@pytest.mark.parametrize("backend", ["c", "reference"])
def test_rope_fuses_on_the_llama_block(case, backend):
    if backend == "c" and compiler() is None:
        pytest.skip("no C compiler")
    ops = _check(*llama_block_case(case), backend)
    assert ops["rope"] == 2 and ops["add"] == 0 and ops["mul"] == 0, ops


@pytest.mark.parametrize("backend", ["c", "reference"])
def test_rope_fuses_on_hf_llama(backend):
    if backend == "c" and compiler() is None:
        pytest.skip("no C compiler")
    ops = _check(*llama_case(), backend)
    assert ops["rope"] == 4 and ops["attention"] == 2, ops  # 2 layers
