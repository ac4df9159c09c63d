"""The bad-input catalogue (docs/errors.md): each entry gets a clear error (an EqsatError whose
message says what is wrong and what to do) or a documented fallback, and never a wrong
result. One test (or a few) per entry, named in the catalogue's table."""

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from eqsat_llm import (
    CaptureError,
    EqsatError,
    FallbackWarning,
    Limits,
    MemoryLimitError,
    RuleError,
    optimize,
)
from eqsat_llm.api import BackendFallbackWarning
from eqsat_llm.cli import main as cli_main
from eqsat_llm.extraction import extract as ex
from eqsat_llm.extraction.egraph_json import EGraphFormatError, load_egraph
from eqsat_llm.extraction.ilp import extract_ilp
from eqsat_llm.rulecheck import load_rules_from

BACKENDS = ("c", "reference")
WRONG_RULES = Path(__file__).parent / "rules_wrong.py"


def fast(model, inputs, backend="c", **kw):
    """optimize() without the rules (what is tested here does not depend on them)."""
    kw.setdefault("rules", [])
    kw.setdefault("measure_eager", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        return optimize(model, inputs, backend=backend, **kw)


def same(got, want, **tol):
    """Eager's values, NaN where eager has NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if not tol:
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    else:
        assert torch.allclose(got, want, equal_nan=True, **tol)


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


# --- 1. an op outside the registry --------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_unsupported_op_runs_in_torch_with_the_eager_result(backend):
    model = Fn(lambda x: torch.fft.rfft(x * 2.0, dim=-1).abs() + 1.0)
    x = torch.randn(4, 16)
    with pytest.warns(FallbackWarning, match="aten._fft_r2c"):
        compiled = optimize(model, (x,), backend=backend, rules=[], measure_eager=False)
    assert compiled.report.backend == backend
    for inp in (x, torch.randn(4, 16)):
        same(compiled(inp), model(inp), atol=1e-5, rtol=1e-5)


# --- 2. data-dependent control flow -------------------------------------------------------------
class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_data_dependent_branch_is_a_short_error_naming_the_line(capfd):
    with pytest.raises(CaptureError) as info:
        optimize(Branchy(), (torch.randn(4, 4),))
    msg = str(info.value)
    assert "branches on the value of a tensor" in msg
    assert "test_bad_inputs.py:" in msg and "`if x.sum() > 0:`" in msg  # the model's line
    assert "torch.cond" in msg and "torch.where" in msg  # what to do
    assert "def forward" not in msg and "GraphModule" not in msg and len(msg) < 600
    assert "def forward" not in capfd.readouterr().err  # torch's partial graph not printed
    assert "torch.ops.aten" in info.value.details  # torch's own messages kept for debugging


@pytest.mark.parametrize("fn", [lambda x: x[x > 0].sum(), lambda x: x * x.max().item(),
                                lambda x: x.nonzero().float()],
                         ids=["mask-index", "item", "nonzero"])
def test_data_dependent_shapes_and_numbers_are_refused(fn):
    with pytest.raises(CaptureError, match="depends on the values of tensors.*torch.where"):
        optimize(Fn(fn), (torch.randn(4, 8),), rules=[], measure_eager=False)


# --- 3. dynamic shapes ---------------------------------------------------------------------------
def test_exported_program_with_dynamic_dims_is_refused():
    x = torch.randn(4, 8)
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(torch.nn.ReLU(), (x,), dynamic_shapes=({0: batch},))
    with pytest.raises(CaptureError, match=r"symbolic dims.*static shapes.*without "
                                           r"dynamic_shapes"):
        optimize(ep, (x,))
    with pytest.raises(TypeError, match="dynamic_shapes"):  # no such option: shapes are static
        optimize(Fn(torch.relu), (x,), dynamic_shapes=({0: batch},))


def test_exported_program_without_or_with_other_example_inputs():
    model, x = Fn(lambda x: torch.relu(x) * 2.0), torch.randn(4, 8)
    ep = torch.export.export(model, (x,))
    compiled = optimize(ep, rules=[])  # its own example inputs (measure_eager runs them)
    assert compiled.report.memory["eager_peak_bytes"] >= 0
    same(compiled(x), model(x))
    with pytest.raises(CaptureError, match=r"example input 0 is torch.float32\[8, 8\].*"
                                           r"exported for torch.float32\[4, 8\]"):
        optimize(ep, (torch.randn(8, 8),))


# --- 4. dtypes -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int16, torch.int32, torch.uint8,
                                   torch.complex64, torch.float16, torch.bfloat16])
def test_other_dtypes_give_the_eager_result(dtype, backend):
    model = Fn(lambda x: x * 2 + x)
    x = (torch.randn(4, 8) * 4).to(dtype)
    compiled = fast(model, (x,), backend)
    if backend == "c" and dtype == torch.complex64:  # no C kernels: torch steps on the arena
        assert compiled.report.torch_ops == {"mul": 1, "add": 1}
    if backend == "c" and dtype in (torch.float16, torch.bfloat16):
        # documented (formats/half.py): computed in float32, rounded once: within the dtype's error
        assert compiled.report.computed_in_float32
        eps = torch.finfo(dtype).eps
        same(compiled(x).float(), model(x).float(), rtol=2 * eps, atol=0)
    else:
        same(compiled(x), model(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.uint8])
def test_an_integer_product_scaled_by_a_float(dtype, backend):
    # the rules folded * 0.5 into the integer matmul's alpha: a float mm of int operands,
    # which no kernel writes (RuntimeError from the out= writer); now guarded by dtype
    model = Fn(lambda x: (x @ x.t()) * 0.5 + 1)
    x = (torch.randn(4, 8) * 4).to(dtype)
    same(fast(model, (x,), backend, rules=None)(x), model(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_float8_inputs_are_converted_like_eager(backend):
    model = Fn(lambda x: x.to(torch.float32) * 2)
    x = torch.randn(4, 8).to(torch.float8_e4m3fn)
    same(fast(model, (x,), backend)(x), model(x))


# --- 5. example inputs that do not match the model -----------------------------------------------
class TwoArgs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, y=None):
        return self.lin(x) + (0 if y is None else y)


@pytest.mark.parametrize("args,kwargs,match", [
    ((torch.randn(4, 8),) * 3, None, r"do not match forward\(x, y=None\): too many positional"),
    ((), None, r"do not match forward\(x, y=None\): missing a required argument: 'x'"),
    ((torch.randn(4, 8),), {"z": torch.randn(4, 8)}, "unexpected keyword argument 'z'"),
    ((torch.randn(4, 5),), None, (r"test_bad_inputs.py:\d+ in forward: `return self.lin\(x\)"
                                  r".*RuntimeError: a and b must have same reduction dim.*eager")),
], ids=["too-many", "too-few", "bad-kwarg", "bad-shape"])
def test_example_inputs_that_do_not_match_the_model(args, kwargs, match):
    with pytest.raises(CaptureError, match=match) as info:
        optimize(TwoArgs(), args, example_kwargs=kwargs)
    assert len(str(info.value)) < 600 and "Developer debug context" not in str(info.value)


# --- 6. calling the compiled program -------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_calls_with_wrong_shape_dtype_device_or_arguments_are_refused(backend):
    compiled = fast(TwoArgs().eval(), (torch.randn(4, 8),), backend)
    with pytest.raises(EqsatError, match=r"input 0: expected float32\[4, 8\], got "
                                         r"torch.float32\[3, 8\]; shapes and dtypes are static"):
        compiled(torch.randn(3, 8))
    with pytest.raises(EqsatError, match=r"expected float32\[4, 8\], got torch.float64"):
        compiled(torch.randn(4, 8, dtype=torch.float64))
    # a meta tensor stands for any other device: the C kernels would read its address
    with pytest.raises(EqsatError, match=r"input 0 is on meta, but the program runs on cpu"):
        compiled(torch.randn(4, 8, device="meta"))
    with pytest.raises(EqsatError, match=r"called with 2 positional argument\(s\), but the "
                                         r"model was optimized for 1 positional"):
        compiled(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(EqsatError, match=r"keyword arguments \['x'\]"):
        compiled(x=torch.randn(4, 8))


class ViewsAndTorchStep(torch.nn.Module):
    """Elementwise C kernels, a torch step between them (flip), an output that is a view of an
    input: every way an input is read."""

    def forward(self, x, y):
        h = torch.flip(x * 2.0 + y, dims=[1]) / 3.0
        return torch.relu(h) + y.sum(-1, keepdim=True), x.t()


def _strided_inputs():
    base = torch.randn(16, 16)
    return {
        "transposed": (torch.randn(8, 4).t(), torch.randn(4, 8)),
        "strided-slice": (base[::4, ::2], base[1::4, 1::2]),
        "offset-slice": (base[3:7, 4:12], base[8:12, :8]),
        "expanded": (torch.randn(1, 8).expand(4, 8), torch.randn(4, 1).expand(4, 8)),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs_give_the_eager_result(backend):
    model = ViewsAndTorchStep()
    compiled = fast(model, (torch.randn(4, 8), torch.randn(4, 8)), backend)
    if backend == "c":
        assert compiled.report.torch_ops == {"aten.flip.default": 1}
    for name, (x, y) in _strided_inputs().items():
        assert not (x.is_contiguous() and y.is_contiguous()), name
        for got, want in zip(compiled(x, y), model(x, y)):
            same(got, want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_aliased_inputs_give_the_eager_result(backend):
    model = ViewsAndTorchStep()
    compiled = fast(model, (torch.randn(4, 8), torch.randn(4, 8)), backend)
    x, base = torch.randn(4, 8), torch.randn(6, 8)
    for a, b in [(x, x), (base[:4], base[2:]), (x, x.view(4, 8))]:  # same tensor, overlaps
        for got, want in zip(compiled(a, b), model(a, b)):
            same(got, want, atol=1e-6, rtol=1e-6)


class WritesItsInput(torch.nn.Module):
    def forward(self, x, y):
        x.add_(1.0)
        return y * 2.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_written_in_place_and_aliased_is_refused(backend):
    compiled = fast(WritesItsInput(), (torch.randn(4, 8), torch.randn(4, 8)), backend)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    x0 = x.clone()
    same(compiled(x, y), y * 2.0)
    same(x, x0 + 1.0)  # the write lands in the caller's tensor
    # eager would see the write through y; the program reads y before it writes x
    with pytest.raises(EqsatError, match="input 0 is written in place.*shares memory"):
        compiled(x, x)
    base = torch.randn(6, 8)
    with pytest.raises(EqsatError, match="shares memory"):
        compiled(base[:4], base[2:])
    # disjoint parts of one tensor are fine
    whole = torch.randn(8, 8)
    same(compiled(whole[:4], whole[4:]), whole[4:] * 2.0)


# --- 7. rule modules -----------------------------------------------------------------------------
HALVING = """
from egglog import String, f64, rewrite
from eqsat_llm.egraph.language import E, Tensor
from eqsat_llm.rulebook import family, reassociates

@family("halving")
def halving(x: Tensor, v: f64, k: String):
    # x * v -> (x * v/2) * 2: a new constant each time, so it never saturates
    yield reassociates("halve-scale", rewrite(E.mul(x, E.scalar(v, k))).to(
        E.mul(E.mul(x, E.scalar(v / 2.0, k)), E.scalar(2.0, k))))
"""

TYPO = """
from egglog import rewrite
from eqsat_llm.egraph.language import E, Tensor
from eqsat_llm.rulebook import exact, family

@family("typo")
def typo(x: Tensor):
    yield exact("relu-relu", rewrite(E.relu(E.relu(x))).to(E.relux(x)))
"""


def test_rule_module_that_raises_on_import_or_in_its_generator(tmp_path):
    (tmp_path / "imports.py").write_text("import no_such_package_for_rules\n")
    with pytest.raises(RuleError, match=r"imports.py' raised on import \(line 1\): "
                                        r"ModuleNotFoundError"):
        load_rules_from(str(tmp_path / "imports.py"))
    (tmp_path / "typo.py").write_text(TYPO)
    with pytest.raises(RuleError, match=r"rule family 'typo' \(.*typo.py:8\) raised while "
                                        r"building its rules: AttributeError.*relux"):
        load_rules_from(str(tmp_path / "typo.py"))
    sys.path.insert(0, str(tmp_path))  # imported as a module: the same error
    try:
        with pytest.raises(RuleError, match=r"rule family 'typo' \(.*typo.py:8\).*relux"):
            load_rules_from("typo")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("typo", None)
    for f in ("imports.py", "typo.py"):
        out = subprocess.run([sys.executable, "-m", "eqsat_llm.cli", "rules", "check",
                              str(tmp_path / f)], check=False, capture_output=True,
                             text=True)
        assert out.returncode == 2 and out.stderr.startswith("error: rule "), out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.parametrize("limits,reason", [(Limits(iterations=5), "iteration_limit"),
                                           (Limits(iterations=1000, enodes=2000), "enode_limit")])
def test_rules_that_never_saturate_stop_at_the_limits(tmp_path, limits, reason):
    (tmp_path / "halving.py").write_text(HALVING)
    rules = load_rules_from(str(tmp_path / "halving.py"))
    model, x = Fn(lambda x: torch.relu(x * 2.0) * 3.0), torch.randn(4, 8)
    compiled = optimize(model, (x,), rules=rules, limits=limits, backend="reference",
                        measure_eager=False, force_rules=True)
    assert compiled.report.stop_reason.startswith(reason)  # (or "... (projected)")
    assert f"stopped: {reason}" in compiled.report.summary()
    same(compiled(x), model(x))


def test_ill_typed_and_wrong_rules_are_refused_with_a_short_message():
    wrong = {r.name: r for r in load_rules_from(str(WRONG_RULES))}
    model, x = Fn(lambda x: (x * 2.0).sum(-1, keepdim=True)), torch.randn(4, 8)
    with pytest.raises(RuleError, match=r"'bad-keepdim' failed its check \(ill-typed\).*"
                                        r"counterexample: x: float64\[.*force_rules=True"
                       ) as info:
        optimize(model, (x,), rules=[wrong["bad-keepdim"]])
    assert "%0 = input" not in str(info.value) and "\\n" not in str(info.value)
    with pytest.raises(RuleError, match=r"'bad-triple' failed its check \(fail\)"):
        optimize(model, (x,), rules=[wrong["bad-triple"]])


# --- 8. corrupt or cyclic e-graph JSON -----------------------------------------------------------
GOOD = {"nodes": {"a": {"op": "x", "eclass": "c0", "children": [], "cost": 1},
                  "b": {"op": "f", "eclass": "c1", "children": ["a"], "cost": 1}},
        "root_eclasses": ["c1"]}


def _bad_files(tmp_path):
    text = json.dumps(GOOD)
    missing_child = json.loads(text)
    missing_child["nodes"]["b"]["children"] = ["zz"]
    missing_root = json.loads(text)
    missing_root["root_eclasses"] = ["c9"]
    cyclic = {"nodes": {"a": {"op": "f", "eclass": "c0", "children": ["b"]},
                        "b": {"op": "g", "eclass": "c1", "children": ["a"]}},
              "root_eclasses": ["c0"]}
    files = {"truncated": (text[:len(text) // 2], "not valid JSON"),
             "empty": ("", "not valid JSON"),
             "missing-child": (json.dumps(missing_child), "child 'zz' names no node"),
             "missing-root": (json.dumps(missing_root), "root eclass 'c9' names no class"),
             "cyclic": (json.dumps(cyclic), "root class 'c0' has no finite-cost choice")}
    out = {}
    for name, (body, match) in files.items():
        (tmp_path / f"{name}.json").write_text(body)
        out[name] = (tmp_path / f"{name}.json", match)
    return out


@pytest.mark.parametrize("method", ["tree", "dag", "ilp"])
def test_corrupt_or_cyclic_egraph_json_is_a_clear_error(tmp_path, method):
    extractors = {"tree": ex.extract_tree_greedy, "dag": ex.extract_dag_greedy,
                  "ilp": extract_ilp}
    for path, match in _bad_files(tmp_path).values():
        with pytest.raises((EGraphFormatError, ex.ExtractionError), match=match):
            extractors[method](load_egraph(path))
        assert issubclass(EGraphFormatError, EqsatError)
    # a cycle with an acyclic way out: extracted, the cycle avoided
    way_out = {"nodes": {"a": {"op": "f", "eclass": "c0", "children": ["b"]},
                         "b": {"op": "g", "eclass": "c1", "children": ["a"], "cost": 0.01},
                         "c": {"op": "leaf", "eclass": "c1", "children": [], "cost": 5}},
               "root_eclasses": ["c0"]}
    result = extractors[method](load_egraph(way_out))
    assert result.choices == {"c0": "a", "c1": "c"}
    ex.check_extraction(load_egraph(way_out), result.choices)


def test_the_extract_command_exits_2_with_one_line(tmp_path, capsys):
    """Every bad file through the command's entry point; the first also as a process of its
    own, as a user runs it (each such process imports torch: seconds apiece)."""
    cases = {name: match for name, (_, match) in _bad_files(tmp_path).items()}
    cases["no-such-file"] = "cannot read .*No such file or directory"
    for k, (name, match) in enumerate(cases.items()):
        path = str(tmp_path / f"{name}.json")
        if k == 0:
            out = subprocess.run([sys.executable, "-m", "eqsat_llm.cli", "extract", path],
                                 check=False, capture_output=True, text=True)
            code, stderr = out.returncode, out.stderr
        else:
            code, stderr = cli_main(["extract", path]), capsys.readouterr().err
        assert code == 2, (name, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, stderr)
        assert re.search(match, lines[0]), (name, lines[0])


# --- 9. no C compiler ----------------------------------------------------------------------------
@pytest.mark.parametrize("cc,match", [("/nonexistent/cc", r"no C compiler found \(set CC"),
                                      ("/bin/false", "/bin/false failed and printed nothing")])
def test_no_c_compiler_falls_back_to_the_reference_runtime(monkeypatch, cc, match):
    monkeypatch.setenv("CC", cc)
    model, x = Fn(lambda x: torch.relu(x * 2.0) * 3.0 + 0.25), torch.randn(4, 8)
    with pytest.warns(BackendFallbackWarning, match=f"{match}.*; running the reference runtime"):
        compiled = optimize(model, (x,), backend="c", rules=[], measure_eager=False)
    assert compiled.report.backend == "reference"
    same(compiled(x), model(x))


# --- 10. NaN and Inf inputs ----------------------------------------------------------------------
NAN_OPS = {
    "relu": torch.relu, "silu": F.silu, "gelu": F.gelu, "exp": torch.exp, "abs": torch.abs,
    "maximum": lambda x: torch.maximum(x, torch.full_like(x, 0.5)),
    "clamp": lambda x: torch.clamp(x, -1, 1), "amax": lambda x: x.amax(-1),
    "sum": lambda x: x.sum(-1), "softmax": lambda x: torch.softmax(x, -1),
    "rms-norm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
    "layer-norm": lambda x: F.layer_norm(x, (16,)),
    "where": lambda x: torch.where(x > 0, x, -x), "isnan": lambda x: torch.ne(x, x).float(),
    "attention": lambda x: F.scaled_dot_product_attention(*[x.view(1, 1, 8, 16)] * 3,
                                                          is_causal=True),
}


def _nan_input():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    x[0, 3], x[1, 5], x[2, 7] = float("nan"), float("inf"), float("-inf")
    x[3, :], x[4, :] = float("nan"), float("inf")
    return x


def _expected(fn, x, backend):
    """What a backend must give at NaN / inf: the reference backend runs torch's own kernels, so
    eager's float32; generated C follows float64 semantics cast back, since torch's float32
    vector kernels differ between hosts (with AVX-512 its gelu(+inf) is NaN, one element or
    AVX2 give +inf)."""
    if backend == "reference":
        return fn(x)
    return fn(x.double()).to(x.dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(NAN_OPS))
def test_nan_and_inf_inputs_give_eager_results(op, backend):
    model, x = Fn(NAN_OPS[op]), _nan_input()
    same(fast(model, (x,), backend, rules=None)(x), _expected(NAN_OPS[op], x, backend),
         atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act", ["relu", "silu", "gelu"])
def test_nan_through_a_gemm_epilogue(act, backend):
    # linear + bias + activation is one gemm kernel on C (its epilogue kept relu(NaN) as 0)
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    model, x = Fn(lambda x: getattr(F, act)(lin(x))).eval(), _nan_input()
    compiled = fast(model, (x,), backend, rules=None)
    if backend == "c" and act != "silu":  # (silu is decomposed: x * sigmoid(x))
        assert list(compiled.graph.op_counts()) == [f"gemm[bias+{act}]"]
    with torch.no_grad():
        want = _expected(lambda x: getattr(F, act)(F.linear(x, lin.weight.to(x.dtype),
                                                            lin.bias.to(x.dtype))), x, backend)
        same(compiled(x), want, atol=1e-5, rtol=1e-5)


# --- 11. a model too large for memory ------------------------------------------------------------
class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64))

    def forward(self, x):
        return x @ (self.w * 2.0) + 1.0  # w * 2 is folded into a constant of 16 KiB


@pytest.mark.parametrize("backend", (*BACKENDS, "triton"))
def test_a_program_larger_than_the_memory_limit_is_refused_before_allocating(
        monkeypatch, backend):
    x = torch.randn(64, 64)
    monkeypatch.setenv("EQSAT_MEMORY_LIMIT", "8K")
    with pytest.raises(MemoryLimitError, match=r"not enough memory to fold the constants: it "
                                               r"needs about 16.0 KiB more \(folded constants "
                                               r"16.0 KiB\) but 8.0 KiB is available "
                                               r"\(EQSAT_MEMORY_LIMIT=8K\)"):
        fast(Scaled(), (x,), backend)
    monkeypatch.setenv("EQSAT_MEMORY_LIMIT", "20K")  # the folded weight fits, not its program
    name = {"c": "C", "triton": "Triton"}.get(backend, backend)
    with pytest.raises(MemoryLimitError, match=f"to run this program on the {name} backend: "
                                               r".*outputs per call 16.0 KiB") as info:
        fast(Scaled(), (x,), backend)
    assert isinstance(info.value, MemoryError) and "quantize" in str(info.value)
    monkeypatch.setenv("EQSAT_MEMORY_LIMIT", "off")
    model = Scaled()
    with torch.no_grad():
        same(fast(model, (x,), backend)(x), model(x), atol=1e-4, rtol=1e-4)
    monkeypatch.setenv("EQSAT_MEMORY_LIMIT", "lots")
    with pytest.raises(EqsatError, match="EQSAT_MEMORY_LIMIT='lots': expected bytes"):
        fast(Scaled(), (x,), backend)


def test_a_cuda_device_is_checked_against_its_own_free_memory(monkeypatch):
    """A Triton program on a CUDA device is refused against that device's free memory (what
    torch.cuda.mem_get_info reports), not the host's."""
    from eqsat_llm import memcheck

    monkeypatch.delenv("EQSAT_MEMORY_LIMIT", raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 << 20, 80 << 30))
    cuda = torch.device("cuda", 0)
    source = "free memory of cuda:0 (torch.cuda.mem_get_info)"
    assert memcheck.available_bytes(cuda) == (3 << 20, source)
    memcheck.check_fits({"arena": 2 << 20}, "run it", cuda)
    with pytest.raises(MemoryLimitError, match=r"needs about 4.0 MiB more \(arena 4.0 MiB\) "
                                               r"but 3.0 MiB is available \(free memory of "
                                               r"cuda:0"):
        memcheck.check_fits({"arena": 4 << 20}, "run it", cuda)


def test_the_limit_defaults_to_the_available_memory(monkeypatch):
    from eqsat_llm import memcheck

    monkeypatch.delenv("EQSAT_MEMORY_LIMIT", raising=False)
    have, source = memcheck.available_bytes()
    if Path("/proc/meminfo").exists():
        assert have is not None and have > 0
        assert "MemAvailable" in source or "cgroup" in source
    assert memcheck.parse_bytes("1.5GiB") == 3 << 29 and memcheck.parse_bytes("512M") == 1 << 29
