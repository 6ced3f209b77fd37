//! Volume topology, as Karpenter's provisioner decides it before a solve: a pod whose volumes
//! are PersistentVolumeClaims (or ephemeral volumes, whose claim is `<pod>-<volume>`) may only
//! go where those volumes can attach. A bound claim's PersistentVolume `nodeAffinity` terms, or
//! an unbound claim's WaitForFirstConsumer StorageClass `allowedTopologies`, become the pod's
//! volume topology: alternatives (one per compatible combination of its volumes' terms) that the
//! node or claim it goes to must satisfy, whichever node-affinity term or preference is being
//! tried. As upstream, they are kept out of the pod's own node affinity, so a topology spread
//! still counts the domains the pod itself allows. A pod whose claims
//! cannot be resolved (missing claim, volume or class, a claim being deleted or Lost, an unbound
//! claim without a class or with an Immediate class) is not provisionable, with a reason naming
//! the object.
//!
//! A claim that names no StorageClass at all (`storageClassName` absent, not `""`) gets the
//! cluster's default class: the apiserver's DefaultStorageClass admission writes it at creation
//! and the PV controller writes it later if a default appears afterwards, so the catalog reads
//! it as that class already (the newest default when several are marked, as both pick it).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use super::csi_migration::{driver_of_provisioner, driver_of_volume};
use super::error::PodError;
use crate::api::requirements::Requirements;

/// `pv.kubernetes.io/bind-completed`: set by the PV controller once a claim is bound; a claim
/// naming a volume without it is still being bound (upstream treats it as unbound).
pub(crate) const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const HOSTNAME: &str = "kubernetes.io/hostname";
/// The annotation marking a StorageClass as the default (and its deprecated beta form).
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
const ANN_DEFAULT_CLASS_BETA: &str = "storageclass.beta.kubernetes.io/is-default-class";

/// What the solve reads of a PersistentVolumeClaim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClaimInfo {
    pub(crate) volume_name: Option<String>,
    pub(crate) storage_class: Option<String>,
    pub(crate) deleting: bool,
    pub(crate) lost: bool,
    pub(crate) bind_completed: bool,
}

/// What the solve reads of a PersistentVolume.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct VolumeInfo {
    /// `spec.nodeAffinity.required.nodeSelectorTerms` (ORed).
    pub(crate) node_terms: Vec<Vec<NodeSelectorRequirement>>,
    /// Local and hostPath volumes: their hostname affinity names a node that may be gone, so
    /// upstream ignores it.
    pub(crate) node_local: bool,
    pub(crate) deleting: bool,
    /// `spec.csi.driver`, or the migrated CSI driver of an in-tree source: whose attach limit
    /// the volume counts against (None: no CSI driver attaches it, e.g. NFS, which no limit
    /// applies to).
    pub(crate) csi_driver: Option<String>,
}

/// What the solve reads of a StorageClass.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ClassInfo {
    pub(crate) immediate: bool,
    /// The CSI driver that will provision (and attach) its volumes: the provisioner, or the
    /// migrated CSI driver of an in-tree plugin name.
    pub(crate) provisioner: String,
    /// Marked the cluster's default (`storageclass.kubernetes.io/is-default-class: "true"`).
    pub(crate) default: bool,
    /// `metadata.creationTimestamp`: the newest default class wins.
    pub(crate) created: Option<jiff::Timestamp>,
    /// `allowedTopologies` terms as `In` requirements (ORed).
    pub(crate) topologies: Vec<Vec<NodeSelectorRequirement>>,
}

/// The claims, volumes and classes the provisioner's storage watch keeps.
#[derive(Clone, Debug, Default)]
pub struct VolumeCatalog {
    /// By `namespace/name`.
    pub(crate) claims: HashMap<String, ClaimInfo>,
    pub(crate) volumes: HashMap<String, VolumeInfo>,
    pub(crate) classes: HashMap<String, ClassInfo>,
}

impl ClaimInfo {
    pub(crate) fn of(pvc: &PersistentVolumeClaim) -> ClaimInfo {
        let spec = pvc.spec.as_ref();
        ClaimInfo {
            volume_name: spec
                .and_then(|s| s.volume_name.clone())
                .filter(|v| !v.is_empty()),
            storage_class: spec.and_then(|s| s.storage_class_name.clone()),
            deleting: pvc.metadata.deletion_timestamp.is_some(),
            lost: pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost"),
            bind_completed: pvc.annotations().contains_key(ANN_BIND_COMPLETED),
        }
    }
}

