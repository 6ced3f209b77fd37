#!/usr/bin/env python3
"""Helper of scripts/provider-id-latency.sh (Python 3 standard library only).

  seed    --kubeconfig F --machine-deployments N --max-size M
          The launch scenario's node groups on a cluster served by `simulate --serve
          --no-controller --scenario none`: MachineDeployments md-0..md-(N-1) (4 CPUs / 16Gi,
          instance type sim-i, zone sim-zone-(i%3), price 0.20 + 0.01 i, max size M), each with
          its own infrastructure template, cloned from the seeded md-small; the seeded size
          MachineDeployments (md-small, ...) deleted; the ClusterAPINodeClass and NodePool
          `default` (consolidation off), as `simulate --scenario launch` seeds them.
  measure --kubeconfig F --claims N --machine-deployments M [--deadline S]
          Watches Machines and NodeClaims (from the current resourceVersion), creates N
          NodeClaims as the launch scenario writes them (round-robin over sim-0..sim-(M-1),
          32 requests at a time), and records for each provider ID the time this watch first saw
          it on a Machine's spec.providerID and on a NodeClaim's status.providerID. Prints one
          JSON object with the percentiles of the difference.
  audit   --log F [--detail per-claim.jsonl]
          The controller's requests in kube-apiserver's audit log F, by verb and resource, and
          their response codes (409: conflicts); with measure's per-claim file, the latency split
          at the API server's timestamps of the claim's status write (Machine provider ID seen ->
          write received -> write answered -> NodeClaim event seen).

The kubeconfig is read through `kubectl config view --raw -o json` (KUBECTL, default
target/tools/bin/kubectl), so no YAML parser is needed.
"""

import argparse
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

CAPI_GROUP = "cluster.x-k8s.io"
NS = "default"


class Client:
    def __init__(self, kubeconfig):
        kubectl = os.environ.get("KUBECTL", "target/tools/bin/kubectl")
        raw = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig,
             "config", "view", "--raw", "--minify", "-o", "json"],
            check=True, capture_output=True, text=True).stdout
        cfg = json.loads(raw)
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        url = urllib.parse.urlparse(cluster["server"])
        self.host, self.port = url.hostname, url.port or 443
        self.tmp = None

        def path_of(key):
            if key in user or key in cluster:
                return (user.get(key) or cluster.get(key))
            data = user.get(key + "-data") or cluster.get(key + "-data")
            if data is None:
                return None
            import atexit
            import base64
            import shutil
            if self.tmp is None:
                self.tmp = tempfile.mkdtemp(prefix="pid-latency-")
                atexit.register(shutil.rmtree, self.tmp, True)
            p = os.path.join(self.tmp, key)
            with open(p, "wb") as f:
                f.write(base64.b64decode(data))
            return p

        ctx = ssl.create_default_context(cafile=path_of("certificate-authority"))
        cert, key = path_of("client-certificate"), path_of("client-key")
        if cert:
            ctx.load_cert_chain(cert, key)
        self.token = user.get("token")
        self.ctx = ctx

    def conn(self, timeout=30):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def headers(self, content_type=None):
        h = {"Accept": "application/json", "User-Agent": "provider-id-latency"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if content_type:
            h["Content-Type"] = content_type
        return h

    def request(self, method, path, body=None, content_type="application/json", ok=(200, 201, 202)):
        c = self.conn()
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers=self.headers(content_type if data else None))
        r = c.getresponse()
        out = r.read()
        c.close()
        if r.status not in ok:
            raise RuntimeError(f"{method} {path}: {r.status} {out[:300]!r}")
        return json.loads(out) if out else None


def capi_version(cl):
    """The Cluster API version the seeded MachineDeployments are served at (preferred)."""
    groups = cl.request("GET", f"/apis/{CAPI_GROUP}")
    return groups["preferredVersion"]["version"]


