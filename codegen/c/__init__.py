"""The C backend: a planned IR program as one generated C translation unit, compiled with the
system compiler (OpenMP, optional OpenBLAS for GEMMs) and called through ctypes.
docs/c-backend.md."""

from .emit import SUPPORTED_OPS, emit_program
from .errors import CCompileError, KernelIndexError, UnsupportedByBackend
from .runtime import CRuntime
from .standalone import save_standalone

__all__ = [
           "SUPPORTED_OPS",
           "CCompileError",
           "CRuntime",
           "KernelIndexError",
           "UnsupportedByBackend",
           "emit_program",
           "save_standalone",
]
