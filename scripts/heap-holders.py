#!/usr/bin/env python3
"""The controller's heap at its peak, by holder: reads the collapsed stacks that
`heaptrack_print --print-flamegraph OUT --flamegraph-cost-type peak` writes and sums the bytes
of each stack under the first rule its frames match (the indexes, the claim actors, the
disruption pass). The profile must come from a build heaptrack can see:
`cargo build --features system-allocator` (jemalloc allocates out of heaptrack's sight).

Usage: scripts/heap-holders.py PEAK_FLAMEGRAPH
"""
import re
import sys

# First match wins: the disruption pass reads the indexes, so it goes before them.
RULES = [
    ("disruption pass (transient: candidates, pod keys)", r"view::disruption|disruption::pass"),
    ("pod index: by_key table (Entry per pod)",
     r"Pods\$GT\$::push.*;apply[^;]*;std::collections::hash::map::HashMap\$LT\$K\$C\$V\$C\$S\$C\$A\$GT\$::insert"),
    ("pod index: patches against the prototypes", r"Patched::new"),
    ("pod index: the rest (sums, node sets, prototypes, labels)", r"state::pods|state\.\.pods"),
    ("NodeClaims (decoded whole, their index)", r"nodeclaim|state::claims"),
    ("Machines index", r"state::machines|capi::json"),
    ("Nodes index (compact Nodes, shared strings)",
     r"state::nodes|CompactNode|compact::StrMap|compact::pack|compact::intern"),
    ("claim actors (their contexts, the router)", r"actors::supervisor|actors::router|actors::nodeclaim"),
    ("the rest of karpenter_capi", r"karpenter_capi"),
    ("outside karpenter_capi", r"."),
]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sums = {name: 0 for name, _ in RULES}
    total = 0
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, cost = line.rstrip().rpartition(" ")
            if not cost.isdigit():
                print(f"not a collapsed stack line: {line[:80]!r}", file=sys.stderr)
                return 1
            total += int(cost)
            name = next(n for n, pat in RULES if re.search(pat, stack))
            sums[name] += int(cost)
    print(f"{total / 1e6:8.2f} MB  heap at its peak")
    for name, _ in RULES:
        print(f"{sums[name] / 1e6:8.2f} MB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