def seed(args):
    cl = Client(args.kubeconfig)
    v = capi_version(cl)
    mds = f"/apis/{CAPI_GROUP}/{v}/namespaces/{NS}/machinedeployments"
    base = cl.request("GET", f"{mds}/md-small")
    infra = base["spec"]["template"]["spec"]["infrastructureRef"]
    infra_group = infra.get("apiGroup") or infra["apiVersion"].split("/")[0]
    infra_groups = cl.request("GET", f"/apis/{infra_group}")
    infra_v = infra_groups["preferredVersion"]["version"]
    plural = infra["kind"].lower() + "s"
    templates = f"/apis/{infra_group}/{infra_v}/namespaces/{NS}/{plural}"
    tmpl = cl.request("GET", f"{templates}/{infra['name']}")

    def clean(obj):
        meta = obj["metadata"]
        keep = ("name", "namespace", "labels", "annotations")
        obj["metadata"] = {k: meta[k] for k in keep if k in meta}
        obj.pop("status", None)
        return obj

    def renamed(obj, old, new):
        return json.loads(json.dumps(obj).replace(f'"{old}"', f'"{new}"'))

    tmpl, base = clean(tmpl), clean(base)
    for i in range(args.machine_deployments):
        name = f"md-{i}"
        cl.request("POST", templates, renamed(tmpl, "md-small", name))
        md = renamed(base, "md-small", name)
        md["spec"]["replicas"] = 0
        md["metadata"]["annotations"] = {
            "capacity.cluster-autoscaler.kubernetes.io/cpu": "4",
            "capacity.cluster-autoscaler.kubernetes.io/memory": "16Gi",
            "capacity.cluster-autoscaler.kubernetes.io/maxPods": "110",
            "capacity.cluster-autoscaler.kubernetes.io/labels":
                f"node.kubernetes.io/instance-type=sim-{i},"
                f"topology.kubernetes.io/zone=sim-zone-{i % 3},"
                "kubernetes.io/arch=amd64,kubernetes.io/os=linux,"
                "karpenter.sh/capacity-type=on-demand",
            "cluster.x-k8s.io/machine-current-price": f"{0.2 + 0.01 * i:.2f}",
            "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
            "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": str(args.max_size),
        }
        md["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})[
            "node.cluster.x-k8s.io/pool"] = name
        cl.request("POST", mds, md)
    # The size MachineDeployments `--scenario none` seeds (md-small, md-medium, ...) go: only the
    # launch scenario's node groups are offered.
    for md in cl.request("GET", mds)["items"]:
        name = md["metadata"]["name"]
        if not name.startswith("md-") or not name[3:].isdigit():
            cl.request("DELETE", f"{mds}/{name}")
    cl.request("POST", "/apis/karpenter.cluster.x-k8s.io/v1alpha1/clusterapinodeclasses", {
        "apiVersion": "karpenter.cluster.x-k8s.io/v1alpha1", "kind": "ClusterAPINodeClass",
        "metadata": {"name": "default"}, "spec": {}})
    cl.request("POST", "/apis/karpenter.sh/v1/nodepools", {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In",
                              "values": ["on-demand"]}],
            "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io",
                             "kind": "ClusterAPINodeClass", "name": "default"}}},
            "disruption": {"consolidateAfter": "Never"}}})
    print(json.dumps({"seeded": args.machine_deployments, "cluster_api_version": v}))


class Watch(threading.Thread):
    """One watch; `on_event(type, obj, t)` is called with the receipt time of each event."""

    def __init__(self, cl, path, on_event):
        super().__init__(daemon=True)
        self.cl, self.path, self.on_event = cl, path, on_event
        self.rv = cl.request("GET", path + "?limit=1")["metadata"]["resourceVersion"]
        self.stopped = False
        self.restarts = 0

    def run(self):
        while not self.stopped:
            try:
                c = self.cl.conn(timeout=600)
                q = urllib.parse.urlencode({"watch": "true", "resourceVersion": self.rv,
                                            "allowWatchBookmarks": "true", "timeoutSeconds": "600"})
                c.request("GET", f"{self.path}?{q}", headers=self.cl.headers())
                r = c.getresponse()
                if r.status != 200:
                    raise RuntimeError(f"watch {self.path}: {r.status} {r.read()[:200]!r}")
                while not self.stopped:
                    line = r.readline()
                    if not line:
                        break
                    t = time.time()
                    ev = json.loads(line)
                    obj = ev.get("object", {})
                    if ev.get("type") == "ERROR":
                        raise RuntimeError(f"watch {self.path}: {obj}")
                    rv = obj.get("metadata", {}).get("resourceVersion")
                    if rv:
                        self.rv = rv
                    if ev.get("type") != "BOOKMARK":
                        self.on_event(ev["type"], obj, t)
            except Exception as e:  # noqa: BLE001 - a cut watch resumes from its last version
                if self.stopped:
                    return
                self.restarts += 1
                print(f"watch {self.path} restarted: {e}", file=sys.stderr)
                time.sleep(0.2)


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    # nearest rank
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return round(s[k], 1)


