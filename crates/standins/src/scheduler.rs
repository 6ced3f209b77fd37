//! Scheduler stand-in: binds pending pods to Ready, schedulable Nodes they fit on (requests,
//! nodeSelector, required node affinity, required pod anti-affinity, NoSchedule/NoExecute
//! taints) through `pods/binding`, and marks the rest `PodScheduled=False, reason Unschedulable` — the signal Karpenter's
//! provisioner acts on. Event driven on pod and node changes, with a short debounce so a burst
//! of events becomes one pass.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::runtime::reflector::{self, Store};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

mod fit;

pub use fit::*;

use super::kubelet::node_ready;
use super::standin::{Shutdown, is_conflict, is_not_found, log_retry, merge_status, spawn_watch};

pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// Bindings (and status writes) of one pass in flight at once.
const WRITES_IN_FLIGHT: usize = 32;

/// A schedulable node in a pass: its allocatable parsed once, its use as the pass places pods.
struct Slot {
    node: Arc<Node>,
    name: String,
    allocatable: Usage,
    used: Usage,
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Quiet time after an event before a pass runs, so bursts coalesce.
    pub debounce: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(20),
        }
    }
}

/// One pod bound by the stand-in.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BindRecord {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub bound_at: jiff::Timestamp,
}

/// Every binding the stand-in made, in order (the API server's write log has them too).
#[derive(Clone, Debug, Default)]
pub struct BindLog(Arc<Mutex<Vec<BindRecord>>>);

impl BindLog {
    pub fn records(&self) -> Vec<BindRecord> {
        self.0.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }
}

struct Inner {
    client: Client,
    cfg: SchedulerConfig,
    pods: Store<Pod>,
    nodes: Store<Node>,
    wake: Notify,
    log: BindLog,
    /// Pods bound by us that the pod cache may not show as bound yet (uid -> node).
    recent: Mutex<HashMap<String, String>>,
    /// Pods marked unschedulable (uid -> when their message may be rewritten next, and the
    /// backoff after that).
    marked: Mutex<HashMap<String, (Instant, Duration)>>,
    retry: AtomicBool,
    shutdown: Shutdown,
}

/// Starts the scheduler stand-in on the current runtime; every task stops on `shutdown`.
pub fn spawn(
    client: Client,
    cfg: SchedulerConfig,
    shutdown: Shutdown,
) -> (BindLog, Vec<JoinHandle<()>>) {
    let (pods, mut pod_writer) = reflector::store::<Pod>();
    let (nodes, mut node_writer) = reflector::store::<Node>();
    let inner = Arc::new(Inner {
        client: client.clone(),
        cfg,
        pods,
        nodes,
        wake: Notify::new(),
        log: BindLog::default(),
        recent: Mutex::new(HashMap::new()),
        marked: Mutex::new(HashMap::new()),
        retry: AtomicBool::new(false),
        shutdown: shutdown.clone(),
    });
    let mut tasks = Vec::new();
    let me = inner.clone();
    tasks.push(spawn_watch(
        "pods (scheduler)",
        Api::<Pod>::all(client.clone()),
        shutdown.clone(),
        move |event| {
            pod_writer.apply_watcher_event(&event);
            me.wake.notify_one();
        },
    ));
    let me = inner.clone();
    tasks.push(spawn_watch(
        "nodes (scheduler)",
        Api::<Node>::all(client),
        shutdown,
        move |event| {
            node_writer.apply_watcher_event(&event);
            me.wake.notify_one();
        },
    ));
    let me = inner.clone();
    tasks.push(tokio::spawn(async move {
        let mut stop = me.shutdown.clone();
        loop {
            tokio::select! {
                _ = me.wake.notified() => {}
                _ = stop.wait() => break,
            }
            if !me.shutdown.sleep(me.cfg.debounce).await {
                break;
            }
            me.pass().await;
            // A failed write is retried after a pause, even if nothing else changes.
            if me.retry.swap(false, Ordering::Relaxed) {
                if !me.shutdown.sleep(Duration::from_millis(200)).await {
                    break;
                }
                me.wake.notify_one();
            }
        }
    }));
    (inner.log.clone(), tasks)
}

