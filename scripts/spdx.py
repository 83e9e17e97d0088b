#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Adds "SPDX-License-Identifier: MIT" to every source file git tracks that
# lacks it (the kinds TestSPDX in format_test.go checks): // in Go, /* */ in
# C, # after the shebang in scripts and first in Makefiles and gnuplot files.
# Run from anywhere: python3 scripts/spdx.py
import subprocess, re, os, sys
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.chdir(root)
files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
TAG = "SPDX-License-Identifier: MIT"
changed = 0
def kind(path, first):
    base = os.path.basename(path)
    if path.endswith(".go"): return "go"
    if path.endswith((".c", ".h")): return "c"
    if base == "Makefile" or path.endswith((".sh", ".gp")): return "hash"
    if first.startswith("#!") and ("sh" in first or "python" in first): return "hash"
    return None
for f in files:
    if "/testdata/" in f or f.startswith("bench/results/") or not os.path.isfile(f):
        continue
    try:
        s = open(f, encoding="utf-8").read()
    except UnicodeDecodeError:
        continue
    first = s.split("\n", 1)[0]
    k = kind(f, first)
    if k is None or "SPDX-License-Identifier" in s[:400]:
        continue
    if k == "go":
        s = "// " + TAG + "\n\n" + s
    elif k == "c":
        s = "/* " + TAG + " */\n" + s
    else:
        if first.startswith("#!"):
            rest = s.split("\n", 1)[1] if "\n" in s else ""
            s = first + "\n# " + TAG + "\n" + rest
        else:
            s = "# " + TAG + "\n" + s
    mode = os.stat(f).st_mode
    open(f, "w", encoding="utf-8").write(s)
    os.chmod(f, mode)
    changed += 1
print("added SPDX to", changed, "files")