def measure(args):
    cl = Client(args.kubeconfig)
    v = capi_version(cl)
    lock = threading.Lock()
    machine_seen, claim_seen, claim_created, claim_of_pid = {}, {}, {}, {}
    counts = {"machine_events": 0, "claim_events": 0}

    def on_machine(kind, obj, t):
        pid = (obj.get("spec") or {}).get("providerID")
        with lock:
            counts["machine_events"] += 1
            if pid and pid not in machine_seen:
                machine_seen[pid] = t

    def on_claim(kind, obj, t):
        name = obj["metadata"]["name"]
        pid = (obj.get("status") or {}).get("providerID")
        with lock:
            counts["claim_events"] += 1
            claim_created.setdefault(name, t)
            if pid and pid not in claim_seen:
                claim_seen[pid] = t
                claim_of_pid[pid] = name

    watches = [Watch(cl, f"/apis/{CAPI_GROUP}/{v}/machines", on_machine),
               Watch(cl, "/apis/karpenter.sh/v1/nodeclaims", on_claim)]
    for w in watches:
        w.start()
    pool = cl.request("GET", "/apis/karpenter.sh/v1/nodepools/default")
    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": "default",
             "uid": pool["metadata"]["uid"], "blockOwnerDeletion": True}

    def claim(i):
        it = f"sim-{i % args.machine_deployments}"
        req = lambda k, vals: {"key": k, "operator": "In", "values": vals}  # noqa: E731
        return cl.request("POST", "/apis/karpenter.sh/v1/nodeclaims", {
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"generateName": "default-", "labels": {"karpenter.sh/nodepool": "default"},
                         "ownerReferences": [owner]},
            "spec": {"requirements": [req("karpenter.sh/nodepool", ["default"]),
                                      req("node.kubernetes.io/instance-type", [it]),
                                      req("karpenter.sh/capacity-type", ["on-demand"])],
                     "resources": {"requests": {"cpu": "1", "memory": "1Gi", "pods": "1"}},
                     "nodeClassRef": {"group": "karpenter.cluster.x-k8s.io",
                                      "kind": "ClusterAPINodeClass", "name": "default"}}})

    time.sleep(0.5)  # the watches are open
    start = time.time()
    with ThreadPoolExecutor(32) as ex:
        list(ex.map(claim, range(args.claims)))
    created = time.time()
    deadline = start + args.deadline
    while time.time() < deadline:
        with lock:
            done = len(claim_seen) >= args.claims
        if done:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    for w in watches:
        w.stopped = True
    with lock:
        lat = [(claim_seen[p] - machine_seen[p]) * 1000 for p in claim_seen if p in machine_seen]
        to_machine_pid = [(machine_seen[p] - start) * 1000 for p in machine_seen]
        to_claim_pid = [(claim_seen[p] - start) * 1000 for p in claim_seen]
        report = {
            "claims": args.claims,
            "machines_with_provider_id": len(machine_seen),
            "claims_with_provider_id": len(claim_seen),
            "matched": len(lat),
            "create_ms": round((created - start) * 1000),
            "provider_id_to_claim_ms": {q: pct(lat, n) for q, n in
                                        (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
            "created_to_machine_provider_id_ms": {q: pct(to_machine_pid, n) for q, n in
                                                  (("p50", 50), ("p99", 99), ("max", 100))},
            "created_to_claim_provider_id_ms": {q: pct(to_claim_pid, n) for q, n in
                                                (("p50", 50), ("p99", 99), ("max", 100))},
            "watch_events": dict(counts),
            "watch_restarts": sum(w.restarts for w in watches),
            "timed_out": len(claim_seen) < args.claims,
        }
        if args.samples:
            report["samples_ms"] = sorted(round(x, 1) for x in lat)
        if args.detail:
            with open(args.detail, "w") as f:
                for p in sorted(claim_seen, key=lambda p: machine_seen.get(p, 0)):
                    row = {"claim": claim_of_pid[p], "provider_id": p,
                           "machine_at": machine_seen.get(p), "claim_at": claim_seen[p]}
                    f.write(json.dumps(row) + "\n")
    print(json.dumps(report))


def stamp(ts):
    """An audit timestamp (RFC 3339, microseconds) as seconds since the epoch."""
    import datetime
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def audit(args):
    """The controller's requests (User-Agent karpenter-capi/...) in kube-apiserver's audit log,
    by verb and resource, with the conflicts (409) among them."""
    by, codes = {}, {}
    status_writes = {}  # claim -> [(received, completed)] of its status patches
    for line in open(args.log, errors="replace"):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("stage") != "ResponseComplete":
            continue
        if not e.get("userAgent", "").startswith("karpenter-capi/"):
            continue
        ref = e.get("objectRef") or {}
        res = ref.get("resource", "?")
        if ref.get("subresource"):
            res += "/" + ref["subresource"]
        key = f"{e.get('verb')} {res}"
        by[key] = by.get(key, 0) + 1
        code = str((e.get("responseStatus") or {}).get("code"))
        codes[code] = codes.get(code, 0) + 1
        if key == "patch nodeclaims/status" and code == "200":
            status_writes.setdefault(ref.get("name"), []).append(
                (stamp(e["requestReceivedTimestamp"]), stamp(e["stageTimestamp"])))
    verbs = ("create", "update", "patch", "delete")
    writes = sum(v for k, v in by.items() if k.split()[0] in verbs)
    split = {}
    if args.detail and os.path.exists(args.detail):
        # The claim's first status write received after its Machine's provider ID was seen is
        # the one carrying the provider ID: split the latency at the API server's timestamps.
        parts = {"machine_to_status_write_received_ms": [], "status_write_served_ms": [],
                 "status_write_answered_to_watch_ms": []}
        for line in open(args.detail):
            r = json.loads(line)
            after = [w for w in status_writes.get(r["claim"], [])
                     if r["machine_at"] and w[0] >= r["machine_at"] - 0.05]
            if not after:
                continue
            received, done = min(after)
            parts["machine_to_status_write_received_ms"].append((received - r["machine_at"]) * 1000)
            parts["status_write_served_ms"].append((done - received) * 1000)
            parts["status_write_answered_to_watch_ms"].append((r["claim_at"] - done) * 1000)
        split = {k: {q: pct(v, n) for q, n in (("p50", 50), ("p90", 90), ("p99", 99))}
                 for k, v in parts.items()}
    print(json.dumps({"controller_requests": dict(sorted(by.items())), "controller_codes": codes,
                      "provider_id_to_claim_split": split,
                      "controller_writes": writes}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed")
    s.add_argument("--kubeconfig", required=True)
    s.add_argument("--machine-deployments", type=int, default=10)
    s.add_argument("--max-size", type=int, default=100)
    m = sub.add_parser("measure")
    m.add_argument("--kubeconfig", required=True)
    m.add_argument("--claims", type=int, default=100)
    m.add_argument("--machine-deployments", type=int, default=10)
    m.add_argument("--deadline", type=float, default=300)
    m.add_argument("--samples", action="store_true")
    m.add_argument("--detail", help="write one JSON line per provider ID (claim, both times) here")
    au = sub.add_parser("audit")
    au.add_argument("--log", required=True)
    au.add_argument("--detail", help="measure's per-claim file: split the latency at the server")
    a = p.parse_args()
    {"seed": seed, "measure": measure, "audit": audit}[a.cmd](a)


if __name__ == "__main__":
    main()
