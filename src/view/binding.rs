//! Where Karpenter's objects live (`--karpenter-objects`) and, in the management cluster, which
//! Cluster each belongs to. NodePools, NodeClaims, ClusterAPINodeClasses and NodeOverlays are
//! cluster-scoped and describe the Cluster's machines, so with `management` they sit beside its
//! Machines, bound by two labels: Cluster API's own `cluster.x-k8s.io/cluster-name` and
//! `karpenter.cluster.x-k8s.io/cluster-namespace` (a cluster-scoped object has no namespace of
//! its own to tell two same-named Clusters apart). CapacityBuffers and CapacityQuotas stay in
//! the workload cluster: a buffer names the workload's Deployments and PodTemplates, and both
//! belong to the autoscaling API of the cluster whose pods they size.

use std::collections::BTreeMap;

use crate::api::wellknown::{
    CLUSTER_NAME_LABEL, CLUSTER_NAMESPACE_LABEL, KARPENTER_GROUP, NODECLASS_GROUP,
};

/// The Cluster the controller serves, whose Karpenter objects it sees in the management cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub cluster: String,
    pub namespace: String,
}

/// An object that names this Cluster but cannot be bound to it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{kind} {name}: metadata.labels[\"{CLUSTER_NAMESPACE_LABEL}\"] {problem}; the object names Cluster {cluster} (metadata.labels[\"{CLUSTER_NAME_LABEL}\"]) but is bound to no Cluster, so no controller uses it"
)]
pub struct BindingError {
    pub kind: String,
    pub name: String,
    pub cluster: String,
    pub problem: String,
}

impl Binding {
    /// The label selector of this Cluster's objects (every watch and list of them).
    pub fn selector(&self) -> String {
        format!(
            "{CLUSTER_NAME_LABEL}={},{CLUSTER_NAMESPACE_LABEL}={}",
            self.cluster, self.namespace
        )
    }

    /// The selector of every object naming this Cluster's name, bound or not (validation).
    pub fn name_selector(&self) -> String {
        format!("{CLUSTER_NAME_LABEL}={}", self.cluster)
    }

    /// Bind an object the controller creates (a NodeClaim).
    pub fn label(&self, labels: &mut BTreeMap<String, String>) {
        labels.insert(CLUSTER_NAME_LABEL.to_string(), self.cluster.clone());
        labels.insert(CLUSTER_NAMESPACE_LABEL.to_string(), self.namespace.clone());
    }

    /// The binding's labels are the management cluster's bookkeeping: a claim's Node in the
    /// workload cluster does not carry them.
    pub fn unlabel(&self, labels: &mut BTreeMap<String, String>) {
        labels.remove(CLUSTER_NAME_LABEL);
        labels.remove(CLUSTER_NAMESPACE_LABEL);
    }

    /// Whether an object naming this Cluster (`name_selector`) has a usable namespace label:
    /// missing or not a namespace name is an error; another namespace is another Cluster's.
    pub fn check(
        &self,
        kind: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), BindingError> {
        let problem = match labels.get(CLUSTER_NAMESPACE_LABEL) {
            None => "is missing".to_string(),
            Some(ns) if !crate::api::validation::dns_label(ns) => {
                format!("is {ns:?}, not a namespace name")
            }
            Some(_) => return Ok(()),
        };
        Err(BindingError {
            kind: kind.to_string(),
            name: name.to_string(),
            cluster: self.cluster.clone(),
            problem,
        })
    }
}

/// Whether objects of API group `group` are Karpenter's (they live where `--karpenter-objects`
/// says); every other kind the controller reads lives in the workload cluster.
pub fn is_karpenter_group(group: &str) -> bool {
    group == KARPENTER_GROUP || group == NODECLASS_GROUP
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> Binding {
        Binding {
            cluster: "sim".into(),
            namespace: "team-a".into(),
        }
    }

    #[test]
    fn selector_names_the_cluster_and_its_namespace() {
        assert_eq!(
            binding().selector(),
            "cluster.x-k8s.io/cluster-name=sim,karpenter.cluster.x-k8s.io/cluster-namespace=team-a"
        );
    }

    #[test]
    fn a_missing_or_malformed_namespace_label_names_the_object_and_field() {
        let b = binding();
        let mut labels = BTreeMap::new();
        let e = b.check("NodePool", "default", &labels).unwrap_err();
        assert!(e.to_string().starts_with("NodePool default: metadata.labels[\"karpenter.cluster.x-k8s.io/cluster-namespace\"] is missing"), "{e}");
        labels.insert(CLUSTER_NAMESPACE_LABEL.into(), "Team_A".into());
        let e = b.check("NodePool", "default", &labels).unwrap_err();
        assert!(
            e.to_string()
                .contains("is \"Team_A\", not a namespace name"),
            "{e}"
        );
        labels.insert(CLUSTER_NAMESPACE_LABEL.into(), "team-b".into());
        assert_eq!(b.check("NodePool", "default", &labels), Ok(()));
    }

    #[test]
    fn labels_bind_and_unlabel_removes_only_the_binding() {
        let b = binding();
        let mut labels = BTreeMap::from([("keep".to_string(), "me".to_string())]);
        b.label(&mut labels);
        assert_eq!(labels.len(), 3);
        b.unlabel(&mut labels);
        assert_eq!(labels.keys().collect::<Vec<_>>(), ["keep"]);
    }
}
