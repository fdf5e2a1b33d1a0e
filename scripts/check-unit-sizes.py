#!/usr/bin/env python3
"""Checks that no file in src/ runs past 500 lines and no function defined there past 80
(CONTRIBUTING's "a file past ~500 lines is usually two concepts"; a function past 80 is usually
named steps not yet named).

A function is a brace block opened outside any other function, at namespace or class scope,
after a header that closes a parameter list (`...)`, `...) const`, `...) : member_(x)`, ...);
its length runs from the header's first line to the closing brace. Lambdas and local classes
count toward the function that holds them.

    scripts/check-unit-sizes.py [--root DIR]   # exit 1 naming each file and function too long
    scripts/check-unit-sizes.py --self-test    # proves the check names a long file and function
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$")


def strip_code(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(path):
    code = strip_code(open(path, encoding="utf-8").read())
    found = []
    # stack of (kind, start_line): kind "scope" (namespace/class) or "function" or "block"
    stack = []
    header_start = None  # first line of the statement being read at scope level
    statement = ""
    line = 1
    for c in code:
        in_function = any(kind == "function" for kind, _ in stack)
        if c == "{":
            if in_function:
                stack.append(("block", line))
            else:
                head = statement.strip()
                if SCOPE.search(head) or head.endswith("=") or not head:
                    stack.append(("scope", line))
                elif re.search(r"\)[\w\s:,(){}<>&*\[\].-]*$", head) and "(" in head:
                    stack.append(("function", header_start or line))
                else:
                    stack.append(("scope", line))
            statement, header_start = "", None
        elif c == "}":
            kind, start = stack.pop() if stack else ("scope", line)
            if kind == "function" and line - start + 1 > MAX_FUNCTION_LINES:
                found.append((start, line - start + 1))
            statement, header_start = "", None
        elif c == ";" and not in_function:
            statement, header_start = "", None
        elif not in_function:
            if not c.isspace() and header_start is None:
                header_start = line
            statement += c
        if c == "\n":
            line += 1
            if not in_function and statement.lstrip().startswith("#"):
                statement, header_start = "", None
    return found


def check(root):
    errors = []
    src = os.path.join(root, "src")
    for folder, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith((".cpp", ".h")):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            lines = open(path, encoding="utf-8").read().count("\n")
            if lines > MAX_FILE_LINES:
                errors.append(f"{rel}: {lines} lines (at most {MAX_FILE_LINES}: two concepts?)")
            for start, length in long_functions(path):
                errors.append(f"{rel}:{start}: a function of {length} lines (at most {MAX_FUNCTION_LINES}: name its steps)")
    return errors


def self_test():
    tmp = tempfile.mkdtemp(prefix="check-unit-sizes-")
    try:
        os.makedirs(os.path.join(tmp, "src", "a"))
        body = "".join(f"  x += {i};  // {{\n" for i in range(MAX_FUNCTION_LINES))
        with open(os.path.join(tmp, "src", "a", "long.cpp"), "w") as f:
            f.write("namespace a {\nstruct S {\n  int f() const;\n};\n"
                    "int S::f() const {\n  int x = 0;\n" + body + "  return x;\n}\n"
                    "int short_one(int y) { return [&] { return y; }(); }\n}  // namespace a\n")
        with open(os.path.join(tmp, "src", "a", "big.h"), "w") as f:
            f.write("#pragma once\n" + "// a line\n" * MAX_FILE_LINES)
        errors = check(tmp)
        want = [f"src/a/big.h: {MAX_FILE_LINES + 1} lines", f"src/a/long.cpp:5: a function of {MAX_FUNCTION_LINES + 4} lines"]
        for w in want:
            if not any(e.startswith(w) for e in errors):
                print(f"check-unit-sizes self-test: expected an error starting {w!r}, got {errors}")
                return 1
        if len(errors) != len(want):
            print(f"check-unit-sizes self-test: expected {len(want)} errors, got {errors}")
            return 1
        print("check-unit-sizes self-test: a long file and a long function are named, a short one is not")
        return 0
    finally:
        shutil.rmtree(tmp)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    errors = check(os.path.abspath(args.root))
    for e in errors:
        print(e)
    if errors:
        print(f"check-unit-sizes: {len(errors)} file(s) or function(s) too long in src/")
        return 1
    print(f"check-unit-sizes: no file in src/ over {MAX_FILE_LINES} lines, no function over {MAX_FUNCTION_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
