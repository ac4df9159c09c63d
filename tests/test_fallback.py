"""An op outside the registry runs in torch; the optimizer still works around it."""

import pytest
import torch

from eqsat_llm import FallbackWarning, optimize


class SpectralMix(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.proj(x).unsqueeze(0).expand(1, 4, 32).reshape(4, 32)
        spectrum = torch.fft.rfft(h, dim=-1).abs()  # not in the registry
        return spectrum.sum(-1, keepdim=True) * 1.0 + h


def test_unsupported_op_falls_back_and_is_named():
    torch.manual_seed(0)
    model, x = SpectralMix().eval(), torch.randn(4, 32)
    with pytest.warns(FallbackWarning, match="aten._fft_r2c"):
        compiled = optimize(model, (x,))
    assert "aten._fft_r2c.default" in compiled.report.fallback_ops
    assert "aten._fft_r2c.default" in compiled.report.summary()
    assert compiled.graph.op_counts()["fallback"] == 1
    # the supported region around it is still optimized
    assert compiled.report.op_counts_after["expand"] == 0
    with torch.no_grad():
        for inp in (x, torch.randn(4, 32)):
            assert torch.allclose(compiled(inp), model(inp), atol=1e-5, rtol=0)


class Flipped(torch.nn.Module):
    def forward(self, x):
        return torch.flip(x * 2.0, dims=[1]) / 3.0  # aten.flip: outside the registry


def test_an_op_the_c_backend_lacks_runs_in_torch_between_c_segments():
    import warnings

    from eqsat_llm.api import BackendFallbackWarning

    x = torch.randn(3, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)  # no whole-program fallback
        warnings.simplefilter("ignore", FallbackWarning)
        compiled = optimize(Flipped(), (x,))
    assert compiled.report.backend == "c"
    assert compiled.report.torch_ops == {"aten.flip.default": 1}
    assert "ran in torch: aten.flip.default x1" in compiled.report.summary()
    assert len(compiled._runtime.program.kernels) == 2  # x * 2 and / 3 in C, around the flip
    for inp in (x, torch.randn(3, 7)):
        assert torch.allclose(compiled(inp), Flipped()(inp), atol=1e-6)


def test_a_failed_c_compile_falls_back_naming_the_kernel(monkeypatch):
    from eqsat_llm.api import BackendFallbackWarning
    from eqsat_llm.codegen import c as cbackend

    def broken(*args, **kwargs):
        raise cbackend.CCompileError("k3_mul", "k3_mul: error: expected ';'", ["cc"])

    monkeypatch.setattr(cbackend, "CRuntime", broken)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU()).eval(), \
        torch.randn(4, 8)
    with pytest.warns(BackendFallbackWarning, match="kernel k3_mul.*expected ';'"):
        compiled = optimize(model, (x,))
    assert compiled.report.backend == "reference"
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), atol=1e-6)
