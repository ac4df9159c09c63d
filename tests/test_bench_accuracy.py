"""Smoke test of benchmarks/accuracy.py in --quick mode: a small byte-level LLaMA trained a few
steps on the stdlib's source (cached in a tmp dir), every system compiled and compared with
eager fp32, trained and untrained. Not a measurement (30-50 s: 12 compiles; the slow set)."""

import pytest

from tests.conftest import load_benchmark

pytest.importorskip("transformers")


@pytest.mark.slow
def test_quick_accuracy_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EQSAT_LLM_ACCURACY_CACHE", str(tmp_path / "env-cache"))
    bench = load_benchmark("accuracy")
    cache = tmp_path / "cache"
    rows = bench.main(["--quick", "--cache-dir", str(cache)])
    assert [p.suffix for p in cache.iterdir()] == [".pt"]  # the trained weights, cached here
    assert not (tmp_path / "env-cache").exists()  # --cache-dir wins over the environment
    by = {(r.model, r.system): r for r in rows}
    systems = [label for label, _, _ in bench.SYSTEMS]
    assert set(by) == {(m, s) for m in ("trained", "untrained") for s in systems}
    for model in ("trained", "untrained"):
        fp32 = by[(model, "eqsat fp32")]
        assert fp32.top1_agreement == 1.0 and fp32.max_rel < 1e-4, fp32
        assert fp32.quantized_gemms == 0 and fp32.gemms > 0
        int8, int4 = by[(model, "eqsat int8")], by[(model, "eqsat int4 (g32)")]
        assert int8.max_rel < int4.max_rel and int8.mean_rel < int4.mean_rel
        for label in systems[2:]:
            r = by[(model, label)]
            assert r.quantized_gemms > 0 and 0.0 < r.max_rel < 1.0, r
        kept = by[(model, "eqsat int8, lm_head float")]  # the LM head stays float
        assert kept.quantized_gemms == int8.quantized_gemms - 1
    # a few steps already move the held-out loss well below a uniform guess (log 256)
    assert by[("trained", "eager fp32")].loss < by[("untrained", "eager fp32")].loss - 0.5
    assert "| trained | eqsat int8 |" in capsys.readouterr().out
