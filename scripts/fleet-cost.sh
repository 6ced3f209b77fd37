#!/usr/bin/env bash
# What serving N Clusters costs, measured apart from the simulator: one process serves a simulated
# fleet (`simulate --clusters N --serve --no-controller --kubeconfig-out DIR`, every Cluster in one
# management API server, each workload cluster its own), and the controllers run as other
# processes, either one fleet process (`run --fleet`) or N single-cluster processes (`run
# --kubeconfig fleet-<i>.kubeconfig --cluster-name sim --cluster-api-namespace fleet-<i>`). Once
# every Cluster's controller is up (and, with PODS, every pod Running) and SETTLE seconds more
# have passed, it prints the controllers' VmRSS and VmHWM (peak RSS) from /proc/PID/status,
# summed over the processes, and the simulator's apart.
#
# Usage: scripts/fleet-cost.sh fleet|single CLUSTERS [PODS]    (PODS: pending pods per cluster,
#        default 0: idle clusters, their node groups and NodePool only)
# Env:   BIN (default target/release/karpenter-capi), SIM_BIN (the binary serving the fleet,
#        default BIN), SETTLE (seconds, default 60), WORK (scratch dir, default a new temp dir),
#        KUBECTL (default $KARPENTER_CAPI_TOOLS/kubectl, else kubectl on PATH; used with PODS).
set -euo pipefail

MODE=${1:?fleet or single}
N=${2:?how many clusters}
PODS=${3:-0}
BIN=${BIN:-target/release/karpenter-capi}
SIM_BIN=${SIM_BIN:-$BIN}
SETTLE=${SETTLE:-60}
WORK=${WORK:-$(mktemp -d)}
KC="$WORK/kubeconfigs"
KUBECTL=${KUBECTL:-$( [ -n "${KARPENTER_CAPI_TOOLS:-}" ] && echo "$KARPENTER_CAPI_TOOLS/kubectl" || echo kubectl )}
case "$MODE" in fleet|single) ;; *) echo "mode: fleet or single, not $MODE" >&2; exit 2 ;; esac
[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release first" >&2; exit 1; }

CTRLS=()
cleanup() {
  # Only the processes this script started, by PID.
  # The controllers first, and waited for: they release their Leases on the simulator.
  for pid in "${CTRLS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${CTRLS[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -n "${SIM:-}" ] && kill "$SIM" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }
if [ "$PODS" -gt 0 ]; then scenario=(--scenario pods --pods "$PODS"); else scenario=(--scenario none); fi
echo "serving $N simulated clusters (${scenario[*]}; log: $WORK/sim.log), load $(load)" >&2
"$SIM_BIN" simulate --clusters "$N" "${scenario[@]}" --serve --no-controller \
  --kubeconfig-out "$KC" --deadline 2h >"$WORK/sim.log" 2>&1 &
SIM=$!
# -s: the log is created by the background shell, maybe after this first looks.
until grep -qs "serving the simulated fleet" "$WORK/sim.log"; do
  kill -0 "$SIM" 2>/dev/null || { cat "$WORK/sim.log" >&2; exit 1; }
  sleep 1
done
echo "fleet up after ${SECONDS}s" >&2

start=$SECONDS
if [ "$MODE" = fleet ]; then
  "$BIN" run --fleet --cluster-api-kubeconfig "$KC/management.kubeconfig" \
    --leader-election-namespace default --metrics-port 0 --health-probe-port 0 \
    >"$WORK/controller.log" 2>&1 &
  CTRLS+=($!)
  up() { grep -c "controller active" "$WORK/controller.log" 2>/dev/null || true; }
else
  for i in $(seq 0 $((N - 1))); do
    "$BIN" run --kubeconfig "$KC/fleet-$i.kubeconfig" --cluster-api-kubeconfig "$KC/management.kubeconfig" \
      --cluster-name sim --cluster-api-namespace "fleet-$i" --metrics-port 0 --health-probe-port 0 \
      >"$WORK/controller-$i.log" 2>&1 &
    CTRLS+=($!)
  done
  up() { grep -l "controller active" "$WORK"/controller-*.log 2>/dev/null | wc -l; }
fi
until [ "$(up)" -ge "$N" ] 2>/dev/null; do
  for pid in "${CTRLS[@]}"; do kill -0 "$pid" 2>/dev/null || { echo "controller $pid exited (logs in $WORK)" >&2; exit 1; }; done
  sleep 1
done
echo "every Cluster's controller up after $((SECONDS - start))s, load $(load)" >&2

if [ "$PODS" -gt 0 ]; then
  not_running() {
    local n=0
    for i in $(seq 0 $((N - 1))); do
      n=$((n + $("$KUBECTL" --kubeconfig "$KC/fleet-$i.kubeconfig" get pods -A --no-headers 2>/dev/null | grep -vc ' Running ' || true)))
    done
    echo "$n"
  }
  while :; do
    left=$(not_running)
    [ "$left" -eq 0 ] && break
    echo "  $left pods not Running yet" >&2
    sleep 10
  done
  nodes=0
  for i in $(seq 0 $((N - 1))); do
    nodes=$((nodes + $("$KUBECTL" --kubeconfig "$KC/fleet-$i.kubeconfig" get nodes --no-headers | wc -l)))
  done
  echo "every pod Running after $((SECONDS - start))s on $nodes Nodes" >&2
fi
sleep "$SETTLE"

kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$2/status"; }
rss=0 hwm=0
for pid in "${CTRLS[@]}"; do
  rss=$((rss + $(kib VmRSS "$pid")))
  hwm=$((hwm + $(kib VmHWM "$pid")))
done
printf '%s: %s clusters, %s pods each, %s controller process(es)\n' "$MODE" "$N" "$PODS" "${#CTRLS[@]}"
printf 'controllers: VmRSS %d MiB, VmHWM %d MiB (summed); per cluster VmRSS %d KiB\n' \
  $((rss / 1024)) $((hwm / 1024)) $((rss / N))
printf 'simulator:   VmRSS %d MiB\n' $(($(kib VmRSS "$SIM") / 1024))
echo "load average at the end: $(load)" >&2
