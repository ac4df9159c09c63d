"""A differential fuzzer: random valid models of the torch functions LLM code calls, each
optimized and run on every backend and compared with eager PyTorch (docs/fuzzing.md)."""

from .check import Failure, available_backends, check_spec
from .run import FuzzResult, fuzz, load_regression, save_regression
from .spec import FuzzModel, Spec, make_inputs

__all__ = ["Failure", "FuzzModel", "FuzzResult", "Spec", "available_backends", "check_spec",
           "fuzz", "load_regression", "make_inputs", "save_regression"]