impl Inner {
    /// One scheduling cycle over every pending pod, in creation order: decide each pod's node
    /// against the nodes' free room (updated as the pass places pods), then write the bindings
    /// and the `Unschedulable` conditions concurrently, as kube-scheduler's binding cycles run
    /// in parallel with the next pod's scheduling cycle.
    async fn pass(&self) {
        let pods = self.pods.state();
        let nodes = self.nodes.state();
        self.forget_settled(&pods);
        let recent = self.recent.lock().clone();

        let mut usage: HashMap<String, Usage> = HashMap::new();
        let mut placed = Placed::default();
        let mut pending = Vec::new();
        for pod in &pods {
            if is_terminal(pod) {
                continue;
            }
            let uid = pod.uid().unwrap_or_default();
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .or_else(|| recent.get(&uid).cloned());
            match node {
                Some(node) => {
                    usage
                        .entry(node.clone())
                        .or_default()
                        .add(&pod_requests(pod));
                    placed.add(&node, pod);
                }
                None if wants_us(pod) => pending.push(pod.clone()),
                None => {}
            }
        }
        // Nothing to schedule: a pass over the nodes (their events wake it) would decide nothing.
        if pending.is_empty() {
            return;
        }
        pending.sort_by_key(|p| {
            (
                p.metadata.creation_timestamp.clone().map(|t| t.0),
                p.name_any(),
            )
        });

        let mut slots: Vec<Slot> = nodes
            .iter()
            .filter(|n| {
                node_ready(n)
                    && n.metadata.deletion_timestamp.is_none()
                    && !n
                        .spec
                        .as_ref()
                        .and_then(|s| s.unschedulable)
                        .unwrap_or(false)
            })
            .map(|n| {
                let name = n.name_any();
                Slot {
                    used: usage.remove(&name).unwrap_or_default(),
                    allocatable: allocatable(n),
                    node: n.clone(),
                    name,
                }
            })
            .collect();
        slots.sort_by(|a, b| a.name.cmp(&b.name));
        let not_ready = nodes.len() - slots.len();
        let node_labels: HashMap<String, BTreeMap<String, String>> = nodes
            .iter()
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect();

        // The most any node has free, per resource: an upper bound for the whole pass (placing
        // pods only lowers it). A pod over it fits nowhere; if it is already marked
        // Unschedulable there is nothing to write, so it costs no walk over the nodes. With
        // thousands of pods pending and every node full, this is most of them.
        let mut max_free = Usage::default();
        for slot in &slots {
            for (k, a) in &slot.allocatable.0 {
                let free = a - slot.used.get(k);
                let e = max_free.0.entry(k.clone()).or_insert(free);
                *e = (*e).max(free);
            }
        }
        let mut binds = Vec::new();
        let mut unschedulable = Vec::new();
        for pod in pending {
            let requests = pod_requests(&pod);
            let fits_nowhere = requests
                .0
                .iter()
                .any(|(k, want)| *want > 0 && *want > max_free.get(k));
            if fits_nowhere && is_marked_unschedulable(&pod) {
                continue;
            }
            let taken = taken_domains(&pod, &node_labels, &placed);
            let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
            let mut best: Option<(usize, i128)> = None;
            for (i, slot) in slots.iter().enumerate() {
                let fit =
                    fits_allocatable(&pod, &requests, &slot.node, &slot.allocatable, &slot.used)
                        .and_then(|free| {
                            if taken.allow(&slot.node) {
                                Ok(free)
                            } else {
                                Err("node(s) didn't match pod anti-affinity rules".to_string())
                            }
                        });
                match fit {
                    Ok(score) => {
                        if best.is_none_or(|(_, f)| score > f) {
                            best = Some((i, score));
                        }
                    }
                    Err(reason) => *reasons.entry(reason).or_default() += 1,
                }
            }
            if not_ready > 0 {
                reasons.insert("node(s) were not ready".into(), not_ready);
            }
            match best {
                Some((i, _)) => {
                    let slot = &mut slots[i];
                    slot.used.add(&requests);
                    placed.add(&slot.name, &pod);
                    binds.push((pod, slot.name.clone()));
                }
                None => unschedulable.push((pod, reasons)),
            }
        }
        let total = nodes.len();
        let binding = stream::iter(binds)
            .map(|(pod, node)| self.bind_owned(pod, node))
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect::<Vec<bool>>();
        let marking = stream::iter(unschedulable)
            .map(|(pod, reasons)| self.mark_owned(pod, total, reasons))
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect::<Vec<()>>();
        futures::join!(binding, marking);
    }

    async fn bind_owned(&self, pod: Arc<Pod>, node: String) -> bool {
        self.bind(&pod, &node).await
    }

    async fn mark_owned(&self, pod: Arc<Pod>, total: usize, reasons: BTreeMap<String, usize>) {
        self.mark_unschedulable(&pod, total, &reasons).await
    }

    /// Drops pods from `recent` once the cache shows them bound (or gone), and from `marked`
    /// once they are no longer pending.
    fn forget_settled(&self, pods: &[Arc<Pod>]) {
        let unsettled: HashSet<String> = pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
            .map(|p| p.uid().unwrap_or_default())
            .collect();
        self.recent.lock().retain(|uid, _| unsettled.contains(uid));
        self.marked.lock().retain(|uid, _| unsettled.contains(uid));
    }

