#!/usr/bin/env python3
"""Which threads of a process spend its CPU, by thread name, over an interval: for an idle
simulated fleet (docs/benchmarks.md, "What a fleet costs per Cluster"), whose ~400 threads
should cost almost nothing.

Usage: scripts/thread-cpu.py PID [SECONDS]    (default 20)

Reads utime + stime of /proc/PID/stat and of every /proc/PID/task/*/stat at the start and the
end; prints the process's CPU as a percentage of one core, then each thread name's (threads of
one name summed: a runtime names all its workers alike), with how many threads have that name
and their scheduler states at the end (R runnable, S sleeping). A thread started during the
interval counts all its CPU; one that ended is missing from its name's figure but not from the
process's.
"""
import collections
import os
import sys
import time


def ticks(stat):
    # The name may hold spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[11]) + int(fields[12])


def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue  # ended since the listing
        state, used = ticks(stat)
        out[tid] = (stat[stat.index("(") + 1:stat.rindex(")")], used, state)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pid, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    if not pid.isdigit() or not os.path.isdir(f"/proc/{pid}/task"):
        sys.exit(f"no process {pid} to read in /proc")
    hz = os.sysconf("SC_CLK_TCK")
    before, start = threads(pid), ticks(open(f"/proc/{pid}/stat").read())[1]
    began = time.monotonic()
    time.sleep(seconds)
    after, end = threads(pid), ticks(open(f"/proc/{pid}/stat").read())[1]
    elapsed = time.monotonic() - began
    core = lambda t: 100.0 * t / hz / elapsed
    by_name = collections.defaultdict(lambda: [0, 0, collections.Counter()])
    for tid, (name, used, state) in after.items():
        row = by_name[name]
        row[0] += 1
        row[1] += used - before[tid][1] if tid in before else used
        row[2][state] += 1
    print(f"process {pid}: {core(end - start):.1f} % of a core over {elapsed:.1f} s, "
          f"{len(after)} threads")
    for name, (n, used, states) in sorted(by_name.items(), key=lambda r: -r[1][1]):
        print(f"  {name:16} {n:4} threads {core(used):6.1f} %  states {dict(states)}")


if __name__ == "__main__":
    main()
