"""Mixture-of-experts models: the routing ops and the expert GEMM as C kernels (against torch
eager's own functions, tests/eager_oracle.py), transformers' experts forms recognised in the
exported graph (capture/moe_forms.py), and MoE families compiled whole and equal to eager."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from eqsat_llm import FallbackWarning, optimize
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.ir import Graph
from eqsat_llm.ops.experts import add_expert_mm

from .conftest import const, inp
from .test_c_kernels_more import c_runtime, inputs_of, run_and_compare

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("shape,k", [((5, 8), 2), ((2, 3, 64), 8), ((7, 4), 4), ((1, 128), 1)])
def test_topk_values_and_indices(shape, k, largest):
    g = Graph()
    x = inp(g, shape)
    dim = len(shape) - 1
    g.outputs = [g.add(op, (x,), k=k, dim=dim, largest=largest)
                 for op in ("topk_values", "topk_indices")]
    run_and_compare(g, inputs_of(g))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("n,k", [(4, 2), (8, 2), (16, 5), (64, 8), (40, 40), (129, 2),
                                 (300, 4), (257, 17), (2000, 40), (4096, 64)])
def test_topk_breaks_ties_as_torch_does(n, k, largest):
    """Scores with many equal values (a zero-initialised router's), and NaNs: the kernel picks
    and orders them as torch.topk does (its nth_element / partial_sort paths, k * 64 <= n or
    not), so a model fed ties routes as eager does."""
    g = Graph()
    x = inp(g, (200, n))
    g.outputs = [g.add(op, (x,), k=k, dim=1, largest=largest)
                 for op in ("topk_values", "topk_indices")]
    gen = torch.Generator().manual_seed(n * 100 + k)
    ties = torch.randint(0, 4, (200, n), generator=gen).float()
    ties[:20] = 0.5  # every value equal
    ties[20:40, ::7] = float("nan")
    values, indices = c_runtime(g).run([ties])
    want = torch.topk(ties, k, 1, largest)
    assert torch.equal(indices, want.indices)
    torch.testing.assert_close(values, want.values, equal_nan=True)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dim,keepdim", [(1, True), (0, False), (2, False)])
def test_arg_extremes(op, dim, keepdim):
    g = Graph()
    x = inp(g, (3, 5, 7))
    g.outputs = [g.add(op, (x,), dim=dim, keepdim=keepdim)]
    xs = inputs_of(g)
    xs[0][1, 2, 3] = float("nan")  # torch counts a NaN as the extreme
    xs[0][0, :, 0] = 1.0  # ties: the first
    run_and_compare(g, xs)


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_scatter_value(dtype):
    g = Graph()
    x = inp(g, (4, 6), dtype)
    idx = const(g, torch.tensor([[0, 5], [2, 2], [1, 3], [4, 0]]))
    g.outputs = [g.add("scatter_value", (x, idx), dim=1, value=1.0)]
    run_and_compare(g, inputs_of(g))


def _expert_mm_graph(S: int, K: int, N: int, E: int, ids: torch.Tensor
                     ) -> tuple[Graph, list[torch.Tensor]]:
    """x [S, K] times experts' weights [E, K, N] (the layout the program prepares from
    transformers' [E, N, K]: the families below read that one)."""
    g = Graph()
    x = inp(g, (S, K))
    gen = torch.Generator().manual_seed(S * 1000 + N)
    w = const(g, torch.randn(E, K, N, generator=gen))
    g.outputs = [add_expert_mm(g, x, w, const(g, ids))]
    return g, [torch.randn(S, K, generator=gen)]


@pytest.mark.parametrize("S,K,N,E", [
    (2, 64, 256, 4),     # decode: each of top-2 rows its own expert
    (8, 96, 200, 8),     # decode at top-8; columns short of a tile
    (96, 40, 72, 6),     # prefill: many rows per expert, K not a vector multiple
    (33, 128, 513, 3),   # rows not a multiple of the tile, one expert unused
])
def test_expert_mm_matches_eager(S, K, N, E):
    gen = torch.Generator().manual_seed(S)
    ids = torch.randint(0, E, (S,), generator=gen)
    if S == 33:
        ids[ids == 2] = 0
    g, xs = _expert_mm_graph(S, K, N, E, ids)
    run_and_compare(g, xs, tol=1e-4)


@pytest.mark.parametrize("ids", [
    [3, 0, 3, 3, 1, 0, 3, 2, 2, 3],  # few rows an expert: the tiles
    [1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1],  # 13 and 2: the packed GEMM and the tiles
], ids=["tiles", "gemm-and-tiles"])
def test_expert_mm_reads_every_row_once_whatever_the_order(ids):
    """Rows sharing an expert in any order: grouped by the kernel, written back to their own
    places, whichever path an expert takes."""
    g, xs = _expert_mm_graph(len(ids), 32, 70, 4, torch.tensor(ids))
    run_and_compare(g, xs, tol=1e-4)


STORED_EXPERTS = ["int8", "fp8_e4m3", "fp8_e4m3_g128", "int4_g32", "int4_g128", "bf16",
                  "fp16"]


def stored_experts_graph(fmt: str, ids: list[int]) -> tuple[Graph, list[torch.Tensor]]:
    """x [S, 256] times 4 experts [256, 128] stored side by side in `fmt` ([K, E N]: each
    expert's output channels their own scales; half formats their values in that dtype)."""
    from eqsat_llm.formats.half_formats import WEIGHT_FORMATS
    from eqsat_llm.formats.quant_formats import quantize
    from eqsat_llm.ops.experts import experts_matrix

    E, K, N, S = 4, 256, 128, len(ids)
    gen = torch.Generator().manual_seed(S)
    side = experts_matrix(torch.randn(E, K, N, generator=gen))
    g = Graph()
    x = inp(g, (S, K))
    if fmt in WEIGHT_FORMATS:
        w = const(g, side.to(getattr(torch, WEIGHT_FORMATS[fmt])))
        scales = g.add("scalar", value=0.0, kind="float")
    else:
        q, s = quantize(side, fmt)
        w, scales = const(g, q), const(g, s)
    g.outputs = [g.add("expert_mm", (x, w, scales, const(g, torch.tensor(ids))), weight=fmt,
                       n=N)]
    return g, [torch.randn(S, K, generator=gen)]


@pytest.mark.parametrize("fmt", STORED_EXPERTS)
@pytest.mark.parametrize("ids", [
    [3, 1],                                  # decode: a row each, in place
    [0, 2, 2, 0, 2, 1, 2, 2, 0, 2, 2, 1],    # prefill: rows gathered per expert
], ids=["decode", "prefill"])
def test_stored_experts_match_eager(fmt, ids):
    """Stored experts times rows routed to them, against eager's bmm over the decoded experts
    (the oracle's own decoding of the formats); one expert unused."""
    g, xs = stored_experts_graph(fmt, ids)
    assert "eq_expert_mm_q" in c_runtime(g).source
    run_and_compare(g, xs, tol=1e-4)


def test_expert_mm_refuses_an_expert_out_of_range():
    from eqsat_llm.codegen.c.errors import KernelIndexError

    g, xs = _expert_mm_graph(3, 16, 64, 4, torch.tensor([0, 4, 1]))
    with pytest.raises(KernelIndexError):
        c_runtime(g).run(xs)


# -- transformers' forms ------------------------------------------------------------------------

def _mixtral(seq: int, implementation: str | None = None):
    from eqsat_llm.models.model_matrix import build

    model, inputs = build("mixtral", seq=seq)
    if implementation is not None:
        model.model.config._experts_implementation = implementation
    return model, inputs


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
@pytest.mark.parametrize("seq", [1, 9])
def test_experts_forms_become_expert_mm(implementation, seq):
    """transformers' grouped and batched experts, and its eager loop over the experts hit
    (captured through the same module's grouped_mm: moe_forms.experts_for_capture): no sort,
    histc or gathered weight left; the expert GEMMs generated in C; equal to eager (the loop
    itself, for "eager")."""
    model, inputs = _mixtral(seq, implementation)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled = optimize(model, inputs, measure_eager=False)
    assert compiled.report.torch_ops == {} and not compiled.report.fallback_ops
    ops = [n.op for n in compiled.graph.nodes]
    assert ops.count("expert_mm") == 4 and ops.count("topk_indices") == 2, ops
    # each expert GEMM packs the experts' weight as stored ([E, N, K], read transposed): a
    # view of the parameter, no transposed copy folded and held beside the packed panels
    g = compiled.graph
    for n in g.nodes:
        if n.op == "expert_mm":
            w = g.node(n.inputs[1])
            assert w.op == "permute" and g.node(w.inputs[0]).op == "param", w
    stored = {tuple(p.shape) for p in model.parameters() if p.dim() == 3}
    transposed = {(e, k, n) for e, n, k in stored}
    assert not any(tuple(t.shape) in transposed for t in g.constants.values())
    assert model.model.config._experts_implementation == implementation  # (switched back)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)


def test_a_form_not_recognised_runs_in_torch_and_says_so():
    """Experts whose gate reads across the sorted rows (a cumulative sum: not row by row, so
    the sort cannot be dropped) keep the captured sort and grouped GEMMs, named by the
    warning: never rewritten into a wrong answer."""
    model, inputs = _mixtral(5)
    for layer in model.model.model.layers:
        experts = layer.mlp.experts
        experts._apply_gate = lambda h, e=experts: type(e)._apply_gate(e, h) + \
            h[:, :h.shape[1] // 2].cumsum(0) * 1e-3
    with pytest.warns(FallbackWarning, match="sort"):
        compiled = optimize(model, inputs, measure_eager=False)
    assert "expert_mm" not in {n.op for n in compiled.graph.nodes}
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)


# -- generation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_moe_generation_is_transformers_and_all_c(family):
    """Greedy tokens equal transformers' generate; the decode and prefill programs run whole
    in C (routing, expert GEMMs and the cache writes)."""
    from .test_generation import CHUNK, MAX_LEN, causal_lm, prompt, quiet_generator, reference

    model = causal_lm(family)
    gen = quiet_generator(model, MAX_LEN, batch_size=2, prefill_chunk=CHUNK)
    ids = prompt(2, 11)
    assert torch.equal(gen.generate(ids, 8), reference(model, ids, 8))
    for program in (gen.decode_program, gen.prefill_program):
        assert program.report.torch_ops == {}, program.report.torch_ops
        assert "expert_mm" in {n.op for n in program.graph.nodes}


def test_generation_with_the_eager_experts_loop():
    """transformers' eager experts (a loop over the experts hit) generate too: captured
    through the module's grouped_mm, planned on the meta twin, transformers' tokens (its
    loop run by eager), and the model left as it was."""
    from .test_generation import causal_lm, prompt, quiet_generator, reference

    model = causal_lm("mixtral")
    model.config._experts_implementation = "eager"
    gen = quiet_generator(model, 32)
    ids = prompt(1, 9)
    assert gen.report.weights_from == "model" and gen.report.decode.torch_ops == {}
    assert model.config._experts_implementation == "eager"
    assert torch.equal(gen.generate(ids, 6), reference(model, ids, 6))


@pytest.mark.parametrize("family", [pytest.param("mixtral", marks=pytest.mark.slow), "phimoe",
                                    "deepseek_v3"])  # (mixtral: 18-26 s, in the slow set)
def test_a_checkpoint_with_one_tensor_per_expert_loads(tmp_path, family):
    """transformers writes the experts one tensor per expert (and Mixtral's and PhiMoE's
    modules under their old names) and converts them as it loads; from_pretrained reads the
    same conversion (generation/converted_layout.py): transformers' greedy tokens, and at
    int8 the tokens of quantizing the loaded model."""
    from eqsat_llm import Generator

    from .test_generation import causal_lm, prompt, reference

    model = causal_lm(family)
    model.save_pretrained(tmp_path)
    ids = prompt(1, 9)
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32)
    assert gen.report.weights_from == "checkpoint" and not gen.report.decode.torch_ops
    assert torch.equal(gen.generate(ids, 5), reference(model, ids, 5))
    if family == "mixtral":
        stored = Generator.from_pretrained(tmp_path, max_seq_len=32, quantize="int8")
        loaded = Generator(model, max_seq_len=32, quantize="int8")
        assert torch.equal(stored.generate(ids, 5), loaded.generate(ids, 5))