    async fn bind(&self, pod: &Pod, node: &str) -> bool {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        let result: Result<serde_json::Value, kube::Error> = api
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await;
        match result {
            Ok(_) => {
                self.recent
                    .lock()
                    .insert(pod.uid().unwrap_or_default(), node.to_string());
                self.log.0.lock().push(BindRecord {
                    namespace: ns,
                    name,
                    node: node.to_string(),
                    bound_at: jiff::Timestamp::now(),
                });
                true
            }
            // Already bound (by an earlier attempt) or gone: the cache catches up.
            Err(err) if is_conflict(&err) || is_not_found(&err) => false,
            Err(err) => {
                log_retry(
                    "scheduler stand-in: bind",
                    &format!("pod {name} to {node}"),
                    &err,
                );
                self.retry_later();
                false
            }
        }
    }

    async fn mark_unschedulable(&self, pod: &Pod, total: usize, reasons: &BTreeMap<String, usize>) {
        let detail = reasons
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect::<Vec<_>>()
            .join(", ");
        let message = if detail.is_empty() {
            format!("0/{total} nodes are available.")
        } else {
            format!("0/{total} nodes are available: {detail}.")
        };
        let mut conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let current = conditions.iter().find(|c| c.type_ == "PodScheduled");
        let marked = current
            .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"));
        if marked && current.is_some_and(|c| c.message.as_deref() == Some(message.as_str())) {
            return;
        }
        // A pod already marked gets its message rewritten at most once per backoff (1 s,
        // doubling to 10 s), as kube-scheduler retries an unschedulable pod after its backoff:
        // otherwise every node event would rewrite every pending pod.
        let uid = pod.uid().unwrap_or_default();
        let now = Instant::now();
        {
            let mut backoffs = self.marked.lock();
            let (next, delay) = backoffs.get(&uid).copied().unwrap_or((now, Duration::ZERO));
            if marked && now < next {
                return;
            }
            let delay = (delay * 2).clamp(Duration::from_secs(1), Duration::from_secs(10));
            backoffs.insert(uid, (now + delay, delay));
        }
        conditions.retain(|c| c.type_ != "PodScheduled");
        let mut conditions: Vec<serde_json::Value> = conditions
            .iter()
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        conditions.push(json!({
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": now,
        }));
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch = json!({"status": {"conditions": conditions, "phase": "Pending"}});
        match merge_status(&api, &pod.name_any(), &patch).await {
            Ok(()) => {}
            Err(err) if is_not_found(&err) => {}
            Err(err) => {
                log_retry(
                    "scheduler stand-in: status",
                    &format!("pod {}", pod.name_any()),
                    &err,
                );
                self.retry_later();
            }
        }
    }

    /// A failed write is retried by a later pass, after a short pause.
    fn retry_later(&self) {
        self.retry.store(true, Ordering::Relaxed);
    }
}

fn is_marked_unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
}

