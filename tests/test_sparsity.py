"""optimize(sparsity="auto"): the formats' reference semantics, the structure the encoder reads
off weights and the analysis carries through transposes and concatenations, the sparse GEMMs
on the LLaMA-style block in the C backend against eager (decode and prefill), a dense model and
a wrongly pruned one staying dense, and clear errors."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.codegen.c.build import compiler
from eqsat_llm.errors import EqsatError, GraphError
from eqsat_llm.formats.pruning import prune_2_4, prune_blocks, prune_linears
from eqsat_llm.formats.sparse_formats import FORMATS as SPARSE_FORMATS
from eqsat_llm.formats.sparse_formats import pack, structure, unpack
from eqsat_llm.models.workloads import llama_block_case
from eqsat_llm.rulebook import resolve

from .conftest import max_error

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def sparse_gemms(compiled) -> dict[str, int]:
    return {f: n for f, n in compiled.report.weight_formats.items() if f in SPARSE_FORMATS}


@pytest.mark.parametrize("fmt", ["sparse24", "bsr16"])
def test_format_round_trip(fmt):
    w = prune_blocks(prune_2_4(torch.randn(64, 48), 0))
    w[4:8, 5] = torch.tensor([0.0, 0.0, 0.0, 2.0])  # one non-zero in a group: padded
    values, index = pack(w, fmt)
    assert torch.equal(unpack(values, index, fmt, 64, 48), w)
    if fmt == "sparse24":
        assert values.shape == (32, 48) and index.shape == (16, 48)
        assert int(index[1, 5]) == 0 | 3 << 2  # kept positions 0 (padding) and 3
    else:
        blocks = structure(w).blocks
        assert values.shape == (blocks, 16, 16) and index.shape == (3 + 1 + blocks,)


def test_structure_reads_each_dim_and_the_blocks():
    w = prune_2_4(torch.randn(32, 64), 1)
    found = structure(w)
    assert found.two_four == (False, True) and found.blocks == found.total_blocks == 8
    found = structure(prune_blocks(torch.randn(32, 64), 0.5))
    assert found.two_four == (False, False) and 0 < found.blocks < 8
    assert structure(torch.randn(3, 4, 4)) is None


def test_pack_refuses_a_weight_without_the_structure():
    with pytest.raises(GraphError, match="not 2:4"):
        pack(torch.randn(8, 4), "sparse24")
    with pytest.raises(GraphError, match="K % 16"):
        pack(torch.randn(24, 16), "bsr16")


def test_sparsity_family_is_opt_in():
    assert not any(r.family == "sparsity" for r in resolve(None))
    assert {r.name for r in resolve(["sparsity"])} == {
        "sparse24-matmul", "sparse24-gemm", "bsr16-matmul", "bsr16-gemm"}


# (each sparsity rule passes `rules check`, on weights pruned along a drawn dim:
# tests/test_rulecheck.py's test_library_rule_passes covers every library rule)


@needs_cc
@pytest.mark.parametrize("case", ["decode", "prefill"])
def test_llama_block_2_4_pruned_runs_sparse_gemms_in_c(case):
    # nn.Linear's weight is [out, in]: 2:4 along its dim 1 is 2:4 along K of x @ W^T, which
    # the analysis finds through the transpose and the QKV and gate/up concatenations
    model, inputs = llama_block_case(case)
    prune_linears(model, lambda w: prune_2_4(w, 1))
    compiled = optimize(model, inputs, sparsity="auto", measure_eager=False)
    assert not compiled.report.torch_ops, compiled.report.torch_ops
    if case == "decode":  # the GEMV reads 0.56x the bytes: all four GEMMs go sparse
        assert sparse_gemms(compiled) == {"sparse24": 4}
        assert "eq_gemm_sparse(" in compiled._runtime.source
    else:  # at 128 rows the dense tiles are faster: the cost model keeps them
        assert sparse_gemms(compiled) == {}
    with torch.no_grad():
        assert max_error(model(*inputs), compiled(*inputs)) < 1e-4


@needs_cc
@pytest.mark.parametrize("case", ["decode", "prefill"])
def test_llama_block_with_zero_blocks_runs_block_sparse_gemms_in_c(case):
    model, inputs = llama_block_case(case)
    prune_linears(model, prune_blocks)
    compiled = optimize(model, inputs, sparsity="auto", measure_eager=False)
    assert not compiled.report.torch_ops, compiled.report.torch_ops
    assert sparse_gemms(compiled) == {"bsr16": 4}
    assert "eq_gemm_sparse(" in compiled._runtime.source
    with torch.no_grad():
        assert max_error(model(*inputs), compiled(*inputs)) < 1e-4


@needs_cc
def test_a_dense_model_stays_dense():
    model, inputs = llama_block_case("decode")
    compiled = optimize(model, inputs, sparsity="auto", measure_eager=False)
    assert sparse_gemms(compiled) == {} and "eq_gemm_sparse(" not in compiled._runtime.source


@needs_cc
def test_2_4_along_the_wrong_dim_is_not_taken_for_2_4_along_k():
    # pruned along the output dim: groups of K hold up to 4 non-zeros, not sparse24
    model, inputs = llama_block_case("decode")
    prune_linears(model, lambda w: prune_2_4(w, 0))
    compiled = optimize(model, inputs, sparsity="auto", measure_eager=False)
    assert sparse_gemms(compiled) == {}
    with torch.no_grad():
        assert max_error(model(*inputs), compiled(*inputs)) < 1e-4


def test_unknown_sparsity_mode_is_refused():
    model, inputs = llama_block_case("decode")
    with pytest.raises(EqsatError, match="sparsity must be None or 'auto'"):
        optimize(model, inputs, sparsity="2:4", measure_eager=False)