impl VolumeInfo {
    pub(crate) fn of(pv: &PersistentVolume) -> VolumeInfo {
        let spec = pv.spec.as_ref();
        let node_terms = spec
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(|r| {
                r.node_selector_terms
                    .iter()
                    .map(|t| t.match_expressions.clone().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        VolumeInfo {
            node_terms,
            node_local: spec.is_some_and(|s| s.local.is_some() || s.host_path.is_some()),
            deleting: pv.metadata.deletion_timestamp.is_some(),
            csi_driver: spec.and_then(driver_of_volume),
        }
    }
}

impl ClassInfo {
    pub(crate) fn of(sc: &StorageClass) -> ClassInfo {
        let topologies = sc
            .allowed_topologies
            .iter()
            .flatten()
            .map(|t| {
                t.match_label_expressions
                    .iter()
                    .flatten()
                    .map(|e| NodeSelectorRequirement {
                        key: e.key.clone(),
                        operator: "In".into(),
                        values: Some(e.values.clone()),
                    })
                    .collect()
            })
            .collect();
        let marked = |key| sc.annotations().get(key).map(String::as_str) == Some("true");
        ClassInfo {
            immediate: sc.volume_binding_mode.as_deref() == Some("Immediate"),
            provisioner: driver_of_provisioner(&sc.provisioner).to_string(),
            default: marked(ANN_DEFAULT_CLASS) || marked(ANN_DEFAULT_CLASS_BETA),
            created: sc.metadata.creation_timestamp.as_ref().map(|t| t.0),
            topologies,
        }
    }
}

impl VolumeCatalog {
    pub fn apply_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let key = format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any());
        self.claims.insert(key, ClaimInfo::of(pvc));
    }
    pub(crate) fn remove_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let key = format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any());
        self.claims.remove(&key);
    }
    pub fn apply_volume(&mut self, pv: &PersistentVolume) {
        self.volumes.insert(pv.name_any(), VolumeInfo::of(pv));
    }
    pub(crate) fn remove_volume(&mut self, pv: &PersistentVolume) {
        self.volumes.remove(&pv.name_any());
    }
    pub fn apply_class(&mut self, sc: &StorageClass) {
        self.classes.insert(sc.name_any(), ClassInfo::of(sc));
    }
    pub(crate) fn remove_class(&mut self, sc: &StorageClass) {
        self.classes.remove(&sc.name_any());
    }

    /// The cluster's default StorageClass: of the classes marked default, the newest, then the
    /// first by name (the apiserver's choice when several are marked).
    pub(crate) fn default_class(&self) -> Option<&str> {
        self.classes
            .iter()
            .filter(|(_, c)| c.default)
            .min_by(|(a_name, a), (b_name, b)| b.created.cmp(&a.created).then(a_name.cmp(b_name)))
            .map(|(name, _)| name.as_str())
    }

    /// The StorageClass a claim uses: the one it names (`""`: none), or the default when it
    /// names none at all.
    fn class_of<'a>(&'a self, claim: &'a ClaimInfo) -> &'a str {
        match &claim.storage_class {
            Some(class) => class,
            None => self.default_class().unwrap_or_default(),
        }
    }

    /// The claim a pod volume uses (`<pod>-<volume>` for an ephemeral volume), by
    /// `namespace/name`; None for volumes that are not claims.
    fn claim_key(pod: &Pod, volume: &k8s_openapi::api::core::v1::Volume) -> Option<String> {
        let ns = pod.namespace().unwrap_or_default();
        if let Some(c) = &volume.persistent_volume_claim {
            return Some(format!("{ns}/{}", c.claim_name));
        }
        volume
            .ephemeral
            .as_ref()
            .map(|_| format!("{ns}/{}-{}", pod.name_any(), volume.name))
    }

    /// The pod's volume topology as alternatives (each an AND of requirements), None when its
    /// volumes do not restrict it; an error when a claim cannot be used (upstream's
    /// `ValidatePersistentVolumeClaims`).
    pub(crate) fn requirements(
        &self,
        pod: &Pod,
    ) -> Result<Option<Vec<Vec<NodeSelectorRequirement>>>, String> {
        let mut alternatives: Vec<Vec<NodeSelectorRequirement>> = vec![Vec::new()];
        let mut restricted = false;
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        for volume in volumes {
            let Some(key) = Self::claim_key(pod, volume) else {
                continue;
            };
            let volume_alts = self.claim_alternatives(&key)?;
            if volume_alts.is_empty() {
                continue;
            }
            restricted = true;
            alternatives = merge(&alternatives, &volume_alts);
        }
        Ok(restricted.then_some(alternatives))
    }

    fn claim_alternatives(&self, key: &str) -> Result<Vec<Vec<NodeSelectorRequirement>>, String> {
        let claim = self
            .claims
            .get(key)
            .ok_or_else(|| format!("PersistentVolumeClaim {key:?} not found"))?;
        if claim.deleting {
            return Err(format!("PersistentVolumeClaim {key:?} is being deleted"));
        }
        if claim.lost {
            return Err(format!(
                "PersistentVolumeClaim {key:?} is bound to a PersistentVolume that does not exist (phase Lost)"
            ));
        }
        let class = self.class_of(claim);
        if let Some(volume_name) = &claim.volume_name {
            let volume = self.volumes.get(volume_name).ok_or_else(|| {
                format!(
                    "PersistentVolume {volume_name:?} of PersistentVolumeClaim {key:?} not found"
                )
            })?;
            if volume.deleting {
                return Err(format!(
                    "PersistentVolume {volume_name:?} of PersistentVolumeClaim {key:?} is being deleted"
                ));
            }
            if !claim.bind_completed {
                return Err(format!(
                    "PersistentVolumeClaim {key:?} names PersistentVolume {volume_name:?} but has no {ANN_BIND_COMPLETED} annotation yet (still binding)"
                ));
            }
            return Ok(volume_alternatives(volume));
        }
        if class.is_empty() {
            return Err(format!(
                "PersistentVolumeClaim {key:?} is unbound and names no StorageClass (and the cluster has no default)"
            ));
        }
        let sc = self.classes.get(class).ok_or_else(|| {
            format!("StorageClass {class:?} of PersistentVolumeClaim {key:?} not found")
        })?;
        if sc.immediate {
            return Err(format!(
                "PersistentVolumeClaim {key:?} is unbound and its StorageClass {class:?} binds Immediate (only WaitForFirstConsumer claims follow the pod)"
            ));
        }
        Ok(sc
            .topologies
            .iter()
            .filter(|t| !t.is_empty())
            .cloned()
            .collect())
    }
}