def test_a_checkpoint_missing_an_expert_names_the_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    from eqsat_llm import EqsatError, Generator

    from .test_generation import causal_lm

    causal_lm("mixtral").save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(EqsatError, match="no tensor model.layers.1.mlp.experts.gate_up_proj"):
        Generator.from_pretrained(tmp_path, max_seq_len=32)


def test_one_expert_per_token_at_one_token_is_recognised():
    """top-1 routing at one token: a single pair, whose positions export writes as a 0-d
    view of arange(1)."""
    import transformers

    cfg = transformers.MixtralConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
        num_experts_per_tok=1, use_cache=False)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    ids = torch.tensor([[5]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled = optimize(model, (ids,), measure_eager=False)
    assert "expert_mm" in {n.op for n in compiled.graph.nodes}
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids)[0], model(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt,tol", [("int8", 0.06), ("int4", 0.5)])
@pytest.mark.parametrize("seq", [1, 9])
def test_quantizing_a_moe_stores_its_experts(fmt, tol, seq):
    """quantize= stores the experts too (rules/quantize.py: quantize-experts-*), run by the
    stored-experts kernel with no torch step; the router's tiny product (an mm, which no
    quantize rule rewrites) stays float, so rounding does not choose the experts."""
    model, inputs = _mixtral(seq)
    compiled = optimize(model, inputs, quantize=fmt, measure_eager=False)
    stored = "int4_g32" if fmt == "int4" else fmt
    experts = [n.attrs["weight"] for n in compiled.graph.nodes if n.op == "expert_mm"]
    assert experts == [stored] * 4 and compiled.report.torch_ops == {}
    assert "eq_expert_mm_q(" in compiled.source()
    q = compiled.report.quantization
    assert q.float_experts == 0 and q.quantized_weights >= 4
    routers = [n for n in compiled.graph.nodes if n.type.shape[-1:] == (4,) and
               n.op in ("gemm", "linear", "matmul", "mm")]
    assert routers and all(n.attrs.get("weight", "float") == "float" for n in routers)
    with torch.no_grad():
        want, got = model(*inputs), compiled(*inputs)
    assert (got - want).abs().max() <= tol * want.abs().max()


def test_a_half_models_experts_stay_half():
    """A bf16 Mixtral's experts are read as bf16 panels (rules/half_weights.py: exact), not
    widened to float32: the program equals eager at bf16's rounding, and its Generator,
    planned on the meta twin, gives transformers' greedy tokens."""
    from eqsat_llm import Generator

    from .test_generation import prompt, reference

    model, inputs = _mixtral(9)
    model = model.to(torch.bfloat16)
    compiled = optimize(model, inputs, measure_eager=False)
    assert [n.attrs["weight"] for n in compiled.graph.nodes if n.op == "expert_mm"] == \
        ["bf16"] * 4
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs).float(), model(*inputs).float(),
                                   atol=0.02, rtol=0.02)
    gen = Generator(model.model, max_seq_len=32)
    assert gen.report.weights_from == "model"
    ids = prompt(1, 7)
    assert torch.equal(gen.generate(ids, 4), reference(model.model, ids, 4))


def test_experts_that_do_not_fill_whole_groups_stay_float_and_say_so():
    """int4_g128 needs K in whole groups of 128: the gate/up experts (K 64) stay float32,
    counted by the report; the down experts (K 128) are stored."""
    model, inputs = _mixtral(3)
    compiled = optimize(model, inputs, quantize="int4_g128", measure_eager=False)
    experts = [n.attrs["weight"] for n in compiled.graph.nodes if n.op == "expert_mm"]
    assert sorted(experts) == ["float", "float", "int4_g128", "int4_g128"]
    q = compiled.report.quantization
    assert q.float_experts == 2 and "2 expert GEMMs kept float32" in q.summary()
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), atol=0.5, rtol=0.5)
