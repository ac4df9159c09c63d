"""One fuzz model through the optimizer and every backend, against eager PyTorch."""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass

import torch

from .compare import mismatch, model_rtol
from .spec import FuzzModel, Spec, make_inputs


@dataclass
class Failure:
    backend: str  # "optimize" when optimizing itself failed
    message: str

    def __str__(self) -> str:
        return f"[{self.backend}] {self.message}"


def available_backends() -> list[str]:
    """The backends this machine can run: C with a compiler, Triton on CUDA or in Triton's
    interpreter (set when eqsat_llm was imported first), and the reference runtime."""
    from ..codegen.c.build import compiler
    from ..codegen.triton.launch import check_mode
    from ..errors import EqsatError

    found = ["c"] if compiler() is not None else []
    try:
        check_mode()
        found.append("triton")
    except (EqsatError, ImportError):
        pass
    return found + ["reference"]


def check_spec(spec: Spec, backends: list[str]) -> list[Failure]:
    """Optimize the spec's model once, run the program on each backend, compare with eager
    (the outputs, and the buffers a model writes in place after the call; such a model is
    called twice); the failures found (none: the model passed)."""
    from .. import optimize

    inputs = make_inputs(spec)
    with torch.no_grad():
        reference = FuzzModel(spec).eval()  # eager runs on a copy: it writes its buffers
        wide = FuzzModel(spec, wide=True)
        # a model with state is called twice: the second call reads what the first wrote
        eager = [_call(reference, inputs) for _ in range(2 if spec.buffers else 1)]
        exact = [_call(wide, inputs) for _ in eager]
    model = FuzzModel(spec).eval()
    state = [x.clone() for x in model.buffers()]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = optimize(model, inputs, backend=backends[0], measure_eager=False)
    except Exception as e:  # noqa: BLE001 - a valid model must optimize; any error is a bug
        return [Failure("optimize", _describe(e))]
    failures = []
    for backend in backends:
        for x, x0 in zip(model.buffers(), state):  # each backend from the initial state
            x.copy_(x0)
        try:
            program = compiled if backend == backends[0] else compiled.on_backend(backend)
            failures += _run(program, model, backend, inputs, eager, exact,
                             model_rtol(spec.dtypes()))
        except Exception as e:  # noqa: BLE001
            failures.append(Failure(backend, _describe(e)))
    return failures


def _call(model: torch.nn.Module, inputs: tuple) -> tuple:
    """The outputs and then the buffers after one call, copied (an output may be a buffer
    the next call writes)."""
    return tuple(t.clone() for t in model(*inputs) + tuple(model.buffers()))


def _run(program, model, backend: str, inputs: tuple, eager: list[tuple], exact: list[tuple],
         rtol: float) -> list[Failure]:
    before = [x.clone() for x in inputs]
    failures = []
    for call, (want, wide) in enumerate(zip(eager, exact)):
        got = program(*inputs)
        got = (got if isinstance(got, tuple) else (got,)) + tuple(model.buffers())
        if len(got) != len(want):
            return [Failure(backend, f"{len(got)} outputs, eager has {len(want)}")]
        n_out = len(want) - len(list(model.buffers()))
        for k, (g, e, x) in enumerate(zip(got, want, wide)):
            why = mismatch(g, e, x, rtol)
            if why is not None:
                what = f"output {k}" if k < n_out else f"buffer b{k - n_out} after the call"
                failures.append(Failure(backend, ("call 2, " if call else "") + f"{what}: {why}"))
    for k, (x, x0) in enumerate(zip(inputs, before)):
        if not torch.equal(x.nan_to_num(), x0.nan_to_num()):
            failures.append(Failure(backend, f"input {k} was written"))
    return failures


def _describe(e: Exception) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1]
    first = str(e).strip().split("\n")[0][:300]
    return f"{type(e).__name__}: {first} (at {where.filename.split('/')[-1]}:{where.lineno})"
