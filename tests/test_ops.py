"""The op registry: each op's e-graph shape rule agrees with its Python type inference, also on
ops that the reference workloads do not use."""

import pytest
import torch

from eqsat_llm.api import optimize_graph
from eqsat_llm.codegen import PlannedRuntime, ReferenceRuntime
from eqsat_llm.egraph.analysis import analysis
from eqsat_llm.egraph.encode import encode
from eqsat_llm.egraph.language import shape
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.ops import REGISTRY, add_gemm

F32 = "float32"


def graph_with(*shapes: tuple[int, ...], dtype: str = F32) -> tuple[Graph, list[int]]:
    g = Graph()
    ids = [g.append("input", (), {"name": f"x{i}", "index": i}, TensorType(s, dtype))
           for i, s in enumerate(shapes)]
    return g, ids


def _int8_gemm(g, x, values):
    w = g.add("view", (values,), shape=[5, 4])
    q, s = (g.add(op, (w,), fmt="int8") for op in ("quantize_weight", "weight_scales"))
    return add_gemm(g, x, q, w_scale=s, weight="int8")


CASES = {
    "transpose": lambda g, x: g.add("transpose", (x[0],), dim0=0, dim1=2),
    "select": lambda g, x: g.add("select", (x[0],), dim=1, index=2),
    "slice": lambda g, x: g.add("slice", (x[0],), dim=2, start=1, end=4, step=2),
    "unsqueeze": lambda g, x: g.add("unsqueeze", (x[0],), dim=3),
    "permute": lambda g, x: g.add("permute", (x[0],), dims=[2, 0, 1]),
    "amin": lambda g, x: g.add("amin", (x[0],), dims=[0, 2], keepdim=True),
    "mean": lambda g, x: g.add("mean", (x[0],), dims=[1], keepdim=False),
    "log_softmax": lambda g, x: g.add("log_softmax", (x[0],), dim=1),
    "cat": lambda g, x: g.add("cat", (x[0], x[0], x[0]), dim=1),
    "broadcast": lambda g, x: g.add("add", (g.add("view", (x[0],), shape=[2, 1, 3, 5]), x[1])),
    "where": lambda g, x: g.add("where", (g.add("gt", (x[1], g.add(
        "scalar", value=0.0, kind="float"))), x[1], g.add("scalar", value=1.0, kind="float"))),
    "layer_norm": lambda g, x: g.add("layer_norm", (x[0], g.add("full", shape=[5], value=1.0,
                                     dtype=F32), g.add("full", shape=[5], value=0.0, dtype=F32)),
                                     normalized_shape=[5], eps=1e-5),
    "bmm": lambda g, x: g.add("bmm", (x[0], g.add("transpose", (x[0],), dim0=1, dim1=2)),
                              alpha=0.5),
    "linear": lambda g, x: g.add("linear", (x[0], g.add("full", shape=[7, 5], value=0.5,
                                                        dtype=F32))),
    "matmul": lambda g, x: g.add("matmul", (x[0], g.add("full", shape=[5, 4], value=0.5,
                                                        dtype=F32)), alpha=2.0),
    "rms_norm": lambda g, x: g.add("rms_norm", (x[0], g.add("full", shape=[5], value=1.5,
                                                            dtype=F32)), eps=1e-6),
    "gemm": lambda g, x: add_gemm(g, x[0], g.add("full", shape=[5, 4], value=0.5, dtype=F32),
                                  norm=g.add("full", shape=[5], value=1.5, dtype=F32),
                                  eps=1e-6, alpha=0.5, prologue="rms_norm"),
    "gemm-int8": lambda g, x: _int8_gemm(g, x[0], g.add("arange", start=0.0, end=20.0, step=1.0,
                                                         dtype=F32)),
    "swiglu": lambda g, x: g.add("swiglu", (x[1], g.add("view", (x[0],), shape=[2, 1, 3, 5]))),
    "attention": lambda g, x: g.add("attention", (x[0], x[0], x[0], g.add(
        "full", shape=[3, 3], value=0.0, dtype=F32), g.add(
        "scalar", value=float("-inf"), kind="float")), scale=0.5, softcap=0.0),
    "sdpa": lambda g, x: g.add("sdpa", (x[0], x[0], x[0]), is_causal=True, scale=0.3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_shape_rule_agrees_with_python_and_runs(case):
    g, x = graph_with((2, 3, 5), (3, 1, 5))
    out = CASES[case](g, x)
    g.outputs = [out]
    enc = encode(g)
    enc.egraph.run(analysis.saturate())
    for node in g.nodes:
        if node.id in enc.exprs:
            got = enc.egraph.extract(shape(enc.exprs[node.id]))
            assert tuple(int(d) for d in got.value) == node.type.shape, str(node)
    inputs = [torch.randn(2, 3, 5), torch.randn(3, 1, 5)]
    used = [i for i in g.input_ids if i in g.live_ids()]
    assert used
    expected = ReferenceRuntime(g).run(inputs)[0]
    optimized = optimize_graph(g, [], fold=False)
    assert torch.equal(ReferenceRuntime(optimized).run(inputs)[0], expected)
    # the planned runtime (every op writing into the arena) computes the same thing
    assert torch.equal(PlannedRuntime(g, check=True).run(inputs)[0], expected)
    assert expected.shape == g.type_of(out).shape


def test_every_op_declares_known_rules():
    for op in REGISTRY.values():
        assert op.shape_rule in {"given", "scalar", "attr", "same", "broadcast", "permute",
                                 "transpose", "unsqueeze", "reduce", "slice", "select", "cat",
                                 "mm", "bmm", "addmm", "linear", "embedding", "sdpa",
                                 "matmul", "gemm", "quant_weight", "quant_scales",
                                 "sparse_values", "sparse_index"}, op.name
        assert op.dtype_rule in {"same", "same_float", "promote", "promote12", "bool", "attr",
                                 "scalar", "given", "quant_weight", "quant_scales",
                                 "sparse_index"}, op.name
        assert op.reference is not None or op.name in {"input", "param", "const", "fallback"}
