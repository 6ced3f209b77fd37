//! Cluster-level default topology spread constraints, applied as kube-scheduler's
//! PodTopologySpread plugin applies its `defaultConstraints` (Karpenter core's
//! `--scheduler-config`, `pkg/controllers/provisioning/scheduling/defaultconstraints.go`).
//!
//! A pod that declares no `topologySpreadConstraints` of its own is spread by the configured
//! defaults, each given a label selector deduced for that pod: the selectors of the Services in
//! its namespace that select it (as equality labels), plus the selector of its controller when
//! that is a ReplicationController, ReplicaSet or StatefulSet (kube-scheduler's
//! `helper.DefaultSelector`). A pod for which nothing can be deduced (a bare pod, a Job's pod no
//! Service selects) gets no default: an empty selector would count every pod in the namespace.
//! Without a configuration nothing changes: upstream's default is no default constraints (it
//! does not mirror kube-scheduler's built-in system defaults).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, OwnerReference,
};
use serde::Deserialize;

use crate::api::validation::qualified_name;

/// Why a `--scheduler-config` document was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("scheduler config: {0}")]
    Decode(String),
    #[error("scheduler config: podTopologySpread.defaultConstraints[{index}]{reason}")]
    Invalid { index: usize, reason: String },
    #[error(
        "scheduler config: podTopologySpread.defaultConstraints[{index}] repeats [{earlier}] ({topology_key}, {when_unsatisfiable})"
    )]
    Duplicate {
        index: usize,
        earlier: usize,
        topology_key: String,
        when_unsatisfiable: String,
    },
}

/// The `--scheduler-config` document: the parts of the cluster's kube-scheduler configuration
/// the solve must mirror (upstream's `SchedulerConfiguration`, same field names).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SchedulerConfig {
    pod_topology_spread: Option<PodTopologySpreadConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PodTopologySpreadConfig {
    #[serde(default)]
    default_constraints: Vec<TopologySpreadConstraint>,
}

/// The configured default constraints (never empty), without selectors.
#[derive(Clone, Debug, PartialEq)]
pub struct DefaultConstraints(Arc<[TopologySpreadConstraint]>);

impl DefaultConstraints {
    /// Decodes and checks a `--scheduler-config` document (YAML or JSON). Empty, or a document
    /// with no default constraints: `None` (nothing is defaulted).
    pub fn parse(raw: &str) -> Result<Option<DefaultConstraints>, ConfigError> {
        if raw.trim().is_empty() {
            return Ok(None);
        }
        let config: SchedulerConfig =
            serde_saphyr::from_str(raw).map_err(|e| ConfigError::Decode(e.to_string()))?;
        let constraints = config
            .pod_topology_spread
            .map(|p| p.default_constraints)
            .unwrap_or_default();
        validate(&constraints)?;
        Ok((!constraints.is_empty()).then(|| DefaultConstraints(constraints.into())))
    }

    pub(crate) fn constraints(&self) -> &[TopologySpreadConstraint] {
        &self.0
    }
}

/// kube-scheduler's `ValidatePodTopologySpreadArgs`, as upstream mirrors it: a document accepted
/// here is one kube-scheduler accepts too.
fn validate(constraints: &[TopologySpreadConstraint]) -> Result<(), ConfigError> {
    for (index, c) in constraints.iter().enumerate() {
        let invalid = |reason: String| ConfigError::Invalid { index, reason };
        if c.max_skew <= 0 {
            return Err(invalid(format!(
                ".maxSkew: {} must be greater than 0",
                c.max_skew
            )));
        }
        if c.topology_key.is_empty() {
            return Err(invalid(".topologyKey must be set".into()));
        }
        qualified_name(&c.topology_key).map_err(|e| invalid(format!(".topologyKey: {e}")))?;
        if !matches!(
            c.when_unsatisfiable.as_str(),
            "DoNotSchedule" | "ScheduleAnyway"
        ) {
            return Err(invalid(format!(
                ".whenUnsatisfiable: {:?} must be DoNotSchedule or ScheduleAnyway",
                c.when_unsatisfiable
            )));
        }
        // The selector is deduced per pod; a static one would count an unrelated set of pods
        // in every other workload.
        if c.label_selector.is_some() {
            return Err(invalid(
                ".labelSelector must not be set: selectors are deduced for each pod".into(),
            ));
        }
        // Inert upstream (the deduced selector overwrites what it would merge into).
        if c.match_label_keys.as_ref().is_some_and(|k| !k.is_empty()) {
            return Err(invalid(
                ".matchLabelKeys must not be set: it has no effect on default constraints".into(),
            ));
        }
        if let Some(earlier) = constraints[..index].iter().position(|e| {
            e.topology_key == c.topology_key && e.when_unsatisfiable == c.when_unsatisfiable
        }) {
            return Err(ConfigError::Duplicate {
                index,
                earlier,
                topology_key: c.topology_key.clone(),
                when_unsatisfiable: c.when_unsatisfiable.clone(),
            });
        }
    }
    Ok(())
}

