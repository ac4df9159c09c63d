"""Ops the C backend does not generate run in torch between compiled C segments, on the same
arena (codegen/c/emit.py `Program.segments` / `torch_phases`, CRuntime `torch_steps`,
codegen/planned.py `ArenaSteps`): programs mixing C kernels and torch steps against eager and
the reference runtime, twice each (the arena is reused), and the backend fusions next to a
torch step (a rope in the GEMM's epilogue, an elementwise chain) on plans that reuse bytes."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from eqsat_llm import optimize
from eqsat_llm.api import BackendFallbackWarning
from eqsat_llm.capture.converter import Slot
from eqsat_llm.codegen import PlannedRuntime, ReferenceRuntime
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.plan import MemoryPlan, check_plan, plan_memory

from .conftest import as_tuple, inp, max_error
from .eager_oracle import run_eager

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def compile_c(model: nn.Module, x: torch.Tensor):
    """optimize() with the C backend; no warning that it fell back to the reference runtime."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)
        warnings.simplefilter("ignore", UserWarning)  # FallbackWarning: ops outside the registry
        compiled = optimize(model.eval(), (x,), measure_eager=False)
    rt = compiled._runtime
    assert compiled.report.backend == "c" and isinstance(rt, CRuntime)
    assert rt.program.kernels and len(rt.program.segments) >= 2  # C kernels and a torch step
    return compiled, rt


def check_against_eager(compiled, model: nn.Module, shape: tuple[int, ...]) -> None:
    for seed in (1, 2):  # twice: the arena is reused, nothing may leak from the first call
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = as_tuple(model(x))
        got = as_tuple(compiled(x))
        assert len(got) == len(want)
        for a, b in zip(want, got):
            assert a.shape == b.shape and a.dtype == b.dtype
            assert (a - b).abs().max().item() <= 1e-5


class FFTInTheMiddle(nn.Module):
    """An aten op outside the registry between C regions of GEMMs and norms."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(33, 32)

    def forward(self, x):
        h = self.up(self.norm(x))
        s = torch.fft.rfft(h, dim=-1).abs() / 8.0  # complex in between: torch only
        return torch.nn.functional.rms_norm(self.down(s), (32,)) + x


def test_an_op_outside_the_registry_runs_in_torch_between_c_segments():
    torch.manual_seed(0)
    model = FFTInTheMiddle()
    compiled, rt = compile_c(model, torch.randn(2, 5, 32))
    ops = {op for _, op in rt.torch_steps}
    assert "aten._fft_r2c.default" in ops
    assert {"layer_norm", "addmm"} & {k.op for k in rt.program.kernels}  # the GEMMs are C
    assert compiled.report.torch_ops["aten._fft_r2c.default"] == 1
    assert "ran in torch: " in compiled.report.summary()
    assert compiled.report.to_dict()["torch_ops"] == compiled.report.torch_ops
    assert "eq_segment" in rt.source and "eq_forward" not in rt.source
    check_against_eager(compiled, model, (2, 5, 32))


class Interleaved(nn.Module):
    """Several torch steps between C kernels (all ops outside the registry): flip (read by
    torch and by C, and a graph output), sort (a tuple: values and indices both used), rfft
    (complex values; a slice of them is an output copied out in torch), and a slice of a torch
    step's buffer as an output (copied out by a C kernel)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up = nn.Linear(32, 64)
        self.mid = nn.Linear(4, 32)
        self.side = nn.Linear(64, 8)
        self.down = nn.Linear(17, 32)

    def forward(self, x):
        h = self.up(self.norm(x))
        c = torch.flip(h, dims=[-1]) / 2.0
        v, i = torch.sort(c, dim=-1, descending=True)
        v, i = v[..., :4], i[..., :4]
        g = torch.nn.functional.silu(self.mid(v)) + i.to(torch.float32).mean(-1, keepdim=True) / 64
        s = torch.fft.rfft(g, dim=-1).abs() / 8.0
        y = self.down(s) + x
        return y, c, self.side(c), torch.fft.rfft(h / 8.0, dim=-1)[..., :4], \
            torch.flip(y, dims=[1])[:, :3]


def test_several_torch_steps_interleaved_with_c_kernels():
    torch.manual_seed(0)
    model = Interleaved()
    compiled, rt = compile_c(model, torch.randn(2, 5, 32))
    ops = compiled.report.torch_ops
    assert ops["aten.flip.default"] == 2 and ops["aten.sort.default"] == 1
    assert ops["aten._fft_r2c.default"] == 2 and ops["getitem"] == 2
    assert len(rt.program.torch_phases) >= 3
    kinds = {rt.plan.kinds[nid] for nid, _ in rt.torch_steps}
    assert {"temp", "copy_out"} <= kinds  # a tuple, and an output copied out, by torch
    assert any(k.op == "copy_out" for k in rt.program.kernels)  # C copies a torch step's slice
    check_against_eager(compiled, model, (2, 5, 32))


