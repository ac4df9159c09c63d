"""The per-user cache of compiled programs and machine calibrations.

$XDG_CACHE_HOME/eqsat-llm/<kind>/ (~/.cache when unset). Entries are named by a content hash
of what they were built from, written atomically (a unique temporary file renamed into
place, so two processes building the same entry at once both end with a whole file), and
read back only when they are what was built:

- The cache directory must be the user's own and writable by nobody else; one that is not
  (another owner, group- or world-writable) is not used: the process gets a private
  temporary directory instead, with a CacheWarning. Nobody else can then plant an entry.
- A compiled object is stored beside the SHA-256 of its bytes (`<entry>.sha256`) and loaded
  only when the bytes hash to it: a truncated, corrupted or foreign file is rebuilt, never
  loaded."""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
import tempfile
import threading
import warnings
from functools import cache
from pathlib import Path
from typing import Any


class CacheWarning(UserWarning):
    """The compile cache could not be used as is (documented fallback: a private one)."""


def base_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "eqsat-llm"


def cache_dir(kind: str) -> Path:
    """The directory of one kind of entry ("c", "triton", "calibration"), created private;
    a private temporary directory when the user's is not safe to read from."""
    path = base_dir() / kind
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _unsafe(path) or _unsafe(path.parent)
    except OSError as e:
        problem = str(e)
    return path if problem is None else _private(path, problem)


@cache  # one private directory (and one warning) per process and refused directory
def _private(path: Path, problem: str) -> Path:
    private = Path(tempfile.mkdtemp(prefix=f"eqsat-llm-{path.name}-"))
    warnings.warn(f"not using the compile cache {path}: {problem}; this process caches in "
                  f"{private} instead (fix the directory's owner or mode to share builds)",
                  CacheWarning, stacklevel=3)
    return private


def _unsafe(path: Path) -> str | None:
    """Why a directory is not safe to load code from (None: it is)."""
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def write_atomic(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all, even with other writers of the same entry."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def store_verified(path: Path, data: bytes) -> None:
    """Store an entry with the digest it is checked against when loaded."""
    write_atomic(path, data)
    write_atomic(_digest_path(path), hashlib.sha256(data).hexdigest().encode())


def is_verified(path: Path) -> bool:
    """Whether `path` holds exactly the bytes that were stored with its digest."""
    try:
        want = _digest_path(path).read_text().strip()
        return hashlib.sha256(path.read_bytes()).hexdigest() == want
    except OSError:
        return False


def load_pickled(path: Path, what: str) -> Any:
    """The object pickled at `path` by a store_verified, or None: absent, or (warned, so
    that the caller rebuilds it) not matching its digest or not readable by this version."""
    if not path.exists():
        return None
    if not is_verified(path):
        warnings.warn(f"{what} {path} does not match its digest; rebuilding it", CacheWarning,
                      stacklevel=3)
        return None
    try:
        return pickle.loads(path.read_bytes())
    except (pickle.UnpicklingError, AttributeError, ImportError, EOFError, TypeError,
            ValueError, RuntimeError) as e:  # an entry another version wrote: rebuild it
        warnings.warn(f"{what} {path} could not be read ({type(e).__name__}: {e}); rebuilding "
                      "it", CacheWarning, stacklevel=3)
        return None


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")
