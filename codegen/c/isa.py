"""The instruction sets the generated C may use: all of this machine's (`-march=native`), or
fewer, so that a wide machine builds and runs the narrower paths of every kernel.

Each kernel picks its path at compile time from the compiler's macros (__AVX512F__,
__AVX512VNNI__, __AVXVNNI__, __AVX2__, __FMA__, __F16C__, __SSE4_1__); no Python code chooses
a kernel by the host's ISA. So switching an extension off is a compiler flag after
`-march=native`, and, being in the flags, it is part of the compile cache's key.

    EQSAT_ISA=avx2 bash scripts/test-isa      # or: EQSAT_ISA=portable python -m pytest ...

`native` (the default) adds nothing. `avx2` is Haswell to Zen 3: AVX2, FMA and F16C, no
AVX-512 (-mno-avx512f turns off every AVX-512 extension, VNNI, BF16 and FP16 with it) and no
AVX-VNNI (which Sapphire Rapids keeps without AVX-512: the int8 kernel would take its
vpdpbusd path, not vpmaddubsw). `sse` is SSE4.2 (no AVX: the 4-float vector paths with their
SSE4.1 intrinsics). `portable` is x86-64's baseline, SSE2: the kernels' plain C and GNU
vector paths, as on a machine with no extension at all."""

from __future__ import annotations

import os

ISA_FLAGS: dict[str, list[str]] = {
    "native": [],
    "avx2": ["-mno-avx512f", "-mno-avxvnni"],
    "sse": ["-mno-avx"],
    "portable": ["-mno-sse3"],
}

ISA_ENV = "EQSAT_ISA"


def isa_name() -> str:
    """The setting of $EQSAT_ISA (native when unset)."""
    return os.environ.get(ISA_ENV) or "native"


def isa_flags(isa: str | None = None) -> list[str]:
    """The flags that restrict `-march=native` to `isa` (default: $EQSAT_ISA)."""
    name = isa if isa is not None else isa_name()
    if name not in ISA_FLAGS:
        raise ValueError(f"{ISA_ENV}={name!r}: expected one of {', '.join(ISA_FLAGS)}")
    return list(ISA_FLAGS[name])
