"""The compile cache: an entry is loaded only when its bytes are the ones built; a directory
others can write is not used; processes building the same program at once all succeed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from eqsat_llm.cache import CacheWarning, cache_dir, is_verified
from eqsat_llm.codegen.c.runtime import CRuntime

from .test_c_backend import small_graph


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _replace(path, data: bytes) -> None:
    """Swap the file (a new inode: the copy this process has loaded is left alone)."""
    tmp = path.with_name("swap.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign", "no_digest"])
def test_a_damaged_or_foreign_entry_is_rebuilt_not_loaded(cache_home, damage):
    first = CRuntime(small_graph())
    entry = first.so_path
    good = entry.read_bytes()
    if damage == "truncated":
        _replace(entry, good[: len(good) // 2])
    elif damage == "garbage":
        _replace(entry, b"\x7fELF" + os.urandom(4096))
    elif damage == "foreign":  # a working shared object, but not the one this entry built
        _replace(entry, (cache_home / "other.so").read_bytes()
                 if (cache_home / "other.so").exists() else _foreign_object(cache_home))
    else:  # planted without the digest its build writes
        entry.with_name(entry.name + ".sha256").unlink()
    assert not is_verified(entry)
    again = CRuntime(small_graph())
    assert not again.cache_hit and again.so_path == entry
    assert is_verified(entry) and entry.read_bytes() == good
    x = small_graph_inputs()
    assert [t.tolist() for t in again.run(x)] == [t.tolist() for t in first.run(x)]


def _foreign_object(home) -> bytes:
    src = home / "other.c"
    src.write_text("int eq_other(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(home / "other.so")],
                   check=True)
    return (home / "other.so").read_bytes()


def small_graph_inputs():
    import torch

    g = small_graph()
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(g.type_of(i).shape, generator=gen) for i in g.input_ids]


def test_a_directory_others_can_write_is_not_used(cache_home):
    shared = cache_home / "eqsat-llm" / "c"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.warns(CacheWarning, match="writable by others"):
        runtime = CRuntime(small_graph())
    assert not runtime.so_path.is_relative_to(shared)
    assert not list(shared.iterdir())


def test_the_cache_directory_is_private(cache_home):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        path = cache_dir("c")
    assert path.stat().st_mode & 0o077 == 0


def test_processes_building_the_same_program_at_once_all_succeed(cache_home):
    script = textwrap.dedent("""
        import torch
        from eqsat_llm.codegen.c.runtime import CRuntime
        from tests.test_c_backend import small_graph
        g = small_graph()  # x * exp(x)
        x = torch.randn(g.type_of(g.input_ids[0]).shape)
        (got,) = CRuntime(g).run([x])
        assert torch.allclose(got, x.exp() * x, atol=1e-5)
        print("ok")
    """)
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]
    entries = list((cache_home / "eqsat-llm" / "c").glob("*.so"))
    assert len(entries) == 1 and is_verified(entries[0])
    assert not list((cache_home / "eqsat-llm" / "c").glob(".*.tmp"))
