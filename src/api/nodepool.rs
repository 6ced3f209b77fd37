//! NodePool (karpenter.sh/v1): a template for NodeClaims plus disruption rules and limits, and
//! the drift hash over its template.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::duration::{GoDuration, NillableDuration};
use super::nodeclaim::{
    NodeClassReference, NodeSelectorRequirementWithMinValues, requirements_cel, taints_schema,
};

/// Default `expireAfter` when a template leaves it out.
pub const DEFAULT_EXPIRE_AFTER_SECS: u64 = 720 * 3600;
/// Default budget when `spec.disruption.budgets` is absent.
pub const DEFAULT_BUDGET_NODES: &str = "10%";

/// NodePoolSpec: the template of NodeClaims this pool launches and how they may be disrupted.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    plural = "nodepools",
    singular = "nodepool",
    status = "NodePoolStatus",
    category = "karpenter",
    derive = "PartialEq",
    derive = "Default",
    doc = "NodePool is the Schema for the NodePools API",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.nodes"
    ),
    printcolumn = r#"{"name":"NodeClass","type":"string","jsonPath":".spec.template.spec.nodeClassRef.name"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","priority":1,"jsonPath":".spec.weight"}"#,
    printcolumn = r#"{"name":"CPU","type":"string","priority":1,"jsonPath":".status.resources.cpu"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","priority":1,"jsonPath":".status.resources.memory"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "message": "Cannot transition NodePool between static (replicas set) and dynamic (replicas unset) provisioning modes",
        "rule": "has(self.replicas) == has(oldSelf.replicas)"
    },
    {
        "message": "only 'limits.nodes' is supported on static NodePools",
        "rule": "!has(self.replicas) || (!has(self.limits) || size(self.limits) == 0 || (size(self.limits) == 1 && 'nodes' in self.limits))"
    },
    {
        "message": "'weight' is not supported on static NodePools",
        "rule": "!has(self.replicas) || !has(self.weight)"
    }
]))]
pub struct NodePoolSpec {
    /// The template of NodeClaims launched from this pool.
    pub template: NodeClaimTemplate,
    /// Parameters of Karpenter's disruption logic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {"consolidateAfter": "0s"}))]
    pub disruption: Option<Disruption>,
    /// Bounds on the capacity this pool may provision (`nodes` counts nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Priority among pools (higher first); absent means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
    /// Fixed number of nodes (static pool, alpha upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i64>,
}

/// The NodeClaim template of a NodePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeClaimTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    pub spec: NodeClaimTemplateSpec,
}

/// Labels and annotations every NodeClaim (and Node) of the pool gets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TemplateMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        transform = label_value_schema,
        extend(
            "maxProperties" = 100,
            "x-kubernetes-map-type" = "atomic",
            "x-kubernetes-validations" = [
                {
                    "message": "label domain \"karpenter.sh\" is restricted",
                    "rule": "self.all(x, x in [\"karpenter.sh/capacity-type\", \"karpenter.sh/nodepool\"] || !x.find(\"^([^/]+)\").endsWith(\"karpenter.sh\"))"
                },
                {
                    "message": "label \"karpenter.sh/nodepool\" is restricted",
                    "rule": "self.all(x, x != \"karpenter.sh/nodepool\")"
                },
                {
                    "message": "label \"kubernetes.io/hostname\" is restricted",
                    "rule": "self.all(x, x != \"kubernetes.io/hostname\")"
                }
            ]
        )
    )]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Constrains label values in the schema the way upstream does.
fn label_value_schema(schema: &mut schemars::Schema) {
    schema.insert(
        "additionalProperties".into(),
        serde_json::json!({
            "type": "string",
            "maxLength": 63,
            "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
        }),
    );
}

/// A NodeClaim spec without resource requests (users cannot set them on a pool).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplateSpec {
    /// Taints applied to every node of the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = taints_schema)]
    pub taints: Option<Vec<Taint>>,
    /// Taints present at startup and removed by a DaemonSet; pods need not tolerate them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = taints_schema)]
    pub startup_taints: Option<Vec<Taint>>,
    /// Requirements applied to every node.
    #[schemars(length(max = 100), transform = nodepool_requirements_cel)]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// Reference to the node class.
    #[schemars(extend("x-kubernetes-validations" = [
        {"message": "nodeClassRef.group is immutable", "rule": "self.group == oldSelf.group"},
        {"message": "nodeClassRef.kind is immutable", "rule": "self.kind == oldSelf.kind"}
    ]))]
    pub node_class_ref: NodeClassReference,
    /// The maximum time to wait for pods to drain before forcefully deleting them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<GoDuration>,
    /// How long after creation a node is expired ("Never" to disable; default 720h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "720h"))]
    pub expire_after: Option<NillableDuration>,
}

