"""The C backend's reductions (sum, mean, amax, amin, any), cumsum, bitwise ops, gathers
(index_select, gather, index), arange and triu/tril against torch eager (tests/eager_oracle.py)
and the registry's reference semantics: ragged shapes, strided views, keepdim, single and
multiple dims, every dtype generated; out-of-range indices; an end-to-end optimize()."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm.codegen import ReferenceRuntime
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.codegen.c.emit_gather import emit_gather
from eqsat_llm.codegen.c.emit_reduce import emit_reduce
from eqsat_llm.codegen.c.values import Ref
from eqsat_llm.ir import Graph, Node, TensorType, contiguous_strides, dtype_of

from .conftest import inp
from .eager_oracle import run_eager

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")
DTYPES = ["float32", "float64", "int64", "int32", "bool"]




def rand(shape: tuple[int, ...], dtype: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == "bool":
        return torch.rand(shape, generator=gen) < 0.3
    if dtype_of(dtype).is_floating_point:
        return torch.randn(shape, generator=gen, dtype=dtype_of(dtype)) * 3
    lo = 0 if dtype == "uint8" else -40
    return torch.randint(lo, 40, shape, generator=gen, dtype=dtype_of(dtype))


def strided(g: Graph, shape: tuple[int, ...], dtype: str, how: str) -> int:
    """A tensor of `shape` read as a plain input, a permuted view or a step-2 slice."""
    if how == "plain":
        return inp(g, shape, dtype)
    if how == "permuted":  # stored reversed, permuted back: every stride out of order
        nd = len(shape)
        return g.add("permute", (inp(g, shape[::-1], dtype),), dims=list(range(nd))[::-1])
    big = inp(g, shape[:-1] + (2 * shape[-1] + 1,), dtype)
    return g.add("slice", (big,), dim=len(shape) - 1, start=1, end=2 * shape[-1] + 1, step=2)


def c_runtime(g: Graph) -> CRuntime:
    """The program with every node a generated kernel (none left to torch)."""
    rt = CRuntime(g)
    assert not getattr(rt.program, "torch_nodes", []), rt.program.torch_nodes
    return rt


def run_and_compare(g: Graph, inputs: list[torch.Tensor], tol: float = 1e-5) -> None:
    got = c_runtime(g).run(inputs)
    for k, (a, b) in enumerate(zip(run_eager(g, inputs) + ReferenceRuntime(g).run(inputs),
                                   got + got)):
        assert a.shape == b.shape and a.dtype == b.dtype, (k, a.shape, b.shape, a.dtype, b.dtype)
        if a.dtype.is_floating_point:
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, equal_nan=True,
                                       msg=f"output {k}")
        else:
            assert torch.equal(a, b), (k, a, b)


def inputs_of(g: Graph, seed: int = 0) -> list[torch.Tensor]:
    return [rand(g.node(i).type.shape, g.node(i).type.dtype, seed + k)
            for k, i in enumerate(g.input_ids)]


# --- reductions ---------------------------------------------------------------------------------
CASES = [  # shape, dims, keepdim
    ((7, 13), [1], False), ((7, 13), [0], True), ((3, 5, 17), [0, 2], False),
    ((3, 5, 17), [1], True), ((4, 1, 6), [1], False), ((2, 3, 4, 5), [0, 1, 2, 3], False),
    ((2, 3, 4, 5), [1, 3], True), ((33,), [0], False), ((5, 300), [0], False),
    ((6, 7), [], True), ((1, 9), [0], False),
]
ALLOWED = {"sum": DTYPES, "mean": ["float32", "float64"], "amax": DTYPES, "amin": DTYPES,
           "any": DTYPES}


@pytest.mark.parametrize("how", ["plain", "permuted", "sliced"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "any"])
def test_reductions(op, dtype, how):
    if dtype not in ALLOWED[op]:
        pytest.skip("torch does not define it")
    g = Graph()
    outs = []
    for shape, dims, keepdim in CASES:
        outs.append(g.add(op, (strided(g, shape, dtype, how),), dims=dims, keepdim=keepdim))
    g.outputs = outs
    run_and_compare(g, inputs_of(g))


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "any"])
@pytest.mark.parametrize("shape, dims", [((64, 1100), [1]), ((3, 40000), [1]),
                                         ((40000, 3), [0]), ((300, 257), [0]),
                                         ((40, 33, 50), [0, 2]), ((12, 7, 400), [1])])
def test_reductions_large(op, shape, dims):
    """The threaded paths: outputs shared, each output's loop split, columns in chunks."""
    g = Graph()
    x = inp(g, shape)
    g.outputs = [g.add(op, (x,), dims=dims, keepdim=False),
                 g.add(op, (g.add("permute", (x,), dims=list(range(len(shape)))[::-1]),),
                       dims=dims, keepdim=True)]
    run_and_compare(g, inputs_of(g))


