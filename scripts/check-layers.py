#!/usr/bin/env python3
"""Checks every #include in src/ and include/fsdpp/ against the layer table of
docs/architecture.md: a file may include its own area's headers and those of the layers below,
never a layer above, and the public headers include each other without a cycle.

The table is the one in the section "## Layers" of docs/architecture.md, top layer first:
    | layer | `src/` folder | public headers | what it holds |
    | checkpoint | `checkpoint/` | `checkpoint.h` | ... |
Its second column names the folder under src/ (or "-"), its third the headers of include/fsdpp/
that belong to that layer. A folder or public header the table does not name is an error, so
the table stays complete.

    scripts/check-layers.py [--root DIR]   # exit 1 naming each include that runs upward
    scripts/check-layers.py --self-test    # proves the check fails on an upward include, a public
                                           # header including a private one, and a cycle
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]')


def read_table(root):
    text = open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8").read()
    section = re.search(r"^## Layers.*?$(.*?)^## ", text, re.M | re.S)
    if not section:
        raise SystemExit("check-layers: docs/architecture.md has no '## Layers' section")
    layers = []  # (name, folders, headers), top first
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= set("-: "):
            continue
        folders = [f.strip("/") for f in re.findall(r"`([^`]+)`", cells[1])]
        headers = re.findall(r"`([^`]+\.h)`", cells[2])
        layers.append((cells[0], folders, headers))
    return layers


def check(root):
    layers = read_table(root)
    level_of_area, level_of_header, name_of_level = {}, {}, {}
    for level, (name, folders, headers) in enumerate(reversed(layers)):  # 0 = bottom
        name_of_level[level] = name
        for f in folders:
            level_of_area[f] = level
        for h in headers:
            level_of_header[h] = level
    errors = []
    src = os.path.join(root, "src")
    inc = os.path.join(root, "include", "fsdpp")
    for area in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, area)) and area not in level_of_area:
            errors.append(f"src/{area}/ is in no layer of docs/architecture.md's table")
    for h in sorted(os.listdir(inc)):
        if h.endswith(".h") and h != "fsdpp.h" and h not in level_of_header:
            errors.append(f"include/fsdpp/{h} is in no layer of docs/architecture.md's table")
    for h in level_of_header:
        if not os.path.exists(os.path.join(inc, h)):
            errors.append(f"docs/architecture.md names include/fsdpp/{h}, which does not exist")

    def target_level(kind, path):
        if kind == "<" and path.startswith("fsdpp/"):
            return level_of_header.get(path[len("fsdpp/"):]), path
        if kind == '"' and "/" in path and path.split("/")[0] in level_of_area:
            return level_of_area[path.split("/")[0]], path
        return None, path

    public_graph = {}
    files = []
    for area in sorted(level_of_area):
        d = os.path.join(src, area)
        if os.path.isdir(d):
            files += [(os.path.join("src", area, f), level_of_area[area], area) for f in sorted(os.listdir(d))
                      if f.endswith((".h", ".cpp"))]
    for h in sorted(level_of_header):
        if os.path.exists(os.path.join(inc, h)):
            files.append((os.path.join("include", "fsdpp", h), level_of_header[h], None))
    for rel, level, area in files:
        deps = []
        for n, line in enumerate(open(os.path.join(root, rel), encoding="utf-8"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, path = m.groups()
            target, _ = target_level(kind, path)
            if target is None:
                continue
            if kind == "<":
                deps.append(path[len("fsdpp/"):])
            elif area is None:
                errors.append(f"{rel}:{n}: a public header includes the private header {path}")
            if target > level:
                errors.append(f"{rel}:{n}: includes {path} from layer '{name_of_level[target]}', above its own "
                              f"layer '{name_of_level[level]}'")
        if area is None:
            public_graph[os.path.basename(rel)] = deps
    # A cycle among public headers (possible within one layer).
    state = {}

    def visit(h, stack):
        state[h] = 1
        for d in public_graph.get(h, []):
            if state.get(d) == 1:
                errors.append("public headers include each other in a cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[h] = 2

    for h in sorted(public_graph):
        if h not in state:
            visit(h, [h])
    return layers, errors


def self_test():
    """A tree whose table puts 'low' below 'high': an upward include and a cycle must be named."""
    tmp = tempfile.mkdtemp(prefix="check-layers-")
    try:
        for d in ("docs", "src/high", "src/low", "include/fsdpp"):
            os.makedirs(os.path.join(tmp, d))
        with open(os.path.join(tmp, "docs", "architecture.md"), "w") as f:
            f.write("## Layers\n\n| layer | `src/` folder | public headers | what |\n|---|---|---|---|\n"
                    "| high | `high/` | `high.h` | top |\n| low | `low/` | `low.h`, `low2.h` | bottom |\n\n## End\n")
        files = {"src/high/a.cpp": '#include "low/b.h"\n#include <fsdpp/high.h>\n',
                 "src/low/b.h": "#pragma once\n", "include/fsdpp/high.h": "#include <fsdpp/low.h>\n",
                 "include/fsdpp/low.h": "#include <fsdpp/low2.h>\n", "include/fsdpp/low2.h": "#pragma once\n",
                 "src/low/c.cpp": '#include "high/x.h"\n'}
        for rel, body in files.items():
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(body)
        _, errors = check(tmp)
        if errors != ["src/low/c.cpp:1: includes high/x.h from layer 'high', above its own layer 'low'"]:
            print("self-test: an upward include was not named exactly:", errors)
            return 1
        os.remove(os.path.join(tmp, "src/low/c.cpp"))
        with open(os.path.join(tmp, "include/fsdpp/high.h"), "w") as f:
            f.write('#include "low/b.h"\n')
        _, errors = check(tmp)
        if errors != ["include/fsdpp/high.h:1: a public header includes the private header low/b.h"]:
            print("self-test: a public header including a private one was not named exactly:", errors)
            return 1
        with open(os.path.join(tmp, "include/fsdpp/high.h"), "w") as f:
            f.write("#include <fsdpp/low.h>\n")
        with open(os.path.join(tmp, "include/fsdpp/low2.h"), "w") as f:
            f.write("#include <fsdpp/low.h>\n")
        _, errors = check(tmp)
        if not any("cycle" in e and "low.h" in e for e in errors):
            print("self-test: a cycle low.h -> low2.h -> low.h was not named:", errors)
            return 1
        print("self-test: an upward include, a public header including a private one and a cycle are all named")
        return 0
    finally:
        shutil.rmtree(tmp)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    layers, errors = check(args.root)
    for e in errors:
        print(e)
    if errors:
        print(f"check-layers: {len(errors)} include(s) run against the layer table of docs/architecture.md")
        return 1
    print(f"check-layers: every include in src/ and include/fsdpp/ follows the {len(layers)} layers of docs/architecture.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
