"""Every op of the registry is complete: priced by the cost model (its `cost` kind, checked as
it is registered), given a meaning, computed by the planned runtime (a writer, or COPY_IN
declared), and run by every backend, as a generated kernel or as a torch step the backend
declares. Adding an op that one of them does not know fails here, naming the op and the
place to declare it."""

import pytest

from eqsat_llm.codegen.c import emit as c_emit
from eqsat_llm.codegen.triton import program as triton_program
from eqsat_llm.ir import VALUE_LEAVES
from eqsat_llm.ops import COPY_IN, REGISTRY, OpDef

# always constant, so evaluated at compile time (fold.py): no backend runs them
FOLDED = frozenset(op for op, d in REGISTRY.items() if d.cost == "fold")
BACKENDS = {"c": c_emit, "triton": triton_program}


def test_every_op_has_a_meaning():
    """Reference semantics, the meaning tests and the rule checker evaluate (the leaves and a
    captured fallback call carry theirs as values and attributes)."""
    unmeant = [op for op, d in REGISTRY.items()
               if d.reference is None and op not in VALUE_LEAVES | {"fallback"}]
    assert unmeant == [], "register it with ref=... in eqsat_llm/ops/"


def test_every_computed_op_declares_how_the_planned_runtime_writes_it():
    unwritten = [op for op, d in REGISTRY.items()
                 if op not in VALUE_LEAVES and not (callable(d.writer) or d.writer == COPY_IN)]
    assert unwritten == [], "register it with writer=<out= writer> or writer=COPY_IN"


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_is_generated_or_a_declared_torch_step(backend):
    module = BACKENDS[backend]
    generated, in_torch = module.SUPPORTED_OPS, module.TORCH_STEP_OPS
    needed = set(REGISTRY) - FOLDED - VALUE_LEAVES
    assert sorted(needed - generated - in_torch) == [], (
        f"the {backend} backend neither generates these ops nor lists them in "
        f"{module.__name__}.TORCH_STEP_OPS")
    assert sorted(generated & in_torch) == [], "an op is generated and a torch step at once"
    assert sorted(in_torch - set(REGISTRY)) == []


def test_a_new_op_nobody_knows_is_reported_by_each_check(monkeypatch):
    monkeypatch.setitem(REGISTRY, "newop", OpDef("newop", 1, (), None, "elementwise", "same",
                                                 "same", "vector", 1.0))
    for check in (test_every_op_has_a_meaning,
                  test_every_computed_op_declares_how_the_planned_runtime_writes_it):
        with pytest.raises(AssertionError):
            check()
    for backend in BACKENDS:
        with pytest.raises(AssertionError, match="TORCH_STEP_OPS"):
            test_every_op_is_generated_or_a_declared_torch_step(backend)


def test_consumers_derive_op_facts_from_the_registry():
    """The planner's stride-free ops, the cost model's frontend forms and both backends'
    matmul ops are the registry's declarations, not lists of their own."""
    from eqsat_llm.extraction.costmodel import FRONTEND_FORMS
    from eqsat_llm.ops import MATMUL_OPS, REGISTRY, ops_where
    from eqsat_llm.plan import STRIDE_FREE_OPS

    assert STRIDE_FREE_OPS == {n for n, d in REGISTRY.items() if d.stride_free} == {"attention"}
    assert FRONTEND_FORMS == ops_where("frontend_form") == {"sdpa", "sdpa_masked"}
    assert MATMUL_OPS <= {n for n, d in REGISTRY.items() if d.category == "matmul"}
    assert MATMUL_OPS <= set(c_emit.EMITTERS) and MATMUL_OPS <= set(triton_program.PLANNERS)


@pytest.mark.parametrize("q_heads,kv_heads,group",
                         [(8, 8, 1), (8, 2, 4), (8, 1, 1), (6, 4, None)])
def test_kv_group_is_how_kv_heads_repeats(q_heads, kv_heads, group):
    import torch

    from eqsat_llm.ops import kv_group
    from eqsat_llm.ops.attention import kv_heads as repeat

    q, kv = torch.empty(1, q_heads, 3, 4), torch.empty(1, kv_heads, 5, 4)
    assert kv_group(q.shape, kv.shape, kv.shape) == group
    if group is not None:
        assert repeat(q, kv).shape[-3] == (q_heads if group > 1 else kv_heads)


def test_an_ops_inputs_are_named_by_the_roles_it_declares():
    """attention, sdpa and gemm name their inputs once (OpDef.operands): the reference, the
    emitters, the cost model and the rule checker's draws read them by role."""
    import torch

    from eqsat_llm.errors import GraphError
    from eqsat_llm.ops import evaluate, operands_of, register

    assert REGISTRY["attention"].operands == ("q", "k", "v", "bias", "sinks")
    assert REGISTRY["gemm"].operands == ("x", "w", "w_scale", "norm", "addend")
    assert operands_of("attention", [1, 2, 3, 4, 5]).bias == 4
    # the reference reads each input by its role: a large sink takes each row's weight onto
    # its zero value; a bias of -inf but on the diagonal makes each row its own v
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    attrs = {"scale": 0.5, "softcap": 0.0}
    sunk = evaluate("attention", [q, k, v, 0.0, torch.full((1, 1, 3, 1), 80.0)], attrs)
    assert sunk.abs().max() < 1e-20
    diagonal = torch.full((3, 3), float("-inf")).fill_diagonal_(0.0)
    assert torch.equal(evaluate("attention", [q, k, v, diagonal, float("-inf")], attrs), v)
    with pytest.raises(ValueError, match="2 operand roles for 3 inputs"):
        register("three_inputs", 3, category="elementwise", shape="same", cost="vector",
                 flops=1.0, operands="a b")
    with pytest.raises(GraphError, match="no operand roles"):
        operands_of("add", [1, 2])
