import ctypes
import importlib.util
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# every program a test runs is run twice, its arena filled differently, and must agree bit for
# bit (codegen/poison.py): a read of a byte the call did not write fails the test that ran it
os.environ.setdefault("EQSAT_POISON_CHECK", "1")

import pytest
import torch

from eqsat_llm.capture import capture
from eqsat_llm.ir import Graph, TensorType
from eqsat_llm.models.workloads import WORKLOADS

torch.set_num_threads(2)
warnings.filterwarnings("ignore", category=FutureWarning)

WORKLOAD_NAMES = list(WORKLOADS)


def private_cache_home(monkeypatch, path: Path) -> None:
    """XDG_CACHE_HOME set to `path` for this test: its own program cache, start records and
    tuning files, so what it finds there is what it made. The compile cache of C objects (keyed
    by their sources and flags) stays the run's: a fresh one made every such test compile its
    programs again, 2-5 s each."""
    from eqsat_llm.cache import cache_dir
    shared = cache_dir("c").resolve()
    monkeypatch.setenv("XDG_CACHE_HOME", str(path))
    (path / "eqsat-llm").mkdir(mode=0o700, parents=True, exist_ok=True)
    (path / "eqsat-llm" / "c").symlink_to(shared, target_is_directory=True)


@pytest.fixture(scope="session")
def workload_cache():
    return {}


@pytest.fixture(params=WORKLOAD_NAMES)
def workload(request, workload_cache):
    """(name, model, inputs, captured) for each reference workload, built once per session."""
    name = request.param
    if name not in workload_cache:
        model, inputs = WORKLOADS[name]()
        workload_cache[name] = (name, model, inputs, capture(model, inputs))
    return workload_cache[name]


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"bench_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def max_error(expected, got) -> float:
    return max((a - b).abs().max().item() for a, b in zip(as_tuple(expected), as_tuple(got)))


# --- C GEMM kernels called through ctypes (test_quant_gemm, test_sparse_gemm, test_w8a8_gemm) -
class Addend(ctypes.Structure):
    """eq_addend (packed_gemm.py): an addend of the tile epilogue."""
    _fields_ = [("p", ctypes.c_void_p), ("rs", ctypes.c_int64), ("cs", ctypes.c_int64),
                ("scale", ctypes.c_float)]


def c_build_dir(request, tmp_path_factory, prefix: str) -> Path:
    """A fresh folder for one build of a kernel test's parametrized fixture (`request.param`
    names the build); skips the test when there is no C compiler."""
    from eqsat_llm.codegen.c.build import compiler

    if compiler() is None:
        pytest.skip("no C compiler (cc / $CC) found")
    return tmp_path_factory.mktemp(f"{prefix}_{request.param}")


def build_c(source: str, flags: list[str], d: Path, name: str) -> ctypes.CDLL:
    """`source` as a shared object in the folder d, compiled with the backend's CFLAGS + flags."""
    from eqsat_llm.codegen.c.build import CFLAGS, compiler

    src, so = d / f"{name}.c", d / f"{name}.so"
    src.write_text(source)
    subprocess.run([compiler(), *CFLAGS, *flags, str(src), "-o", str(so), "-lm"],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(so))


@dataclass
class GemmOperands:
    """Random operands of one epilogue GEMM call: A (row stride lda) and its float64 view a,
    the row scale, C filled with NaN (row stride ldc, wider than N), and the addends: their
    float64 values as they broadcast, and the eq_addend array (with the tensors kept alive)."""
    a_full: torch.Tensor
    a: torch.Tensor
    lda: int
    rowscale: torch.Tensor | None
    c: torch.Tensor
    ldc: int
    tensors: list
    addends: Any
    count: int
    keep: list


def gemm_operands(m: int, n: int, k: int, gen: torch.Generator, *, lda_pad: int = 0,
                  rowscale: bool = False, addends: tuple[str, ...] = ()) -> GemmOperands:
    lda, ldc = k + lda_pad, n + 3
    a_full = torch.randn(m, lda, generator=gen)
    rs = torch.rand(m, generator=gen) + 0.5 if rowscale else None
    # (stored shape, as it broadcasts, row stride, column stride)
    kinds = {"residual": ((m, n), (m, n), n, 1), "bias": ((n,), (1, n), 0, 1),
             "rowvec": ((m,), (m, 1), 1, 0)}
    stored, tensors, structs = [], [], []
    for i, kind in enumerate(addends):
        shape, ref_shape, r_s, c_s = kinds[kind]
        stored.append(torch.randn(shape, generator=gen))
        tensors.append(stored[-1].reshape(ref_shape).double() * (0.5 + i))
        structs.append(Addend(stored[-1].data_ptr(), r_s, c_s, 0.5 + i))
    e = (Addend * len(structs))(*structs) if structs else None
    return GemmOperands(a_full, a_full[:, :k].double(), lda, rs,
                        torch.full((m, ldc), float("nan")), ldc, tensors, e, len(structs), stored)


def _act(y: torch.Tensor, act: int) -> torch.Tensor:
    f = torch.nn.functional
    return [y, f.relu(y), f.silu(y), f.gelu(y, approximate="tanh"), f.gelu(y)][act]