def test_float32_sums_accumulate_exactly_enough():
    """float32 sum/mean within 1e-5 relative of the exact (float64) result on a long row
    with a large offset (naive float32 accumulation drifts)."""
    g = Graph()
    x = inp(g, (3, 100003))
    g.outputs = [g.add("sum", (x,), dims=[1], keepdim=False),
                 g.add("mean", (x,), dims=[0, 1], keepdim=False)]
    xs = [torch.rand(3, 100003) + 1000.0]
    s, m = c_runtime(g).run(xs)
    exact = xs[0].double()
    torch.testing.assert_close(s.double(), exact.sum(1), rtol=1e-5, atol=0)
    torch.testing.assert_close(m.double(), exact.mean(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_amax_amin_propagate_nan(dtype):
    g = Graph()
    x = inp(g, (6, 300), dtype)
    g.outputs = [g.add(op, (v,), dims=[d], keepdim=False) for op in ("amax", "amin")
                 for v in (x, g.add("permute", (x,), dims=[1, 0])) for d in (0, 1)]
    xs = inputs_of(g)
    xs[0][2, 5] = float("nan")
    xs[0][4, 299] = float("nan")
    run_and_compare(g, xs)


def test_any_of_small_floats_and_nan():
    """any is `!= 0`, not a cast to int: 0.25 and NaN count as true."""
    g = Graph()
    x = inp(g, (4, 5))
    g.outputs = [g.add("any", (x,), dims=[1], keepdim=False),
                 g.add("any", (x,), dims=[0], keepdim=True)]
    xs = [torch.zeros(4, 5)]
    xs[0][1, 2], xs[0][3, 0] = 0.25, float("nan")
    run_and_compare(g, xs)


# --- cumsum -------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["plain", "permuted", "sliced"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cumsum(dtype, how):
    g = Graph()
    outs = []
    for shape in [(7, 13), (3, 5, 17), (4, 1, 6), (33,), (5, 300), (1, 1)]:
        x = strided(g, shape, dtype, how)
        outs += [g.add("cumsum", (x,), dim=d) for d in range(-len(shape), len(shape))]
    g.outputs = outs
    run_and_compare(g, inputs_of(g))


@pytest.mark.parametrize("shape, dim", [((300, 400), 0), ((300, 400), 1), ((5, 9000), 1)])
def test_cumsum_large(shape, dim):
    g = Graph()
    x = inp(g, shape)
    g.outputs = [g.add("cumsum", (x,), dim=dim),
                 g.add("cumsum", (g.add("transpose", (x,), dim0=0, dim1=1),), dim=1 - dim)]
    run_and_compare(g, inputs_of(g), tol=1e-4)


# --- bitwise, triu/tril, arange -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bool", "int64", "int32", "uint8", "int8"])
def test_bitwise(dtype):
    g = Graph()
    x = strided(g, (5, 1, 13), dtype, "plain")
    y = strided(g, (7, 13), dtype, "permuted")
    s = g.add("scalar", value=True if dtype == "bool" else 6, kind="bool" if dtype == "bool"
              else "int")
    a, o = g.add("bitwise_and", (x, y)), g.add("bitwise_or", (x, y))
    g.outputs = [a, o, g.add("bitwise_not", (x,)), g.add("bitwise_and", (y, s)),
                 g.add("bitwise_or", (s, y)),
                 g.add("bitwise_not", (g.add("bitwise_or", (a, o)),))]  # fused chain
    run_and_compare(g, inputs_of(g))


def test_bitwise_mixed_int_and_bool():
    g = Graph()
    x, m = inp(g, (4, 9), "int32"), inp(g, (4, 9), "bool")
    y = inp(g, (9,), "int64")
    g.outputs = [g.add("bitwise_and", (x, m)), g.add("bitwise_or", (x, y))]
    run_and_compare(g, inputs_of(g))


@pytest.mark.parametrize("how", ["plain", "permuted", "sliced"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
def test_triu_tril(dtype, how):
    g = Graph()
    outs = []
    for shape in [(5, 7), (7, 5), (2, 3, 6, 4), (1, 9)]:
        x = strided(g, shape, dtype, how)
        outs += [g.add(op, (x,), diagonal=d) for op in ("triu", "tril") for d in (-2, 0, 1, 3)]
    big = inp(g, (3, 200, 130), dtype)  # threaded
    outs += [g.add("triu", (big,), diagonal=0), g.add("tril", (big,), diagonal=-1)]
    g.outputs = outs
    run_and_compare(g, inputs_of(g))


def test_triu_in_place_of_its_input():
    """triu/tril are elementwise to the planner: the result may reuse its input's bytes."""
    g = Graph()
    x = inp(g, (6, 9))
    e = g.add("exp", (x,))
    t = g.add("triu", (e,), diagonal=1)
    g.outputs = [g.add("mul", (t, g.add("scalar", value=2.0, kind="float")))]
    run_and_compare(g, inputs_of(g))


@pytest.mark.parametrize("start, end, step, dtype", [
    (0, 10, 1, "int64"), (-3, 17, 2, "int32"), (0.5, 7.3, 0.37, "float32"),
    (10, 0, -1.5, "float64"), (0, 40000, 1, "float32"), (5, -7, -3, "int64"),
    (0, 1, 0.1, "float32"), (2, 3, 1, "uint8")])
def test_arange(start, end, step, dtype):
    g = Graph()
    g.outputs = [g.add("arange", (), start=float(start), end=float(end), step=float(step),
                       dtype=dtype)]
    run_and_compare(g, [], tol=1e-6)


# --- gathers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["plain", "permuted"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select(dtype, how):
    g = Graph()
    outs = []
    for shape in [(7, 13), (3, 5, 17), (4, 1, 6)]:
        x = strided(g, shape, dtype, how)
        for d in range(len(shape)):
            idx = inp(g, (5,), "int64" if d % 2 == 0 else "int32")
            outs.append(g.add("index_select", (x, idx), dim=d))
        i0 = inp(g, (), "int64")  # a 0-d index keeps the dim (size 1)
        outs.append(g.add("index_select", (x, i0), dim=-1))
    g.outputs = outs
    xs = inputs_of(g)
    _fill_indices(g, xs, "index_select")
    run_and_compare(g, xs)


def _fill_indices(g: Graph, xs: list[torch.Tensor], op: str, neg: bool = False) -> None:
    """Valid random indices for every index operand of the `op` nodes (an operand may be a
    view of an input: the stored input is filled)."""
    pos = {i: k for k, i in enumerate(g.input_ids)}
    gen = torch.Generator().manual_seed(1)
    for n in g.nodes:
        if n.op != op:
            continue
        x_shape = g.node(n.inputs[0]).type.shape
        dims = n.attrs["positions"] if op == "index" else [n.attrs["dim"]]
        for d, i in zip(dims, n.inputs[1:]):
            while g.node(i).op != "input":
                i = g.node(i).inputs[0]
            t = g.node(i).type
            lo = -x_shape[d] if neg else 0
            xs[pos[i]] = torch.randint(lo, x_shape[d], t.shape, generator=gen,
                                       dtype=dtype_of(t.dtype))


@pytest.mark.parametrize("how", ["plain", "permuted"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(dtype, how):
    g = Graph()
    outs = []
    for shape, ishape in [((7, 13), (7, 4)), ((7, 13), (3, 13)), ((3, 5, 17), (2, 5, 9)),
                          ((4, 1, 6), (4, 1, 6)), ((9,), (20,))]:
        x = strided(g, shape, dtype, how)
        for d in range(len(shape)):
            ish = tuple(m if k == d else min(m, n) for k, (m, n) in
                        enumerate(zip(ishape, shape)))
            idx = strided(g, ish, "int64", how)
            outs.append(g.add("gather", (x, idx), dim=d))
    g.outputs = outs
    xs = inputs_of(g)
    _fill_indices(g, xs, "gather")
    run_and_compare(g, xs)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
@pytest.mark.parametrize("how", ["plain", "permuted"])
def test_index(dtype, how):
    g = Graph()
    x = strided(g, (6, 7, 8, 5), dtype, how)

    def index(positions: list[int], shapes: list[tuple[int, ...]], it: str = "int64") -> int:
        idx = [inp(g, s, it) for s in shapes]
        out = torch.ops.aten.index.Tensor(
            torch.empty((6, 7, 8, 5), device="meta"),
            [torch.empty(shapes[positions.index(p)], dtype=torch.int64, device="meta")
             if p in positions else None for p in range(max(positions) + 1)])
        return g.append("index", (x, *idx), {"positions": positions},
                        TensorType(tuple(out.shape), dtype))
    g.outputs = [index([0], [(4,)]), index([1], [(3, 2)]), index([3], [(2,)], "int32"),
                 index([1, 2], [(3, 1), (4,)]),          # adjacent, broadcast: in place
                 index([0, 2], [(5,), (5,)]),            # apart: the index dims lead
                 index([0, 3], [(2, 1), (1, 3)]),
                 index([2], [()]),                       # 0-d index drops the dim
                 index([0, 1, 2, 3], [(4,), (4,), (1,), (4,)])]
    xs = inputs_of(g)
    _fill_indices(g, xs, "index", neg=True)
    run_and_compare(g, xs)


# --- out-of-range indices -----------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["gather", "index_select", "index", "embedding"])
def test_out_of_range_indices_raise_as_torch_does(bad):
    """torch raises on an out-of-range index; so does the compiled call (KernelIndexError, an
    IndexError): the kernel reads nothing there and flags it. Never a clamp, never a stray
    read, never a value returned. The next call with good indices is right."""
    from eqsat_llm.codegen.c import KernelIndexError

    g = Graph()
    x = inp(g, (5, 6))
    gi, si, ii, ei = (inp(g, s, "int64") for s in ((5, 3), (4,), (4,), (2, 3)))
    g.outputs = [g.add("gather", (x, gi), dim=1), g.add("index_select", (x, si), dim=0),
                 g.append("index", (x, ii), {"positions": [1]}, TensorType((5, 4), "float32")),
                 g.add("embedding", (x, ei))]
    good = [torch.randn(5, 6), torch.tensor([[0, 5, 2]] * 5), torch.tensor([1, 4, 4, 0]),
            torch.tensor([-6, 5, 0, -1]), torch.tensor([[0, 4, 1], [2, 3, 3]])]
    wrong = {"gather": (1, torch.tensor([[0, 6, 2]] * 5)), "index_select": (2, torch.tensor(
        [1, 5, 4, 0])), "index": (3, torch.tensor([-7, 5, 0, 1])),
        "embedding": (4, torch.tensor([[0, 5, 1], [2, 3, 3]]))}[bad]
    rt = c_runtime(g)
    xs = list(good)
    xs[wrong[0]] = wrong[1]
    with pytest.raises(KernelIndexError, match="out of range"):
        rt.run(xs)
    want = run_eager(g, good)
    for got, w in zip(rt.run(good), want):
        torch.testing.assert_close(got, w)


# --- declined combinations ------------------------------------------------------------------------
def _ref(shape: tuple[int, ...], dtype: str) -> Ref:
    return Ref("IN", 0, 0, shape, contiguous_strides(shape), dtype)


def test_declined_dtype_combinations_return_none():
    x = _ref((3, 4), "int64")
    mean = Node(1, "mean", (0,), {"dims": [1], "keepdim": False}, TensorType((3,), "float32"))
    assert emit_reduce(mean, _ref((3,), "float32"), [x]) is None
    cs = Node(1, "cumsum", (0,), {"dim": 0}, TensorType((3, 4), "float32"))  # dtype= not made
    assert emit_reduce(cs, _ref((3, 4), "float32"), [x]) is None
    mask = Node(2, "index", (0, 1), {"positions": [0]}, TensorType((2, 4), "int64"))
    assert emit_gather(mask, _ref((2, 4), "int64"), [x, _ref((3,), "bool")]) is None
    ar = Node(0, "arange", (), {"start": 0.0, "end": 2.0, "step": 1.0, "dtype": "bool"},
              TensorType((2,), "bool"))
    assert emit_gather(ar, _ref((2,), "bool"), []) is None


# --- end to end -----------------------------------------------------------------------------------
class Reducer(torch.nn.Module):
    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = x.sum(-1)
        m = x.mean((0, 2))
        c = torch.cumsum(x, 1)
        gth = torch.gather(x, 2, idx)
        a = torch.any(x > 1.5, -1)
        return s * 2.0 + 1.0, m, c, gth, a


def test_optimize_end_to_end():
    from eqsat_llm import optimize

    x = torch.randn(3, 5, 7)
    idx = torch.randint(0, 7, (3, 5, 4))
    model = Reducer()
    compiled = optimize(model, (x, idx))
    assert compiled.report.backend == "c"
    assert not getattr(compiled.report, "torch_ops", {})  # nothing left to torch
    with torch.no_grad():
        want = model(x, idx)
    x2, idx2 = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5, 4))
    for args in ((x, idx), (x2, idx2)):
        with torch.no_grad():
            want, got = model(*args), compiled(*args)
        for a, b in zip(want, got):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_edge_shapes():
    """0-d inputs, empty reductions (sum 0, mean NaN, any false), empty gathers."""
    g = Graph()
    s, e = inp(g, ()), inp(g, (0, 3))
    i = inp(g, (0,), "int64")
    g.outputs = [g.add("sum", (s,), dims=[], keepdim=False),
                 g.add("amax", (s,), dims=[0], keepdim=True), g.add("cumsum", (s,), dim=0),
                 g.add("sum", (e,), dims=[0], keepdim=False),
                 g.add("mean", (e,), dims=[0], keepdim=True),
                 g.add("any", (e,), dims=[0, 1], keepdim=False),
                 g.add("cumsum", (e,), dim=0), g.add("index_select", (e, i), dim=1)]
    run_and_compare(g, inputs_of(g))
