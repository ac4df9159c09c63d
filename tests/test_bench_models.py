"""Smoke test of benchmarks/models.py: one quick row (LLaMA, small, one token) with its three
systems built, checked against eager and timed once. Not a measurement."""

import pytest

from tests.conftest import load_benchmark

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("transformers")



def test_quick_llama_decode_row(capsys):
    bench = load_benchmark("models")
    rows = bench.main(["--quick", "--families", "llama", "--shapes", "decode",
                       "--no-tinyllama"])
    assert len(rows) == 1
    row = rows[0]
    assert row.error is None and row.shape == "1x1"
    assert set(row.systems) == {"eager", "eqsat", "ort"}
    for s in row.systems.values():  # each system timed, or its failure recorded
        assert s.ms is not None or s.error or s.wrong, s.name
    assert row.systems["eager"].ms > 0 and row.systems["ort"].ms > 0
    assert row.systems["ort"].err < 1e-3
    eq = row.systems["eqsat"]  # the optimizer is the code under change: its failure is a row
    if eq.error is None:
        assert eq.info["backend"] in ("c", "reference") and eq.err < 1e-3
    assert row.work.weight_bytes > 0 and row.work.flops > 0
    out = capsys.readouterr().out
    assert "| llama | 1x1 |" in out and "Models as users load them" in out
