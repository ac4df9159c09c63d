"""The C backend (codegen/c): every generated kernel against torch eager (tests/eager_oracle.py)
and the ops' reference semantics, the optimized workloads against eager, errors, the compile
cache and the standalone build."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from eqsat_llm.codegen import ReferenceRuntime
from eqsat_llm.codegen.c import (
    CCompileError,
    CRuntime,
    UnsupportedByBackend,
    emit_attention,
    save_standalone,
)
from eqsat_llm.codegen.c.blas import openblas_dir
from eqsat_llm.codegen.c.build import CFLAGS, compiler
from eqsat_llm.codegen.c.isa import isa_flags
from eqsat_llm.ir import Graph

from .conftest import (
    NO_SINK,
    assert_outputs_match,
    binary_ops_graph,
    const,
    inp,
    rand_inputs,
    scalar,
    unary_ops_graph,
)
from .eager_oracle import run_eager

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")
BLAS = [False] + ([True] if openblas_dir() else [])


def check(g: Graph, inputs: list[torch.Tensor], tol: float = 1e-5, **kw) -> CRuntime:
    """C against torch eager (written apart from the registry) and the reference runtime."""
    rt = CRuntime(g, **kw)
    got = rt.run(inputs)
    assert_outputs_match(run_eager(g, inputs), got, tol)
    assert_outputs_match(ReferenceRuntime(g).run(inputs), got, tol)
    return rt


def test_the_eager_oracle_has_every_op():
    """Every registry op that runs has a torch meaning in tests/eager_oracle.py (leaves are
    bound, fallbacks are torch calls already; sparse packing folds at compile time)."""
    from eqsat_llm.ops import REGISTRY

    from .eager_oracle import OPS
    skip = {"input", "param", "const", "fallback", "sparse_values", "sparse_index"}
    assert sorted(set(REGISTRY) - set(OPS) - skip) == []


# --- kernels ----------------------------------------------------------------------------------
def test_binary_broadcast_scalars_comparisons_where():
    g = binary_ops_graph()
    check(g, rand_inputs(g))


def test_comparisons_of_mixed_integer_types_widen_as_torch():
    """CPM-Ant's position buckets: int64 against int32, int32 against bool, in C."""
    g = Graph()
    a, b = inp(g, (4, 9), "int64"), inp(g, (1, 9), "int32")
    m = inp(g, (4, 1), "bool")
    g.outputs = [g.add("lt", (a, b)), g.add("eq", (b, m)), g.add("ge", (m, a))]
    xs = [torch.randint(-3 << 33, 3 << 33, (4, 9)), torch.randint(-2, 3, (1, 9), dtype=torch.int32),
          torch.rand(4, 1) < 0.5]
    rt = check(g, xs)
    assert not rt.torch_steps  # all three in generated C


@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 129)])
def test_unary(shape):
    g = unary_ops_graph(shape)
    _, y = g.input_ids
    g.outputs.append(g.add("exp", (g.add("mul", (y, scalar(g, 30.0))),)))  # large arguments
    xs = rand_inputs(g)
    xs[0] = xs[0].abs() + 0.1
    check(g, xs, tol=2e-6)


def test_views_cat_and_copies():
    g = Graph()
    x = inp(g, (2, 6, 10))
    p = g.add("permute", (x,), dims=[0, 2, 1])                       # (2, 10, 6) strided
    sl = g.add("slice", (p,), dim=1, start=1, end=9, step=2)         # (2, 4, 6)
    n = g.add("neg", (sl,))
    c = g.add("cat", (n, sl, sl), dim=2)                             # (2, 4, 18)
    v = g.add("view", (p,), shape=[2, 60])                           # a copy: not viewable
    u = g.add("unsqueeze", (g.add("select", (x,), dim=1, index=3),), dim=0)  # (1, 2, 10)
    e = g.add("expand", (u,), shape=[3, 2, 10])
    g.outputs = [c, v, g.add("add", (e, scalar(g, 1.0))), g.add("clone", (p,)), sl]
    check(g, rand_inputs(g))


