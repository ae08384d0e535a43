#!/usr/bin/env python3
"""Disassembles the attend library's per-ISA objects (flash's and decode's isa_*.cpp)
and fails if an instruction could run where dispatch did not ask for it:

- isa_scalar objects: nothing beyond x86-64's baseline anywhere (the scalar path
  must run on any x86-64);
- isa_avx2 objects: kernel code (namespace isa_avx2, templates on SimdAvx2) nothing
  beyond AVX2;
- every isa_* object: functions outside its kernel region (inline functions from
  shared headers, which the linker may merge with other files' copies) nothing
  beyond the baseline, so a build on any compiler cannot leak wide instructions
  into generic code (src/cpu/target_region.h).

Usage: check_isa_objects.py <expected object count> <object>...
Prints "isa objects clean: N" on success.
"""
import re
import subprocess
import sys

# Anything VEX/EVEX-encoded (mnemonics starting with v), wide registers, mask
# registers, and the BMI/LZCNT instructions: none of them is x86-64 baseline.
BEYOND_BASELINE = re.compile(
    r"\t(v[a-z0-9]+|shlx|shrx|sarx|rorx|andn|bzhi|pdep|pext|mulx|blsi|blsr|blsmsk|lzcnt|tzcnt)\s"
    r"|%[yz]mm|%k[0-7]\b")
BEYOND_AVX2 = re.compile(r"%zmm|%k[0-7]\b|\ttile|\tvdpbf16|\tvcvtne2ps2bf16|\tvcvtneps2bf16")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def functions(obj):
    asm = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", obj],
                         check=True, capture_output=True, text=True).stdout
    name, body = None, []
    for line in asm.splitlines():
        m = FUNCTION.match(line)
        if m:
            if name is not None:
                yield name, body
            name, body = m.group(1), []
        elif name is not None and line.strip():
            body.append(line)
    if name is not None:
        yield name, body


def check(obj):
    family = re.search(r"isa_(scalar|avx2|avx512|avx512bf16)\.cpp", obj).group(1)
    simd = {"scalar": "SimdScalar", "avx2": "SimdAvx2", "avx512": "SimdAvx512", "avx512bf16": "SimdAvx512"}[family]
    problems = []
    for name, body in functions(obj):
        # Kernel code: the region's namespace, or anything instantiated on the family's
        # Simd type (unique to this family, so never merged with another's copy), or
        # the AMX tile units (cpu/amx_tiles.h: defined only inside AVX-512 regions).
        kernel = f"isa_{family}::" in name or simd in name or (simd == "SimdAvx512" and "AmxTiles" in name)
        if family == "scalar" or not kernel:
            forbidden, what = BEYOND_BASELINE, "beyond x86-64 baseline"
        elif family == "avx2":
            forbidden, what = BEYOND_AVX2, "beyond AVX2"
        else:
            continue
        hits = [line for line in body if forbidden.search(line)]
        if hits:
            where = "kernel" if kernel else "shared (outside the target region)"
            problems.append(f"{obj}: {where} function {name}: {len(hits)} instructions {what}, "
                            f"e.g. {hits[0].strip()}")
    return problems


def main(argv):
    expected = int(argv[1])
    objects = [o for arg in argv[2:] for o in arg.split(";") if re.search(r"isa_\w+\.cpp\.o(bj)?$", o)]
    problems = [p for obj in objects for p in check(obj)]
    for p in problems:
        print(p)
    if len(objects) != expected:
        print(f"expected {expected} isa_* objects, found {len(objects)}")
        return 1
    if problems:
        return 1
    print(f"isa objects clean: {len(objects)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
