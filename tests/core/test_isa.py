"""CPU instruction sets: both branches of every ISA-dependent decision, on whichever machine runs the tests."""

from __future__ import annotations

from echo2sdk.core import isa

# /proc/cpuinfo flag lines (abridged) of the two machine kinds this project runs on.
XEON = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma sha_ni\n"


def test_flags_come_from_the_first_flags_line():
    assert isa.cpu_flags(XEON) >= {"avx2", "avx512f", "amx_bf16"}
    assert isa.cpu_flags("processor: 0\n") == frozenset()


def test_native_bf16_only_with_avx512_bf16_or_amx():
    assert isa.native_bf16(isa.cpu_flags(XEON))
    assert isa.native_bf16(frozenset({"amx_bf16"}))
    assert not isa.native_bf16(isa.cpu_flags(EPYC))
    assert not isa.native_bf16(frozenset({"avx512f"}))  # AVX-512 without its bf16 extension


def test_describe_names_what_is_there_and_what_is_missing():
    assert isa.describe(isa.cpu_flags(XEON)) == "AVX-512 + AVX512-BF16 + AMX"
    assert isa.describe(isa.cpu_flags(EPYC)) == "AVX2 (no AVX-512, no AMX)"
    assert isa.describe(frozenset()) == "unknown (no /proc/cpuinfo flags)"


def test_this_machine_is_described():
    assert isa.describe(isa.cpu_flags()) != "unknown (no /proc/cpuinfo flags)"