/// A volume's node-affinity terms; a local or hostPath volume's hostname requirements are
/// dropped (a term left empty allows anywhere).
fn volume_alternatives(volume: &VolumeInfo) -> Vec<Vec<NodeSelectorRequirement>> {
    let mut out = Vec::new();
    for term in &volume.node_terms {
        let kept: Vec<NodeSelectorRequirement> = term
            .iter()
            .filter(|r| !(volume.node_local && r.key == HOSTNAME))
            .cloned()
            .collect();
        if !kept.is_empty() || (volume.node_local && !term.is_empty()) {
            out.push(kept);
        }
    }
    out
}

/// A pod's claims by the CSI driver that attaches them: driver -> claim `namespace/name`.
pub(crate) type PodVolumes = BTreeMap<String, BTreeSet<String>>;

/// One existing node's CSI attach limits (CSINode `spec.drivers[].allocatable.count`) and the
/// claims its pods already use, per driver (upstream's `VolumeUsage`). Pods sharing a claim
/// count it once.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct VolumeUsage {
    pub(crate) limits: BTreeMap<String, usize>,
    pub(crate) in_use: PodVolumes,
}

impl VolumeUsage {
    /// Whether the pod's claims, added to those in use, stay within every driver's limit.
    pub(crate) fn fits(&self, pod: &PodVolumes) -> bool {
        pod.iter().all(|(driver, claims)| {
            let Some(limit) = self.limits.get(driver) else {
                return true;
            };
            let used = self.in_use.get(driver);
            let new = claims
                .iter()
                .filter(|c| !used.is_some_and(|u| u.contains(*c)))
                .count();
            used.map_or(0, BTreeSet::len) + new <= *limit
        })
    }