def check_gemm_result(lib: ctypes.CDLL, ops: GemmOperands, w: torch.Tensor, n: int,
                      alpha: float, act: int, swiglu: bool, what: tuple) -> None:
    """C's first n columns against torch in float64 on the weight w (float64, [K, N or 2N]),
    to fp32 accumulation's error (1e-4 of the sum of the products' magnitudes, per element);
    nothing written past n, no kernel error flagged."""
    assert ctypes.c_int.in_dll(lib, "eq_index_error").value == 0
    assert ops.c[:, n:].isnan().all(), "wrote past N"
    got = ops.c[:, :n].double()
    assert not got.isnan().any(), what
    m = ops.c.shape[0]
    f = alpha * (ops.rowscale.double()[:, None] if ops.rowscale is not None
                 else torch.ones(m, 1, dtype=torch.float64))
    y, mag = f * (ops.a @ w), f.abs() * (ops.a.abs() @ w.abs())
    if swiglu:
        g, u, mg, mu = y[:, :n], y[:, n:], mag[:, :n], mag[:, n:]
        want = torch.nn.functional.silu(g) * u
        scale = (g.abs() + mg + 1) * (u.abs() + mu + 1)
    else:
        zero = torch.zeros(1, dtype=torch.float64)
        want = _act(y + sum(ops.tensors, zero), act)
        scale = mag + sum((t.abs() for t in ops.tensors), zero) + 1
    err = ((got - want).abs() / scale).max().item() if got.numel() else 0.0
    assert err <= 1e-4, (*what, err)


# --- building IR graphs by hand (backend and kernel tests) -----------------------------------
def inp(g: Graph, shape: tuple[int, ...], dtype: str = "float32") -> int:
    """The graph's next input."""
    k = sum(n.op == "input" for n in g.nodes)
    return g.append("input", (), {"name": f"x{k}", "index": k}, TensorType(shape, dtype))


def const(g: Graph, t: torch.Tensor) -> int:
    name = f"c{len(g.constants)}"
    g.constants[name] = t
    return g.append("const", (), {"name": name},
                    TensorType(tuple(t.shape), str(t.dtype).removeprefix("torch.")))


NO_SINK = float("-inf")  # the attention op's sinks input when a model has none


def scalar(g: Graph, v: float) -> int:
    return g.add("scalar", value=v, kind="float")


def rand_inputs(g: Graph, positive: bool = False, seed: int = 0) -> list[torch.Tensor]:
    """Standard normal values for the graph's inputs (|x| + 0.1 with `positive`)."""
    gen = torch.Generator().manual_seed(seed)
    xs = []
    for i in g.input_ids:
        x = torch.randn(g.node(i).type.shape, generator=gen)
        xs.append(x.abs() + 0.1 if positive else x)
    return xs


def assert_outputs_match(want: list, got: list, tol: float) -> None:
    """Same shapes and dtypes; bools equal, numbers within tol (absolute and relative)."""
    assert len(want) == len(got)
    for k, (a, b) in enumerate(zip(want, got)):
        assert a.shape == b.shape and a.dtype == b.dtype, (k, a.shape, b.shape)
        if a.dtype == torch.bool:
            assert torch.equal(a, b), k
        else:
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=f"output {k}")


def unary_ops_graph(shape: tuple[int, ...]) -> Graph:
    """The unary ops on x (rand_inputs' first input made positive: rsqrt, log), gelu both ways
    and swiglu on y: one output each (the backends' elementwise kernels against the
    reference). Inputs x, y are `g.input_ids`."""
    g = Graph()
    x, y = inp(g, shape), inp(g, shape)
    ops = ("neg", "rsqrt", "sqrt", "exp", "log", "tanh", "sigmoid", "silu", "relu",
           "reciprocal", "abs", "cos", "sin", "erf", "expm1", "log1p", "floor")
    g.outputs = [g.add(op, (x,)) for op in ops]
    g.outputs += [g.add("gelu", (y,), approximate="tanh"), g.add("gelu", (y,), approximate="none"),
                  g.add("swiglu", (y, x))]
    return g


def binary_ops_graph() -> Graph:
    """Binary ops with broadcasting and scalars, comparisons, where, logical ops and casts:
    one output each (the backends' elementwise kernels against the reference)."""
    g = Graph()
    x, y = inp(g, (5, 1, 13)), inp(g, (7, 13))
    s = scalar(g, 0.37)
    outs = [g.add(op, (x, y)) for op in ("add", "sub", "mul", "div", "maximum", "minimum")]
    outs += [g.add("mul", (x, s)), g.add("sub", (s, y)),
             g.add("pow", (x, g.add("scalar", value=2, kind="int")))]
    cmp = [g.add(op, (x, y)) for op in ("lt", "ge", "eq", "ne")]
    outs += cmp + [g.add("where", (cmp[0], x, y)), g.add("logical_and", (cmp[0], cmp[1])),
                   g.add("logical_not", (cmp[2],)), g.add("to_dtype", (x,), dtype="int64"),
                   g.add("to_dtype", (y,), dtype="bool")]
    g.outputs = outs
    return g
