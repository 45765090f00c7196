"""What the CPU can do: the instruction sets that decide which paths are fast or supported.

Machines that run echo2sdk differ: an Intel Xeon with AVX-512 and AMX, an AMD EPYC with AVX2 only. Two
decisions depend on it: the learner's precision (bf16 autocast is only fast with native bf16 matmul:
AVX512-BF16 or AMX) and what vLLM's CPU attention kernels support (fewer head sizes on AVX2). Both read
the flags here, from /proc/cpuinfo; every function takes the flags as an argument, so both branches are
tested on any machine.
"""

from __future__ import annotations

from functools import cache

__all__ = ["cpu_flags", "native_bf16", "describe"]


@cache
def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return fh.read()
    except OSError:  # not Linux: no flags, the conservative answers
        return ""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags ("avx2", "avx512f", "amx_bf16", ...), from the first `flags` line of
    /proc/cpuinfo (or of `cpuinfo`); empty when there is none."""
    text = _read_cpuinfo() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: frozenset[str]) -> bool:
    """True when the CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16). Elsewhere bf16 runs emulated
    kernels: an AVX2 EPYC took 289 s for a 16 x 100-token learner step in bf16 against 14 s in fp32."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def describe(flags: frozenset[str]) -> str:
    """The vector instruction sets in a few words, for messages: "AVX-512 + AMX", "AVX2 (no AVX-512)"."""
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_tile", "AMX")) if flag in flags]
        return " + ".join(["AVX-512", *extras])
    if "avx2" in flags:
        return "AVX2 (no AVX-512, no AMX)"
    return "no AVX2" if flags else "unknown (no /proc/cpuinfo flags)"