    pub(crate) fn add(&mut self, pod: &PodVolumes) {
        for (driver, claims) in pod {
            self.in_use
                .entry(driver.clone())
                .or_default()
                .extend(claims.iter().cloned());
        }
    }
}

/// The volume inputs of [`super::solve_with_volumes`]: existing nodes' usage by node name and
/// pending pods' volumes by pod `namespace/name`.
#[derive(Clone, Debug, Default)]
pub struct NodeVolumes {
    pub(crate) by_node: HashMap<String, VolumeUsage>,
    pub(crate) by_pod: HashMap<String, PodVolumes>,
}

impl VolumeCatalog {
    /// The pod's claims by the CSI driver that attaches them: a bound claim's volume's driver,
    /// else its StorageClass's provisioner (the default class's when it names none), in-tree
    /// plugins counted as their migrated CSI driver. Claims that resolve to no driver are not
    /// counted (upstream's `GetVolumes`).
    pub(crate) fn pod_volumes(&self, pod: &Pod) -> PodVolumes {
        let mut out = PodVolumes::new();
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        for volume in volumes {
            let Some(key) = Self::claim_key(pod, volume) else {
                continue;
            };
            let Some(claim) = self.claims.get(&key) else {
                continue;
            };
            let driver = match &claim.volume_name {
                Some(v) => self.volumes.get(v).and_then(|v| v.csi_driver.clone()),
                None => self
                    .classes
                    .get(self.class_of(claim))
                    .map(|c| c.provisioner.clone()),
            };
            if let Some(driver) = driver {
                out.entry(driver).or_default().insert(key);
            }
        }
        out
    }
}

/// CSI attach limits by node name, then driver (CSINode `spec.drivers[].allocatable.count`).
pub type CsiLimits = HashMap<String, BTreeMap<String, usize>>;

/// The limits a CSINode declares (drivers without an allocatable count have none).
pub(crate) fn csinode_limits(
    node: &k8s_openapi::api::storage::v1::CSINode,
) -> BTreeMap<String, usize> {
    node.spec
        .drivers
        .iter()
        .filter_map(|d| {
            let count = d.allocatable.as_ref()?.count?;
            Some((d.name.clone(), usize::try_from(count).unwrap_or(0)))
        })
        .collect()
}

/// Every limited existing node's usage (the claims of the pods bound to it) and the pending
/// pods' volumes. Empty when no node and no instance type declares a limit.
fn node_volumes(
    snapshot: &super::Snapshot,
    catalog: &VolumeCatalog,
    limits: &CsiLimits,
) -> NodeVolumes {
    let mut out = NodeVolumes::default();
    for node in &snapshot.nodes {
        if let Some(l) = limits.get(&node.name).filter(|l| !l.is_empty()) {
            out.by_node.insert(
                node.name.clone(),
                VolumeUsage {
                    limits: l.clone(),
                    in_use: PodVolumes::new(),
                },
            );
        }
    }
    let typed = snapshot
        .nodepools
        .iter()
        .any(|p| p.instance_types.iter().any(|t| !t.csi_limits.is_empty()));
    if out.by_node.is_empty() && !typed {
        return out;
    }
    for pod in &snapshot.bound_pods {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(usage) = node.and_then(|n| out.by_node.get_mut(n)) {
            usage.add(&catalog.pod_volumes(pod));
        }
    }
    for pod in &snapshot.pods {
        let volumes = catalog.pod_volumes(pod);
        if !volumes.is_empty() {
            let key = super::pod::pod_key(pod);
            out.by_pod.insert(key, volumes);
        }
    }
    out
}

/// Every pair of an existing alternative and a volume's, keeping only the pairs that can both
/// hold when any can (upstream's `mergeVolumeRequirementAlternatives`).
fn merge(
    existing: &[Vec<NodeSelectorRequirement>],
    volume: &[Vec<NodeSelectorRequirement>],
) -> Vec<Vec<NodeSelectorRequirement>> {
    let pairs = || {
        existing
            .iter()
            .flat_map(|e| volume.iter().map(move |v| (e, v)))
    };
    let compatible: Vec<_> = pairs().filter(|(e, v)| compatible(e, v)).collect();
    let chosen = if compatible.is_empty() {
        pairs().collect()
    } else {
        compatible
    };
    chosen
        .into_iter()
        .map(|(e, v)| e.iter().chain(v).cloned().collect())
        .collect()
}

