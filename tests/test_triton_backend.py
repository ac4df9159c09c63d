"""The Triton backend (codegen/triton/) as a whole, in Triton's interpreter on the CPU: its
generated elementwise kernels and fused chains, row kernels, whole programs against the
reference runtime and eager, the torch steps for what it does not generate, and its use through
optimize() (backend="triton", "auto") and the Generator."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from eqsat_llm import Generator, optimize
from eqsat_llm.codegen import ReferenceRuntime
from eqsat_llm.codegen.triton.launch import device
from eqsat_llm.codegen.triton.runtime import TritonRuntime
from eqsat_llm.errors import EqsatError
from eqsat_llm.ir import Graph
from eqsat_llm.models.workloads import LlamaBlock
from eqsat_llm.ops.experts import add_expert_mm

from .conftest import (
    assert_outputs_match,
    binary_ops_graph,
    const,
    inp,
    rand_inputs,
    scalar,
    unary_ops_graph,
)
from .eager_oracle import run_eager
from .test_moe import STORED_EXPERTS, stored_experts_graph
from .triton_device import on_device, on_host

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy in the interpreter


def check(g: Graph, inputs: list[torch.Tensor], tol: float = 1e-5) -> TritonRuntime:
    rt = TritonRuntime(g)
    want = run_eager(g, inputs)  # torch eager (tests/eager_oracle.py)
    for _ in range(2):  # the arena is reused: nothing may leak from the first call
        with np.errstate(all="ignore"):
            assert_outputs_match(want, on_host(rt.run(on_device(inputs))), tol)
    return rt


def test_elementwise_ops_broadcast_scalars_comparisons_where():
    g = binary_ops_graph()
    rt = check(g, rand_inputs(g))
    assert not rt.torch_steps and rt.kernel_count == len(g.outputs)


def test_unary_ops():
    g = unary_ops_graph((3, 37))
    x, _ = g.input_ids
    g.outputs.append(g.add("pow", (x, scalar(g, 0.5))))
    xs = rand_inputs(g)
    xs[0] = xs[0].abs() + 0.1
    rt = check(g, xs, tol=2e-6)
    assert not rt.torch_steps


def test_elementwise_chain_is_one_kernel_and_strided_inputs_are_read_in_place():
    g = Graph()
    x = inp(g, (4, 6, 10))
    t = g.add("permute", (x,), dims=[0, 2, 1])  # (4, 10, 6) read through strides
    b = const(g, torch.randn(6))
    y = g.add("exp", (g.add("mul", (g.add("add", (t, b)), scalar(g, 0.5))),))
    g.outputs = [g.add("sigmoid", (y,))]
    rt = check(g, rand_inputs(g))
    (members,) = rt.program.fused.values()
    assert len(members) == 4 and rt.kernel_count == 1
    assert rt.source.count("@triton.jit") == 1


def test_row_ops_and_rope():
    g = Graph()
    x = inp(g, (2, 5, 3, 40))
    w, b = const(g, torch.randn(40)), const(g, torch.randn(40))
    cos, sin = const(g, torch.randn(5, 1, 40)), const(g, torch.randn(5, 1, 40))
    g.outputs = [g.add("rms_norm", (x, w), eps=1e-6),
                 g.add("layer_norm", (x, w, b), normalized_shape=[40], eps=1e-5),
                 g.add("softmax", (x,), dim=-1), g.add("log_softmax", (x,), dim=3),
                 g.add("rope", (x, cos, sin))]
    rt = check(g, rand_inputs(g))
    assert not rt.torch_steps
    assert {ln.name for ls in rt.program.launches.values() for ln in ls} == {
        "rms_norm", "layer_norm", "softmax", "log_softmax", "rope"}


def test_ops_without_a_kernel_run_in_torch_on_the_arena():
    g = Graph()
    x = inp(g, (4, 9))
    c = g.add("cumsum", (g.add("exp", (x,)),), dim=1)  # no Triton kernel: a torch step
    g.outputs = [g.add("mul", (c, scalar(g, 2.0))), g.add("softmax", (x,), dim=0)]
    rt = check(g, rand_inputs(g))
    assert sorted(op for _, op in rt.torch_steps) == ["cumsum", "softmax"]
    assert rt.kernel_count == 2  # exp, then mul after the torch step


def small_block(**kw) -> LlamaBlock:
    return LlamaBlock(d_model=64, n_heads=4, ffn=96, **kw).eval()


@pytest.mark.parametrize("shape", ["prefill", "decode_kv"])
def test_llama_block_runs_whole_on_triton_and_matches_eager(shape):
    model = small_block()
    gen = torch.Generator().manual_seed(0)
    seq = 24 if shape == "prefill" else 1
    inputs = (torch.randn(1, seq, 64, generator=gen),)
    if shape == "decode_kv":
        inputs += (torch.randn(1, 4, 40, 16, generator=gen),
                   torch.randn(1, 4, 40, 16, generator=gen))
    model, inputs = model.to(device()), on_device(inputs)
    compiled = optimize(model, inputs, backend="triton", measure_eager=False)
    report = compiled.report
    assert report.backend == "triton" and not report.torch_ops
    assert compiled.report.op_counts_after.get("attention") == 1
    with torch.no_grad():
        want = model(*inputs)
    with np.errstate(all="ignore"):
        got = compiled(*inputs)
    for a, b in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    text = compiled.source("triton")
    gemms = sum(v for k, v in report.op_counts_after.items() if k.startswith("gemm"))
    assert text.count("gemm_kernel[") == gemms and "_attention_fwd[" in text
    with pytest.raises(EqsatError, match="no c source"):
        compiled.source("c")


def test_auto_is_c_on_cpu_inputs_and_triton_on_cuda_ones():
    from eqsat_llm.api import resolve_backend

    assert resolve_backend("auto", [torch.randn(2)]) == "c"
    cuda_like = torch.empty(2, device="meta")  # (no CUDA here: a tensor that says is_cuda)
    assert resolve_backend("auto", [_Cuda(cuda_like)]) == "triton"


class _Cuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:
        return True


def test_unknown_backend_is_refused():
    with pytest.raises(EqsatError, match="unknown backend"):
        optimize(small_block(), (torch.randn(1, 3, 64),), backend="cuda")


def test_generator_on_triton_gives_transformers_tokens():
    pytest.importorskip("transformers")
    from eqsat_llm.models.model_matrix import build

    model = build("llama", seq=4)[0].model.to(device())
    ids = on_device(torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(3)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            gen = Generator(model, max_seq_len=16, backend="triton")
            got = gen.generate(ids, max_new_tokens=4)
        with torch.no_grad():
            want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4,
                                  do_sample=False)
    assert torch.equal(got, want)
    for program in (gen.decode_program, gen.prefill_program):
        # every node a Triton kernel but the KV cache writes, torch's own in-place ops
        assert program.report.backend == "triton"
        assert set(program.report.torch_ops) == {"aten.index_put_.default"}


def test_embedding_gathers_rows_and_an_out_of_range_id_raises():
    from eqsat_llm.codegen.c import KernelIndexError

    g = Graph()
    ids = inp(g, (2, 7), "int64")
    w = const(g, torch.randn(11, 24))
    g.outputs = [g.add("embedding", (w, ids))]
    good = [torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(0))]
    rt = check(g, good)
    assert not rt.torch_steps
    bad = [good[0].clone()]
    bad[0][1, 3] = 11
    with pytest.raises(KernelIndexError), np.errstate(all="ignore"):
        rt.run(on_device(bad))
    with np.errstate(all="ignore"):  # the flag was reset: a good call runs again
        torch.testing.assert_close(on_host(rt.run(on_device(good)))[0],
                                   ReferenceRuntime(g).run(good)[0])


def test_index_and_index_select_gather_with_negative_ids_and_raise_out_of_range():
    from eqsat_llm.codegen.c import KernelIndexError

    g = Graph()
    x = inp(g, (3, 10, 4))
    pos = inp(g, (2, 5), "int64")
    sel = inp(g, (6,), "int64")
    g.outputs = [g.add("index", (x, pos), positions=[1]),
                 g.add("index_select", (x, sel), dim=2)]
    gen = torch.Generator().manual_seed(0)
    good = [torch.randn(3, 10, 4, generator=gen),
            torch.randint(-10, 10, (2, 5), generator=gen),
            torch.randint(0, 4, (6,), generator=gen)]
    rt = check(g, good)
    assert not rt.torch_steps
    bad = [good[0], good[1].clone(), good[2]]
    bad[1][0, 0] = 10
    with pytest.raises(KernelIndexError), np.errstate(all="ignore"):
        rt.run(on_device(bad))
    negative = [good[0], good[1], torch.tensor([0, -1, 2, 3, 1, 0])]  # refused, as by torch
    with pytest.raises(KernelIndexError), np.errstate(all="ignore"):
        rt.run(on_device(negative))


def test_index_with_two_broadcast_index_tensors():
    g = Graph()
    x = inp(g, (2, 7, 5), "bool")
    a, b = inp(g, (3, 1), "int64"), inp(g, (1, 4), "int64")
    g.outputs = [g.add("index", (x, a, b), positions=[0, 1])]
    gen = torch.Generator().manual_seed(1)
    rt = check(g, [torch.rand(2, 7, 5, generator=gen) > 0.5,
                   torch.randint(-2, 2, (3, 1), generator=gen),
                   torch.randint(0, 7, (1, 4), generator=gen)])
    assert not rt.torch_steps


def _half_compute(graph) -> set[str]:
    """The dtypes of the values a program computes (its leaves and scalars left out)."""
    return {n.type.dtype for n in graph.nodes if n.op not in ("input", "param", "const",
                                                              "scalar")}


@pytest.mark.parametrize("family", [
    "llama", "gpt2", "mixtral",
    *(pytest.param(f, marks=pytest.mark.slow) for f in (
        "bert", "deepseek_v3", "falcon", "gpt_oss", "gptj", "granite", "olmo2", "olmoe",
        "opt", "phimoe", "qwen2_moe", "qwen3", "stablelm", "starcoder2"))])
def test_a_bf16_model_keeps_its_activations_bf16(family):
    """A bf16 model on Triton computes in bf16 (each kernel in float32 inside, its values
    stored half: no float32 pass, formats/half.py is the C backend's), its RMSNorm and SwiGLU
    fused from their half spellings (rules/fusion.py rms-norm-half, swiglu-half), its GEMMs
    on bf16 weights; within 3e-2 of eager's largest logit (eager rounds after every op, the
    kernels at their ends: bf16's 8 bits, a few roundings apart)."""
    pytest.importorskip("transformers")
    from eqsat_llm.models.model_matrix import build

    model, inputs = build(family, seq=8)
    model, inputs = model.to(device(), torch.bfloat16), on_device(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = optimize(model, inputs, backend="triton", measure_eager=False)
    report = compiled.report
    assert report.backend == "triton" and not report.computed_in_float32
    assert "float32" not in {t for n in compiled.graph.nodes if n.op.startswith("gemm")
                             for t in [n.type.dtype]}
    if family in ("llama", "gpt2"):  # whole: no torch step, every value bf16 (or ids)
        assert not report.torch_ops and _half_compute(compiled.graph) <= {"bfloat16", "int64"}
        assert set(report.weight_formats) <= {"bf16"}
    if family == "llama":
        counts = report.op_counts_after
        assert counts.get("gemm[bf16+swiglu]") == 2 and "mean" not in counts, counts
    with torch.no_grad(), np.errstate(all="ignore"):
        want, got = model(*inputs).float(), compiled(*inputs)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 3e-2 * want.abs().max()


def test_an_fp16_model_multiplies_half_tiles():
    """fp16 activations times fp16 weights: every GEMM multiplies fp16 tiles (gemm.dot_kind:
    tensor cores on a GPU, float32 sums), within fp16's precision of eager."""
    pytest.importorskip("transformers")
    from eqsat_llm.codegen.triton.gemm import DOT_HALF
    from eqsat_llm.models.model_matrix import build

    model, inputs = build("llama", seq=8)
    model, inputs = model.to(device(), torch.float16), on_device(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = optimize(model, inputs, backend="triton", measure_eager=False)
    dots = [ln.constexprs["DOT"] for _, ls in compiled._runtime._actions if ls
            for ln in ls if ln.name == "gemm"]
    assert dots and set(dots) == {DOT_HALF}, dots
    with torch.no_grad(), np.errstate(all="ignore"):
        want, got = model(*inputs).float(), compiled(*inputs)
    assert (got.float() - want).abs().max() <= 3e-3 * want.abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_block_prefill", "llama_block_decode",
                                  "llama_block_decode_kv"])
def test_reference_workloads_run_whole_on_triton(name):
    from eqsat_llm.models.workloads import WORKLOADS

    model, inputs = WORKLOADS[name]()
    model, inputs = model.to(device()), on_device(inputs)
    compiled = optimize(model, inputs, backend="triton", measure_eager=False)
    assert compiled.report.backend == "triton" and not compiled.report.torch_ops
    with torch.no_grad(), np.errstate(all="ignore"):
        want, got = model(*inputs), compiled(*inputs)
    for a, b in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows,experts", [(2, 4), (24, 3)])
def test_expert_mm_reads_each_rows_expert_and_an_out_of_range_id_raises(rows, experts):
    """The expert GEMM (docs/moe.md) as a Triton kernel: each row times its expert's weight,
    against eager's bmm over the gathered weights; an id past the experts raises."""
    from eqsat_llm.codegen.c import KernelIndexError

    g = Graph()
    x = inp(g, (rows, 40))
    ids = inp(g, (rows,), "int64")
    w = const(g, torch.randn(experts, 40, 72))
    g.outputs = [add_expert_mm(g, x, w, ids)]
    gen = torch.Generator().manual_seed(rows)
    good = [torch.randn(rows, 40, generator=gen),
            torch.randint(0, experts, (rows,), generator=gen)]
    rt = check(g, good, tol=1e-4)
    assert not rt.torch_steps
    bad = [good[0], good[1].clone()]
    bad[1][-1] = experts
    with pytest.raises(KernelIndexError), np.errstate(all="ignore"):
        rt.run(on_device(bad))


@pytest.mark.parametrize("fmt", STORED_EXPERTS)
def test_stored_experts_are_a_triton_kernel(fmt):
    """Experts stored side by side (int8, fp8, int4, bf16, fp16) dequantized per tile by the
    expert kernel, against eager's bmm over the decoded experts; one expert unused."""
    g, xs = stored_experts_graph(fmt, [3, 1, 0, 3, 3])
    rt = check(g, xs, tol=1e-4)
    assert not rt.torch_steps and rt.kernel_count == 1


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("keepdim", [True, False])
def test_arg_extremes_take_the_first_and_count_nan_as_the_extreme(op, keepdim):
    g = Graph()
    x = inp(g, (3, 4, 9))
    g.outputs = [g.add(op, (x,), dim=2, keepdim=keepdim)]
    xs = [torch.randn(3, 4, 9, generator=torch.Generator().manual_seed(1))]
    xs[0][0, 1, :] = 2.0  # ties: the first
    xs[0][2, 3, 5] = float("nan")
    rt = check(g, xs)
    assert not rt.torch_steps


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_value_writes_a_number_where_the_index_points_and_checks_it(dim):
    from eqsat_llm.codegen.c import KernelIndexError

    g = Graph()
    x = inp(g, (5, 6))
    idx = inp(g, (3, 2) if dim == 1 else (2, 6), "int64")
    g.outputs = [g.add("scatter_value", (x, idx), dim=dim, value=1.0)]
    gen = torch.Generator().manual_seed(dim)
    n = 6 if dim == 1 else 5
    good = [torch.randn(5, 6, generator=gen),
            torch.randint(0, n, (3, 2) if dim == 1 else (2, 6), generator=gen)]
    rt = check(g, good)
    assert not rt.torch_steps
    bad = [good[0], good[1].clone()]
    bad[1][0, 0] = n
    with pytest.raises(KernelIndexError), np.errstate(all="ignore"):
        rt.run(on_device(bad))
