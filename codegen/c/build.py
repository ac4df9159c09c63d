"""Compiling a generated program into a shared object, cached by a hash of the source, the
flags and the compiler: $XDG_CACHE_HOME/eqsat-llm/c/<hash>.so (~/.cache when unset). An entry
is loaded only if its bytes are the ones its build stored (eqsat_llm/cache.py)."""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ...cache import cache_dir as user_cache_dir
from ...cache import is_verified, store_verified
from .errors import CCompileError
from .isa import isa_flags

if TYPE_CHECKING:  # (emit imports the kernels, which load their helpers through build)
    from .emit import Program
    from .kernel_library import LibraryBuild

# -fno-trapping-math: no program reads the floating-point exception flags, and without it GCC
# 12 vectorizes no loop that calls eq_expf (silu, gelu, sigmoid epilogues, the SwiGLU join);
# the values are IEEE's either way. Measured by benchmarks/cflags_ab.py (interleaved, 9
# rounds, two runs): LLaMA block prefill 0.90-0.93x the time without it, decode 0.84-0.94x,
# GPT-2 0.72x.
# -fno-ipa-pure-const -fno-ipa-modref: GCC 12 (-O1 and above, with -fopenmp) rewrites some
# strided `omp simd` copies' addresses from one integer induction variable, then summarises the
# kernel as free of side effects, and its caller drops the call: the kernel's output is never
# written and the program reads stale arena bytes (wrong logits in GLM-4, StableLM, Nemotron,
# gpt-oss and others from 24 tokens on). Without those summaries no call is dropped;
# tests/c_fixtures/lost_stores.c is the reduced case, run by tests/test_c_compiler.py. The
# block's prefill and decode times are unchanged (docs/c-backend.md).
# $EQSAT_ISA (isa.py) narrows -march=native, read once here: flags a caller appends after
# CFLAGS (a test's -mavx512vnni) still win.
CFLAGS = ["-O3", "-march=native", *isa_flags(), "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
          "-fno-math-errno", "-fno-trapping-math", "-fno-ipa-pure-const", "-fno-ipa-modref"]

# the profiling build (emit.py): each kernel call adds its wall time to eq_profile[k]
PROFILE_FLAG = "-DEQ_PROFILE"


def compiler() -> str | None:
    cc = os.environ.get("CC", "cc")
    return shutil.which(cc)


def builds_with(macro: str) -> bool:
    """Whether the backend's C is compiled with `macro` defined (an ISA extension's, such as
    __AVX512BW__): the cost model prices a kernel whose fast path needs it (the kernels pick
    their paths from these macros)."""
    return macro in backend_defines()


def backend_defines() -> frozenset[str]:
    """The macros the backend's C is compiled with: -march=native narrowed by $EQSAT_ISA."""
    return compiler_defines(("-march=native", *isa_flags()))


def compiler_defines(flags: tuple[str, ...]) -> frozenset[str]:
    """The macros the C compiler ($CC) defines with `flags` (none without a compiler)."""
    cc = compiler()
    return frozenset() if cc is None else _defines(cc, flags)


def isa_fingerprint() -> str:
    """The vector extensions the backend's C is built with (its ISA macros, $EQSAT_ISA
    applied): the optimized program depends on them (the cost model prices kernels by their
    fast paths, builds_with), so the program cache and the start records key on them; a
    cache carried to another CPU, or read under another EQSAT_ISA, is not reused."""
    return " ".join(sorted(m for m in backend_defines()
                           if m.startswith(("__AVX", "__FMA", "__F16C", "__SSE", "__AMX"))))


@cache
def _defines(cc: str, flags: tuple[str, ...]) -> frozenset[str]:
    out = subprocess.run([cc, *flags, "-dM", "-E", "-x", "c", os.devnull], check=False,
                         capture_output=True, text=True)
    return frozenset(line.split()[1] for line in out.stdout.splitlines()
                     if line.startswith("#define ")) if out.returncode == 0 else frozenset()


@cache
def _compiler_id(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], check=False, capture_output=True, text=True,
                             timeout=30)
        return out.stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return cc


def cache_dir() -> Path:
    return user_cache_dir("c")


@dataclass
class Built:
    path: Path
    cache_hit: bool
    seconds: float  # the compile's (the shared kernel library's included when it was built)
    index_error_symbol: str = "eq_index_error"  # the flag its kernels set


