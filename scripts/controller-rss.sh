#!/usr/bin/env bash
# The controller's peak memory against a large settled simulated cluster, measured apart from the
# simulator: the cluster is served by one process (`simulate --serve --no-controller --scenario
# none --nodes N --pods M`), the controller runs as another (`run --kubeconfig ...`), and this
# script reads the controller's VmHWM (peak RSS) and VmRSS from /proc/PID/status once it is
# Ready (/readyz), and again after it has run SETTLE seconds on the synced cluster.
#
# With IDLE and CHANGES set it also measures CPU: the controller's utime+stime (/proc/PID/stat)
# over IDLE seconds of quiet after Ready (as % of one core), then over CHANGES pod label patches
# made through the API (kubectl proxy and curl, 8 at a time), less the idle rate over that time,
# as CPU ms per 1,000 pod changes.
#
# Usage: scripts/controller-rss.sh [NODES] [PODS]    (default 5000 50000)
# Env:   BIN (default target/release/karpenter-capi), SIM_BIN (the binary serving the cluster,
#        default BIN: another build may serve while BIN is the controller under test), SETTLE (seconds after ready, default 30),
#        PORT (simulated API server, default 16443), HEALTH_PORT (default 18081),
#        MACHINE_DEPLOYMENTS (default 10), WORK (scratch dir, default a new temp dir),
#        CLUSTER_KUBECONFIG (a kubeconfig of a cluster already served by `simulate --serve
#        --no-controller ...`: no stand-up, so several builds or runs read the same cluster),
#        CONTROL_PLANE (simulated, the default, or real: etcd, kube-apiserver, kube-scheduler and
#        kube-controller-manager from KUBEBUILDER_ASSETS; the pods are then created through the
#        API and started by the kubelet stand-in, and the script waits until none is Pending),
#        IDLE (seconds of idle CPU measured after SETTLE, default 0: not measured),
#        CHANGES (pod label patches after the idle measurement, default 0: none),
#        KUBECTL (default $KARPENTER_CAPI_TOOLS/kubectl, else kubectl on PATH),
#        KEEP_CLUSTER=1 (leave the stood-up cluster serving, for CLUSTER_KUBECONFIG runs).
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
CONTROL_PLANE=${CONTROL_PLANE:-simulated}
IDLE=${IDLE:-0}
CHANGES=${CHANGES:-0}
KUBECTL=${KUBECTL:-$( [ -n "${KARPENTER_CAPI_TOOLS:-}" ] && echo "$KARPENTER_CAPI_TOOLS/kubectl" || echo kubectl )}

[ -x "$BIN" ] || { echo "no $BIN: run cargo build --release first" >&2; exit 1; }

cleanup() {
  # Only the processes this script started, by PID.
  [ -n "${CTRL:-}" ] && kill "$CTRL" 2>/dev/null || true
  [ -n "${PROXY:-}" ] && kill "$PROXY" 2>/dev/null || true
  [ -z "${KEEP_CLUSTER:-}" ] && [ -n "${SIM:-}" ] && kill "$SIM" 2>/dev/null || true
  [ -z "${KEEP_CLUSTER:-}" ] && wait 2>/dev/null || true
}
trap cleanup EXIT

if [ -n "${CLUSTER_KUBECONFIG:-}" ]; then
  KUBECONFIG_OUT=$CLUSTER_KUBECONFIG
else
  echo "standing up $NODES Nodes and $PODS pods on the $CONTROL_PLANE control plane (log: $WORK/sim.log)" >&2
  "$SIM_BIN" simulate --control-plane "$CONTROL_PLANE" --serve --no-controller --scenario none \
    --nodes "$NODES" --pods "$PODS" --machine-deployments "$MDS" --deadline 2h --port "$PORT" \
    --kubeconfig-out "$KUBECONFIG_OUT" >"$WORK/sim.log" 2>&1 &
  SIM=$!
  echo "$SIM" >"$WORK/sim.pid"
  # The server says it is serving once the Nodes and pods are in.
  until grep -q "serving the simulated cluster" "$WORK/sim.log"; do
    kill -0 "$SIM" 2>/dev/null || { cat "$WORK/sim.log" >&2; exit 1; }
    sleep 1
  done
  echo "cluster up after ${SECONDS}s (kubeconfig: $KUBECONFIG_OUT)" >&2
fi

