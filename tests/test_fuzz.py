"""The differential fuzzer: random valid models optimized and run on every backend against
eager (50 in the default run, 350 more in the slow set), the regressions it saved, and its
own parts (the state check, the shrinker's moves)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eqsat_llm.capture import converter
from eqsat_llm.fuzz import Spec, available_backends, check_spec, fuzz, load_regression
from eqsat_llm.fuzz.compare import mismatch
from eqsat_llm.fuzz.shrink import prune, shrink
from eqsat_llm.fuzz.spec import Tensor

REGRESSIONS = sorted((Path(__file__).parent / "fuzz_regressions").glob("*.json"))
# the C backend and the reference runtime on every model; Triton (its interpreter here, about
# a second a launch) on a share of them in the default run, on all of them with -m slow
CPU_BACKENDS = [b for b in available_backends() if b != "triton"]


@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(s, marks=pytest.mark.slow) for s in (2, 3))])
def test_random_models_match_eager_on_every_cpu_backend(seed):
    result = fuzz(25, seed, CPU_BACKENDS)  # (the slow set runs 250 more)
    assert result.models >= 25
    assert not result.found, result.summary()


@pytest.mark.slow
def test_many_random_models_match_eager_on_every_cpu_backend():
    result = fuzz(200, 10, CPU_BACKENDS)
    assert not result.found, result.summary()


@pytest.mark.skipif("triton" not in available_backends(), reason="no Triton")
@pytest.mark.parametrize("seed", [100])
def test_random_models_match_eager_on_triton(seed):
    result = fuzz(6, seed, ["triton"], max_steps=4)  # (the slow set runs 100 more)
    assert result.models >= 6
    assert not result.found, result.summary()


@pytest.mark.slow
@pytest.mark.skipif("triton" not in available_backends(), reason="no Triton")
def test_many_random_models_match_eager_on_triton():
    result = fuzz(100, 101, ["triton"])
    assert not result.found, result.summary()


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_saved_regression_now_matches_eager(path):
    failures = check_spec(load_regression(path), available_backends())
    assert not failures, "\n".join(str(f) for f in failures)


def test_a_planted_bug_is_found_shrunk_and_saved(monkeypatch, tmp_path):
    """The frontend made to read torch.neg as exp: the fuzzer must see the program disagree
    with eager, shrink the model to the one neg, and save it."""
    aten = torch.ops.aten
    monkeypatch.setitem(converter.ATEN, aten.neg.default, converter.ATEN[aten.exp.default])
    result = fuzz(5, 0, ["reference"], save_dir=tmp_path)
    assert result.found, "no model with neg among 5"
    first = result.found[0]
    assert any(op == "neg" for op, _, _ in first.spec.steps)
    shrunk = first.shrunk
    assert [op for op, _, _ in shrunk.steps] == ["neg"], shrunk.describe()
    saved = load_regression(first.saved)
    assert saved.steps == shrunk.steps
    assert check_spec(saved, ["reference"])  # still fails while the bug is planted


def test_mismatch_accepts_rounding_and_refuses_wrong_values_and_nans():
    exact = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    eager = exact.float()
    assert mismatch(eager + 1e-7, eager, exact) is None
    assert "differ" in mismatch(eager + torch.tensor([0, 0, 1e-2]), eager, exact)
    assert "differ" in mismatch(torch.tensor([1.0, float("nan"), 3.0]), eager, exact)
    nan = torch.tensor([float("nan"), float("inf"), 1.0])
    assert mismatch(nan.clone(), nan, nan.double()) is None
    assert "differ" in mismatch(torch.tensor([float("nan"), -float("inf"), 1.0]), nan,
                                nan.double())
    assert "expected" in mismatch(eager[:2], eager, exact)
    ints = torch.tensor([1, 2, 3])
    assert mismatch(ints.clone(), ints, ints) is None
    assert "differ" in mismatch(ints + torch.tensor([0, 0, 1]), ints, ints)


def test_shrink_keeps_a_failing_step_and_drops_the_rest():
    spec = Spec(inputs=[Tensor([2, 3], seed=0), Tensor([3], seed=1)],
                params=[Tensor([3, 4], seed=2)],
                steps=[("exp", ["i0"], {}), ("add", ["v0", "i1"], {}),
                       ("matmul", ["v1", "p0"], {}), ("tanh", ["v2"], {})],
                outputs=["v3", "v0"])
    shrunk = shrink(spec, lambda s: any(op == "exp" for op, _, _ in s.steps))
    assert [op for op, _, _ in shrunk.steps] == ["exp"]
    assert shrunk.outputs == ["v0"] and len(shrunk.inputs) == 1 and not shrunk.params


def test_prune_renumbers_what_the_outputs_read():
    spec = Spec(inputs=[Tensor([2], seed=0), Tensor([2], seed=1)],
                steps=[("neg", ["i0"], {}), ("exp", ["i1"], {})], outputs=["v1"])
    pruned = prune(spec)
    assert pruned.steps == [("exp", ["i0"], {})] and pruned.inputs[0].seed == 1
    assert Spec.from_json(pruned.to_json()) == pruned


def test_fuzz_command_runs_and_reports(capsys):
    from eqsat_llm.cli import main

    assert main(["fuzz", "--count", "3", "--seed", "5", "--backend", "reference",
                 "--save", ""]) == 0
    out = capsys.readouterr().out
    assert "3 models" in out and "0 failing" in out


def _kv_write_spec() -> Spec:
    """A KV-cache write as the fuzzer draws it: k projected, index_copy_ into a buffer at
    run-time positions, the cache read after."""
    return Spec(inputs=[Tensor([1, 2, 8], seed=0), Tensor([1], "int64", high=5, seed=1)],
                params=[Tensor([8, 8], seed=2)], buffers=[Tensor([1, 6, 8], seed=500)],
                steps=[("linear", ["i0", "p0"], {}), ("positions", ["i1"], {"n": 2}),
                       ("index_copy_", ["b0", "v1", "v0"], {"dim": 1}),
                       ("mul_scalar", ["v2"], {"c": 2.0})],
                outputs=["v3"])


def test_state_writes_are_checked_after_the_call(monkeypatch):
    """The buffers a model writes are compared with eager's after each of two calls: a program
    that drops its write-back (planted) is caught, though its outputs are right."""
    from eqsat_llm import api

    spec = _kv_write_spec()
    assert Spec.from_json(spec.to_json()) == spec
    assert not check_spec(spec, ["reference"])
    monkeypatch.setattr(api, "write_state_in_place", lambda graph, captured: [])
    monkeypatch.setattr(api.Compiled, "_write_back",
                        lambda self, outs, flat: outs[len(self._writes):])
    failures = check_spec(spec, ["reference"])
    assert [f.message.split(":")[0] for f in failures] == [
        "buffer b0 after the call", "call 2, buffer b0 after the call"], failures


def test_shrink_takes_layers_off_a_stack():
    kw = {"kind": "mlp", "count": 4, "d": 8, "f": 8, "heads": 1, "kv": 1, "dh": 4,
          "norm": "rms", "causal": False, "seed": 0}
    spec = Spec(inputs=[Tensor([1, 3, 8], seed=0)],
                steps=[("exp", ["i0"], {}), ("layers", ["v0"], kw), ("tanh", ["v1"], {})],
                outputs=["v2"])
    assert Spec.from_json(spec.to_json()) == spec
    shrunk = shrink(spec, lambda s: any(op == "layers" for op, _, _ in s.steps))
    assert [(op, kw.get("count")) for op, _, kw in shrunk.steps] == [("layers", 1)]