fn is_terminal(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

fn wants_us(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .is_none_or(|n| n == DEFAULT_SCHEDULER_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn node(labels: Value, taints: Value, cpu: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "2"}},
        }))
        .unwrap()
    }

    fn container(cpu: &str) -> Value {
        json!([{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}])
    }

    #[test]
    fn requests_sum_containers_and_respect_init_and_limits() {
        let p = pod(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m"}}},
                {"name": "b", "resources": {"limits": {"cpu": "250m", "memory": "1Gi"}}},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
        }));
        let r = pod_requests(&p);
        assert_eq!(r.get("cpu"), 2000);
        assert_eq!(r.get("memory"), (1i128 << 30) * 1000);
        assert_eq!(r.get("pods"), 1000);
    }

    #[test]
    fn pod_level_requests_replace_the_containers_for_what_they_name() {
        let p = pod(json!({
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}],
            "resources": {"requests": {"cpu": "3"}},
            "overhead": {"cpu": "100m"},
        }));
        let r = pod_requests(&p);
        assert_eq!(r.get("cpu"), 3100);
        assert_eq!(r.get("memory"), (1i128 << 30) * 1000);
    }

    #[test]
    fn fit_checks_resources_and_pod_slots() {
        let n = node(json!({}), json!([]), "2");
        let p = pod(json!({"containers": container("1500m")}));
        let r = pod_requests(&p);
        // 0.5 of 2 CPUs and 3 of 4 GiB left free: (0.25 + 0.75) / 2.
        assert_eq!(fits(&p, &r, &n, &Usage::default()), Ok(500_000));
        let mut used = Usage::default();
        used.add(&r);
        assert_eq!(fits(&p, &r, &n, &used), Err("Insufficient cpu".into()));
        let small = pod(json!({"containers": container("1m")}));
        let rs = pod_requests(&small);
        let mut two = Usage::default();
        two.add(&rs);
        two.add(&rs);
        assert_eq!(fits(&small, &rs, &n, &two), Err("Too many pods".into()));
    }

    #[test]
    fn the_least_allocated_node_by_cpu_and_memory_share_scores_highest() {
        // A 1 CPU / 3 GiB pod. On `cpu` it leaves 3 of 8 CPUs and none of 3 GiB free; on
        // `mem`, 1 of 2 CPUs and 3 of 6 GiB. More CPU stays free on `cpu` (3 against 1), but
        // kube-scheduler averages the shares: 0.19 against 0.5.
        let at = |name: &str, cpu: &str, memory: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "10"}},
            }))
            .unwrap()
        };
        let p = pod(
            json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "3Gi"}}}]}),
        );
        let r = pod_requests(&p);
        let score = |n: &Node, used_cpu: &str| {
            let mut used = Usage::default();
            used.0.insert(
                "cpu".into(),
                crate::quantity::parse_milli(used_cpu).unwrap(),
            );
            fits(&p, &r, n, &used).unwrap()
        };
        let cpu_rich = score(&at("cpu", "8", "3Gi"), "4");
        let balanced = score(&at("mem", "2", "6Gi"), "0");
        assert!(balanced > cpu_rich, "{balanced} <= {cpu_rich}");
    }

    #[test]
    fn selector_and_affinity_operators() {
        let n = node(json!({"zone": "a", "gen": "5"}), json!([]), "4");
        let with = |spec: Value| {
            let p = pod(spec);
            let r = pod_requests(&p);
            fits(&p, &r, &n, &Usage::default()).is_ok()
        };
        let affinity = |expr: Value| json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}});
        assert!(with(
            json!({"containers": [], "nodeSelector": {"zone": "a"}})
        ));
        assert!(!with(
            json!({"containers": [], "nodeSelector": {"zone": "b"}})
        ));
        assert!(with(affinity(
            json!({"key": "zone", "operator": "In", "values": ["a", "b"]})
        )));
        assert!(!with(affinity(
            json!({"key": "zone", "operator": "NotIn", "values": ["a"]})
        )));
        assert!(with(affinity(json!({"key": "zone", "operator": "Exists"}))));
        assert!(with(affinity(
            json!({"key": "gpu", "operator": "DoesNotExist"})
        )));
        assert!(with(affinity(
            json!({"key": "gen", "operator": "Gt", "values": ["4"]})
        )));
        assert!(!with(affinity(
            json!({"key": "gen", "operator": "Lt", "values": ["5"]})
        )));
        assert!(!with(affinity(
            json!({"key": "zone", "operator": "Gt", "values": ["1"]})
        )));
    }

    #[test]
    fn required_anti_affinity_spreads_over_hostnames() {
        let mut a = node(json!({"kubernetes.io/hostname": "a"}), json!([]), "4");
        a.metadata.name = Some("a".into());
        let mut b = node(json!({"kubernetes.io/hostname": "b"}), json!([]), "4");
        b.metadata.name = Some("b".into());
        let labels: HashMap<String, BTreeMap<String, String>> = [&a, &b]
            .iter()
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect();
        let spread: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "d", "labels": {"app": "x"}},
            "spec": {"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}
            ]}}},
        }))
        .unwrap();
        let mut placed = Placed::default();
        assert!(anti_affinity_ok(&spread, &a, &labels, &placed));
        placed.add("a", &spread);
        assert!(!anti_affinity_ok(&spread, &a, &labels, &placed));
        assert!(anti_affinity_ok(&spread, &b, &labels, &placed));
        // Another namespace is out of scope by default.
        let mut other = spread.clone();
        other.metadata.namespace = Some("elsewhere".into());
        assert!(anti_affinity_ok(&other, &a, &labels, &placed));
    }

    #[test]
    fn taints_need_tolerations() {
        let n = node(
            json!({}),
            json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}, {"key": "soft", "effect": "PreferNoSchedule"}]),
            "4",
        );
        let check = |tolerations: Value| {
            let p = pod(json!({"containers": [], "tolerations": tolerations}));
            let r = pod_requests(&p);
            fits(&p, &r, &n, &Usage::default())
        };
        assert_eq!(
            check(json!([])),
            Err("node(s) had untolerated taint {karpenter.sh/unregistered: }".into())
        );
        assert!(check(json!([{"key": "karpenter.sh/unregistered", "operator": "Exists"}])).is_ok());
        assert!(check(json!([{"operator": "Exists"}])).is_ok());
        assert!(check(json!([{"key": "karpenter.sh/unregistered", "operator": "Exists", "effect": "NoSchedule"}])).is_err());
    }
}