/// The owner kinds a selector is deduced from, as (apiVersion, kind).
pub(crate) const REPLICATION_CONTROLLER: (&str, &str) = ("v1", "ReplicationController");
pub(crate) const REPLICA_SET: (&str, &str) = ("apps/v1", "ReplicaSet");
pub(crate) const STATEFUL_SET: (&str, &str) = ("apps/v1", "StatefulSet");

/// What a controller adds to a deduced selector, split the way kube-scheduler folds it in: a
/// ReplicationController's selector is merged into the Services' labels (overwriting a key they
/// share), a ReplicaSet's or StatefulSet's is ANDed on as requirements.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnerSelector {
    Labels(BTreeMap<String, String>),
    Requirements(Vec<LabelSelectorRequirement>),
}

impl OwnerSelector {
    /// A ReplicaSet's or StatefulSet's selector as requirements (each label one `In`).
    pub fn from_label_selector(selector: Option<&LabelSelector>) -> OwnerSelector {
        let Some(s) = selector else {
            return OwnerSelector::Requirements(Vec::new());
        };
        let labels = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| LabelSelectorRequirement {
                key: k.clone(),
                operator: "In".into(),
                values: Some(vec![v.clone()]),
            });
        let expressions = s.match_expressions.iter().flatten().cloned();
        OwnerSelector::Requirements(labels.chain(expressions).collect())
    }
}

/// Who owns a selector: the workload object's kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

/// The inputs of a deduction, kept by the workload watch: the selectors of Services and of
/// ReplicationControllers, ReplicaSets and StatefulSets, nothing else of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workloads {
    /// namespace -> Service name -> `spec.selector`. Services without a selector (they select
    /// no pod) or with an empty one (it adds no label) are left out.
    services: HashMap<String, BTreeMap<String, BTreeMap<String, String>>>,
    owners: HashMap<WorkloadKey, OwnerSelector>,
}

impl Workloads {
    pub fn put_service(
        &mut self,
        namespace: &str,
        name: &str,
        selector: Option<&BTreeMap<String, String>>,
    ) {
        match selector.filter(|s| !s.is_empty()) {
            Some(s) => {
                self.services
                    .entry(namespace.to_string())
                    .or_default()
                    .insert(name.to_string(), s.clone());
            }
            None => self.remove_service(namespace, name),
        }
    }

    pub(crate) fn remove_service(&mut self, namespace: &str, name: &str) {
        if let Some(by_name) = self.services.get_mut(namespace) {
            by_name.remove(name);
            if by_name.is_empty() {
                self.services.remove(namespace);
            }
        }
    }

    pub fn put_owner(&mut self, key: WorkloadKey, selector: OwnerSelector) {
        self.owners.insert(key, selector);
    }

    pub(crate) fn remove_owner(&mut self, key: &WorkloadKey) {
        self.owners.remove(key);
    }

    /// Forget every Service (`services`) or every owner of `kind`, before a re-list.
    pub(crate) fn clear_services(&mut self) {
        self.services.clear();
    }

    pub(crate) fn clear_owners(&mut self, kind: &str) {
        self.owners.retain(|k, _| k.kind != kind);
    }

    /// The selector kube-scheduler deduces for `pod`'s default constraints, or None when
    /// nothing selects it (then it gets no default).
    pub fn deduce(&self, pod: &Pod) -> Option<LabelSelector> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let none = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&none);
        let mut match_labels = BTreeMap::new();
        for selector in self
            .services
            .get(namespace)
            .into_iter()
            .flat_map(|s| s.values())
        {
            if selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                match_labels.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        let mut requirements = Vec::new();
        match self.owner_of(pod, namespace) {
            Some(OwnerSelector::Labels(l)) => {
                match_labels.extend(l.iter().map(|(k, v)| (k.clone(), v.clone())))
            }
            Some(OwnerSelector::Requirements(r)) => requirements.extend(r.iter().cloned()),
            None => {}
        }
        if match_labels.is_empty() && requirements.is_empty() {
            return None;
        }
        Some(LabelSelector {
            match_labels: (!match_labels.is_empty()).then_some(match_labels),
            match_expressions: (!requirements.is_empty()).then_some(requirements),
        })
    }

    /// The selector of the pod's controller, when it is a kind selectors are deduced from and
    /// the watch has seen it (a controller deleted while its pods linger adds nothing).
    fn owner_of(&self, pod: &Pod, namespace: &str) -> Option<&OwnerSelector> {
        let owner = controller(pod)?;
        let kind = [REPLICATION_CONTROLLER, REPLICA_SET, STATEFUL_SET]
            .into_iter()
            .find(|(api_version, kind)| owner.api_version == *api_version && owner.kind == *kind)?
            .1;
        self.owners.get(&WorkloadKey {
            kind,
            namespace: namespace.to_string(),
            name: owner.name.clone(),
        })
    }
}