class OutputReadByKernels(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        c = torch.flip(self.lin(x), dims=[0])  # a graph output, written by torch ...
        return c, torch.softmax(self.lin(c), dim=-1), c.transpose(0, 1)  # ... read by C


def test_a_torch_step_writes_a_graph_output_that_kernels_read():
    torch.manual_seed(0)
    model = OutputReadByKernels()
    compiled, rt = compile_c(model, torch.randn(6, 16))
    assert [op for _, op in rt.torch_steps] == ["aten.flip.default"]
    (nid, _), = rt.torch_steps
    assert rt.plan.kinds[nid] == "output" and nid in compiled.graph.outputs
    check_against_eager(compiled, model, (6, 16))


def test_without_torch_steps_one_eq_forward_call():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.SiLU()).eval()
    compiled = optimize(model, (torch.randn(4, 8),), measure_eager=False)
    rt = compiled._runtime
    assert rt.torch_steps == [] and compiled.report.torch_ops == {}
    assert rt.program.segments == [] and "eq_forward" in rt.source and "eq_segment" not in \
        rt.source
    assert "ran in torch" not in compiled.report.summary()


# --- IR programs: dtypes the emitters decline, in place ----------------------------------------


def const(g: Graph, name: str, shape: tuple[int, ...], seed: int) -> int:
    gen = torch.Generator().manual_seed(seed)
    g.constants[name] = torch.randn(shape, generator=gen) / shape[0] ** 0.5
    return g.append("const", (), {"name": name}, TensorType(shape, "float32"))


def run_both(g: Graph, plan: MemoryPlan | None = None, inputs=None, **kw):
    """CRuntime against torch eager, the reference runtime (and the planned one), on two sets
    of inputs."""
    rt = CRuntime(g, plan, **kw)
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        xs = inputs(gen) if inputs else [torch.randn(g.node(i).type.shape, generator=gen)
                                         for i in g.input_ids]
        want = tuple(ReferenceRuntime(g).run(xs))
        got = tuple(rt.run(xs))
        assert max_error(want, got) <= 1e-5
        assert max_error(tuple(run_eager(g, xs)), got) <= 1e-5  # torch eager
        assert max_error(tuple(PlannedRuntime(g, plan).run(xs)), got) <= 1e-5
    return rt


def test_a_dtype_the_emitter_declines_runs_in_torch_in_place():
    # abs of int64 has no C kernel (its emitter computes float math only); the plan writes it
    # over its input's buffer, and a C kernel reads the result
    g = Graph()
    x = inp(g, (4, 33), "int64")
    a = g.add("mul", (x, g.add("scalar", value=3.0, kind="int")))
    b = g.add("abs", (a,))
    f = g.add("to_dtype", (b,), dtype="float32")
    g.outputs = [g.add("mul", (f, g.add("scalar", value=0.5, kind="float")))]
    plan = plan_memory(g)
    assert plan.buffers[b].inplace_of == a
    rt = run_both(g, plan, lambda gen: [torch.randint(-50, 50, (4, 33), generator=gen)])
    assert [op for _, op in rt.torch_steps] == ["abs"]


def test_an_integer_matmul_runs_in_torch():
    g = Graph()
    x, w = inp(g, (5, 7), "int64"), inp(g, (7, 3), "int64")
    m = g.add("matmul", (x, w), alpha=1.0)
    g.outputs = [g.add("exp", (g.add("mul", (g.add("to_dtype", (m,), dtype="float32"),
                                               g.add("scalar", value=0.01, kind="float"))),))]
    rt = run_both(g, inputs=lambda gen: [torch.randint(-5, 5, (5, 7), generator=gen),
                                         torch.randint(-5, 5, (7, 3), generator=gen)])
    assert [op for _, op in rt.torch_steps] == ["matmul"]


def cumsum_in_torch(g: Graph, x: int, dim: int) -> int:
    """A `fallback` node (an aten op outside the registry, as the frontend makes them) running
    torch.cumsum: never generated in C."""
    t = g.node(x).type
    return g.append("fallback", (x,), {"target": "aten.cumsum.default", "key": len(g.nodes),
                                       "fn": torch.ops.aten.cumsum.default,
                                       "template": ((Slot(0), dim), {})}, t)


