"""profile.py: a compiled program timed kernel by kernel as its backend runs it, against the
cost model's prediction (no timing is asserted: only the structure and its consistency)."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

from eqsat_llm import optimize
from eqsat_llm.api import FallbackWarning
from eqsat_llm.ir import VALUE_LEAVES
from eqsat_llm.models.workloads import LlamaBlock
from eqsat_llm.plan import ARENA, COPY_OUT, OUTPUT, TEMP
from eqsat_llm.profile import FLAG_RATIO, attach_profile, profile_program

COMPUTING = (ARENA, OUTPUT, TEMP, COPY_OUT)  # plan kinds of nodes some kernel must compute


@pytest.fixture(scope="module")
def block():
    model = LlamaBlock(d_model=64, n_heads=2, ffn=128, max_seq=16).eval()
    x = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(0))
    return optimize(model, (x,), measure_eager=False), (x,)


class WithTorchSteps(nn.Module):
    """flip has no C kernel: a torch step between two C segments."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return torch.softmax(self.lin(torch.flip(self.lin(x), dims=[0])), dim=-1)


def computing_nodes(compiled) -> set[int]:
    g, kinds = compiled.graph, compiled.plan.kinds
    return {n.id for n in g.nodes if n.id in g.live_ids() and n.op not in VALUE_LEAVES
            and kinds.get(n.id) in COMPUTING}


def check_profile(compiled, result, backend: str) -> None:
    assert result["backend"] == backend and result["repeats"] == 3
    kernels = result["kernels"]
    members = [nid for k in kernels for nid in k["node_ids"]]
    assert len(members) == len(set(members)), "a node in two kernels"
    assert computing_nodes(compiled) <= set(members)
    for k in kernels:
        assert k["measured_us"] > 0, k
        r = k["ratio"]
        if k["predicted_us"] > 0:
            assert r == pytest.approx(k["measured_us"] / k["predicted_us"])
            assert k["flagged"] == (not 1 / FLAG_RATIO <= r <= FLAG_RATIO)
        else:  # not priced (a view the backend copies): flagged when it took time
            assert r is None and k["flagged"]
        assert (k["reason"] is not None) == k["flagged"]
    ratios = [k["ratio"] for k in kernels if k["ratio"] is not None]
    assert result["median_ratio"] == pytest.approx(statistics.median(ratios))
    worst = max(max(r, 1 / r) for r in ratios)
    assert result["worst_ratio"] == pytest.approx(worst)
    named = next(k for k in kernels if k["name"] == result["worst_kernel"])
    assert max(named["ratio"], 1 / named["ratio"]) == pytest.approx(worst)
    assert result["flagged"] == sum(k["flagged"] for k in kernels)
    assert result["total_measured_us"] == pytest.approx(sum(k["measured_us"] for k in kernels))
    assert result["total_predicted_us"] == pytest.approx(
        sum(k["predicted_us"] for k in kernels))


def test_c_program_kernels_cover_the_program_and_report_their_error(block):
    compiled, inputs = block
    result = profile_program(compiled, inputs, repeats=3)
    check_profile(compiled, result, "c")
    c_names = {k.name for k in compiled._runtime.program.kernels}
    assert {k["name"] for k in result["kernels"]} == c_names  # no torch step here
    fused = [k for k in result["kernels"] if len(k["node_ids"]) > 1]
    assert fused and all("+" in k["ops"] for k in fused)  # e.g. the ropes in the Q/K GEMM
    attach_profile(compiled.report, result)
    assert compiled.report.profile is result
    by_name = {k["name"]: k for k in result["kernels"]}
    for entry in compiled.report.kernels:
        if entry["id"] in computing_nodes(compiled):
            assert entry["measured_us"] == by_name[entry["group"]]["measured_us"]
            assert entry["id"] in by_name[entry["group"]]["node_ids"]


def test_torch_steps_of_the_c_backend_are_kernels_of_their_own():
    torch.manual_seed(0)
    x = torch.randn(6, 16)
    with pytest.warns(FallbackWarning, match="flip"):
        compiled = optimize(WithTorchSteps().eval(), (x,), measure_eager=False)
    result = profile_program(compiled, (x,), repeats=3)
    check_profile(compiled, result, "c")
    steps = [k for k in result["kernels"] if k["name"].startswith("torch:")]
    assert [k["ops"] for k in steps] == ["aten.flip.default"]
    assert steps[0]["name"] == f"torch:aten.flip.default#{steps[0]['node_ids'][0]}"
    assert not steps[0]["flagged"] or steps[0]["reason"].startswith("runs in torch")


def test_reference_backend_one_kernel_per_node(block):
    compiled, inputs = block
    ref = compiled.on_backend("reference")
    result = profile_program(ref, inputs, repeats=3)
    check_profile(ref, result, "reference")
    assert all(len(k["node_ids"]) == 1 for k in result["kernels"])


def test_triton_interpreter_is_not_timed(block):
    compiled, inputs = block
    result = profile_program(compiled.on_backend("triton"), inputs, repeats=3)
    assert result["backend"] == "triton" and "interpreter" in result["reason"]
    assert result["kernels"] and all(k["measured_us"] is None and not k["flagged"]
                                     for k in result["kernels"])
    assert result["total_measured_us"] is None and result["median_ratio"] is None
