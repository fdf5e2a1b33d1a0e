#!/usr/bin/env python3
"""Reads one rank's Chrome trace written with ProfilerOptions().profile_memory(true) and says
where its memory peaked: the highest `memory` sample, and on each thread's track the spans
open at that moment (innermost last), e.g. which FSDP unit's backward was computing and which
collectives were running on the comm threads.

    scripts/trace-memory-peak.py rank-0.json [--within SPAN]

--within SPAN looks only at samples inside the first span whose name starts with SPAN
(e.g. "backward", "step 1").
"""
import argparse
import json

MIB = 1 << 20

parser = argparse.ArgumentParser(usage=__doc__)
parser.add_argument("trace")
parser.add_argument("--within", help="only samples inside the first span whose name starts with this")
args = parser.parse_args()

with open(args.trace) as f:
    events = json.load(f)["traceEvents"]
tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
spans = [e for e in events if e.get("ph") == "X"]
samples = [e for e in events if e.get("ph") == "C" and e["name"] == "memory"]
if not samples:
    raise SystemExit(f"{args.trace}: no memory samples (record with ProfilerOptions().profile_memory(true))")

start, end = samples[0]["ts"], samples[-1]["ts"]
if args.within:
    inside = [s for s in spans if s["name"].startswith(args.within)]
    if not inside:
        raise SystemExit(f"{args.trace}: no span named {args.within}...")
    start, end = inside[0]["ts"], inside[0]["ts"] + inside[0]["dur"]
    print(f"within {inside[0]['name']}: {start} .. {end} us")
window = [s for s in samples if start <= s["ts"] <= end]
if not window:
    raise SystemExit(f"{args.trace}: no memory samples in that window")
first = window[0]["args"]["bytes"]
peak = max(window, key=lambda s: s["args"]["bytes"])
t = peak["ts"]
print(f"peak {peak['args']['bytes'] / MIB:.3f} MiB at {t} us "
      f"({(peak['args']['bytes'] - first) / MIB:+.3f} MiB from the window's first sample)")
for tid in sorted({s["tid"] for s in spans}):
    open_spans = sorted((s for s in spans if s["tid"] == tid and s["ts"] <= t <= s["ts"] + s["dur"]),
                        key=lambda s: (s["ts"], -s["dur"]))
    if open_spans:
        print(f"  {tracks.get(tid, f'thread {tid}')}: " + " > ".join(s["name"] for s in open_spans))
