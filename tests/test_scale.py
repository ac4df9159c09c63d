"""A model on the meta device (LLaMA-7B's shapes, no weights) goes through every phase up to the
memory plan without materialising a weight; calling it raises a clear error
(eqsat_llm/weights/meta.py). Times are benchmarks/scale.py's to measure: no test asserts one."""

import os
from unittest import mock

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.errors import EqsatError
from eqsat_llm.fold import fold_constants
from eqsat_llm.formats.half import exact_half_dtypes
from eqsat_llm.ir import Graph
from eqsat_llm.models.workloads import LLAMA_7B, stacked_llama_blocks
from eqsat_llm.plan import check_plan

from .conftest import const, inp, load_benchmark

PHASES = ("capture", "encode", "saturate", "serialize", "extract", "decode", "fold", "plan")
SEQ = 16


def _meta_case(depth: int):
    model = stacked_llama_blocks(depth, **LLAMA_7B, device="meta")
    return model, torch.empty(1, SEQ, LLAMA_7B["d_model"], device="meta")


@pytest.fixture(scope="module")
def meta_7b():
    model, x = _meta_case(2)
    # every phase runs: not a program another test left in the cache (generation/program_cache.py)
    with mock.patch.dict(os.environ, {"EQSAT_PROGRAM_CACHE": "0"}):
        return model, x, optimize(model, (x,))


def test_every_phase_to_the_plan_runs(meta_7b):
    _, _, compiled = meta_7b
    report = compiled.report
    assert all(report.timings.get(p, 0) > 0 for p in PHASES), report.timings
    assert "codegen" not in report.timings  # nothing generated from meta weights
    assert report.backend == "none" and report.meta_weights > 0
    # the real model's fusions happened: one attention per layer, GEMMs with fused operands
    assert report.op_counts_after["attention"] == 2
    assert any(op.startswith("gemm[") for op in report.op_counts_after)
    check_plan(compiled.graph, compiled.plan)
    # the arena holds the layers' activations at the real shapes (a [1, 16, 11008] float32
    # SwiGLU intermediate alone is 688 KiB)
    assert compiled.plan.arena_bytes >= SEQ * LLAMA_7B["ffn"] * 4
    assert "weights on the meta device" in report.summary()


def test_no_weight_is_materialised(meta_7b):
    model, _, compiled = meta_7b
    assert all(p.is_meta for p in model.parameters())
    weights = [t for t in compiled.graph.constants.values() if t.numel() >= 4096 ** 2]
    assert weights and all(t.is_meta for t in weights)  # merged QKV, gate/up: meta too
    # what is real is computed from shapes alone (the causal mask): small
    real = [t for t in compiled.graph.constants.values() if not t.is_meta]
    assert sum(t.numel() * t.element_size() for t in real) < 2**20


def test_calling_raises_a_clear_error(meta_7b):
    _, x, compiled = meta_7b
    with pytest.raises(EqsatError, match="meta device"):
        compiled(torch.zeros(x.shape))
    with pytest.raises(EqsatError, match="meta device"):
        compiled.source()


def test_quantize_plans_integer_weights_on_meta():
    model, x = _meta_case(1)
    compiled = optimize(model, (x,), quantize="int8")
    assert compiled.report.weight_formats == {"int8": 4}
    assert compiled.report.quantization.outputs == []  # nothing to run: not measured
    int8 = [t for t in compiled.graph.constants.values() if t.dtype == torch.int8]
    assert int8 and all(t.is_meta for t in int8)


def test_sparsity_refuses_meta_weights():
    model, x = _meta_case(1)
    with pytest.raises(EqsatError, match="meta device"):
        optimize(model, (x,), sparsity="auto")


def test_fold_makes_meta_values_without_evaluating():
    g = Graph()
    a = const(g, torch.empty(8, 4, device="meta"))
    b = const(g, torch.ones(8, 4))
    x = inp(g, (8, 4))
    g.outputs = [g.add("add", (x, g.add("add", (a, b))))]
    folded = fold_constants(g)
    assert folded.count == 1
    value = next(t for k, t in folded.graph.constants.items() if k.startswith("folded"))
    assert value.is_meta and value.shape == (8, 4) and value.dtype == torch.float32


def test_half_exactness_is_not_read_off_meta_values():
    assert exact_half_dtypes(torch.empty(4, 4, device="meta")) == []
    assert exact_half_dtypes(torch.empty(4, 4, device="meta", dtype=torch.bfloat16)) == \
        ["bfloat16"]


def test_benchmark_rows_and_table():
    scale = load_benchmark("scale")
    row = scale.measure(1, SEQ)  # in this process (the script runs each depth in a fresh one)
    assert row["depth"] == 1 and row["arena_mib"] > 0 and row["peak_rss_mib"] > 0
    assert row["stamped"] == 0  # one layer: nothing to stamp
    row["full_trace"] = 1.0  # (measured by measure_full_trace, in a process of its own)
    assert all(row[p] > 0 for p in scale.PHASES)
    assert scale.table([row]).count("\n") == 2  # head, separator, one row


def test_generator_refuses_meta_weights():
    from eqsat_llm import Generator

    model = stacked_llama_blocks(1, d_model=64, n_heads=2, ffn=128, device="meta")
    with pytest.raises(EqsatError, match="meta device"):
        Generator(model, max_seq_len=8)
