#!/usr/bin/env python3
"""Two single-node fsdpp-run jobs started at once on one machine, neither given a port: both
finish, and while they run no rank listens anywhere but on loopback (the store on fsdpp-run's
free 127.0.0.1 port, Gloo on loopback).

  two_jobs_at_once.py FSDPP_RUN PROGRAM [ARGS...]
"""
import os
import subprocess
import sys
import time

LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc/net shows them


def descendants(pid):
    """pid's children, grandchildren, ... from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def listening_sockets():
    """inode -> local address (hex, as /proc/net/tcp*) of every listening TCP socket."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A":
                        found[fields[9]] = fields[1].split(":")[0]
        except OSError:
            pass
    return found


def exposed(pids):
    """(pid, address) of listening sockets the pids hold outside loopback."""
    listening = listening_sockets()
    bad = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = target[8:-1]
                if inode in listening and listening[inode] not in LOOPBACK:
                    bad.append((pid, listening[inode]))
    return bad


def main():
    launcher, program = sys.argv[1], sys.argv[2:]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    jobs = [subprocess.Popen([launcher, "--nproc-per-node", "2", "--timeout", "60", *program], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    deadline, looked, bad = time.monotonic() + 240, 0, []
    while any(j.poll() is None for j in jobs) and time.monotonic() < deadline:
        pids = [p for j in jobs for p in [j.pid] + descendants(j.pid)]
        bad += exposed(pids)
        looked += 1
        time.sleep(0.2)
    ok = True
    for i, j in enumerate(jobs):
        if j.poll() is None:
            j.kill()
        out = j.communicate()[0]
        if j.returncode != 0:
            print(f"job {i} exited with code {j.returncode}:\n{out}")
            ok = False
    if bad:
        print(f"listening outside loopback: {sorted(set(bad))}")
        ok = False
    if looked < 2:
        print("the jobs ended before their sockets could be looked at")
        ok = False
    if ok:
        print(f"OK: two jobs at once both finished; their sockets looked at {looked} times, none outside loopback")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
