"""Elementwise-chain fusion in the C backend (codegen/c/fuse_elementwise.py): random chains
against torch eager and the reference runtime (test_c_backend.check), the cases that must not
fuse, kernel counts, and a module through `eqsat_llm.optimize`."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

import eqsat_llm
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.codegen.c.emit import emit_program
from eqsat_llm.codegen.c.fuse_elementwise import fusion_groups
from eqsat_llm.ir import Graph
from eqsat_llm.plan import plan_memory

from .conftest import inp, rand_inputs, scalar
from .test_c_backend import check

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")

SHAPE = (5, 7, 3)
UNARY = ["neg", "tanh", "sigmoid", "abs", "relu", "silu", "sin", "exp", "gelu"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


def leaves(g: Graph) -> list[int]:
    """Operands of SHAPE or broadcasting into it, some of them strided views."""
    full = inp(g, SHAPE)
    row = inp(g, (1, 7, 1))
    last = inp(g, (3,))
    perm = g.add("permute", (inp(g, (3, 7, 5)),), dims=[2, 1, 0])          # (5, 7, 3) strided
    sl = g.add("slice", (inp(g, (5, 15, 3)),), dim=1, start=1, end=15, step=2)  # (5, 7, 3)
    tr = g.add("permute", (inp(g, (3, 7, 1)),), dims=[2, 1, 0])             # (1, 7, 3) strided
    return [full, row, last, perm, sl, tr]


def random_chain(g: Graph, rng: random.Random, length: int) -> int:
    ls = leaves(g)
    full = [ls[0], ls[3], ls[4]]
    cur = rng.choice(full)
    done = 0
    while done < length:
        kind = rng.choice(["unary", "binary", "binary", "where", "cast", "scalar"])
        if kind == "unary":
            op = rng.choice(UNARY)
            cur = g.add(op, (cur,), **({"approximate": rng.choice(["none", "tanh"])}
                                       if op == "gelu" else {}))
        elif kind == "binary":
            other = rng.choice(ls)
            args = (cur, other) if rng.random() < 0.5 else (other, cur)
            cur = g.add(rng.choice(BINARY), args)
        elif kind == "scalar":
            cur = g.add(rng.choice(["mul", "add", "sub"]), (cur, scalar(g, rng.uniform(-2, 2))))
        elif kind == "where":
            cond = g.add(rng.choice(["gt", "lt"]), (rng.choice(full), scalar(g, 0.1)))
            cur = g.add("where", (cond, cur, rng.choice(ls)))
        else:  # a round trip through float64 with an op in between
            d = g.add("to_dtype", (cur,), dtype="float64")
            d = g.add("mul", (d, scalar(g, 1.5)))
            cur = g.add("to_dtype", (d,), dtype="float32")
            done += 2
        done += 1
    return cur


@pytest.mark.parametrize("seed", range(12))
def test_random_chains_are_one_kernel(seed):
    rng = random.Random(seed)
    g = Graph()
    g.outputs = [random_chain(g, rng, rng.randint(2, 6))]
    rt = check(g, rand_inputs(g, seed=seed))
    assert len(rt.program.kernels) == 1, [k.name for k in rt.program.kernels]
    assert rt.program.kernels[0].node == g.outputs[0]
    assert len(rt.program.kernels[0].fused) >= 2


def test_several_chains_and_unfused_kernel_count():
    rng = random.Random(99)
    g = Graph()
    g.outputs = [random_chain(g, rng, 4), random_chain(g, rng, 5)]
    plan = plan_memory(g)
    assert len(fusion_groups(g, plan)) == 2
    unfused = emit_program(g, plan, fuse=False).kernels
    assert len(unfused) >= 9
    rt = check(g, rand_inputs(g))
    assert len(rt.program.kernels) == 2


def test_shared_intermediate_and_output_intermediate_not_fused():
    g = Graph()
    x, y = inp(g, (9, 11)), inp(g, (11,))
    t = g.add("tanh", (x,))                      # two consumers
    a = g.add("mul", (t, y))
    b = g.add("add", (t, scalar(g, 1.0)))
    u = g.add("sigmoid", (g.add("sub", (a, b)),))  # sub is fused into sigmoid
    v = g.add("exp", (x,))                      # a graph output and consumed
    w = g.add("neg", (v,))
    g.outputs = [u, v, w]
    plan = plan_memory(g)
    groups = fusion_groups(g, plan)
    inner = {m for gr in groups for m in gr.members[:-1]}
    assert t not in inner and v not in inner
    rt = check(g, rand_inputs(g))
    assert len(rt.program.kernels) < len(emit_program(g, plan, fuse=False).kernels)
    ops = {k.op for k in rt.program.kernels}
    assert {"tanh", "exp", "neg"} <= ops


def test_intermediate_with_other_shape_not_fused():
    g = Graph()
    x, y = inp(g, (6, 1)), inp(g, (6, 10))
    t = g.add("exp", (x,))                      # (6, 1) broadcast into (6, 10): not recomputed
    g.outputs = [g.add("mul", (t, y))]
    rt = check(g, rand_inputs(g))
    assert len(rt.program.kernels) == 2


def test_intermediate_viewed_not_fused():
    g = Graph()
    x = inp(g, (4, 6))
    t = g.add("exp", (x,))
    p = g.add("permute", (t,), dims=[1, 0])
    g.outputs = [g.add("neg", (p,))]
    assert fusion_groups(g, plan_memory(g)) == []
    rt = check(g, rand_inputs(g))
    assert [k.op for k in rt.program.kernels] == ["exp", "neg"]


def test_long_chain_fused_over_reused_arena_bytes():
    """Inner nodes' inputs die early in the plan, which reuses their bytes; fused, the chain
    must read them before they are overwritten (or the group is cut)."""
    g = Graph()
    x, y = inp(g, (33, 17)), inp(g, (33, 17))
    a = g.add("exp", (g.add("mul", (x, y)),))
    h = g.add("tanh", (a,))
    side = g.add("sigmoid", (x,))            # separate chains interleaved in the plan
    b = g.add("mul", (h, g.add("add", (side, y))))
    c = g.add("sub", (g.add("neg", (b,)), g.add("relu", (y,))))
    g.outputs = [c, g.add("sin", (g.add("abs", (c,)),))]
    plan = plan_memory(g)
    assert plan.arena_bytes < sum(b.nbytes for b in plan.buffers.values() if b.alias_of is None)
    rt = check(g, rand_inputs(g))
    assert [k.node for k in rt.program.kernels] == [g.outputs[0], g.outputs[1]]


def test_input_overwritten_before_root_cuts_the_group():
    """softmax(x) dies at the cast (per the plan); the next softmax takes its bytes before the
    add runs, so the cast must keep its own kernel."""
    g = Graph()
    x, y = inp(g, (16, 33)), inp(g, (16, 33))
    a = g.add("softmax", (x,), dim=-1)
    t1 = g.add("to_dtype", (a,), dtype="float64")
    t2 = g.add("exp", (t1,))
    z = g.add("softmax", (y,), dim=-1)
    g.outputs = [g.add("add", (t2, z))]
    plan = plan_memory(g)
    [group] = fusion_groups(g, plan)
    assert t2 in group.members
    ba, bz = plan.buffers[a], plan.buffers[z]
    if ba.offset < bz.offset + bz.nbytes and bz.offset < ba.offset + ba.nbytes:
        assert t1 not in group.members  # the plan this test was written against
    check(g, rand_inputs(g))


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.randn(37))

    def forward(self, x):
        h = x @ x.transpose(-1, -2)
        y = (h * torch.sigmoid(h) + 1.0) * 0.5 - self.b[:h.shape[-1]]
        return torch.tanh(y) * 2.0


def test_module_through_optimize():
    torch.manual_seed(0)
    m = Chain()
    x = torch.randn(2, 37, 5)
    compiled = eqsat_llm.optimize(m, [x], measure_eager=False)
    assert compiled.report.backend == "c"
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(compiled(x), want, atol=1e-5, rtol=1e-5)
    kernels = compiled._runtime.program.kernels
    unfused = emit_program(compiled.graph, compiled.plan, fuse=False).kernels
    assert len(kernels) < len(unfused)
    assert any(len(k.fused) >= 3 for k in kernels)