/// NodePool requirements additionally may not name `karpenter.sh/nodepool` (the pool sets it).
fn nodepool_requirements_cel(schema: &mut schemars::Schema) {
    requirements_cel(schema);
    if let Some(serde_json::Value::Array(rules)) = schema.get_mut("x-kubernetes-validations") {
        rules.push(serde_json::json!({
            "message": "label \"karpenter.sh/nodepool\" is restricted",
            "rule": "self.all(x, x.key != \"karpenter.sh/nodepool\")"
        }));
    }
}

/// Which nodes consolidation may remove.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConsolidationPolicy {
    WhenEmpty,
    #[default]
    WhenEmptyOrUnderutilized,
    Balanced,
}

/// The disruption methods a budget may be limited to.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum DisruptionReason {
    Underutilized,
    Empty,
    Drifted,
    /// Node repair (Karpenter v1.15): a node unhealthy past its toleration, replaced within
    /// the budgets that name this reason (or none).
    Unhealthy,
}

impl DisruptionReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            DisruptionReason::Underutilized => "Underutilized",
            DisruptionReason::Empty => "Empty",
            DisruptionReason::Drifted => "Drifted",
            DisruptionReason::Unhealthy => "Unhealthy",
        }
    }
}

/// Disruption settings of a NodePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// How long to wait after the last pod event before consolidating ("Never" to disable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "0s"))]
    pub consolidate_after: Option<NillableDuration>,
    /// Which nodes consolidation may remove (default WhenEmptyOrUnderutilized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "WhenEmptyOrUnderutilized"))]
    pub consolidation_policy: Option<ConsolidationPolicy>,
    /// Limits on how many nodes may be disrupted at once; the most restrictive active one wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 50),
        extend(
            "default" = [{"nodes": "10%"}],
            "x-kubernetes-list-type" = "atomic",
            "x-kubernetes-validations" = [
                {"message": "'schedule' must be set with 'duration'", "rule": "self.all(x, has(x.schedule) == has(x.duration))"}
            ]
        )
    )]
    pub budgets: Option<Vec<Budget>>,
}

impl Disruption {
    pub fn consolidate_after(&self) -> NillableDuration {
        self.consolidate_after.unwrap_or_default()
    }

    pub fn consolidation_policy(&self) -> ConsolidationPolicy {
        self.consolidation_policy.unwrap_or_default()
    }

    /// The budgets in force: the configured ones, or upstream's default of one 10% budget.
    pub fn budgets(&self) -> Vec<Budget> {
        match &self.budgets {
            Some(b) => b.clone(),
            None => vec![Budget {
                nodes: DEFAULT_BUDGET_NODES.to_string(),
                ..Budget::default()
            }],
        }
    }
}

/// How many of a pool's nodes may be disrupting at once, optionally only in a cron window and
/// only for some reasons.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Budget {
    /// A count ("5") or a percentage of the pool's nodes ("10%").
    #[schemars(regex(pattern = r"^((100|[0-9]{1,2})%|[0-9]+)$"), extend("default" = "10%"))]
    pub nodes: String,
    /// Cron schedule (UTC) at which the budget becomes active; needs `duration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((.+)\s(.+)\s(.+)\s(.+)\s(.+))$"
    ))]
    pub schedule: Option<String>,
    /// How long the budget stays active after each schedule hit (minutes and hours only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "budget_duration_schema")]
    pub duration: Option<GoDuration>,
    /// Disruption reasons the budget applies to; absent means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 50), extend("x-kubernetes-list-type" = "set"))]
    pub reasons: Option<Vec<DisruptionReason>>,
}

fn budget_duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "pattern": "^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$"
    })
}

/// NodePoolStatus is the observed state of a NodePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Resources provisioned by this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<BTreeMap<String, Quantity>>,
    /// Number of nodes of this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub nodes: Option<i64>,
    /// Signals for health and readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// The generation of the referenced node class last observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_observed_generation: Option<i64>,
    /// Rollout status: the generation the counts below were computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Rollout status: nodes matching the pool's current spec (not drifted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_nodes: Option<i64>,
    /// Rollout status: nodes whose NodeClaim is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_nodes: Option<i64>,
    /// Rollout status: nodes both up to date and Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date_and_ready_nodes: Option<i64>,
}

impl NodePool {
    /// The pool's conditions (empty when there is no status yet).
    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }

    /// A static NodePool (`spec.replicas` set) keeps that many nodes whatever is pending, so
    /// provisioning leaves it out.
    pub fn is_static(&self) -> bool {
        self.spec.replicas.is_some()
    }

    /// The effective weight (absent = 0).
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }

    /// The disruption settings with upstream's defaults filled in.
    pub fn disruption(&self) -> Disruption {
        self.spec.disruption.clone().unwrap_or_default()
    }

    /// The effective `expireAfter` (default 720h).
    pub fn expire_after(&self) -> NillableDuration {
        self.spec
            .template
            .spec
            .expire_after
            .unwrap_or(NillableDuration::from_secs(DEFAULT_EXPIRE_AFTER_SECS))
    }
}

