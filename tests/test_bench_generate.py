"""Smoke test of benchmarks/generate.py: one quick group (small LLaMA, batch 1, prompt 16, 8 new
tokens) with every system built, its tokens compared with eager's and timed once. Not a
measurement."""

import importlib.util

import pytest
import torch

from tests.conftest import load_benchmark

pytest.importorskip("transformers")

def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_agreement_names_the_first_divergence():
    bench = load_benchmark("generate")
    want = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]])
    assert bench.agreement(want.clone(), want, prompt=2) == (True, "yes")
    got = want.clone()
    got[1, 4] = 9  # the third new token of the second row
    assert bench.agreement(got, want, prompt=2) == (
        False, "first divergence at new token 2 of 3")


@pytest.mark.slow  # ~45 s: torch.compile, the ONNX export and eqsat-llm's compile
def test_quick_small_batch1(capsys):
    bench = load_benchmark("generate")
    groups = bench.main(["--quick", "--models", "small", "--batch", "1"])
    assert len(groups) == 1
    g = groups[0]
    ran = {"eager", "static", "eqsat"} | ({"ort"} if _has("onnxruntime") and _has("onnxscript")
                                          else set())
    assert set(g.systems) == ran
    for s in g.systems.values():  # timed, or its failure recorded in its row
        assert s.samples or s.error, s.name
    eq = g.systems["eqsat"]  # the code under change: it must build, run and agree
    assert eq.error is None and eq.match, eq.match_text
    assert g.systems["eager"].match
    if "ort" in g.systems and g.systems["ort"].error is None:
        assert g.systems["ort"].match, g.systems["ort"].match_text
    out = capsys.readouterr().out
    assert "Text generation (benchmarks/generate.py)" in out
    for s in g.systems.values():
        assert f"| small | {bench.LABEL[s.name]} | 1 | 16/8 |" in out