fn compatible(a: &[NodeSelectorRequirement], b: &[NodeSelectorRequirement]) -> bool {
    match (
        Requirements::from_pod_node_selector(a),
        Requirements::from_pod_node_selector(b),
    ) {
        (Ok(a), Ok(b)) => a.compatible(&b).is_ok(),
        // An unreadable requirement is reported when the pod is read; keep the pair.
        _ => true,
    }
}

/// Each pending pod's volume topology, by pod `namespace/name`: the alternatives its volumes
/// allow (any one will do). Kept apart from the pod's own node affinity, as upstream keeps them:
/// they narrow the node or claim a pod goes to, never the domains a topology spread counts.
pub(crate) type VolumeTopology = HashMap<String, Vec<Requirements>>;

/// The volume inputs of a solve, prepared from the snapshot: each pending pod's volume topology
/// (into `snapshot.volume_topology`), and existing nodes' CSI attach limits with what their pods
/// use. Pods whose claims cannot be used are taken out of the snapshot and returned with the
/// reason (as pods the solve cannot read: upstream ignores them).
pub fn prepare(
    snapshot: &mut super::Snapshot,
    catalog: &VolumeCatalog,
    limits: &CsiLimits,
) -> (NodeVolumes, Vec<(String, PodError)>) {
    let mut failures = Vec::new();
    let mut topology = VolumeTopology::new();
    snapshot
        .pods
        .retain(|pod| match pod_topology(pod, catalog) {
            Ok(None) => true,
            Ok(Some((key, alts))) => {
                topology.insert(key, alts);
                true
            }
            Err((key, details)) => {
                failures.push((key, PodError::InvalidPod { details }));
                false
            }
        });
    snapshot.volume_topology = topology;
    (node_volumes(snapshot, catalog, limits), failures)
}

/// The volume topology of bound pods a simulation moves (consolidation's, drift's), by pod key.
/// A pod whose claims cannot be resolved is left without one: its volume is broken wherever it
/// goes, and the provisioner reports it once the pod is pending.
pub(crate) fn topology_of<'p>(
    pods: impl IntoIterator<Item = &'p Pod>,
    catalog: &VolumeCatalog,
) -> VolumeTopology {
    pods.into_iter()
        .filter_map(|p| pod_topology(p, catalog).ok().flatten())
        .collect()
}