def build(program: Program, flags: list[str]) -> Built:
    """Compile (or find in the cache) `program`; raise CCompileError naming the kernel. A
    program built against the shared kernel library (`program.linked`) has it built first
    (kernel_library.py), beside it in the cache."""
    cc = compiler()
    if cc is None:
        raise CCompileError(None, "no C compiler found (set CC or install cc)", [])
    t0 = time.perf_counter()
    link: list[str] = []
    symbol = "eq_index_error"
    if getattr(program, "linked", False):
        lib, lib_path = kernel_library_for(flags)
        _ensure_library(cc, lib, lib_path)  # (waits for prepare_kernel_library's compile)
        flags = [*flags, *lib.program_defines()]
        link = lib.link_flags(lib_path)
        symbol = lib.index_error_symbol
    key = hashlib.sha256("\0".join([program.source, *flags, _compiler_id(cc)]).encode())
    target = cache_dir() / f"{key.hexdigest()[:32]}.so"
    if is_verified(target):
        return Built(target, True, time.perf_counter() - t0, symbol)
    _compile(cc, program, flags, target, link)
    return Built(target, False, time.perf_counter() - t0, symbol)


def kernel_library_for(flags: list[str]) -> tuple[LibraryBuild, Path]:
    """The shared kernel library that a program compiled with `flags` links against, and
    where the compile cache keeps it (needs a C compiler)."""
    # (imported here: the libraries' modules load their helpers through this one)
    from .kernel_library import library_build
    lib = library_build(tuple(flags), _compiler_id(compiler() or "cc"))
    return lib, cache_dir() / lib.file_name


def _ensure_library(cc: str, lib: LibraryBuild, path: Path) -> None:
    """The library compiled into `path` unless the cache holds it. One compile at a time (a
    lock file beside it, an open file description each: threads of one process wait on it
    too): the others wait, then find it (a start's background compile and its first
    program's build; a parallel start's parent and children)."""
    from .kernel_library import SOURCE
    if is_verified(path):
        return
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes, or the process dies)
        if not is_verified(path):
            _compile(cc, _HelperSource(SOURCE), list(lib.flags), path)


def prepare_kernel_library(flags: list[str] | None = None) -> None:
    """Start compiling the shared kernel library for programs built with `flags` (CFLAGS) in
    a background thread, where the compile cache lacks it: a start overlaps its 5 s of gcc
    with the optimization before its first program (whose build waits for it). A failure
    there is left to that build, which compiles the library itself and reports it."""
    cc = compiler()
    if cc is None:
        return
    lib, path = kernel_library_for(list(CFLAGS) if flags is None else flags)

    def compile_quietly() -> None:
        try:
            _ensure_library(cc, lib, path)
        except (CCompileError, OSError):
            pass
    if not is_verified(path):
        threading.Thread(target=compile_quietly, daemon=True, name="eqsat-kernel-library").start()


def _compile(cc: str, program: Program | _HelperSource, flags: list[str], target: Path,
             link: list[str] | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="eqsat-c-") as tmp:
        src = Path(tmp) / "model.c"
        src.write_text(program.source)
        obj = Path(tmp) / "model.so"
        # (the libraries after the source: a linker that drops the unneeded ones keeps them)
        cmd = [cc, *flags, str(src), "-o", str(obj), *(link or []), "-lm"]
        res = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if res.returncode != 0:
            raise CCompileError(_blame(program, res.stderr), res.stderr, cmd)
        store_verified(target, obj.read_bytes())


@dataclass(frozen=True)
class _HelperSource:
    """A hand-written C library as build() reads a program: its source, no kernels to blame."""
    source: str

    @staticmethod
    def kernel_at(line: int) -> None:
        return None


@cache
def helper_library(source: str) -> ctypes.CDLL | None:
    """A small hand-written C library of load-time helpers (quantizer.py),
    built once per machine through the compile cache; None where no C compiler is found."""
    if compiler() is None:
        return None
    return ctypes.CDLL(str(build(_HelperSource(source), CFLAGS).path))  # type: ignore[arg-type]


def _blame(program: Program | _HelperSource, stderr: str) -> str | None:
    """The kernel the first error is in (errors on other lines, e.g. a bad flag: None)."""
    for m in re.finditer(r"model\.c:(\d+):(?:\d+:)? (?:fatal )?error", stderr):
        k = program.kernel_at(int(m.group(1)))
        if k is not None:
            return k.name
    return None
