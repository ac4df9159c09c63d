"""The shared kernel library (codegen/c/kernel_library.py): a program includes the libraries'
headers and calls the library compiled once per flag set; the kernels' index-error flag is
the library's; two flag sets in one process make two libraries whose names stay apart; the
library compiled once, in the background of a start; a library missing from the compile
cache is built again."""

from __future__ import annotations

import ctypes

import pytest
import torch

from eqsat_llm.codegen.c import CRuntime, KernelIndexError
from eqsat_llm.codegen.c import build as c_build
from eqsat_llm.codegen.c.build import CFLAGS, build, cache_dir, compiler
from eqsat_llm.codegen.c.emit import emit_program
from eqsat_llm.ir import Graph
from eqsat_llm.ops import add_gemm

from .conftest import const, inp
from .eager_oracle import run_eager

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")


def _embedding_then_gemm() -> Graph:
    """Rows of a table picked by ids (an out-of-range id flags an index error), times a packed
    constant weight (the packed GEMM: a library call)."""
    gen = torch.Generator().manual_seed(0)
    g = Graph()
    x = g.add("embedding", (const(g, torch.randn(10, 24, generator=gen)), inp(g, (3,), "int64")))
    g.outputs = [add_gemm(g, x, const(g, torch.randn(24, 40, generator=gen)))]
    return g


GOOD = [torch.tensor([1, 9, 0])]


def _check(rt: CRuntime, g: Graph) -> None:
    torch.testing.assert_close(rt.run(GOOD)[0], run_eager(g, GOOD)[0], rtol=1e-5, atol=1e-5)


def test_a_program_calls_the_library_instead_of_compiling_its_text():
    g = _embedding_then_gemm()
    rt = CRuntime(g)
    _check(rt, g)
    assert rt.program.linked and "eq_gemm_packed(int64_t M" in rt.source  # the prototype
    linked = rt.so_path.read_bytes()
    # the packed GEMM's parallel region, outlined by OpenMP: compiled in a whole-text build
    whole = build(emit_program(g, rt.plan), list(CFLAGS)).path.read_bytes()
    region = b"eq_gemm_packed._omp_fn"
    assert region in whole and b"eqk-" not in whole
    assert region not in linked and b"eqk-" in linked  # (the library it needs)
    assert len(linked) < len(whole)


def test_an_index_error_in_a_linked_program_raises():
    """The embedding kernel flags the id 10 in the library's flag, which the runtime reads."""
    g = _embedding_then_gemm()
    rt = CRuntime(g)
    with pytest.raises(KernelIndexError, match="out of range"):
        rt.run([torch.tensor([1, 10, 0])])
    _check(rt, g)  # the flag was cleared


def test_two_flag_sets_make_two_libraries_in_one_process():
    """Programs of the same graph built with other tile constants link their own library,
    its entry points named apart: each runs right beside the other."""
    g = _embedding_then_gemm()
    a, b = CRuntime(g), CRuntime(g, flags=[*CFLAGS, "-DEQ_KC=16"])
    assert a.so_path != b.so_path
    libraries = {p.name for p in cache_dir().glob("eqk-*.so")}
    assert sum(name in a.so_path.read_bytes().decode("latin-1") for name in libraries) == 1
    assert sum(name in b.so_path.read_bytes().decode("latin-1") for name in libraries) == 1
    assert ctypes.addressof(a._index_error) != ctypes.addressof(b._index_error)
    for rt in (a, b, a):
        _check(rt, g)


def test_the_library_is_compiled_once_in_the_background_and_again_when_missing(
        tmp_path, monkeypatch):
    """prepare_kernel_library (a start's first step) compiles it in a thread; the program's
    build waits for that compile instead of making its own. A library gone from the cache is
    compiled again before a cached program that needs it is returned."""
    own = tmp_path / "c"  # a compile cache of its own: the run's is shared by the workers
    own.mkdir()
    monkeypatch.setattr(c_build, "cache_dir", lambda: own)
    compiles: list[str] = []
    compile_one = c_build._compile

    def counted(cc, program, flags, target, link=None):
        compiles.append("library" if "-fvisibility=hidden" in flags else "program")
        compile_one(cc, program, flags, target, link)
    monkeypatch.setattr(c_build, "_compile", counted)
    g = _embedding_then_gemm()
    c_build.prepare_kernel_library()
    assert compiles in ([], ["library"])  # (the thread may have begun)
    _check(CRuntime(g), g)
    assert compiles == ["library", "program"]
    (library,) = own.glob("eqk-*.so")
    library.unlink()
    rt = CRuntime(g)  # the program from the cache, its library compiled again
    assert rt.cache_hit and library.exists() and compiles == ["library", "program", "library"]
    _check(rt, g)
