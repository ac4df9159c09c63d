"""The tile autotuner (codegen/triton/autotune.py) on the GEMM kernel, with EQSAT_TUNE=1 (so
also in Triton's interpreter), two tilings of the test's and a clock the test sets: the
fastest tiling whose result is right is kept and cached per device, a wrong or failing one is
dropped, outputs that share an input's memory are computed once, and the budget and the
switch are obeyed; the same for the flash-attention and row kernels; and the compiled
kernels' candidate tilings."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from eqsat_llm.codegen.triton import attention, autotune, gemm, rows
from eqsat_llm.codegen.triton.gemm import plan_gemm
from eqsat_llm.codegen.triton.rows import plan_rows
from eqsat_llm.ops import GEMM_DEFAULTS

from .eager_oracle import OPS as EAGER
from .test_triton_attention import causal_mask, qkv
from .test_triton_attention import plan as plan_attention
from .test_triton_gemm import _plan
from .triton_device import run_launches

ATTRS = {**GEMM_DEFAULTS, "n": 48, "prologue": "rms_norm", "eps": 1e-6, "alpha": 0.75,
         "epilogue": "add"}


@pytest.fixture
def tuning(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> autotune._State:
    monkeypatch.setenv("EQSAT_TUNE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    state = autotune._State()
    monkeypatch.setattr(autotune, "STATE", state)
    # the fixed tiling and half of it, compiled or interpreted
    monkeypatch.setattr(gemm, "gemm_choices", lambda m, n, k: [
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64},
        {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}])
    return state


def _clock(fast: int, seen: list[dict[str, Any]], key: str = "BLOCK_M") -> autotune.Timer:
    """A clock on which tilings with tiling[key] == fast take half the time."""
    def timer(run: Any, tiling: dict[str, Any]) -> float:
        run()
        seen.append(tiling)
        return 0.5 if tiling[key] == fast else 1.0
    return timer


def _inputs(seed: int = 0) -> list[Any]:
    torch.manual_seed(seed)
    return [torch.randn(33, 64), torch.randn(64, 48) / 8, 0.0, torch.randn(64),
            torch.randn(33, 48)]


def _gemm(ins: list[Any], out: torch.Tensor, extra: list[Any] | None = None) -> list[Any]:
    """The launches of ATTRS' gemm over ins into out, run once; extra tilings appended."""
    launches = _plan(plan_gemm, "gemm", ATTRS, ins, out)
    launches[0].choices += extra or []
    run_launches(launches, [*ins, out])
    return launches


