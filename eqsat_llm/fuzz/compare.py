"""Whether a compiled program's outputs are eager's: integers and booleans bit for bit, NaN and
inf where eager has them, finite floats within a bound that allows for rounding.

The bound of a float element is `atol + rtol * |eager| + 2 * |eager - exact|`, where `exact`
is the same model run in float64: a compiled program may round differently from eager (it
fuses, reassociates sums, contracts a * b + c), and where eager's own result is far from
the exact one (cancellation, a large sum) the compiled one may be as far the other way. atol
scales with the output's largest exact magnitude, because a matmul's or a sum's rounding
error is relative to its terms, not to an element that happens to cancel to near zero. rtol
is that of the least precise float dtype the model computes in (`model_rtol`): a float32
output computed from bfloat16 values carries bfloat16's rounding, which a compiled program
may place differently (it computes half models in float32: docs/decisions.md), so such a
model's atol is a whole half rounding."""

from __future__ import annotations

import torch

# relative tolerance by the output's dtype: a few units in the last place
RTOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-9}


def model_rtol(dtypes: set[torch.dtype]) -> float:
    """The relative tolerance of a model whose values take these dtypes."""
    return max((RTOL[d] for d in dtypes if d in RTOL), default=0.0)


def mismatch(got: object, eager: torch.Tensor, exact: torch.Tensor,
             rtol: float = 0.0) -> str | None:
    """None if `got` matches `eager` (floats within max(rtol, the output dtype's)); otherwise
    what differs, in words."""
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return f"expected {eager.dtype}{list(eager.shape)}, got {got.dtype}{list(got.shape)}"
    if not eager.dtype.is_floating_point:
        bad = got != eager
        if bad.any():
            return f"{int(bad.sum())} of {eager.numel()} elements differ, first at " \
                   f"{_first(bad)}: {got[bad][0].item()} vs eager {eager[bad][0].item()}"
        return None
    g, e, x = got.double(), eager.double(), exact.double()
    nan_differs = torch.isnan(g) != torch.isnan(e)
    inf_differs = (torch.isinf(g) | torch.isinf(e)) & (g != e) & ~torch.isnan(g) \
        & ~torch.isnan(e)
    finite = torch.isfinite(g) & torch.isfinite(e)
    bad = nan_differs | inf_differs
    if finite.any():
        scale = x[torch.isfinite(x)].abs().max().item() if torch.isfinite(x).any() else 1.0
        # a model computing in a half dtype rounds elsewhere than eager (half models are
        # computed in float32): one half rounding of the model's values, not a tenth of one
        half = rtol > RTOL[eager.dtype]
        rtol = max(rtol, RTOL[eager.dtype])
        atol = rtol * max(scale, 1.0) * (1.0 if half else 0.1)
        bound = atol + rtol * e.abs() + 2 * (e - x).abs().nan_to_num(0)
        bad |= finite & ((g - e).abs() > bound)
    if bad.any():
        where = _first(bad)
        return (f"{int(bad.sum())} of {eager.numel()} elements differ, first at {where}: "
                f"{g[where].item():.7g} vs eager {e[where].item():.7g} "
                f"(float64 {x[where].item():.7g})")
    return None


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])
