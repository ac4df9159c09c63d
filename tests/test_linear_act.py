"""Linear + bias + activation as one op: the gemm with the bias epilogue and an activation,
act(addmm(bias, a, b, beta, alpha)), one kernel. Its reference against the pair, the C backend
(packed, BLAS and generated GEMMs) and the planned runtime on odd shapes, its shape rule and
cost, and the rules that recognise it on GPT-2 (addmm -> view -> gelu_new)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from eqsat_llm import optimize
from eqsat_llm.codegen import PlannedRuntime, ReferenceRuntime
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.blas import openblas_dir
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.codegen.c.packed_gemm import ACTIVATIONS
from eqsat_llm.egraph.analysis import analysis
from eqsat_llm.egraph.encode import encode
from eqsat_llm.egraph.language import shape
from eqsat_llm.extraction.costmodel import CostModel
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.models.workloads import gpt2_case
from eqsat_llm.ops import GEMM_DEFAULTS, add_gemm, evaluate

from .conftest import const, inp, max_error, rand_inputs
from .eager_oracle import run_eager

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")
BLAS = [False] + ([True] if openblas_dir() else [])
K, N = 19, 37  # N not a multiple of 32 (the packed panel width) nor of 16
ACTS = ["relu", "silu", "gelu_tanh", "gelu"]
PAIRS = {"relu": torch.relu, "silu": F.silu,
         "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}


def _graph(m: int, w_input: bool = False, bias_2d: bool = False, beta: float = 1.0,
           alpha: float = 1.0) -> Graph:
    """One gemm[bias+act] per activation on the same x [m, K]: a constant weight (packed), or w an
    input (BLAS or the generated GEMM); the bias a row [N] (an addend of the packed tile) or a
    full [m, N] (added after the GEMM, the activation then in a loop)."""
    g = Graph()
    x, b = inp(g, (m, K)), inp(g, (m, N) if bias_2d else (N,))
    if w_input:
        w = inp(g, (K, N))
    else:
        w = const(g, torch.randn(K, N, generator=torch.Generator().manual_seed(1)))
    g.outputs = [add_gemm(g, x, w, addend=b, beta=beta, alpha=alpha, epilogue="bias", act=a)
                 for a in ACTS]
    return g


@pytest.mark.parametrize("act", ACTS)
def test_reference_is_the_pair_it_replaces(act):
    b, x, w = torch.randn(N), torch.randn(5, K), torch.randn(K, N)
    for beta, alpha in ((1.0, 1.0), (0.5, 2.0)):
        pair = PAIRS[act](torch.addmm(b, x, w, beta=beta, alpha=alpha))
        attrs = {**GEMM_DEFAULTS, "n": N, "beta": beta, "alpha": alpha, "epilogue": "bias",
                 "act": act}
        got = evaluate("gemm", [x, w, 0.0, 0.0, b], attrs)
        assert torch.equal(got, pair)


@needs_cc
@pytest.mark.parametrize("blas", BLAS)
@pytest.mark.parametrize("m", [1, 5, 33])
def test_c_backend_matches_reference(blas, m):
    for w_input, bias_2d, beta, alpha in ((False, False, 1.0, 1.0), (True, False, 1.0, 1.0),
                                          (False, True, 0.5, 1.5), (True, True, 1.0, 1.0)):
        g = _graph(m, w_input, bias_2d, beta, alpha)
        inputs = rand_inputs(g)
        want = ReferenceRuntime(g).run(inputs)
        rt = CRuntime(g, use_blas=blas)
        assert sum(k.op.startswith("gemm[bias+") for k in rt.program.kernels) == len(ACTS)
        got = rt.run(inputs)
        for act, a, b, e in zip(ACTS, want, got, run_eager(g, inputs)):
            assert b.shape == a.shape
            assert max_error(a, b) <= 1e-5, (m, act, w_input, bias_2d)
            assert max_error(e, b) <= 1e-5, (m, act, w_input, bias_2d)  # torch eager
        # the planned (torch) runtime runs the reference's own steps: bit-identical
        for a, b in zip(want, PlannedRuntime(g, check=True).run(inputs)):
            assert torch.equal(a, b)


@needs_cc
def test_packed_path_applies_the_activation_in_the_tile_epilogue():
    g = _graph(16)  # a constant weight and a row bias: one packed call each, act in its epilogue
    rt = CRuntime(g)
    lines = rt.source.split("\n")
    kernels = [k for k in rt.program.kernels if k.op.startswith("gemm[bias+")]
    assert len(kernels) == len(ACTS)
    for k in kernels:
        code = "\n".join(lines[k.first_line - 1:k.last_line])
        code = code[code.index("eq_gemm_packed("):]
        assert "EQ_SGEMM" not in code
        act = ACTIVATIONS[g.node(k.node).attrs["act"]]
        assert re.search(rf"\s{act}, [01]\);", code[:code.index(";") + 1]), code


@needs_cc
def test_c_activations_match_torch_on_a_wide_range():
    # eq_act (packed epilogue) and the loop after the GEMM, against torch, over [-12, 12]
    m = 64
    g = Graph()
    x = inp(g, (m, 1))
    g.constants["w"] = torch.ones(1, 40)
    w = g.append("const", (), {"name": "w"}, TensorType((1, 40), "float32"))
    b = inp(g, (m, 40))  # a full bias: the activation in the loop
    r = inp(g, (40,))  # a row bias: the activation in the tile epilogue
    g.outputs = [add_gemm(g, x, w, addend=bias, epilogue="bias", act=a)
                 for a in ACTS for bias in (b, r)]
    xs = [torch.linspace(-12, 12, m).reshape(m, 1), torch.zeros(m, 40),
          torch.linspace(-0.5, 0.5, 40)]
    for want, got in zip(run_eager(g, xs), CRuntime(g).run(xs)):
        assert max_error(want, got) <= 1e-5


def test_shape_rule_and_cost():
    g = Graph()
    b, x = inp(g, (N,)), inp(g, (5, K))
    g.constants["w"] = torch.randn(K, N)
    w = g.append("const", (), {"name": "w"}, TensorType((K, N), "float32"))
    y = add_gemm(g, x, w, addend=b, epilogue="bias", act="gelu_tanh")
    g.outputs = [y]
    assert g.type_of(y).shape == (5, N)
    enc = encode(g)
    enc.egraph.run(analysis.saturate())
    got = enc.egraph.extract(shape(enc.exprs[y]))
    assert tuple(int(d) for d in got.value) == (5, N)
    # one kernel that never writes the product out and reads it back: cheaper than the pair
    cm = CostModel()
    f32 = lambda *s: TensorType(s, "float32")
    bs, xs, ws, out = f32(512), f32(16, 128), f32(128, 512), f32(16, 512)
    ab = {"beta": 1.0, "alpha": 1.0}
    py = TensorType((), "py_float")
    gemm = {**GEMM_DEFAULTS, "n": 512, "epilogue": "bias"}
    for act, (op, attrs) in {"gelu_tanh": ("gelu", {"approximate": "tanh"}),
                             "relu": ("relu", {})}.items():
        fused = cm.micros("gemm", {**gemm, "act": act}, [xs, ws, py, py, bs], out)
        addmm = cm.micros("addmm", ab, [bs, xs, ws], out)
        assert addmm < fused < addmm + cm.micros(op, attrs, [out], out)
    ref = CostModel(backend="reference")  # the reference runs the pair: priced as the pair
    pair = ref.micros("addmm", ab, [bs, xs, ws], out) + ref.micros(
        "gelu", {"approximate": "tanh"}, [out], out)
    assert ref.micros("gemm", {**gemm, "act": "gelu_tanh"}, [xs, ws, py, py, bs], out) == \
        pytest.approx(pair)


@pytest.mark.parametrize("backend", ["c", "reference"])
def test_gelu_fuses_into_the_mlp_up_projection_on_gpt2(backend):
    if backend == "c" and compiler() is None:
        pytest.skip("no C compiler")
    model, inputs = gpt2_case()
    compiled = optimize(model, inputs, backend=backend)
    assert compiled.report.backend == backend  # no fallback
    ops = compiled.graph.op_counts()
    # each layer's c_fc + gelu_new is one gemm[bias+gelu_tanh] (the gelu reads it via a view)
    assert ops["gemm[bias+gelu_tanh]"] == 2 and ops["gelu"] == 0 and ops["tanh"] == 0, ops
    rules = {r.name: r for r in compiled.report.rules}
    assert rules["addmm-view-gelu-tanh"].matches == 2 and rules["addmm-view-gelu-tanh"].used
    with torch.no_grad():
        assert max_error(model(*inputs), compiled(*inputs)) <= 1e-5
        fresh = tuple(torch.randint_like(x, 0, 100) if not x.is_floating_point()
                      else torch.randn_like(x) for x in inputs)
        assert max_error(model(*fresh), compiled(*fresh)) <= 1e-5