@pytest.mark.parametrize("blas", BLAS)
@pytest.mark.parametrize("m", [1, 5, 33])
def test_matmuls(blas, m):
    g = Graph()
    x = inp(g, (1, m, 37))
    w = const(g, torch.randn(37, 19))
    wt = const(g, torch.randn(19, 37))
    b = const(g, torch.randn(19))
    x2 = g.add("view", (x,), shape=[m, 37])
    q, k = inp(g, (2, m, 3, 8)), inp(g, (2, 11, 3, 8))
    qp = g.add("permute", (q,), dims=[0, 2, 1, 3])                   # (2, 3, m, 8) strided
    kt = g.add("permute", (k,), dims=[0, 2, 3, 1])                   # (2, 3, 8, 11)
    a3, b3 = inp(g, (3, m, 5)), inp(g, (3, 5, 7))
    g.outputs = [g.add("matmul", (x, w), alpha=1.0), g.add("matmul", (x, w), alpha=0.5),
                 g.add("mm", (x2, w), alpha=1.0), g.add("matmul", (qp, kt), alpha=0.125),
                 g.add("bmm", (a3, b3), alpha=1.0),
                 g.add("addmm", (b, x2, w), beta=1.0, alpha=1.0),
                 g.add("linear", (x, wt)), g.add("linear_bias", (x, wt, b))]
    check(g, rand_inputs(g), use_blas=blas)


def test_norms_softmax_embedding():
    g = Graph()
    x = inp(g, (3, 7, 45))
    w, b = const(g, torch.randn(45)), const(g, torch.randn(45))
    table = const(g, torch.randn(50, 9))
    ids = const(g, torch.tensor([[3, 0, 49], [7, 7, 1]]))
    g.outputs = [g.add("rms_norm", (x, w), eps=1e-6),
                 g.add("layer_norm", (x, w, b), normalized_shape=[45], eps=1e-5),
                 g.add("softmax", (x,), dim=-1), g.add("softmax", (x,), dim=1),
                 g.add("log_softmax", (x,), dim=-1), g.add("embedding", (table, ids))]
    check(g, rand_inputs(g))


@pytest.mark.parametrize("sq,sk,d", [(70, 70, 24), (1, 131, 16), (9, 1, 8)])
def test_attention(sq, sk, d, monkeypatch):
    g = Graph()
    q = g.add("permute", (inp(g, (2, sq, 3, d)),), dims=[0, 2, 1, 3])  # strided like the block
    k, v = inp(g, (2, 3, sk, d)), inp(g, (2, 3, sk, d))
    mask = torch.full((sq, sk), float("-inf")).triu(sk - sq + 1) if sq == sk else \
        torch.randn(1, sk)
    bias = const(g, mask)
    g.outputs = [g.add("attention", (q, k, v, bias, scalar(g, NO_SINK)), scale=d ** -0.5,
                       softcap=0.0)]
    xs = rand_inputs(g)
    # prefill-sized query blocks run on the packed GEMM's micro-kernels
    rt = check(g, xs, use_blas=False)
    assert ("eq_panel(" in rt.source) == (sq >= 8)
    # the causal mask's hidden keys are skipped per block of query rows
    assert ("key_end[] = {64, 70}" in rt.source) == (sq == sk == 70)
    monkeypatch.setattr(emit_attention, "PACKED_SCRATCH", 0)  # too big for its stack scratch:
    check(g, xs, use_blas=False)  # the flash-style kernel
    if openblas_dir() is not None:  # per-head GEMMs through BLAS (prefill-sized query blocks)
        rt = check(g, xs, use_blas=True)
        assert ("EQ_SGEMM(101, 111, 112, rows" in rt.source) == (sq >= 8)