# On a real control plane the kubelet stand-in starts the created pods after the stand-up says
# it serves: wait until none is left Pending, so the controller starts on a settled cluster.
if [ "$CONTROL_PLANE" = real ]; then
  while :; do
    pending=$("$KUBECTL" --kubeconfig "$KUBECONFIG_OUT" get pods -A --chunk-size 1000 \
      --field-selector status.phase=Pending -o name 2>/dev/null | wc -l)
    [ "$pending" -eq 0 ] && break
    echo "  $pending pods still Pending" >&2
    sleep 10
  done
  echo "every pod started after ${SECONDS}s" >&2
fi

load() { cut -d' ' -f1-3 /proc/loadavg; }
# The controller's CPU so far (utime + stime, in clock ticks).
ticks() { awk '{print $14 + $15}' "/proc/$CTRL/stat"; }
now() { date +%s.%N; }
echo "load average before the controller: $(load)" >&2

start=$(now)
"$BIN" run --kubeconfig "$KUBECONFIG_OUT" --disable-leader-election \
  --metrics-port 0 --health-probe-port "$HEALTH_PORT" >"$WORK/controller.log" 2>&1 &
CTRL=$!
until curl -fsS "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null 2>&1; do
  kill -0 "$CTRL" 2>/dev/null || { cat "$WORK/controller.log" >&2; exit 1; }
  sleep 0.2
done
ready=$(echo "$(now) - $start" | bc)
ticks_ready=$(ticks)
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
printf 'CPU to ready:      %s s (utime+stime)\n' "$(echo "scale=2; $ticks_ready / $(getconf CLK_TCK)" | bc)"
printf 'at ready:          VmHWM %d MiB, VmRSS %d MiB\n' $((hwm_ready / 1024)) $((rss_ready / 1024))
printf 'after %ss more:    VmHWM %d MiB, VmRSS %d MiB\n' "$SETTLE" $((hwm / 1024)) $((rss / 1024))
printf 'peak RSS (VmHWM):  %d MiB\n' $((hwm / 1024))
printf 'controller log lines choosing offerings or deleting: %s\n' "$writes"

HZ=$(getconf CLK_TCK)
if [ "$IDLE" -gt 0 ]; then
  t0=$(ticks); w0=$(now)
  sleep "$IDLE"
  t1=$(ticks); w1=$(now)
  idle_rate=$(echo "scale=6; ($t1 - $t0) / $HZ / ($w1 - $w0)" | bc)
  printf 'idle CPU over %ss:  %s %% of a core (%s ticks of 1/%s s)\n' "$IDLE" \
    "$(echo "scale=3; $idle_rate * 100 / 1" | bc)" $((t1 - t0)) "$HZ"
fi

if [ "$CHANGES" -gt 0 ]; then
  PROXY_PORT=$((HEALTH_PORT + 1))
  "$KUBECTL" --kubeconfig "$KUBECONFIG_OUT" proxy --port "$PROXY_PORT" >"$WORK/proxy.log" 2>&1 &
  PROXY=$!
  until curl -fsS "http://127.0.0.1:$PROXY_PORT/version" >/dev/null 2>&1; do sleep 0.2; done
  # A value of its own per run, so every patch is a change (and a watch event) on a reused cluster.
  mark=$(date +%s)
  t0=$(ticks); w0=$(now)
  seq 0 $((CHANGES - 1)) | xargs -P 8 -I{} curl -fsS -o /dev/null -X PATCH \
    -H 'Content-Type: application/merge-patch+json' \
    -d "{\"metadata\":{\"labels\":{\"perf-mark\":\"$mark\"}}}" \
    "http://127.0.0.1:$PROXY_PORT/api/v1/namespaces/default/pods/standup-{}"
  w_patched=$(now)
  # The controller's handling of the last events, and its debounced passes after them.
  sleep 10
  t1=$(ticks); w1=$(now)
  used=$(echo "scale=6; ($t1 - $t0) / $HZ - ${idle_rate:-0} * ($w1 - $w0)" | bc)
  printf '%s pod changes in %ss; controller CPU %s s (%s ticks) less idle: %s ms per 1,000 changes\n' \
    "$CHANGES" "$(echo "scale=1; ($w_patched - $w0) / 1" | bc)" \
    "$(echo "scale=3; ($t1 - $t0) / $HZ" | bc)" $((t1 - t0)) \
    "$(echo "scale=0; $used * 1000 * 1000 / $CHANGES / 1" | bc)"
  printf 'peak RSS (VmHWM) after the changes: %d MiB\n' $(($(status VmHWM) / 1024))
fi
echo "load average at the end: $(load)" >&2
