#!/usr/bin/env bash
# The controller's peak memory against a large settled simulated cluster, measured apart from the
# simulator: the cluster is served by one process (`simulate --serve --no-controller --scenario
# none --nodes N --pods M`), the controller runs as another (`run --kubeconfig ...`), and this
# script reads the controller's VmHWM (peak RSS) and VmRSS from /proc/PID/status once it is
# Ready (/readyz), and again after it has run SETTLE seconds on the synced cluster.
#
# Usage: scripts/controller-rss.sh [NODES] [PODS]    (default 5000 50000)
# Env:   BIN (default target/release/karpenter-capi), SIM_BIN (the binary serving the cluster,
#        default BIN: another build may serve while BIN is the controller under test), SETTLE (seconds after ready, default 30),
#        PORT (simulated API server, default 16443), HEALTH_PORT (default 18081),
#        MACHINE_DEPLOYMENTS (default 10), WORK (scratch dir, default a new temp dir),
#        CLUSTER_KUBECONFIG (a kubeconfig of a cluster already served by `simulate --serve
#        --no-controller ...`: no stand-up, so several builds or runs read the same cluster).
# Build first: cargo build --release
set -euo pipefail

NODES=${1:-5000}
PODS=${2:-50000}
BIN=${BIN:-target/release/karpenter-capi}
SIM_BIN=${SIM_BIN:-$BIN}
SETTLE=${SETTLE:-30}
PORT=${PORT:-16443}
HEALTH_PORT=${HEALTH_PORT:-18081}
MDS=${MACHINE_DEPLOYMENTS:-10}
WORK=${WORK:-$(mktemp -d)}
KUBECONFIG_OUT="$WORK/simulated.kubeconfig"

[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release first" >&2; exit 1; }

cleanup() {
  # Only the two processes this script started, by PID.
  [ -n "${CTRL:-}" ] && kill "$CTRL" 2>/dev/null || true
  [ -n "${SIM:-}" ] && kill "$SIM" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

if [ -n "${CLUSTER_KUBECONFIG:-}" ]; then
  KUBECONFIG_OUT=$CLUSTER_KUBECONFIG
else
  echo "standing up $NODES Nodes and $PODS pods (log: $WORK/sim.log)" >&2
  "$SIM_BIN" simulate --serve --no-controller --scenario none --nodes "$NODES" --pods "$PODS" \
    --machine-deployments "$MDS" --deadline 1h --port "$PORT" \
    --kubeconfig-out "$KUBECONFIG_OUT" >"$WORK/sim.log" 2>&1 &
  SIM=$!
  # The server says it is serving once the Nodes and pods are in.
  until grep -q "serving the simulated cluster" "$WORK/sim.log"; do
    kill -0 "$SIM" 2>/dev/null || { cat "$WORK/sim.log" >&2; exit 1; }
    sleep 1
  done
  echo "cluster up after ${SECONDS}s" >&2
fi

start=$SECONDS
"$BIN" run --kubeconfig "$KUBECONFIG_OUT" --disable-leader-election \
  --metrics-port 0 --health-probe-port "$HEALTH_PORT" >"$WORK/controller.log" 2>&1 &
CTRL=$!
until curl -fsS "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null 2>&1; do
  kill -0 "$CTRL" 2>/dev/null || { cat "$WORK/controller.log" >&2; exit 1; }
  sleep 0.2
done
ready=$((SECONDS - start))
status() { grep -E "^$1:" "/proc/$CTRL/status" | awk '{print $2}'; }
hwm_ready=$(status VmHWM)
rss_ready=$(status VmRSS)
sleep "$SETTLE"
hwm=$(status VmHWM)
rss=$(status VmRSS)
writes=$(grep -c '"offering chosen"\|deleting' "$WORK/controller.log" || true)
# What was stood up, from the server's last progress line (claims lost to timeouts show here).
stood=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/sim.log" 2>/dev/null | grep -o 'nodes [0-9]*' | tail -1 | awk '{print $2}' || true)
printf 'controller ready after %ss on %s Nodes (asked %s) / %s pods\n' "$ready" "${stood:-?}" "$NODES" "$PODS"
printf 'at ready:          VmHWM %d MiB, VmRSS %d MiB\n' $((hwm_ready / 1024)) $((rss_ready / 1024))
printf 'after %ss more:    VmHWM %d MiB, VmRSS %d MiB\n' "$SETTLE" $((hwm / 1024)) $((rss / 1024))
printf 'peak RSS (VmHWM):  %d MiB\n' $((hwm / 1024))
printf 'controller log lines choosing offerings or deleting: %s\n' "$writes"