/// One pod's volume topology alternatives with its key: None when its volumes do not constrain
/// it, `Err` (key, reason) when its claims cannot be used.
#[allow(clippy::type_complexity)]
fn pod_topology(
    pod: &Pod,
    catalog: &VolumeCatalog,
) -> Result<Option<(String, Vec<Requirements>)>, (String, String)> {
    let has_claims = pod.spec.as_ref().is_some_and(|s| {
        s.volumes
            .iter()
            .flatten()
            .any(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
    });
    if !has_claims {
        return Ok(None);
    }
    let key = super::pod::pod_key(pod);
    let alternatives = catalog.requirements(pod).and_then(|alts| {
        alts.unwrap_or_default()
            .iter()
            .map(|alt| Requirements::from_pod_node_selector(alt).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()
    });
    match alternatives {
        Ok(alts) if alts.is_empty() => Ok(None),
        Ok(alts) => Ok(Some((key, alts))),
        Err(details) => Err((key, details)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn zone(values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: "topology.kubernetes.io/zone".into(),
            operator: "In".into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn merging_keeps_only_compatible_pairs_when_some_exist() {
        let existing = vec![vec![zone(&["a"])], vec![zone(&["b"])]];
        let merged = merge(&existing, &[vec![zone(&["b", "c"])]]);
        assert_eq!(merged, vec![vec![zone(&["b"]), zone(&["b", "c"])]]);
        // None compatible: every pair, so the solve reports the conflict.
        let merged = merge(&[vec![zone(&["a"])]], &[vec![zone(&["c"])]]);
        assert_eq!(merged.len(), 1);
    }

    #[test]
    fn volume_usage_counts_distinct_claims_per_limited_driver() {
        let vols = |pairs: &[(&str, &str)]| {
            let mut v = PodVolumes::new();
            for (d, c) in pairs {
                v.entry(d.to_string()).or_default().insert(c.to_string());
            }
            v
        };
        let mut usage = VolumeUsage {
            limits: [("csi".to_string(), 2)].into_iter().collect(),
            in_use: vols(&[("csi", "ns/a")]),
        };
        assert!(usage.fits(&vols(&[("csi", "ns/a"), ("csi", "ns/b")])));
        assert!(!usage.fits(&vols(&[("csi", "ns/b"), ("csi", "ns/c")])));
        // Drivers without a limit are never full.
        assert!(usage.fits(&vols(&[
            ("other", "ns/x"),
            ("other", "ns/y"),
            ("other", "ns/z")
        ])));
        usage.add(&vols(&[("csi", "ns/b")]));
        assert!(usage.fits(&vols(&[("csi", "ns/a")])));
        assert!(!usage.fits(&vols(&[("csi", "ns/c")])));
    }

    #[test]
    fn the_newest_default_class_is_the_default_then_the_first_by_name() {
        let sc = |name: &str, created: &str, default: &str| -> StorageClass {
            serde_json::from_value(json!({
                "metadata": {"name": name, "creationTimestamp": created,
                             "annotations": {ANN_DEFAULT_CLASS: default}},
                "provisioner": "kubernetes.io/aws-ebs",
            }))
            .unwrap()
        };
        let mut catalog = VolumeCatalog::default();
        assert_eq!(catalog.default_class(), None);
        catalog.apply_class(&sc("old", "2024-01-01T00:00:00Z", "true"));
        catalog.apply_class(&sc("newest-not-default", "2024-03-01T00:00:00Z", "false"));
        assert_eq!(catalog.default_class(), Some("old"));
        catalog.apply_class(&sc("new-b", "2024-02-01T00:00:00Z", "true"));
        catalog.apply_class(&sc("new-a", "2024-02-01T00:00:00Z", "true"));
        assert_eq!(catalog.default_class(), Some("new-a"));
        // An in-tree provisioner is read as its migrated CSI driver.
        assert_eq!(catalog.classes["old"].provisioner, "ebs.csi.aws.com");
        // A claim naming no class uses the default; one naming "" uses none.
        let none = ClaimInfo::default();
        assert_eq!(catalog.class_of(&none), "new-a");
        let empty = ClaimInfo {
            storage_class: Some(String::new()),
            ..ClaimInfo::default()
        };
        assert_eq!(catalog.class_of(&empty), "");
    }

    #[test]
    fn local_volume_hostname_affinity_is_dropped() {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "local"},
            "spec": {"local": {"path": "/mnt"}, "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": ["gone"]}]}
            ]}}}
        }))
        .unwrap();
        assert_eq!(
            volume_alternatives(&VolumeInfo::of(&pv)),
            vec![Vec::<NodeSelectorRequirement>::new()]
        );
    }

    #[test]
    fn volume_zones_stay_out_of_the_pods_affinity() {
        let mut catalog = VolumeCatalog::default();
        catalog.apply_volume(
            &serde_json::from_value(json!({
                "metadata": {"name": "pv"},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z"]}]}
                ]}}}
            }))
            .unwrap(),
        );
        catalog.apply_claim(
            &serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "default",
                             "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                "spec": {"volumeName": "pv", "storageClassName": ""},
                "status": {"phase": "Bound"}
            }))
            .unwrap(),
        );
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}
        }))
        .unwrap();
        let mut snapshot = super::super::Snapshot {
            pods: vec![pod.clone()],
            ..Default::default()
        };
        let (_, failures) = prepare(&mut snapshot, &catalog, &CsiLimits::new());
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(
            snapshot.pods,
            vec![pod.clone()],
            "the pod itself is left as it is"
        );
        let zone_only = Requirements::from_pod_node_selector(&[zone(&["z"])]).unwrap();
        let expected = VolumeTopology::from([("default/p".to_string(), vec![zone_only])]);
        assert_eq!(snapshot.volume_topology, expected);
        // A bound pod a simulation moves gets the same.
        assert_eq!(topology_of([&pod], &catalog), expected);
    }
}
