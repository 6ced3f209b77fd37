//! NodeClaim (karpenter.sh/v1): one requested node, and the types NodePool's template shares
//! with it (requirements, node class reference).

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::duration::{GoDuration, NillableDuration};

pub use super::resource_list::ResourceList;

/// The requirement operators Karpenter accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Operator {
    #[default]
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
    Gte,
    Lte,
}

impl Operator {
    pub fn as_str(&self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
            Operator::Gte => "Gte",
            Operator::Lte => "Lte",
        }
    }

    /// Parses the operator names used by pods' node selectors and by our CRDs.
    pub fn parse(text: &str) -> Option<Operator> {
        Some(match text {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            "Gte" => Operator::Gte,
            "Lte" => Operator::Lte,
            _ => return None,
        })
    }

    /// True for the integer comparison operators.
    pub fn is_numeric(&self) -> bool {
        matches!(
            self,
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte
        )
    }
}

impl std::fmt::Display for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node selector requirement plus `minValues`: how many distinct values of `key` the chosen
/// instance types must still span (flexibility).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirementWithMinValues {
    /// The label key that the selector applies to.
    #[schemars(
        length(max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
        ),
        extend("x-kubernetes-validations" = [
            {
                "message": "label domain \"karpenter.sh\" is restricted",
                "rule": "self in [\"karpenter.sh/capacity-type\", \"karpenter.sh/nodepool\"] || !self.find(\"^([^/]+)\").endsWith(\"karpenter.sh\")"
            },
            {
                "message": "label \"kubernetes.io/hostname\" is restricted",
                "rule": "self != \"kubernetes.io/hostname\""
            }
        ])
    )]
    pub key: String,
    /// Represents a key's relationship to a set of values.
    pub operator: Operator,
    /// Values for In/NotIn (non-empty for In); exactly one integer for Gt/Lt/Gte/Lte; none for
    /// Exists/DoesNotExist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub values: Option<Vec<String>>,
    /// The minimum number of unique values required to define the flexibility of the requirement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub min_values: Option<i64>,
}

impl NodeSelectorRequirementWithMinValues {
    pub fn new(key: &str, operator: Operator, values: &[&str]) -> Self {
        NodeSelectorRequirementWithMinValues {
            key: key.to_string(),
            operator,
            values: if values.is_empty() {
                None
            } else {
                Some(values.iter().map(|v| v.to_string()).collect())
            },
            min_values: None,
        }
    }

    pub fn values(&self) -> &[String] {
        self.values.as_deref().unwrap_or_default()
    }
}

/// Reference to the provider-specific node class (a ClusterAPINodeClass).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct NodeClassReference {
    /// Kind of the referent.
    #[schemars(extend("x-kubernetes-validations" = [{"message": "kind may not be empty", "rule": "self != ''"}]))]
    pub kind: String,
    /// Name of the referent.
    #[schemars(extend("x-kubernetes-validations" = [{"message": "name may not be empty", "rule": "self != ''"}]))]
    pub name: String,
    /// API group of the referent.
    #[schemars(
        regex(pattern = r"^[^/]*$"),
        extend("x-kubernetes-validations" = [{"message": "group may not be empty", "rule": "self != ''"}])
    )]
    pub group: String,
}

/// Resources a NodeClaim asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceRequirements {
    /// Minimum resources the node must provide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<ResourceList>,
}

