"""The CPU each benchmark names (`benchmarks._common.cpu_info`, from /proc/cpuinfo text), and the vector width
the attention kernel compiles for on this CPU (`kernels.cpu_attention.vector_lanes`): 16 with AVX-512, 8 with
AVX2 only, where the AVX-512 shapes spilled and ran at 0.76x the XLA path.

A separate file from test_cpu_attention.py, whose no-compiler subprocess test counts that file's tests."""
import os
import sys
from pathlib import Path

import pytest

from kernels import cpu_attention as ca

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks._common import cpu_info, isa_summary  # noqa: E402

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni

processor\t: 1
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni
"""
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2
"""
SAPPHIRE = ("model name\t: Intel(R) Xeon(R) Platinum 8481C\n"
            "flags\t\t: sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n")
OLD = "model name\t: Intel(R) Core(TM)2 Duo\nflags\t\t: fpu sse sse2 ssse3\n"
GRAVITON = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 sve\n"


@pytest.mark.parametrize("text,cpu,isa", [
    (XEON, "Intel(R) Xeon(R) CPU @ 2.20GHz", "avx512 (avx512_bf16)"),
    (EPYC, "AMD EPYC 7B13", "avx2"),
    (SAPPHIRE, "Intel(R) Xeon(R) Platinum 8481C", "avx512 (avx512_bf16, amx_bf16, amx_tile, amx_int8)"),
    (OLD, "Intel(R) Core(TM)2 Duo", "sse"),
])
def test_cpu_info_reads_the_model_and_the_isa(text, cpu, isa):
  info = cpu_info(text)
  assert info["cpu"] == cpu and info["cpu_isa"] == isa
  assert isinstance(info["cpu_cores"], int) and info["cpu_cores"] >= 1


def test_cpu_info_without_a_model_name_or_flags(monkeypatch):
  monkeypatch.setattr("platform.processor", lambda: "aarch64")
  assert cpu_info(GRAVITON)["cpu"] == "aarch64" and cpu_info(GRAVITON)["cpu_isa"] == "sve"
  assert cpu_info("")["cpu_isa"] == "unknown"
  assert isa_summary(["fp", "asimd"]) == "neon" and isa_summary([]) == "unknown"


def test_cpu_info_of_this_machine_is_json_ready():
  info = cpu_info()
  assert set(info) == {"cpu", "cpu_isa", "cpu_cores"} and info["cpu"] and info["cpu_isa"]
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      flags = next((line for line in f if line.startswith("flags")), "").split()
    if "avx512f" in flags:
      assert info["cpu_isa"].startswith("avx512")
    elif "avx2" in flags:
      assert info["cpu_isa"] == "avx2"


@pytest.mark.skipif(ca.find_compiler() is None, reason="no C++ compiler ($CXX, default g++) for the kernel")
def test_the_kernel_is_built_for_this_cpus_vector_width():
  """-march=native picks the width: 16 lanes only where the CPU has AVX-512, so an AVX2-only CPU gets the
  8-lane, 16-register shapes and not the AVX-512 ones split in two."""
  flags = ca._cpu_flags().split()
  if not flags:
    pytest.skip("no /proc/cpuinfo flags to compare with")
  assert ca.vector_lanes() == (16 if "avx512f" in flags else 8)