/// What a solve needs to default pods: the constraints and the deduction inputs (shared with
/// the workload index, so a snapshot copies two pointers).
#[derive(Clone, Debug)]
pub struct DefaultSpread {
    pub constraints: DefaultConstraints,
    pub workloads: Arc<Workloads>,
}

impl DefaultSpread {
    /// The default constraints `pod` is scheduled under, each with the pod's deduced selector,
    /// or None when the pod declares constraints of its own or nothing selects it.
    pub(crate) fn for_pod(&self, pod: &Pod) -> Option<Arc<[TopologySpreadConstraint]>> {
        if has_own_constraints(pod) {
            return None;
        }
        self.stamped(pod)
    }

    /// [`DefaultSpread::for_pod`] of each of `pods`, in order, deduced once per pod shape (its
    /// namespace, controller and labels, all a deduction reads): a workload's pods share one
    /// answer, as upstream caches it.
    pub(crate) fn for_pods(&self, pods: &[Pod]) -> Vec<Option<Arc<[TopologySpreadConstraint]>>> {
        type Shape<'p> = (
            &'p str,
            Option<(&'p str, &'p str, &'p str)>,
            Option<&'p BTreeMap<String, String>>,
        );
        let mut by_shape: HashMap<Shape<'_>, Option<Arc<[TopologySpreadConstraint]>>> =
            HashMap::new();
        pods.iter()
            .map(|pod| {
                if has_own_constraints(pod) {
                    return None;
                }
                let owner = controller(pod)
                    .map(|o| (o.api_version.as_str(), o.kind.as_str(), o.name.as_str()));
                let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
                let shape = (namespace, owner, pod.metadata.labels.as_ref());
                by_shape
                    .entry(shape)
                    .or_insert_with(|| self.stamped(pod))
                    .clone()
            })
            .collect()
    }

    /// The constraints with the pod's deduced selector, if one can be deduced.
    fn stamped(&self, pod: &Pod) -> Option<Arc<[TopologySpreadConstraint]>> {
        let selector = self.workloads.deduce(pod)?;
        Some(
            self.constraints
                .constraints()
                .iter()
                .map(|c| TopologySpreadConstraint {
                    label_selector: Some(selector.clone()),
                    ..c.clone()
                })
                .collect(),
        )
    }
}

