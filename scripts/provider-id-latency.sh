#!/usr/bin/env bash
# Machine provider ID -> NodeClaim provider ID latency of a controller build, measured from the
# API server's side (issue 40): a real control plane with the Cluster API stand-in and no
# controller is served by one process (`SIM_BIN simulate --control-plane real --serve
# --no-controller --scenario none --provider-delay 2s --jitter 1s`), the launch scenario's node
# groups are seeded into it (MachineDeployments md-0..md-N-1, the NodeClass and NodePool
# `default`), the controller under test runs as another process (`BIN run --kubeconfig ...
# --disable-leader-election`), and once it is Ready the helper (provider-id-latency.py) opens a
# watch on Machines and one on NodeClaims, creates CLAIMS NodeClaims directly (as the launch
# scenario does; no pods) and records, per provider ID, when its watch first saw it on a
# Machine's spec.providerID and on a NodeClaim's status.providerID. Prints one JSON object:
# p50/p90/p99/max of the difference, the one-minute load average before and after, the
# controller's CPU during the measurement, its requests by verb and resource from kube-apiserver's
# audit log (conflicts: code 409), and the latency split at the audit timestamps of each claim's
# provider-ID status write. Management and workload share one API server (two apart are not set
# up). Per-claim times: $WORK/per-claim.jsonl. SAMPLES=1 adds every sample to the JSON.
#
# Usage: scripts/provider-id-latency.sh [CLAIMS]    (default 100)
# Env:   BIN (the controller under test, default target/debug/karpenter-capi), SIM_BIN (serves
#        the cluster, default target/debug/karpenter-capi: a build with `--control-plane real`
#        and `--serve --no-controller`), MACHINE_DEPLOYMENTS (default 10), PROVIDER_DELAY (2s),
#        JITTER (1s), DEADLINE (seconds to wait for every claim's provider ID, default 300),
#        HEALTH_PORT (default 28081), LABEL (a name for the build in the JSON), WORK (scratch
#        dir, default a new temp dir; the logs stay there), SETTLE (seconds between Ready and
#        the claims, default 5), KUBEBUILDER_ASSETS, KARPENTER_CAPI_TOOLS (kubectl),
#        KARPENTER_CAPI_UPSTREAM (Cluster API CRDs): defaults under target/ and ../shared.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
CLAIMS=${1:-100}
BIN=${BIN:-$root/target/debug/karpenter-capi}
SIM_BIN=${SIM_BIN:-$root/target/debug/karpenter-capi}
MDS=${MACHINE_DEPLOYMENTS:-10}
PROVIDER_DELAY=${PROVIDER_DELAY:-2s}
JITTER=${JITTER:-1s}
DEADLINE=${DEADLINE:-300}
HEALTH_PORT=${HEALTH_PORT:-28081}
SETTLE=${SETTLE:-5}
LABEL=${LABEL:-$BIN}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$root/target/control-plane}
export KARPENTER_CAPI_TOOLS=${KARPENTER_CAPI_TOOLS:-$root/target/tools/bin}
export KARPENTER_CAPI_UPSTREAM=${KARPENTER_CAPI_UPSTREAM:-$root/../shared/upstream}
export KUBECTL=$KARPENTER_CAPI_TOOLS/kubectl
KC="$WORK/cluster.kubeconfig"

for b in "$BIN" "$SIM_BIN"; do [ -x "$b" ] || { echo "no $b: build it first" >&2; exit 1; }; done
[ -x "$KUBECTL" ] || { echo "no kubectl in $KARPENTER_CAPI_TOOLS (.ci/install-tools)" >&2; exit 1; }

cleanup() {
  # Only the two processes this script started, by PID; simulate stops its control plane on
  # SIGTERM (etcd, kube-apiserver, kube-scheduler, kube-controller-manager).
  [ -n "${CTRL:-}" ] && kill "$CTRL" 2>/dev/null || true
  [ -n "${SIM:-}" ] && kill "$SIM" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

load1() { cut -d' ' -f1 /proc/loadavg; }
# utime + stime of a process, in ms.
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / hz)}' "/proc/$1/stat"; }

echo "standing up a real control plane (log: $WORK/sim.log)" >&2
"$SIM_BIN" simulate --control-plane real --serve --no-controller --scenario none \
  --machine-deployments 1 --provider-delay "$PROVIDER_DELAY" --jitter "$JITTER" --deadline 2h \
  --kubeconfig-out "$KC" >"$WORK/sim.log" 2>&1 &
SIM=$!
until grep -q "serving the simulated cluster" "$WORK/sim.log"; do
  kill -0 "$SIM" 2>/dev/null || { cat "$WORK/sim.log" >&2; exit 1; }
  sleep 1
done
python3 "$here/provider-id-latency.py" seed --kubeconfig "$KC" --machine-deployments "$MDS" \
  --max-size "$CLAIMS" >&2

"$BIN" run --kubeconfig "$KC" --disable-leader-election --metrics-port 0 \
  --health-probe-port "$HEALTH_PORT" >"$WORK/controller.log" 2>&1 &
CTRL=$!
start=$SECONDS
until curl -fsS "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null 2>&1; do
  kill -0 "$CTRL" 2>/dev/null || { cat "$WORK/controller.log" >&2; exit 1; }
  [ $((SECONDS - start)) -lt 120 ] || { echo "controller not Ready after 120 s" >&2; exit 1; }
  sleep 0.2
done
ready_s=$((SECONDS - start))
sleep "$SETTLE"

load_before=$(load1)
cpu_before=$(cpu_ms "$CTRL")
python3 "$here/provider-id-latency.py" measure --kubeconfig "$KC" --claims "$CLAIMS" \
  --machine-deployments "$MDS" --deadline "$DEADLINE" ${SAMPLES:+--samples} \
  --detail "$WORK/per-claim.jsonl" >"$WORK/measure.json"
cpu_after=$(cpu_ms "$CTRL")
load_after=$(load1)
# The controller's requests as the API server logged them: the real control plane keeps an audit
# log beside its certificates (the directory of the kubeconfig's CA file).
ca=$("$KUBECTL" --kubeconfig "$KC" config view --raw --minify \
  -o jsonpath='{.clusters[0].cluster.certificate-authority}')
if [ -n "$ca" ] && [ -f "$(dirname "$ca")/audit.log" ]; then
  python3 "$here/provider-id-latency.py" audit --log "$(dirname "$ca")/audit.log" \
    --detail "$WORK/per-claim.jsonl" >"$WORK/audit.json"
else
  echo '{}' >"$WORK/audit.json"
fi
python3 - "$WORK/measure.json" "$WORK/audit.json" <<EOF
import json, sys
m = json.load(open(sys.argv[1]))
out = {"label": "$LABEL", "load1_before": $load_before, "load1_after": $load_after,
       "controller_ready_s": $ready_s, "controller_cpu_ms": $cpu_after - $cpu_before,
       "work": "$WORK"}
out.update(m)
out.update(json.load(open(sys.argv[2])))
print(json.dumps(out))
EOF
