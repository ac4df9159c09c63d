"""torch.export of a model, and what a failed export means for the user: a PyTorch model
(an `nn.Module` with example inputs, an `fx.GraphModule` exported the same way, or an
`ExportedProgram`) as an ExportedProgram with the core-aten decompositions applied, and each
failure explained as the line of the user's code it came from (data-dependent control flow,
a wrong signature)."""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import sys
import traceback
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ..errors import CaptureError
from .moe_forms import experts_for_capture

aten = torch.ops.aten


def export(model: Any, example_inputs: tuple, example_kwargs: dict | None = None
           ) -> ExportedProgram:
    """torch.export the model (strict mode first, then non-strict) and decompose to core aten."""
    if isinstance(model, ExportedProgram):
        ep = model
        check_example_inputs(ep, example_inputs, example_kwargs)
    else:
        if not isinstance(model, torch.nn.Module):
            raise CaptureError(f"expected an nn.Module, fx.GraphModule or ExportedProgram, "
                               f"got {type(model).__name__}")
        failures: list[tuple[str, Exception, str]] = []
        ep = None
        for strict in (False, True):
            # torch.export prints its partial graph to stderr when it fails and logs the
            # failed fake-tensor call: kept out of sight (CaptureError.details has them),
            # replayed when the export succeeds
            printed = io.StringIO()
            try:
                with contextlib.redirect_stderr(printed), _quiet(_EXPORT_LOGGERS), \
                        experts_for_capture(model):
                    ep = torch.export.export(model, tuple(example_inputs),
                                             example_kwargs or None, strict=strict)
                sys.stderr.write(printed.getvalue())
                break
            except Exception as exc:  # noqa: BLE001 - export's message names the construct
                failures.append((f"strict={strict}", exc, printed.getvalue()))
        if ep is None:
            raise _export_error(model, failures) from None
    return ep.run_decompositions(_decompositions())


# loggers that report, at ERROR/WARNING level with tracebacks, what the export's exception
# then says again (a failed fake-tensor call, an unbacked symbol without user code)
_EXPORT_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes",
                   "torch.export._trace")


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]):
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# TypeErrors of binding the example inputs to forward's parameters (inspect.Signature.bind)
_SIGNATURE_ERROR = re.compile(r"too many positional arguments|missing a required argument|"
                              r"unexpected keyword argument|positional argument")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*([^\n]*)')
# torch's files and the whole eqsat_llm package's (this module is in eqsat_llm/capture/)
_NOT_USER = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)),
             "<frozen ")


def user_line(texts: list[str], tracebacks: list[Any] = ()) -> str | None:
    """The innermost frame outside torch and eqsat_llm in torch's messages or stack traces
    ('File "m.py", line 6, in forward' + the code line) or the exceptions' tracebacks, as
    'm.py:6 in forward: `code`'; None when torch recorded none."""
    frames = [(f, int(n), fn, code.strip()) for t in texts for f, n, fn, code in _FRAME.findall(t)]
    frames += [(fr.filename, fr.lineno, fr.name, (fr.line or "").strip())
               for tb in tracebacks for fr in traceback.extract_tb(tb)]
    user = [f for f in frames if not f[0].startswith(_NOT_USER)]
    if not user:
        return None
    f, n, fn, code = user[-1]
    return f"{f}:{n} in {fn}" + (f": `{code}`" if code else "")


def _data_dependent(exc: BaseException) -> bool:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    text = str(exc).lower()
    return isinstance(exc, GuardOnDataDependentSymNode) or "data-dependent" in text \
        or "data dependent" in text


DATA_DEPENDENT_HELP = ("programs here are captured once, with fixed control flow and static "
                       "shapes: make it branchless (torch.where, a mask of fixed shape), express "
                       "the branch with torch.cond, or move it out of the model's forward")


def _export_error(model: Any, failures: list[tuple[str, Exception, str]]) -> CaptureError:
    """A short CaptureError for a failed torch.export: what went wrong, the model's source
    line where torch names one, what to do. torch's full messages (and the partial graph it
    prints) are in the error's `details`."""
    where = user_line([str(e) for _, e, _ in failures], [e.__traceback__ for _, e, _ in failures])
    at = f" at {where}" if where else ""
    first = failures[0][1]
    if any(_data_dependent(e) for _, e, _ in failures):
        msg = (f"the model branches on the value of a tensor{at} (data-dependent control "
               f"flow: an `if`/`while` on a tensor, or `.item()`); {DATA_DEPENDENT_HELP}")
    elif isinstance(first, TypeError) and _SIGNATURE_ERROR.search(str(first)):
        try:
            sig = f"forward{inspect.signature(model.forward)}"
        except (TypeError, ValueError):
            sig = "the model's forward"
        msg = (f"the example inputs do not match {sig}: {first}; pass example_inputs "
               "(positional) and example_kwargs as forward takes them")
    else:
        text = str(first).strip()  # non-strict's: strict mode's mostly wraps the same error
        line = f"{type(first).__name__}: {text.splitlines()[0][:300] if text else ''}"
        msg = (f"torch.export could not capture the model{at}: {line} (check "
               "that the model runs in eager PyTorch on the example inputs; torch's full "
               "message: CaptureError.details)")
    err = CaptureError(msg)
    err.details = "\n".join(f"{mode}: {type(e).__name__}: {e}\n{printed}"
                             for mode, e, printed in failures)
    return err


def check_example_inputs(ep: ExportedProgram, example_inputs: tuple,
                         example_kwargs: dict | None) -> None:
    """An ExportedProgram is captured as exported (its example inputs are not traced again):
    example inputs given with it must be of the shapes and dtypes it was exported for."""
    if not example_inputs and not example_kwargs:
        return
    flat, spec = torch.utils._pytree.tree_flatten((tuple(example_inputs), example_kwargs or {}))
    if spec != ep.call_spec.in_spec:
        raise CaptureError(f"the example inputs are structured as {spec}, but the "
                           f"ExportedProgram takes {ep.call_spec.in_spec}")
    users = [s.arg.name for s in ep.graph_signature.input_specs
             if s.kind == InputKind.USER_INPUT]
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    for k, (x, name) in enumerate(zip(flat, users)):
        want = vals.get(name)
        if isinstance(x, torch.Tensor) and isinstance(want, torch.Tensor) and not has_symbolic_dims(
                want) and (x.shape != want.shape or x.dtype != want.dtype):
            raise CaptureError(f"example input {k} is {x.dtype}{list(x.shape)}, but the "
                               f"ExportedProgram was exported for {want.dtype}"
                               f"{list(want.shape)}: export it again for these shapes, or "
                               "pass the nn.Module")


def has_symbolic_dims(val: Any) -> bool:
    """A value torch left symbolic: a SymInt/SymFloat/SymBool (a number read from a tensor,
    `.item()`), or a tensor with a symbolic size (a dynamic dim, a data-dependent shape)."""
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    return isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape)


def _decompositions() -> dict:
    """Core-aten decompositions, except for scaled_dot_product_attention: kept whole, it maps
    to the registry's sdpa ops and the rules make it one attention kernel (decomposed, it is
    a dozen ops with a scale split across q and k and a guard for fully masked rows)."""
    table = torch.export.default_decompositions()
    table.pop(aten.scaled_dot_product_attention.default, None)
    return table
