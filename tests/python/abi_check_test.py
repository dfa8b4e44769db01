# SPDX-License-Identifier: MIT
"""abi_check_test - the ctypes mirror in adapters/python/wex against
src/include/wex.h (test py_abi): every mirrored struct's size, alignment,
field offsets, sizes and order, the constants and the dtype table as
abi_dump prints them compiled against the header, and every wex_* function
the package calls declared with the header prototype's argument and
return types (a uint64 passed as a default int, or a pointer returned as
one, is cut to 32 bits on x86-64 without a word).

usage: abi_check_test.py ABI_DUMP WEX_H PACKAGE_DIR
"""
import ctypes
import glob
import os
import re
import subprocess
import sys

import wex

# C types of the header's prototypes, as ctypes spells them.
CTYPES = {"int": ctypes.c_int, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
          "size_t": ctypes.c_size_t, "ssize_t": ctypes.c_ssize_t, "void": None}


def c_type(decl):
    """(base type name, pointer depth) of a C declaration without its name."""
    decl = re.sub(r"\s+", " ", decl.strip())
    base = re.sub(r"\b(const|struct)\b", "", decl.replace("*", "")).split()
    return (base[0] if base else "void"), decl.count("*")


def same(c, py):
    """Whether ctypes type py passes C type c (a c_type result) unchanged."""
    base, ptr = c
    if ptr == 0:
        want = CTYPES[base]
        return py is want or (want is not None and py is not None and
                              ctypes.sizeof(py) == ctypes.sizeof(want) and
                              py._type_ == want._type_)
    if py is None:
        return False
    if ptr == 1 and base == "char":
        return py is ctypes.c_char_p
    # Any other pointer: a pointer type of pointer size.
    return ctypes.sizeof(py) == ctypes.sizeof(ctypes.c_void_p) and (
        py in (ctypes.c_void_p, ctypes.c_char_p) or
        (hasattr(py, "_type_") and not isinstance(py._type_, str)) or
        getattr(py, "_type_", "") == "P")


def check_dump(out, bad):
    structs = {"wex_tensor": wex.Tensor, "wex_sync_result": wex.SyncResult,
               "wex_layout_tensor": wex.LayoutTensor, "wex_client_params": wex._Params}
    lines = [line.split() for line in out.splitlines()]
    for w in lines:
        if w[0] in structs and w[1] == "size":
            py = structs[w[0]]
            if (ctypes.sizeof(py), ctypes.alignment(py)) != (int(w[2]), int(w[4])):
                bad.append("%s: C size/align %s/%s, ctypes %d/%d" % (
                    w[0], w[2], w[4], ctypes.sizeof(py), ctypes.alignment(py)))
        elif "." in w[0] and w[1] == "off":
            s, f = w[0].split(".")
            if f not in [n for n, _ in structs[s]._fields_]:
                bad.append("%s.%s missing in ctypes" % (s, f))
                continue
            d = getattr(structs[s], f)
            if (d.offset, d.size) != (int(w[2]), int(w[4])):
                bad.append("%s.%s: C off/size %s/%s, ctypes %d/%d" % (
                    s, f, w[2], w[4], d.offset, d.size))
        elif w[0] == "const":
            if getattr(wex, w[1], None) != int(w[2]):
                bad.append("constant %s: C %s, python %r" % (w[1], w[2], getattr(wex, w[1], None)))
        elif w[0] == "dtype":
            i, name, size = int(w[1]), w[2], int(w[3])
            if wex.DTYPES[i] != name or (i and wex.DTYPE_SIZE[name] != size):
                bad.append("dtype %d: C %s/%d, python %s" % (i, name, size, wex.DTYPES[i]))
    for s, py in structs.items():
        cf = [w[0].split(".")[1] for w in lines if w[0].startswith(s + ".")]
        if cf != [n for n, _ in py._fields_]:
            bad.append("%s field order: C %s, ctypes %s" % (s, cf, [n for n, _ in py._fields_]))


def check_functions(header, pkg, bad):
    text = re.sub(r"/\*.*?\*/", "", open(header).read(), flags=re.S)
    protos = {}
    for m in re.finditer(r"WEX_API\s+([^;(]*?)\b(wex_\w+)\s*\(([^)]*)\)\s*;", text):
        ret, name, args = m.groups()
        args = [] if args.strip() in ("", "void") else [
            a if a.strip().endswith("*") else re.sub(r"\b\w+\s*$", "", a.strip())
            for a in args.split(",")]
        protos[name] = (c_type(ret), [c_type(a) for a in args])
    lib = wex.lib()
    src = "".join(open(f).read() for f in glob.glob(os.path.join(pkg, "*.py")))
    used = sorted(set(re.findall(r"\b(wex_[a-z_]+)\b", src)) & set(protos))
    for name in used:
        f = getattr(lib, name, None)
        if f is None:
            continue  # (an optional entry point this build lacks)
        cret, cargs = protos[name]
        if f.argtypes is None:
            bad.append("%s: argtypes not set" % name)
            continue
        if not same(cret, f.restype):
            bad.append("%s: returns %s, restype %r" % (name, cret, f.restype))
        if len(cargs) != len(f.argtypes):
            bad.append("%s: %d args in C, %d argtypes" % (name, len(cargs), len(f.argtypes)))
        for i, (ca, pa) in enumerate(zip(cargs, f.argtypes)):
            if not same(ca, pa):
                bad.append("%s arg %d: C %s, argtypes %r" % (name, i, ca, pa))
    print("header prototypes: %d; used by the binding: %d" % (len(protos), len(used)))
    if not used:
        bad.append("no wex_* function of the header found in %s" % pkg)


def main():
    dump, header, pkg = sys.argv[1:4]
    bad = []
    check_dump(subprocess.run([dump], capture_output=True, text=True, check=True).stdout, bad)
    check_functions(header, pkg, bad)
    for b in bad:
        print("MISMATCH", b)
    print("FAIL" if bad else "PASS: the ctypes mirror agrees with wex.h")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
