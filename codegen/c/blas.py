"""Finding the BLAS the generated code may call: scipy-openblas32 from PyPI
(libscipy_openblas.so, cblas symbols prefixed `scipy_`). Optional: without it every GEMM runs
the generated kernel."""

from __future__ import annotations

import ctypes
import os
from functools import cache


@cache
def openblas_dir() -> str | None:
    """The folder holding libscipy_openblas.so, or None when the package is not installed."""
    if os.environ.get("EQSAT_C_NO_BLAS"):
        return None
    try:
        import scipy_openblas32  # type: ignore[import-not-found]
    except ImportError:
        return None
    d = scipy_openblas32.get_lib_dir()
    return d if os.path.exists(os.path.join(d, "libscipy_openblas.so")) else None


@cache
def load_openblas() -> ctypes.CDLL | None:
    """Load the library once, globally, single-threaded: the generated code splits each GEMM
    over its own OpenMP threads (two thread pools would fight over the cores)."""
    d = openblas_dir()
    if d is None:
        return None
    lib = ctypes.CDLL(os.path.join(d, "libscipy_openblas.so"), mode=ctypes.RTLD_GLOBAL)
    lib.scipy_openblas_set_num_threads(1)
    return lib


def link_flags() -> list[str]:
    d = openblas_dir()
    if d is None:
        return []
    return ["-DEQ_USE_BLAS", f"-L{d}", "-l:libscipy_openblas.so", f"-Wl,-rpath,{d}"]
