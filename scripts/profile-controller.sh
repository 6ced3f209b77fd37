#!/usr/bin/env bash
# A CPU profile of the controller's threads in one `simulate` run, on either backend, for
# docs/benchmarks.md ("Where the controller's CPU goes on a real control plane"): perf samples
# the whole `simulate` process with DWARF call graphs, and writes its samples out as text for
# scripts/profile-buckets.py, which keeps the controller's threads: every thread not named
# `sim*` or `cpu-meter`, as `cpu_ms.controller` counts them (the actix System thread, named
# after the binary, and the tokio workers the solver runs on).
#
# On the real backend perf attaches once the control plane's four processes are running, so it
# does not follow them (a child forked while perf watches the parent is profiled too). kubectl
# and helm, run later to install the chart, are other processes and left out.
#
# Usage: scripts/profile-controller.sh OUT -- SIMULATE-ARGS...
#   e.g. scripts/profile-controller.sh prof/real-burst -- --control-plane real \
#          --scenario launch --claims 1000 --machine-deployments 10 --deadline 15m
# Writes OUT.json (the JSON report), OUT.perf.data, OUT.perf.txt (the process's samples),
# OUT.stderr and OUT.load (load average before and after, wall time).
# Env: BIN (default target/release/karpenter-capi; its name must not start with `sim`),
#      FREQ (samples a second, default 499), STACK (bytes of stack copied a sample, default
#      16384). The real backend needs KUBEBUILDER_ASSETS and KARPENTER_CAPI_TOOLS, as
#      `simulate --control-plane real` does.
# Needs perf (Debian: linux-perf) and the right to profile the process (root, or
# kernel.perf_event_paranoid <= 1). Build first: cargo build --release
set -euo pipefail

[ $# -ge 2 ] && [ "$2" = "--" ] || { sed -n '13,17p' "$0" >&2; exit 2; }
OUT=$1
shift 2
BIN=${BIN:-target/release/karpenter-capi}
FREQ=${FREQ:-499}
STACK=${STACK:-16384}
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release first" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"

real=false
for a in "$@"; do case "$a" in real | --control-plane=real) real=true ;; esac; done
echo "before $(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT.load"
start=$(date +%s%N)
"$BIN" simulate "$@" --report json --report-out "$OUT.json" >"$OUT.stdout" 2>"$OUT.stderr" &
pid=$!
if $real; then
    for _ in $(seq 1 600); do
        [ "$(pgrep -P "$pid" | wc -l)" -ge 4 ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
fi
perf record -F "$FREQ" --call-graph "dwarf,$STACK" -p "$pid" -o "$OUT.perf.data" >"$OUT.perf.log" 2>&1 &
perf_pid=$!
rc=0
wait "$pid" || rc=$?
# perf ends by itself when the process does; give it a moment, then ask it to.
sleep 1
kill -INT "$perf_pid" 2>/dev/null || true
wait "$perf_pid" || true
end=$(date +%s%N)
echo "after $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT.load"
echo "exit $rc wall_ms $(((end - start) / 1000000))" >>"$OUT.load"
# No inline resolution: it runs addr2line over the binary for every frame (minutes), and a
# release build has no debug info for it to find anyway.
DEBUGINFOD_URLS= perf script --no-inline -i "$OUT.perf.data" --pid "$pid" \
    -F comm,tid,time,period,ip,sym,dso >"$OUT.perf.txt" 2>/dev/null
cat "$OUT.load"
exit "$rc"