/// NodeClaimSpec describes the desired state of a node.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    singular = "nodeclaim",
    status = "NodeClaimStatus",
    category = "karpenter",
    derive = "PartialEq",
    derive = "Default",
    doc = "NodeClaim is the Schema for the NodeClaims API",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".metadata.labels.node\\.kubernetes\\.io/instance-type"}"#,
    printcolumn = r#"{"name":"Capacity","type":"string","jsonPath":".metadata.labels.karpenter\\.sh/capacity-type"}"#,
    printcolumn = r#"{"name":"Zone","type":"string","jsonPath":".metadata.labels.topology\\.kubernetes\\.io/zone"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"ImageID","type":"string","priority":1,"jsonPath":".status.imageID"}"#,
    printcolumn = r#"{"name":"ID","type":"string","priority":1,"jsonPath":".status.providerID"}"#,
    printcolumn = r#"{"name":"NodePool","type":"string","priority":1,"jsonPath":".metadata.labels.karpenter\\.sh/nodepool"}"#,
    printcolumn = r#"{"name":"NodeClass","type":"string","priority":1,"jsonPath":".spec.nodeClassRef.name"}"#,
    printcolumn = r#"{"name":"Drifted","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Drifted\")].status"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"message": "spec is immutable", "rule": "self == oldSelf"}]))]
pub struct NodeClaimSpec {
    /// Taints applied to the NodeClaim's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = taints_schema)]
    pub taints: Option<Vec<Taint>>,
    /// Taints applied at startup and expected to be removed by a DaemonSet; pods need not
    /// tolerate them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = taints_schema)]
    pub startup_taints: Option<Vec<Taint>>,
    /// Requirements that constrain the node's properties.
    #[schemars(length(max = 100), transform = requirements_cel)]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// Resources the node must provide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Reference to the node class.
    pub node_class_ref: NodeClassReference,
    /// The maximum time to wait for pods to drain before forcefully deleting them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<GoDuration>,
    /// How long after creation the node is expired ("Never" to disable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "720h"))]
    pub expire_after: Option<NillableDuration>,
}

/// Upstream's taint list schema: atomic list, known effects, key and value syntax.
pub(crate) fn taints_schema(schema: &mut schemars::Schema) {
    schema.insert("x-kubernetes-list-type".into(), "atomic".into());
    let qualified = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";
    let Some(props) = schema
        .get_mut("items")
        .and_then(|i| i.get_mut("properties"))
        .and_then(|p| p.as_object_mut())
    else {
        return;
    };
    if let Some(effect) = props.get_mut("effect").and_then(|e| e.as_object_mut()) {
        effect.insert(
            "enum".into(),
            serde_json::json!(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        );
    }
    if let Some(key) = props.get_mut("key").and_then(|e| e.as_object_mut()) {
        key.insert("minLength".into(), 1.into());
        key.insert("pattern".into(), qualified.into());
    }
    if let Some(value) = props.get_mut("value").and_then(|e| e.as_object_mut()) {
        value.insert("pattern".into(), qualified.into());
    }
}

/// Adds the CEL rules upstream puts on requirement lists (enforced again in `validation`).
pub(crate) fn requirements_cel(schema: &mut schemars::Schema) {
    schema.insert("x-kubernetes-list-type".into(), "atomic".into());
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([
            {
                "message": "requirements with operator 'In' must have a value defined",
                "rule": "self.all(x, x.operator == 'In' ? x.values.size() != 0 : true)"
            },
            {
                "message": "requirements operator 'Gt', 'Lt', 'Gte', or 'Lte' must have a single positive integer value",
                "rule": "self.all(x, (x.operator == 'Gt' || x.operator == 'Lt' || x.operator == 'Gte' || x.operator == 'Lte') ? (x.values.size() == 1 && int(x.values[0]) >= 0) : true)"
            },
            {
                "message": "requirements with 'minValues' must have at least that many values specified in the 'values' field",
                "rule": "self.all(x, (x.operator == 'In' && has(x.minValues)) ? x.values.size() >= x.minValues : true)"
            }
        ]),
    );
}

/// NodeClaimStatus is the observed state of a NodeClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// Name of the Node backing this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The cloud provider's ID for the instance (the Machine's providerID).
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Image the node was launched with.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Capacity of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<ResourceList>,
    /// Allocatable capacity of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<ResourceList>,
    /// Signals for health and readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// The last time a pod was scheduled to or removed from the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pod_event_time: Option<Time>,
}

impl NodeClaim {
    /// The claim's conditions (empty when there is no status yet).
    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }
}
