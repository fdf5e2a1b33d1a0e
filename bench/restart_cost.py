#!/usr/bin/env python3
"""What a restart costs: examples/train_gpt at 4 ranks under `fsdpp-run --max-restarts 1`, one
rank SIGKILLed mid-run; the time from its death to the first step the restarted job completes,
split at the lines the launcher and the trainer print on the way (all timestamps taken here, as
the lines arrive).

  bench/restart_cost.py [--build build] [--nproc 4] [--kill-at-step 12] [--repeat 3]

Prints one line per run and the median of each interval. The trainer's model is small (2 layers,
dim 64, byte tokens), so the restart is mostly process start, rendezvous, and the checkpoint's
load; a larger model adds its load time (docs/benchmarks.md, "Distributed checkpoint").
"""
import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def corpus(path, size=200_000, seed=3):
    rng = random.Random(seed)
    words = "the a cat dog river king moon road door song sees follows carries paints answers".split()
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(size // 5)))


def rank_pid(launcher_pid, rank):
    """The pid of the launcher's child whose RANK is `rank`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(pid)
        except (OSError, IndexError, ValueError):
            continue
    return None


def one_run(args, workdir, data):
    ckpt = os.path.join(workdir, "ckpt")
    subprocess.run(["rm", "-rf", ckpt], check=True)
    cmd = [f"{args.build}/tools/fsdpp-run", "--nproc-per-node", str(args.nproc), "--max-restarts", "1",
           "--timeout", "60", f"{args.build}/examples/train_gpt", "--data", data, "--device", "cpu",
           "--layers", "2", "--dim", "64", "--heads", "4", "--seq", "64", "--batch", str(2 * args.nproc),
           "--steps", str(args.kill_at_step + 8), "--ckpt-every", "5", "--log-every", "1", "--eval-every", "1000",
           "--ckpt-dir", ckpt, "--sample-tokens", "0"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    watchdog = threading.Timer(300, p.kill)
    watchdog.start()
    marks, lines = {}, []
    step_line = re.compile(r"\[rank0\]: step +(\d+)/")
    for line in p.stdout:
        now = time.monotonic()
        lines.append(line)
        m = step_line.search(line)
        if "killed" not in marks and m and int(m.group(1)) == args.kill_at_step:
            pid = rank_pid(p.pid, args.nproc // 2)
            if pid is None:
                break
            os.kill(pid, signal.SIGKILL)
            marks["killed"] = time.monotonic()
        elif "killed" in marks:
            if "restarting all ranks" in line:
                marks.setdefault("restart", now)
            elif "resumed from" in line and "restart" in marks:
                marks.setdefault("resumed", now)
            elif m and "resumed" in marks:
                marks.setdefault("first step", now)
    code = p.wait()
    watchdog.cancel()
    if code != 0 or len(marks) != 4:
        sys.exit("run failed (exit code %d, marks %s):\n%s" % (code, sorted(marks), "".join(lines[-40:])))
    return {k: marks[k] - marks["killed"] for k in ("restart", "resumed", "first step")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--kill-at-step", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fsdpp-restart-bench-") as workdir:
        data = os.path.join(workdir, "corpus.txt")
        corpus(data)
        runs = []
        for i in range(args.repeat):
            r = one_run(args, workdir, data)
            runs.append(r)
            print("run %d: rank %d SIGKILLed after step %d; launcher restarting %.2f s, trainer resumed %.2f s, "
                  "first step done %.2f s after the kill" % (i + 1, args.nproc // 2, args.kill_at_step, r["restart"],
                                                             r["resumed"], r["first step"]), flush=True)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print("median of %d at %d ranks: restarting %.2f s, resumed %.2f s, first step %.2f s after the kill"
              % (args.repeat, args.nproc, med["restart"], med["resumed"], med["first step"]))


if __name__ == "__main__":
    main()