def test_the_fastest_right_tiling_is_kept_and_cached(tuning: autotune._State) -> None:
    seen: list[dict[str, Any]] = []
    tuning.timer = _clock(32, seen)
    ins = _inputs()
    want = EAGER["gemm"](ins, ATTRS)
    out = torch.full_like(want, float("nan"))
    (launch,) = _gemm(ins, out)
    assert [t["BLOCK_M"] for t in seen] == [64, 32]  # the fixed tiling, then half of it
    assert launch.constexprs["BLOCK_M"] == 32 and launch.grid == (2 * 2, 1)
    assert not launch.choices
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    (table,) = [json.loads(p.read_text()) for p in
                autotune.cache_dir("triton-tuning").glob("interpreter-*.json")]
    assert list(table.values()) == [{"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}]
    # another process: the file's choice, nothing timed
    fresh = autotune._State()
    fresh.timer = _clock(64, seen := [])
    autotune.STATE = fresh
    out2 = torch.full_like(want, float("nan"))
    (again,) = _gemm(ins, out2)
    assert seen == [] and again.constexprs["BLOCK_M"] == 32
    torch.testing.assert_close(out2, want, atol=1e-4, rtol=1e-4)


def test_a_wrong_or_failing_tiling_is_not_chosen(tuning: autotune._State) -> None:
    seen: list[dict[str, Any]] = []
    tuning.timer = _clock(16, seen)
    ins = _inputs(1)
    want = EAGER["gemm"](ins, ATTRS)
    out = torch.full_like(want, float("nan"))
    fixed = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}
    wrong = {**fixed, "BLOCK_M": 16, "SCALE": False}  # the fastest, but alpha left out
    failing = {**fixed, "BLOCK_M": 16, "BLOCK_N": 24}  # tl.arange needs powers of 2
    (launch,) = _gemm(ins, out, [((3, 1), wrong), ((3, 1), failing)])
    assert launch.constexprs["BLOCK_M"] == 64 and launch.constexprs["SCALE"]
    assert [t["BLOCK_M"] for t in seen] == [64, 32]  # neither the wrong nor the failing
    assert [t for _, t, _ in tuning.dropped] == [wrong, failing]
    assert tuning.dropped[0][2] == "its result differs from the fixed tiling's"
    assert "Error" in tuning.dropped[1][2]  # the interpreter's or the compiler's
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


def test_an_output_sharing_its_addend_is_added_once(tuning: autotune._State) -> None:
    # out = alpha * rms(x) @ W + out: the tuning runs write scratch, the chosen one `out`
    tuning.timer = _clock(32, [])
    x, w, _, norm, residual = _inputs(2)
    want = EAGER["gemm"]([x, w, 0.0, norm, residual], ATTRS)
    out = residual.clone()
    ins = [x, w, 0.0, norm, out]
    launches = _plan(plan_gemm, "gemm", ATTRS, ins, out)
    run_launches(launches, [*ins, out])
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    assert launches[0].constexprs["BLOCK_M"] == 32


@pytest.mark.parametrize("switch,budget", [("0", "60"), ("1", "0")])
def test_the_switch_and_the_budget_keep_the_fixed_tiling(
        tuning: autotune._State, monkeypatch: pytest.MonkeyPatch, switch: str,
        budget: str) -> None:
    monkeypatch.setenv("EQSAT_TUNE", switch)
    monkeypatch.setenv("EQSAT_TUNE_BUDGET", budget)
    seen: list[dict[str, Any]] = []
    tuning.timer = _clock(32, seen)
    ins = _inputs(3)
    out = torch.empty(33, 48)
    (launch,) = _gemm(ins, out)
    assert seen == [] and launch.constexprs["BLOCK_M"] == 64
    torch.testing.assert_close(out, EAGER["gemm"](ins, ATTRS), atol=1e-4, rtol=1e-4)


def test_the_interpreter_does_not_tune_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EQSAT_TUNE", raising=False)
    assert not autotune.enabled()


def test_a_corrupt_tuning_file_is_tuned_afresh(tuning: autotune._State) -> None:
    path = autotune.cache_dir("triton-tuning") / f"{autotune.device_name()}.json"
    path.write_text("{not json")
    seen: list[dict[str, Any]] = []
    tuning.timer = _clock(32, seen)
    (launch,) = _gemm(_inputs(4), torch.empty(33, 48))
    assert len(seen) == 2 and launch.constexprs["BLOCK_M"] == 32
    (choice,) = json.loads(path.read_text()).values()
    assert choice["BLOCK_M"] == 32


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (1, 48, 32), (100, 96, 64),
                                   (512, 11008, 4096), (4096, 128, 32)])
def test_the_compiled_gemm_candidates(monkeypatch: pytest.MonkeyPatch, m: int, n: int,
                                      k: int) -> None:
    monkeypatch.setattr(gemm, "interpreting", lambda: False)
    tilings = gemm.gemm_choices(m, n, k)
    fixed = gemm.gemm_tiles(m, n, k)
    assert tuple(tilings[0][s] for s in ("BLOCK_M", "BLOCK_N", "BLOCK_K")) == fixed
    assert len({tuple(t.values()) for t in tilings}) == len(tilings)
    for t in tilings:
        sides = (t["BLOCK_M"], t["BLOCK_N"], t["BLOCK_K"])
        assert all(s >= 16 and s & (s - 1) == 0 for s in sides)  # what tl.dot takes
        assert t["BLOCK_N"] <= max(64, 2 * n) and t["BLOCK_K"] <= max(64, 2 * k)
    assert len(tilings) > 1 or (n <= 64 and k <= 64)