# --- backend fusions next to a torch step ------------------------------------------------------
def plan_at(g: Graph, offsets: dict[int, int]) -> MemoryPlan:
    """The plan of `g` in its own node order with its buffers at `offsets` (views and in-place
    results follow their base), checked: a valid plan that reuses bytes as told."""
    plan = plan_memory(g, order=sorted(g.live_ids()))

    def offset(nid: int) -> int:
        b = plan.buffers[nid]
        if nid in offsets:
            return offsets[nid]
        if b.inplace_of is not None:
            return offset(b.inplace_of)
        assert b.alias_of is not None, f"no offset given for %{nid}"
        return offset(b.alias_of) + b.offset - plan.buffers[b.alias_of].offset

    buffers = {nid: dataclasses.replace(b, offset=offset(nid)) for nid, b in plan.buffers.items()}
    arena = max(b.offset + b.nbytes for b in buffers.values())
    plan = dataclasses.replace(plan, buffers=buffers, arena_bytes=arena)
    check_plan(g, plan)
    return plan


def rope_graph(step: str) -> tuple[Graph, dict[str, int]]:
    """T = x @ W; a torch step between the GEMM and the rope: cumsum of z ("writes"), of exp(z)
    computed before the GEMM ("reads"), or sort of exp(z), a tuple whose values are taken
    ("tuple"); f = softmax(its result); r = rope(head split of T[:, :, :64]);
    out = r * (head split of T[:, :, 64:]) + f."""
    g = Graph()
    x, z = inp(g, (1, 8, 64)), inp(g, (1, 2, 8, 32))
    w = const(g, "w", (64, 128), 1)
    cos, sin = const(g, "cos", (8, 32), 2), const(g, "sin", (8, 32), 3)
    ids = {}
    src = z if step == "writes" else g.add("exp", (z,))
    if step != "writes":
        ids["e0"] = src
    t = ids["t"] = g.add("matmul", (x, w), alpha=1.0)
    if step == "tuple":
        zt = g.node(z).type
        pair = g.append("fallback", (src,), {
            "target": "aten.sort.default", "key": len(g.nodes), "fn": torch.ops.aten.sort.default,
            "template": ((Slot(0), 3), {})}, (zt, TensorType(zt.shape, "int64")))
        e = ids["e"] = g.append("getitem", (pair,), {"index": 0}, zt)
    else:
        e = ids["e"] = cumsum_in_torch(g, src, 3)
    f = ids["f"] = g.add("softmax", (e,), dim=3)

    def heads(start: int) -> int:
        part = g.add("slice", (t,), dim=2, start=start, end=start + 64, step=1)
        return g.add("permute", (g.add("view", (part,), shape=[1, 8, 2, 32]),), dims=[0, 2, 1, 3])

    r = ids["r"] = g.add("rope", (heads(0), cos, sin))
    ids["prod"] = g.add("mul", (r, heads(64)))
    g.outputs = [g.add("add", (ids["prod"], f))]
    return g, ids


@pytest.mark.parametrize("step", ["writes", "reads", "tuple"])
def test_rope_is_not_moved_over_a_torch_step_that_touches_its_bytes(step):
    # the rope's output reuses bytes the torch step between the GEMM and the rope writes
    # (cumsum's own buffer) or reads (exp's, dead after the step; "tuple": read by a sort that
    # torch computes into a temporary): written at the GEMM's place it would be overwritten,
    # or be read as the step's input. With bytes of its own it is fused.
    g, ids = rope_graph(step)
    clobbered = ids["e" if step == "writes" else "e0"]
    base = {"t": 0, "e0": 4096, "e": 6144, "f": 8192}
    for rope_offset, fused in ((base["e" if step == "writes" else "e0"], False),
                               (10240, True)):
        offsets = {ids[k]: v for k, v in base.items() if k in ids} | {ids["r"]: rope_offset}
        plan = plan_at(g, offsets)
        assert (plan.buffers[ids["r"]].offset == plan.buffers[clobbered].offset) != fused
        rt = run_both(g, plan)
        assert len(rt.torch_steps) == (2 if step == "tuple" else 1)
        epilogue = {r for k in rt.program.kernels for r in k.epilogue}
        assert (ids["r"] in epilogue) == fused


def test_an_elementwise_chain_is_cut_at_a_torch_step_that_overwrites_its_input():
    # fused, a = to_dtype(z0) would be computed inside mul's kernel, i.e. after the torch step
    # q, which the plan lets write z0's bytes (z0 is dead once a has read it): a must be a
    # kernel of its own. (z0 is a softmax: not elementwise, so it is in memory either way.)
    g = Graph()
    x, y = inp(g, (4, 64)), inp(g, (4, 64))
    z0 = g.add("softmax", (x,), dim=1)
    a = g.add("to_dtype", (z0,), dtype="float64")
    q = cumsum_in_torch(g, y, 1)
    g.outputs = [g.add("mul", (a, q))]
    shared = plan_at(g, {z0: 0, a: 2048, q: 0})
    rt = run_both(g, shared)
    assert not any(k.fused for k in rt.program.kernels)
    apart = plan_at(g, {z0: 0, a: 2048, q: 4096})
    rt = run_both(g, apart)
    assert any(k.fused == (a, g.outputs[0]) for k in rt.program.kernels)