/// The hash earlier releases of this controller stamped as `v3`: FNV-1a 64 over canonical JSON
/// of `spec.template` without requirements and resources. Read only to recognise their claims,
/// which are re-stamped with upstream's hash rather than drifted.
pub fn legacy_hash(np: &NodePool) -> String {
    let mut value = serde_json::to_value(&np.spec.template).unwrap_or(serde_json::Value::Null);
    if let Some(spec) = value.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.remove("requirements");
        spec.remove("resources");
    }
    let mut canonical = String::new();
    write_canonical(&value, &mut canonical);
    fnv1a64(canonical.as_bytes()).to_string()
}

/// FNV-1a, 64 bit: fixed and dependency-free, so hashes are stable across builds and versions.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

fn is_empty(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => true,
        serde_json::Value::Object(m) => m.values().all(is_empty),
        serde_json::Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// JSON with sorted keys and empty values dropped.
fn write_canonical(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(m) => {
            let mut entries: Vec<_> = m.iter().filter(|(_, v)| !is_empty(v)).collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        serde_json::Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::drift_hash::nodepool_hash;
    use crate::api::nodeclaim::Operator;

    fn pool() -> NodePool {
        let mut np = NodePool::new("default", NodePoolSpec::default());
        np.spec.template.spec.node_class_ref = NodeClassReference {
            group: "karpenter.cluster.x-k8s.io".into(),
            kind: "ClusterAPINodeClass".into(),
            name: "default".into(),
        };
        np.spec.template.spec.requirements = vec![NodeSelectorRequirementWithMinValues::new(
            "kubernetes.io/arch",
            Operator::In,
            &["amd64"],
        )];
        np
    }

    #[test]
    fn hashes_ignore_requirements_but_not_labels_or_taints() {
        hash_properties(nodepool_hash, true);
        hash_properties(legacy_hash, false);
    }

    /// What both hashes share; upstream's also takes taints as a set.
    fn hash_properties(nodepool_hash: fn(&NodePool) -> String, taints_as_set: bool) {
        let base = pool();
        let h = nodepool_hash(&base);
        assert_eq!(h, nodepool_hash(&base.clone()), "stable");
        assert!(h.parse::<u64>().is_ok(), "decimal: {h}");

        let mut reqs = base.clone();
        reqs.spec
            .template
            .spec
            .requirements
            .push(NodeSelectorRequirementWithMinValues::new(
                "topology.kubernetes.io/zone",
                Operator::In,
                &["a"],
            ));
        reqs.spec.template.spec.requirements[0].values = Some(vec!["arm64".into()]);
        assert_eq!(
            nodepool_hash(&reqs),
            h,
            "requirement-only changes keep the hash"
        );

        let mut weight = base.clone();
        weight.spec.weight = Some(50);
        assert_eq!(
            nodepool_hash(&weight),
            h,
            "fields outside the template keep the hash"
        );

        let mut reordered = base.clone();
        let taint = |key: &str| Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        reordered.spec.template.spec.taints = Some(vec![taint("a"), taint("b")]);
        let ab = nodepool_hash(&reordered);
        reordered.spec.template.spec.taints = Some(vec![taint("b"), taint("a")]);
        assert_eq!(
            nodepool_hash(&reordered) == ab,
            taints_as_set,
            "taints as a set"
        );

        let mut labels = base.clone();
        labels.spec.template.metadata = Some(TemplateMetadata {
            labels: Some([("team".to_string(), "a".to_string())].into()),
            annotations: None,
        });
        assert_ne!(nodepool_hash(&labels), h);

        let mut taints = base.clone();
        taints.spec.template.spec.taints = Some(vec![Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]);
        assert_ne!(nodepool_hash(&taints), h);

        let mut expire = base.clone();
        expire.spec.template.spec.expire_after = Some(NillableDuration::from_secs(24 * 3600));
        assert_ne!(nodepool_hash(&expire), h);
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn defaults_follow_upstream() {
        let np = pool();
        assert_eq!(np.weight(), 0);
        let d = np.disruption();
        assert_eq!(
            d.consolidation_policy(),
            ConsolidationPolicy::WhenEmptyOrUnderutilized
        );
        assert_eq!(d.consolidate_after(), NillableDuration::from_secs(0));
        assert_eq!(d.budgets().len(), 1);
        assert_eq!(d.budgets()[0].nodes, "10%");
        assert_eq!(np.expire_after(), NillableDuration::from_secs(720 * 3600));
    }
}