def test_flash_attention_takes_its_fastest_tiling(tuning: autotune._State,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "attention_choices", lambda r, t, d: [
        {"BLOCK_M": 32, "BLOCK_N": 32}, {"BLOCK_M": 16, "BLOCK_N": 16}])
    seen: list[dict[str, Any]] = []
    tuning.timer = _clock(16, seen)
    q, k, v = qkv(b=1, h=4, hkv=2, s=20, t=20, d=16)
    bias = causal_mask(20, 20)
    out = torch.full((1, 4, 20, 16), float("nan"))
    (launch,) = plan_attention(q, k, v, bias, out, 0.25)
    run_launches([launch], [q, k, v, bias, float("-inf"), out])
    assert [t["BLOCK_M"] for t in seen] == [32, 16]
    # 20 queries x 2 heads of a kv head: 40 rows, three blocks of 16 for each of 2 kv heads
    assert launch.constexprs["BLOCK_N"] == 16 and launch.grid == (3, 2, 1)
    want = EAGER["attention"]([q, k, v, bias, float("-inf")], {"scale": 0.25})
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", ["rms_norm", "softmax"])
def test_a_row_kernel_takes_its_fastest_blocking(tuning: autotune._State,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 op: str) -> None:
    monkeypatch.setattr(rows, "row_choices", lambda n, d: [{"ROWS": 8}, {"ROWS": 2}])
    seen: list[dict[str, Any]] = []
    tuning.timer = _clock(2, seen, "ROWS")
    torch.manual_seed(5)
    x = torch.randn(6, 40)
    ins, attrs = ([x, torch.randn(40)], {"eps": 1e-6}) if op == "rms_norm" else \
        ([x], {"dim": -1, "half_to_float": False})
    out = torch.full_like(x, float("nan"))
    (launch,) = _plan(plan_rows, op, attrs, ins, out)
    run_launches([launch], [*ins, out])
    assert [t["ROWS"] for t in seen] == [8, 2]
    assert launch.constexprs["ROWS"] == 2 and launch.grid == (3,)
    torch.testing.assert_close(out, EAGER[op](ins, attrs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("r,t,d", [(1, 4096, 128), (4, 4096, 64), (128, 128, 64),
                                   (2048, 2048, 128), (512, 512, 256), (16, 16, 32)])
def test_the_compiled_attention_candidates(monkeypatch: pytest.MonkeyPatch, r: int, t: int,
                                           d: int) -> None:
    monkeypatch.setattr(attention, "interpreting", lambda: False)
    tilings = attention.attention_choices(r, t, d)
    fixed = attention.blocking(r, t, d, 1)[:2]
    assert (tilings[0]["BLOCK_M"], tilings[0]["BLOCK_N"]) == fixed and len(tilings[0]) == 2
    assert len({tuple(x.values()) for x in tilings}) == len(tilings)
    for x in tilings:
        assert all(s >= 16 and s & (s - 1) == 0 for s in (x["BLOCK_M"], x["BLOCK_N"]))
    for x in tilings[1:]:  # (the fixed one takes 64 keys however few there are)
        assert x["BLOCK_M"] <= max(16, 2 * r) and x["BLOCK_N"] <= max(16, 2 * t)
    assert len(tilings) > 1 or r <= 16 and t <= 16


@pytest.mark.parametrize("n,d", [(1, 2048), (64, 2048), (4096, 4096), (7, 100), (512, 32000)])
def test_the_compiled_row_candidates(monkeypatch: pytest.MonkeyPatch, n: int, d: int) -> None:
    monkeypatch.setattr(rows, "interpreting", lambda: False)
    tilings = rows.row_choices(n, d)
    fixed, block, _ = rows._blocking(n, d)
    assert tilings[0] == {"ROWS": fixed}
    assert len({tuple(x.items()) for x in tilings}) == len(tilings)
    for x in tilings:
        assert 1 <= x["ROWS"] <= max(1, 2 * n)
        assert x["ROWS"] == fixed or x["ROWS"] * block <= 1 << 14
        assert x.get("num_warps", 4) * 32 <= max(128, x["ROWS"] * block)
    assert len(tilings) > 1
