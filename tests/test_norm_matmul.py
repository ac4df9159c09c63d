"""The gemm's rms_norm prologue: an RMSNorm feeding a matmul as one op and one C
kernel."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.codegen import ReferenceRuntime
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.codegen.planned import PlannedRuntime
from eqsat_llm.extraction.costmodel import CostModel
from eqsat_llm.extraction.machine import DEFAULT
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.models.workloads import llama_block_case, llama_case
from eqsat_llm.ops import GEMM_DEFAULTS, add_gemm, evaluate
from eqsat_llm.rulebook import resolve
from eqsat_llm.rulecheck import check_rule

from .conftest import const, inp, max_error, rand_inputs
from .test_c_backend import check

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def test_reference_is_exactly_the_pair():
    gen = torch.Generator().manual_seed(0)
    x, g, w = (torch.randn(3, 5, 24, generator=gen), torch.randn(24, generator=gen),
               torch.randn(24, 40, generator=gen))
    for alpha in (1.0, 0.5):
        pair = evaluate("matmul", [evaluate("rms_norm", [x, g], {"eps": 1e-6}), w],
                        {"alpha": alpha})
        attrs = {**GEMM_DEFAULTS, "n": 40, "eps": 1e-6, "alpha": alpha, "prologue": "rms_norm"}
        fused = evaluate("gemm", [x, w, 0.0, g, 0.0], attrs)
        assert torch.equal(pair, fused)
        eager = torch.nn.functional.rms_norm(x, (24,), g, 1e-6) @ w * alpha  # torch's meaning
        torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # (test_rulecheck checks every library rule on 3 instances by default)
def test_rule_passes_the_checker():
    rule = next(r for r in resolve(["fusion"]) if r.name == "rms-norm-matmul")
    result = check_rule(rule, instances=20)
    assert result.status == "pass" and result.instances_checked == 20, result


def test_fused_op_costs_less_than_its_parts():
    ref = CostModel(DEFAULT, backend="reference")
    fused = CostModel(DEFAULT)
    for m in (1, 128):
        x, w, g = (TensorType((1, m, 512), "float32"), TensorType((512, 3072), "float32"),
                   TensorType((512,), "float32"))
        out = TensorType((1, m, 3072), "float32")
        a = {**GEMM_DEFAULTS, "n": 3072, "eps": 1e-6, "prologue": "rms_norm"}
        py = TensorType((), "py_float")
        pair = (fused.seconds("rms_norm", {"eps": 1e-6}, [x, g], x)
                + fused.seconds("matmul", {"alpha": 1.0}, [x, w], out))
        assert fused.seconds("gemm", a, [x, w, py, g, py], out) < pair
        assert ref.seconds("gemm", a, [x, w, py, g, py], out) > pair - 1e-12


def _graph(m: int, k: int, n: int, lead: tuple[int, ...], *, w_const: bool, g_const: bool,
           alpha: float = 1.0) -> Graph:
    gen = torch.Generator().manual_seed(m * 1000 + n)
    g = Graph()
    x = inp(g, (*lead, m, k))
    w = const(g, torch.randn(k, n, generator=gen) / k ** 0.5) if w_const else inp(g, (k, n))
    gg = const(g, torch.rand(k, generator=gen) + 0.5) if g_const else inp(g, (k,))
    g.outputs = [add_gemm(g, x, w, norm=gg, eps=1e-6, alpha=alpha, prologue="rms_norm")]
    return g


@needs_cc
@pytest.mark.parametrize("m", [1, 5, 33, 130])
@pytest.mark.parametrize("n", [40, 97])
def test_kernel_fused_on_odd_shapes(m, n):
    g = _graph(m, 48, n, (1,), w_const=True, g_const=True)
    rt = check(g, rand_inputs(g))
    # g folded into the packed weight; the row scale in the GEMM's epilogue
    assert "eq_gemm_packed(mb" in rt.source and "malloc" not in rt.source


@needs_cc
def test_kernel_fused_over_several_row_blocks():
    g = _graph(300, 64, 70, (2,), w_const=True, g_const=True, alpha=0.5)  # 600 rows
    rt = check(g, rand_inputs(g))
    assert "eq_gemm_packed(mb" in rt.source


@needs_cc
@pytest.mark.parametrize("w_const,g_const", [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("m", [1, 33])
def test_kernel_normalises_rows_itself_when_not_constant(m, w_const, g_const):
    # g cannot be folded into a packed weight: the one kernel normalises each row locally
    g = _graph(m, 24, 37, (2,), w_const=w_const, g_const=g_const, alpha=0.75)
    rt = check(g, rand_inputs(g))
    assert "eq_gemm_packed(mb" not in rt.source
    assert [k.op for k in rt.program.kernels] == ["gemm[rms_norm]"]


@needs_cc
def test_kernel_on_a_strided_input():
    g = Graph()
    x = g.add("permute", (inp(g, (5, 3, 32)),), dims=[1, 0, 2])  # rows not evenly spaced
    w, gg = const(g, torch.randn(32, 45)), const(g, torch.rand(32) + 0.5)
    g.outputs = [add_gemm(g, x, w, norm=gg, eps=1e-5, prologue="rms_norm")]
    check(g, rand_inputs(g))


def test_planned_runtime_runs_it():
    g = _graph(7, 24, 37, (1,), w_const=True, g_const=False)
    xs = rand_inputs(g)
    assert torch.equal(PlannedRuntime(g, check=True).run(xs)[0], ReferenceRuntime(g).run(xs)[0])


CASES = {"prefill": lambda: llama_block_case("prefill"),
         "decode": lambda: llama_block_case("decode"), "llama": llama_case}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fires_and_is_extracted(name):
    model, inputs = CASES[name]()
    compiled = optimize(model, inputs, measure_eager=False)
    ops = compiled.graph.op_counts()
    # the attention norms feed the merged QKV projection in one op (and LLaMA's final norm the
    # LM head); the FFN norms stay apart: their gate/up projections take the SwiGLU epilogue
    # instead (gemm[swiglu], priced cheaper: tests/test_matmul_swiglu.py)
    assert ops["gemm[rms_norm]"] == (3 if name == "llama" else 1), ops
    assert ops["rms_norm"] == ops["gemm[swiglu]"] == (2 if name == "llama" else 1), ops
    used = {r.name for r in compiled.report.rules if r.used}
    # the norm and the merged projections it feeds are reported used, inside the fused op
    assert {"rms-norm-matmul", "merge-parallel-matmul"} <= used, used
    assert used & {"rms-norm", "rms-norm-weight-first"}, used
    with torch.no_grad():
        assert max_error(model(*inputs), compiled(*inputs)) <= 1e-5
    if compiler() is not None:  # the C backend, norm folded into the packed weights
        assert isinstance(compiled._runtime, CRuntime)
        # (the QKV projection's call also computes the ropes: tests/test_rope_epilogue.py)
        # (kernels equal but for their places share a function: codegen/c/shared_kernels.py)
        lines = compiled._runtime.source.split("\n")
        normed = [k for k in compiled._runtime.program.kernels
                  if k.op.startswith("gemm[") and "rms_norm" in k.op]
        assert len(normed) == ops["gemm[rms_norm]"]
        for k in normed:
            code = "\n".join(lines[k.first_line - 1:k.last_line])
            assert "eq_gemm_packed(mb" in code or "eq_gemm_packed_rope(mb" in code, k.op