@pytest.mark.parametrize("heads,kv,sq,sk", [
    (8, 2, 1, 200),   # GQA decode: a KV head's 4 query heads one key-major tile
    (8, 2, 1, 1),     # one key
    (6, 2, 2, 65),    # 3 heads x 2 rows: a tile of 6, a block of 64 keys and one more
    (24, 2, 1, 64),   # 12 rows a KV head: a full tile and one of 4
    (4, 4, 3, 70),    # 3 rows a tile (MHA)
    (2, 2, 1, 130),   # a row a tile (MHA decode)
])
@pytest.mark.parametrize("terms", ["mask", "softcap+sinks"])
def test_attention_tiles_key_major(heads, kv, sq, sk, terms):
    """The flash kernel's key-major tiles (emit_attention) against eager: a run-time mask
    hiding a block of keys, a whole row (a zero row, as sdpa) and, past 64 keys, whole
    blocks; softcap and a sink per row."""
    g = Graph()
    q = inp(g, (2, heads, sq, 64))
    k, v = inp(g, (2, kv, sk, 64)), inp(g, (2, kv, sk, 64))
    if terms == "mask":
        bias, sinks, softcap = inp(g, (2, 1, sq, sk)), scalar(g, NO_SINK), 0.0
    else:
        bias, sinks, softcap = scalar(g, 0.0), inp(g, (2, heads, sq, 1)), 5.0
    g.outputs = [g.add("attention", (q, k, v, bias, sinks), scale=0.125, softcap=softcap)]
    xs = rand_inputs(g)
    if terms == "mask":
        mask = torch.zeros(2, 1, sq, sk)
        mask[0, :, :, sk // 3:] = float("-inf")  # batch 0: the keys past a third hidden
        mask[1, :, 0, :] = float("-inf")  # batch 1: its first row sees nothing
        mask[1, :, 1:, :max(1, sk - 64)] = float("-inf")  # its other rows: the last 64 keys
        xs[3] = mask
    rt = check(g, xs, tol=1e-5)
    assert "eq_rows" in rt.source


def test_key_extents_of_masks():
    causal = torch.full((6, 6), float("-inf")).triu(1)
    assert emit_attention.key_extents(causal, (2, 6, 6), 2) == [2, 4, 6]
    assert emit_attention.key_extents(torch.zeros(6, 6), (2, 6, 6), 2) is None  # no mask
    per_head = torch.stack([causal, torch.zeros(6, 6)])  # heads differ: nothing skipped
    assert emit_attention.key_extents(per_head, (2, 6, 6), 2) is None
    hidden = causal.clone()
    hidden[:2] = float("-inf")  # a fully masked block keeps its keys (zero rows, as sdpa)
    assert emit_attention.key_extents(hidden, (1, 6, 6), 2) == [6, 4, 6]


@pytest.mark.parametrize("blas", BLAS)
def test_runtimes_sharing_one_library_run_at_once(blas, monkeypatch):
    """Two CRuntimes of one program load the same shared object: its kernels keep no state
    of their own (scratch on the stack), so calls from two threads at once stay correct."""
    import threading
    if blas:  # the per-head BLAS attention, not the packed one
        monkeypatch.setattr(emit_attention, "PACKED_SCRATCH", 0)
    g = Graph()
    q, k, v = (inp(g, (1, 4, 70, 16)) for _ in range(3))
    g.outputs = [g.add("attention", (q, k, v, scalar(g, 0.0), scalar(g, NO_SINK)), scale=0.25,
                       softcap=0.0)]
    rts = [CRuntime(g, use_blas=blas) for _ in range(2)]
    assert rts[0].so_path == rts[1].so_path
    errors: list[str] = []

    def work(rt: CRuntime, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(30):
            xs = [torch.randn(1, 4, 70, 16, generator=gen) for _ in range(3)]
            want = run_eager(g, xs)[0]
            if not torch.allclose(rt.run(xs)[0], want, atol=1e-5, rtol=1e-5):
                errors.append(f"runtime {seed} gave a wrong result")

    threads = [threading.Thread(target=work, args=(rt, i)) for i, rt in enumerate(rts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --- errors, cache, caller outputs ----------------------------------------------------------------
def small_graph() -> Graph:
    g = Graph()
    x = inp(g, (4, 33))
    g.outputs = [g.add("mul", (g.add("exp", (x,)), x))]
    return g


def test_ops_without_a_kernel_run_in_torch_and_the_standalone_build_names_them(tmp_path):
    # an integer matmul has no C kernel: CRuntime runs it in torch between its C segments
    # (tests/test_segments.py); the standalone build, which has no torch, refuses the program
    g = Graph()
    x, w = inp(g, (4, 5), "int64"), inp(g, (5, 3), "int64")
    m = g.add("to_dtype", (g.add("matmul", (x, w), alpha=1.0),), dtype="float32")
    g.outputs = [g.add("exp", (m,))]
    assert [op for _, op in CRuntime(g).torch_steps] == ["matmul"]
    with pytest.raises(UnsupportedByBackend, match="matmul") as e:
        save_standalone(g, None, tmp_path / "model")
    assert e.value.ops == ["matmul"]


def test_compile_error_names_the_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    g = small_graph()

    def broken(name: str, text: str) -> str:  # exp is fused into mul's kernel (k2_mul)
        return text.replace("{\n", "{\n this is not C;\n", 1) if "mul" in name else text
    with pytest.raises(CCompileError) as e:
        CRuntime(g, kernel_hook=broken)
    assert e.value.kernel is not None and "mul" in e.value.kernel
    assert "error" in e.value.message and e.value.kernel in str(e.value)


def test_bad_flag_gives_the_compiler_message(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(CCompileError, match="no-such-flag") as e:
        CRuntime(small_graph(), flags=CFLAGS + ["-fno-such-flag"])
    assert e.value.kernel is None


def test_cache_hit_on_second_build(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = CRuntime(small_graph())
    second = CRuntime(small_graph())
    assert not first.cache_hit and second.cache_hit and first.so_path == second.so_path
    assert first.so_path.is_relative_to(tmp_path / "eqsat-llm" / "c")


def test_caller_provided_outputs():
    g = small_graph()
    rt = CRuntime(g)
    xs = rand_inputs(g)
    out = [torch.empty(4, 33)]
    res = rt.run(xs, out=out)
    assert res[0] is out[0]
    torch.testing.assert_close(out[0], torch.exp(xs[0]) * xs[0])


# --- workloads ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def optimized():
    from eqsat_llm import optimize
    from eqsat_llm.models.workloads import WORKLOADS
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            model, inputs = WORKLOADS[name]()
            cache[name] = (model, inputs, optimize(model, inputs))
        return cache[name]
    return get


def _eager_error(model, inputs, outs) -> float:
    import torch.utils._pytree as pytree
    with torch.no_grad():
        want = pytree.tree_leaves(model(*inputs))
    return max((a - b).abs().max().item() for a, b in zip(want, outs))


@pytest.mark.parametrize("shape", ["prefill", "decode", "decode_kv"])
def test_llama_block_against_eager(optimized, shape):
    model, inputs, compiled = optimized(f"llama_block_{shape}")
    rt = CRuntime(compiled.graph)
    err = _eager_error(model, inputs, rt.run(list(inputs)))
    assert err < 1e-5, err  # tighter than the 1e-4 required; seen: 4.8e-7 / 4.8e-7 / 8.3e-7
    fresh = [torch.randn_like(x) for x in inputs]
    assert _eager_error(model, fresh, rt.run(fresh)) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_transformers_models(optimized, name):
    model, inputs, compiled = optimized(name)
    rt = CRuntime(compiled.graph)
    assert _eager_error(model, inputs, rt.run(list(inputs))) < 1e-4


# --- standalone build -----------------------------------------------------------------------------
def _run_standalone(g: Graph, inputs: list[torch.Tensor], tmp_path) -> list[torch.Tensor]:
    d = save_standalone(g, None, tmp_path / "model")
    exe = d / "model"
    subprocess.run([compiler(), "-O2", "-march=native", *isa_flags(), "-fopenmp", "-std=gnu11",
                    "main.c", "model.c", "-o", str(exe), "-lm"], cwd=d, check=True)
    (d / "inputs.bin").write_bytes(b"".join(x.contiguous().numpy().tobytes() for x in inputs))
    subprocess.run([str(exe), "weights.bin", "inputs.bin", "outputs.bin"], cwd=d, check=True)
    raw = torch.frombuffer(bytearray((d / "outputs.bin").read_bytes()), dtype=torch.float32)
    outs, pos = [], 0
    for t in ReferenceRuntime(g).run(inputs):
        outs.append(raw[pos:pos + t.numel()].view(t.shape))
        pos += t.numel()
    return outs


@pytest.mark.skipif(shutil.which("cc") is None and compiler() is None, reason="no cc")
def test_standalone_small(tmp_path):
    g = Graph()
    x = inp(g, (3, 21))
    w = const(g, torch.randn(21, 10))
    g.outputs = [g.add("add", (g.add("matmul", (x, w), alpha=1.0), scalar(g, 2.0))),
                 g.add("softmax", (x,), dim=-1)]
    xs = rand_inputs(g)
    for a, b in zip(run_eager(g, xs), _run_standalone(g, xs, tmp_path)):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_standalone_llama_block(optimized, tmp_path):
    model, inputs, compiled = optimized("llama_block_decode_kv")
    outs = _run_standalone(compiled.graph, list(inputs), tmp_path)
    assert _eager_error(model, inputs, outs) < 1e-4


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, -1.0, -2.0, 1.7])
def test_pow_by_a_scalar_matches_torch_bit_for_bit(exponent):
    # torch special-cases these exponents (x*x, x*x*x, 1/x, ...); the C kernel does the same
    g = Graph()
    x = inp(g, (7, 37))
    g.outputs = [g.add("pow", (x, scalar(g, exponent)))]
    xs = [torch.rand(7, 37) + 0.5]
    expected = torch.pow(xs[0], exponent)
    got = CRuntime(g).run(xs)[0]
    if exponent in (0.5, 1.7):  # sqrt (torch's is Sleef's, 0.5001 ulp) and powf: rounding
        assert torch.allclose(got, expected, rtol=1e-6, atol=0)
    else:
        assert torch.equal(got, expected)


def test_vectorised_tanh_is_accurate():
    g = Graph()
    x = inp(g, (3, 1001))
    g.outputs = [g.add("tanh", (x,))]
    xs = [torch.linspace(-12, 12, 3003).reshape(3, 1001)]
    assert (CRuntime(g).run(xs)[0] - torch.tanh(xs[0])).abs().max().item() < 5e-7


def test_repeated_layers_share_their_kernel_functions():
    # kernels equal but for their places are one C function (shared_kernels.py): the source
    # and its compile do not grow with the depth, the calls do
    from eqsat_llm import optimize
    from eqsat_llm.models.workloads import stacked_llama_blocks

    counts = {}
    for depth in (3, 6):
        model = stacked_llama_blocks(depth, d_model=64, n_heads=2, ffn=128)
        x = torch.randn(1, 8, 64)
        compiled = optimize(model, (x,), measure_eager=False)
        program = compiled._runtime.program
        functions = {k.function for k in program.kernels}
        counts[depth] = (len(program.kernels), len(functions))
        assert compiled.source().count("\nstatic void k") == len(functions)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert counts[6][0] > counts[3][0] and counts[6][1] == counts[3][1], counts
