"""The eqsat-llm command."""

import json
import re
from pathlib import Path

import pytest

from eqsat_llm.cli import main

GYM = Path(__file__).resolve().parents[2] / "shared" / "extraction-gym"


def test_rules_list(capsys):
    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    assert "view-view" in out and "layout" in out and "reassociates" in out


@pytest.mark.skipif(not GYM.exists(), reason="../shared/extraction-gym is not beside the checkout")
def test_extract_prints_one_json_object(capsys):
    path = GYM / "egg" / "math_simplify_factor.json"
    if not path.exists():
        path = next(GYM.rglob("*.json"))
    assert main(["extract", str(path), "--method", "dag", "--choices"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"] == "dag-greedy" and result["cost"] > 0 and result["choices"]


def test_extract_names_a_malformed_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": {"a": {"op": "x", "children": ["missing"], "eclass": "c"}}}')
    assert main(["extract", str(bad)]) == 2
    assert "missing" in capsys.readouterr().err


def test_demo_checks_against_eager(capsys):
    assert main(["demo", "--shape", "decode", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "max |eqsat - eager|" in out and "x eager" in out and "rules fired" in out


def test_generate_prints_tokens_per_second_beside_eager(capsys, tmp_path):
    saved = tmp_path / "gen.json"
    assert main(["generate", "gpt2", "--prompt-len", "6", "--new-tokens", "4", "--chunk", "4",
                 "--repeat", "1", "--eager", "--report", "--json", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "decode program (1 token)" in out and "KV cache" in out
    assert re.search(r"eqsat-llm: prompt 6 x 1 in [\d.]+ ms, 4 new tokens, .* tokens/s", out)
    assert re.search(r"transformers eager generate: [\d.]+ tokens/s .*tokens match", out), out
    # both programs' reports, in the format optimize() gives: explained and diffed per program
    assert main(["explain", str(saved), "--op", "attention"]) == 0
    out = capsys.readouterr().out
    assert "## prefill program\n%" in out and "## decode program\n%" in out
    assert main(["report", "diff", str(saved), str(saved)]) == 0
    assert capsys.readouterr().out.count("kernels: the same") == 2


def test_generate_names_an_unknown_model():
    with pytest.raises(SystemExit, match="unknown model 'nope'"):
        main(["generate", "nope"])


def test_optimize_with_quantized_weights(capsys):
    assert main(["optimize", "llama_block_decode", "--quantize", "int8",
                 "--keep-float", "o_proj"]) == 0
    out = capsys.readouterr().out
    assert "weights quantized to int8: 3 GEMMs; kept float: o_proj" in out, out
    assert "gemm[rms_norm+int8]" in out and "gemm[add]" in out


def pruned_block():
    """The LLaMA-style block at decode, every Linear weight with half its 16 x 16 blocks zero
    (for --sparsity: a `module:function` model spec)."""
    from eqsat_llm.formats.pruning import prune_blocks, prune_linears
    from eqsat_llm.models.workloads import llama_block_case

    model, inputs = llama_block_case("decode")
    return prune_linears(model, prune_blocks), inputs


def test_optimize_with_sparsity(capsys):
    assert main(["optimize", "tests.test_cli:pruned_block", "--sparsity", "auto"]) == 0
    out = capsys.readouterr().out
    assert "GEMM weights stored as: 4 bsr16" in out and "gemm[rms_norm+bsr16]" in out, out


def test_optimize_runs_on_the_backend_asked_for(capsys):
    # (the Triton backend itself, interpreted, is tested in test_triton_backend.py)
    assert main(["optimize", "llama_block_decode", "--backend", "reference"]) == 0
    out = capsys.readouterr().out
    assert "backend reference" in out and "max |eqsat - eager| = " in out, out
