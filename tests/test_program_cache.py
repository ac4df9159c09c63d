"""The on-disk program cache (generation/program_cache.py): a second start of a meta-device model
takes its optimized program from disk, generates the same tokens, and misses when anything the
program depends on changes; a damaged entry is rebuilt with a warning, never loaded."""

import warnings

import pytest
import torch

from eqsat_llm.cache import CacheWarning
from eqsat_llm.generation.generator import Generator

transformers = pytest.importorskip("transformers")
from tests.conftest import private_cache_home
from tests.test_checkpoint import PROMPT, _save


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    private_cache_home(monkeypatch, tmp_path / "xdg")
    monkeypatch.delenv("EQSAT_PROGRAM_CACHE", raising=False)
    return tmp_path / "xdg" / "eqsat-llm" / "programs"


def _start(path, **options):
    gen = Generator.from_pretrained(path, max_seq_len=32, **options)
    return gen, gen.generate(PROMPT, max_new_tokens=5)


def test_a_second_start_takes_the_program_from_disk(tmp_path, cache_home):
    _save(tmp_path / "ck")
    first, tokens = _start(tmp_path / "ck", quantize="int8")
    assert first.decode_program.report.program_cache == "miss"
    assert len(list(cache_home.glob("*.pkl"))) == 2  # the decode step and the prefill chunk
    second, again = _start(tmp_path / "ck", quantize="int8")
    assert second.decode_program.report.program_cache == "hit"
    assert second.prefill_program.report.program_cache == "hit"
    assert "capture" not in second.decode_program.report.timings  # nothing re-optimized
    # the report as complete as the first's (the weight formats, the quantization summary)
    for a, b in ((first.decode_program, second.decode_program),
                 (first.prefill_program, second.prefill_program)):
        assert b.report.weight_formats == a.report.weight_formats != {}
        assert b.report.quantization.quantized_weights == a.report.quantization.quantized_weights
    assert torch.equal(again, tokens)
    # another format, another cache length: other programs
    other, _ = _start(tmp_path / "ck", quantize="int4_g32")
    assert other.decode_program.report.program_cache == "miss"
    longer = Generator.from_pretrained(tmp_path / "ck", max_seq_len=64, quantize="int8")
    assert longer.decode_program.report.program_cache == "miss"


def test_another_instruction_set_misses(tmp_path, cache_home, monkeypatch):
    # the optimized program depends on the ISA the C is built for (the cost model prices the
    # kernels' fast paths): a cache read under another EQSAT_ISA, or carried to another CPU,
    # is not reused (the start record neither)
    _save(tmp_path / "ck")
    _, tokens = _start(tmp_path / "ck", quantize="int8")
    monkeypatch.setenv("EQSAT_ISA", "portable")
    other, again = _start(tmp_path / "ck", quantize="int8")
    assert other.decode_program.report.program_cache == "miss"
    assert other.prefill_program.report.program_cache == "miss"
    assert len(list(cache_home.glob("*.pkl"))) == 4
    assert torch.equal(again, tokens)


def test_a_changed_config_misses(tmp_path, cache_home):
    _save(tmp_path / "a")
    _start(tmp_path / "a")
    model = _save(tmp_path / "b")  # the same shapes, another rms_norm eps
    model.config.rms_norm_eps = 1e-3
    model.config.save_pretrained(tmp_path / "b")
    gen, _ = _start(tmp_path / "b")
    assert gen.decode_program.report.program_cache == "miss"


def test_a_damaged_entry_is_rebuilt_not_loaded(tmp_path, cache_home):
    _save(tmp_path / "ck")
    _, tokens = _start(tmp_path / "ck")
    for entry in cache_home.glob("*.pkl"):
        entry.write_bytes(entry.read_bytes()[:-100])
    with pytest.warns(CacheWarning, match="does not match its digest"):
        gen, again = _start(tmp_path / "ck")
    assert gen.decode_program.report.program_cache == "miss"
    assert torch.equal(again, tokens)


def test_a_loaded_model_is_cached_as_its_meta_twin_but_folded_weights_never(tmp_path,
                                                                          cache_home):
    from eqsat_llm import optimize

    model = _save(tmp_path / "ck")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = Generator(model, 32)  # planned on its meta twin: no weight value in the program
        again = Generator(model, 32)
        # optimize() on a loaded model folds weight values into its program: not stored
        compiled = optimize(torch.nn.Linear(64, 64), (torch.randn(2, 64),),
                            measure_eager=False)
    assert gen.report.weights_from == "model"
    assert gen.decode_program.report.program_cache == "miss"
    assert again.decode_program.report.program_cache == "hit"
    assert torch.equal(again.generate(PROMPT, max_new_tokens=5),
                       gen.generate(PROMPT, max_new_tokens=5))
    assert compiled.report.program_cache == "off"
    assert len(list(cache_home.glob("*.pkl"))) == 2  # the Generator's two programs only


_WARM = """
import sys, torch
from eqsat_llm.generation.generator import Generator
gen = Generator.from_pretrained(sys.argv[1], max_seq_len=32, quantize="int8")
prompt = torch.tensor({prompt})
tokens = gen.generate(prompt, max_new_tokens=5)
print(tokens.tolist(), "transformers" in sys.modules, gen.model is None,
      gen.report.decode_optimized, gen.report.prefill_optimized, gen.report.weights_from)
"""


def test_a_second_start_in_a_new_process_builds_no_model(tmp_path, cache_home):
    import os
    import subprocess
    import sys

    _save(tmp_path / "ck")
    _, tokens = _start(tmp_path / "ck", quantize="int8")
    assert len(list((cache_home.parent / "starts").glob("*.pkl"))) == 1  # the start record
    out = subprocess.run(
        [sys.executable, "-c", _WARM.format(prompt=PROMPT.tolist()), str(tmp_path / "ck")],
        capture_output=True, text=True, env=dict(os.environ), timeout=600, check=True)
    assert out.stdout.startswith(str(tokens.tolist())), (out.stdout, tokens.tolist())
    # transformers never imported, the model never built, both programs from the cache, the
    # weights read from the shards, the generation defaults (eos) and rotary tables from
    # the record: the same tokens as the first start
    assert out.stdout.split("]] ")[1].split() == [
        "False", "True", "by", "an", "earlier", "start", "by", "an", "earlier", "start",
        "checkpoint"], out.stdout


def test_a_start_record_whose_programs_are_gone_starts_cold(tmp_path, cache_home):
    _save(tmp_path / "ck")
    _, tokens = _start(tmp_path / "ck")
    for entry in cache_home.glob("*.pkl"):
        entry.unlink()
    gen, again = _start(tmp_path / "ck")
    assert gen.model is not None and gen.decode_program.report.program_cache == "miss"
    assert torch.equal(again, tokens)


def test_a_damaged_start_record_is_rebuilt_not_loaded(tmp_path, cache_home):
    _save(tmp_path / "ck")
    _, tokens = _start(tmp_path / "ck")
    (record,) = (cache_home.parent / "starts").glob("*.pkl")
    record.write_bytes(record.read_bytes()[:-50])
    with pytest.warns(CacheWarning, match="start record .* does not match its digest"):
        gen, again = _start(tmp_path / "ck")
    assert gen.model is not None  # built again, and the record with it
    assert torch.equal(again, tokens)
    warm, _ = _start(tmp_path / "ck")
    assert warm.model is None and warm.report.decode_optimized == "by an earlier start"
