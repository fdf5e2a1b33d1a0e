#!/usr/bin/env python3
"""Merges the per-rank Chrome traces of fsdpp::profiler::export_chrome_trace into one file
that Perfetto (https://ui.perfetto.dev) or chrome://tracing opens with one process per rank.

    scripts/merge-chrome-traces.py OUT.json rank-0.json rank-1.json ...
"""
import json
import sys

if len(sys.argv) < 3:
    sys.exit(__doc__)
events = []
for path in sys.argv[2:]:
    with open(path) as f:
        events += json.load(f)["traceEvents"]
with open(sys.argv[1], "w") as f:
    json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
