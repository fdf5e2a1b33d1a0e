#!/usr/bin/env python3
"""Checks docs/seed-coverage.md against the seeds' test methods and the registered tests.

  check-seed-coverage.py --extract SEEDS_DIR > docs/seed-tests.txt
      Lists every `def test_` of the seed files (PyTorch's Python tests, kept outside the
      repository in ../shared/seeds) as "<seed> <Class>.<test_name>", one per line.
  check-seed-coverage.py [--ctest-dir BUILD_DIR | --tests-file FILE] [--gtest-binary EXE]
      Checks that every line of docs/seed-tests.txt has exactly one row in the table of
      docs/seed-coverage.md (and no row names a test the seeds do not have), that each row
      names at least one C++ test or says "pending: ..." / "not applicable on CPU: ...", and
      that every C++ test the table names (`Suite.Name`, in backticks) is registered: it is a
      name of `ctest -N` in BUILD_DIR or a gtest test of EXE (ctest runs EXE's tests in groups,
      tests/discover_test_groups.cmake), or a parameterized test's name up to its "/WorldSizeN".
      Without --ctest-dir, --tests-file or --gtest-binary only the first two checks run.

Exit status 0 when everything holds; 1 with one line per problem otherwise.
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED_TESTS = os.path.join(REPO, "docs", "seed-tests.txt")
COVERAGE = os.path.join(REPO, "docs", "seed-coverage.md")


def extract(seeds_dir):
    out = []
    for name in sorted(os.listdir(seeds_dir)):
        seed = name[:3]
        cls = None
        with open(os.path.join(seeds_dir, name), encoding="utf-8") as f:
            for line in f:
                m = re.match(r"class (\w+)", line)
                if m:
                    cls = m.group(1)
                m = re.match(r"\s+def (test_\w+)", line)
                if m:
                    out.append(f"{seed} {cls}.{m.group(1)}")
    return out


def read_seed_tests():
    tests = []
    with open(SEED_TESTS, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                seed, name = line.split()
                tests.append((seed, name))
    return tests


def read_table():
    """Rows of the coverage table: (line number, seed, Class.test_name, C++ tests cell)."""
    rows = []
    with open(COVERAGE, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not line.startswith("|") or len(cells) < 3 or not re.fullmatch(r"\d{3}", cells[0]):
                continue
            rows.append((number, cells[0], cells[1].strip("`"), cells[2]))
    return rows


def gtest_tests(binary):
    text = subprocess.run([binary, "--gtest_list_tests"], check=True, capture_output=True, text=True).stdout
    names, suite = set(), None
    for line in text.splitlines():
        if not line.startswith(" "):
            suite = line.split("#")[0].strip().rstrip(".")
        elif suite:
            names.add(suite + "." + line.split("#")[0].strip())
    return names


def registered_tests(args):
    names = gtest_tests(args.gtest_binary) if args.gtest_binary else set()
    if not (args.tests_file or args.ctest_dir):
        return names
    if args.tests_file:
        with open(args.tests_file, encoding="utf-8") as f:
            text = f.read()
    else:
        text = subprocess.run([args.ctest, "-N"], cwd=args.ctest_dir, check=True, capture_output=True, text=True).stdout
    for line in text.splitlines():
        m = re.search(r"Test\s+#\d+: (\S+)", line)
        names.add(m.group(1) if m else line.strip())
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extract", metavar="SEEDS_DIR")
    parser.add_argument("--ctest-dir", metavar="BUILD_DIR")
    parser.add_argument("--ctest", default="ctest", help="the ctest to run (default: ctest on PATH)")
    parser.add_argument("--tests-file", metavar="FILE", help="a saved `ctest -N` output")
    parser.add_argument("--gtest-binary", metavar="EXE", help="a gtest binary whose tests count as registered")
    args = parser.parse_args()
    if args.extract:
        print("\n".join(extract(args.extract)))
        return 0

    problems = []
    seed_tests = read_seed_tests()
    rows = read_table()
    by_key = {}
    for number, seed, name, cell in rows:
        by_key.setdefault((seed, name), []).append(number)
    for key in seed_tests:
        if key not in by_key:
            problems.append(f"seed {key[0]} {key[1]}: no row in docs/seed-coverage.md")
        elif len(by_key[key]) > 1:
            problems.append(f"seed {key[0]} {key[1]}: rows at lines {by_key[key]}; keep one")
    known = set(seed_tests)
    registered = registered_tests(args) if (args.ctest_dir or args.tests_file or args.gtest_binary) else None
    for number, seed, name, cell in rows:
        if (seed, name) not in known:
            problems.append(f"docs/seed-coverage.md:{number}: seed {seed} has no test {name} (docs/seed-tests.txt)")
        cxx = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*)(?:/\*)?`", cell)
        status = re.sub(r"`[^`]*`", "", cell).strip(" ,;")
        if not cxx and not re.match(r"(pending|not applicable on CPU): \S", status):
            problems.append(f"docs/seed-coverage.md:{number}: {name} names no C++ test and says neither "
                            "'pending: <topic>' nor 'not applicable on CPU: <why>'")
        if registered is None:
            continue
        for test in cxx:
            if test not in registered and not any(r.startswith(test + "/") for r in registered):
                problems.append(f"docs/seed-coverage.md:{number}: {name}: C++ test {test} is not registered (ctest -N, gtest)")
    for p in problems:
        print(p)
    covered = sum(1 for _, _, _, cell in rows if not re.match(r"(pending|not applicable on CPU):", cell))
    print(f"check-seed-coverage: {len(seed_tests)} seed tests, {len(rows)} rows, {covered} with C++ tests, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