fn has_own_constraints(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// The pod's controller owner reference.
fn controller(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value, owner: Option<(&str, &str, &str)>) -> Pod {
        let owners = owner.map(|(api_version, kind, name)| {
            json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": "u", "controller": true}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "labels": labels, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c"}]},
        }))
        .expect("pod")
    }

    fn key(kind: &'static str, name: &str) -> WorkloadKey {
        WorkloadKey {
            kind,
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_upstream_example_and_empty() {
        assert_eq!(DefaultConstraints::parse("").expect("empty"), None);
        assert_eq!(
            DefaultConstraints::parse("podTopologySpread: {}").expect("no constraints"),
            None
        );
        let d = DefaultConstraints::parse(
            "podTopologySpread:\n  defaultConstraints:\n    - maxSkew: 3\n      topologyKey: kubernetes.io/hostname\n      whenUnsatisfiable: ScheduleAnyway\n",
        )
        .expect("valid")
        .expect("some");
        assert_eq!(d.constraints().len(), 1);
        assert_eq!(d.constraints()[0].max_skew, 3);
        // JSON is YAML too.
        let j = DefaultConstraints::parse(
            r#"{"podTopologySpread":{"defaultConstraints":[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"DoNotSchedule","minDomains":3}]}}"#,
        )
        .expect("json")
        .expect("some");
        assert_eq!(j.constraints()[0].min_domains, Some(3));
    }

    #[test]
    fn refuses_what_kube_scheduler_refuses() {
        let doc = |c: &str| format!("podTopologySpread:\n  defaultConstraints:\n{c}");
        let one = "    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}\n";
        let cases = [
            ("podTopologySpred: {}".to_string(), "podTopologySpred"),
            (
                doc("    - {maxSkew: 0, topologyKey: a, whenUnsatisfiable: DoNotSchedule}\n"),
                "defaultConstraints[0].maxSkew",
            ),
            (
                doc("    - {maxSkew: 1, topologyKey: 'a b', whenUnsatisfiable: DoNotSchedule}\n"),
                "defaultConstraints[0].topologyKey",
            ),
            (
                doc("    - {maxSkew: 1, topologyKey: a, whenUnsatisfiable: Maybe}\n"),
                "defaultConstraints[0].whenUnsatisfiable",
            ),
            (
                doc(
                    "    - {maxSkew: 1, topologyKey: a, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {a: b}}}\n",
                ),
                "defaultConstraints[0].labelSelector",
            ),
            (
                doc(
                    "    - {maxSkew: 1, topologyKey: a, whenUnsatisfiable: DoNotSchedule, matchLabelKeys: [a]}\n",
                ),
                "defaultConstraints[0].matchLabelKeys",
            ),
            (
                doc(&format!("{one}{one}")),
                "defaultConstraints[1] repeats [0]",
            ),
        ];
        for (raw, want) in cases {
            let err = DefaultConstraints::parse(&raw).expect_err(&raw).to_string();
            assert!(err.contains(want), "{raw}: {err}");
        }
    }

    #[test]
    fn deduces_from_services_and_supported_owners() {
        let mut w = Workloads::default();
        let app = labels(&[("app", "web")]);
        // No owner, no Service: nothing.
        assert_eq!(w.deduce(&pod(json!({"app": "web"}), None)), None);
        // A Job is not a kind selectors are deduced from.
        let job = pod(json!({"app": "web"}), Some(("batch/v1", "Job", "j")));
        assert_eq!(w.deduce(&job), None);
        // A Service selecting it: its selector, as labels.
        w.put_service("default", "web", Some(&app));
        w.put_service("default", "other", Some(&labels(&[("app", "db")])));
        w.put_service("default", "everything", Some(&BTreeMap::new()));
        assert_eq!(
            w.deduce(&job).and_then(|s| s.match_labels),
            Some(app.clone())
        );
        // A ReplicaSet adds its selector as requirements.
        w.put_owner(
            key("ReplicaSet", "rs"),
            OwnerSelector::from_label_selector(Some(&LabelSelector {
                match_labels: Some(labels(&[("pod-template-hash", "h")])),
                match_expressions: None,
            })),
        );
        let owned = pod(
            json!({"app": "web", "pod-template-hash": "h"}),
            Some(("apps/v1", "ReplicaSet", "rs")),
        );
        let s = w.deduce(&owned).expect("selector");
        assert_eq!(s.match_labels, Some(app.clone()));
        assert_eq!(
            s.match_expressions,
            Some(vec![LabelSelectorRequirement {
                key: "pod-template-hash".into(),
                operator: "In".into(),
                values: Some(vec!["h".into()]),
            }])
        );
        // A ReplicationController's selector overwrites the Services' labels.
        w.put_owner(
            key("ReplicationController", "rc"),
            OwnerSelector::Labels(labels(&[("app", "web"), ("rc", "1")])),
        );
        let rc = pod(
            json!({"app": "web", "rc": "1"}),
            Some(("v1", "ReplicationController", "rc")),
        );
        assert_eq!(
            w.deduce(&rc).and_then(|s| s.match_labels),
            Some(labels(&[("app", "web"), ("rc", "1")]))
        );
        // The owner kind must match the apiVersion too; forgotten owners add nothing.
        let wrong_group = pod(json!({}), Some(("extensions/v1beta1", "ReplicaSet", "rs")));
        assert_eq!(w.deduce(&wrong_group), None);
        w.clear_owners("ReplicaSet");
        w.remove_service("default", "web");
        assert_eq!(w.deduce(&owned), None);
    }

    #[test]
    fn a_pod_with_its_own_constraints_keeps_them() {
        let constraints = DefaultConstraints::parse(
            "podTopologySpread: {defaultConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule}]}",
        )
        .expect("valid")
        .expect("some");
        let mut w = Workloads::default();
        w.put_service("default", "web", Some(&labels(&[("app", "web")])));
        let spread = DefaultSpread {
            constraints,
            workloads: Arc::new(w),
        };
        let mut p = pod(json!({"app": "web"}), None);
        let defaulted = spread.for_pod(&p).expect("defaulted");
        assert_eq!(
            defaulted[0]
                .label_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone()),
            Some(labels(&[("app", "web")]))
        );
        // Pods of one shape share one answer; a pod nothing selects gets none.
        let other = pod(json!({"app": "db"}), None);
        let each = spread.for_pods(&[p.clone(), p.clone(), other]);
        assert_eq!(each[0].as_deref(), Some(&defaulted[..]));
        assert!(Arc::ptr_eq(
            each[0].as_ref().expect("defaulted"),
            each[1].as_ref().expect("defaulted")
        ));
        assert_eq!(each[2], None);
        if let Some(spec) = p.spec.as_mut() {
            spec.topology_spread_constraints = Some(defaulted.to_vec());
        }
        assert_eq!(spread.for_pod(&p), None);
        assert_eq!(spread.for_pods(&[p]), vec![None]);
    }
}
