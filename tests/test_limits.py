"""Saturation stops gracefully at its limits (rounds, e-graph size, time, memory), also before
a round that would overrun one, and the program it extracts is still right."""

from __future__ import annotations

import pytest
import torch

from eqsat_llm import Limits, optimize
from eqsat_llm.egraph.saturate import _limit_reached
from eqsat_llm.models.workloads import StackedLlamaBlocks

LIMITS = Limits(iterations=30, enodes=100_000, seconds=30.0, memory_mb=4096.0)


@pytest.mark.parametrize("now, growth, expected", [
    ((10_000, 1.0, 500.0), (1.0, 0.1, 1.0), None),
    ((100_000, 1.0, 500.0), (1.0, 0.1, 1.0), "enode_limit"),
    ((10_000, 31.0, 500.0), (1.0, 0.1, 1.0), "time_limit"),
    ((10_000, 1.0, 5000.0), (1.0, 0.1, 1.0), "memory_limit"),
    ((40_000, 1.0, 500.0), (4.0, 0.1, 1.0), "enode_limit (projected)"),  # 160k > 1.5 x 100k
    ((40_000, 1.0, 500.0), (3.0, 0.1, 1.0), None),  # 120k: within 1.5 x the limit
    ((10_000, 20.0, 500.0), (3.0, 10.0, 1.0), "time_limit (projected)"),  # 20 + 30 > 45
    ((10_000, 1.0, 2000.0), (3.0, 0.1, 1500.0), "memory_limit (projected)"),
])
def test_a_round_is_not_started_when_it_would_overrun_a_limit(now, growth, expected):
    size, seconds, memory = now
    factor, round_seconds, round_memory = growth
    assert _limit_reached(LIMITS, size, seconds, memory, factor, round_seconds,
                          round_memory) == expected


def test_the_memory_limit_stops_saturation_with_a_correct_program():
    torch.manual_seed(0)
    model = StackedLlamaBlocks(1, d_model=32, n_heads=2, ffn=64).eval()
    x = torch.randn(1, 4, 32)
    compiled = optimize(model, (x,), limits=Limits(memory_mb=1.0), measure_eager=False)
    assert compiled.report.stop_reason == "memory_limit" and compiled.report.iterations == 1
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), atol=1e-4)


def test_explosive_ac_rules_stop_at_the_size_limit_with_a_correct_program():
    torch.manual_seed(0)
    model = StackedLlamaBlocks(1, d_model=32, n_heads=2, ffn=64).eval()
    x = torch.randn(1, 4, 32)
    compiled = optimize(model, (x,), rules=["all", "algebra-ac"], extractor="dag",
                        limits=Limits(enodes=10_000), measure_eager=False)
    report = compiled.report
    assert report.stop_reason.startswith("enode_limit"), report.stop_reason
    sizes = report.egraph_size_per_iteration  # stopped at the first round over (or about
    assert sizes[-2] < 10_000, sizes            # to be over) the limit, not later
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), atol=1e-4)
