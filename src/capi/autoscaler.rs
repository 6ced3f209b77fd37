//! Cluster Autoscaler's clusterapi annotations beyond the scale-from-zero shape: the CSI drivers
//! a MachineDeployment's nodes run with their attach limits, the DRA driver its GPUs are
//! published through, Cluster API's pause, and whether a rollout is under way. Users already
//! carry them on their MachineDeployments; this reads them the way the autoscaler does, but
//! reports a malformed value (the autoscaler skips it with a log line) like every other
//! annotation of the catalog.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::wellknown::GPU_COUNT_ANNOTATION;
use crate::capi::annotations::{
    self, AnnotationError, AnnotationErrors, Problem, ScaleFromZero, validate_label_key,
};
use crate::capi::model::{Machine, MachineDeployment};

/// `driver=limit,driver2=limit2`: the CSI drivers installed on the nodes and how many volumes
/// each may attach (0: installed, no limit stated).
pub const CSI_DRIVER_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/csi-driver";
pub use crate::capi::annotations::DRA_DRIVER_ANNOTATION;
/// Cluster API's pause: present (any value) on a scalable resource, its controllers leave it
/// alone.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// What the driver annotations say about the nodes a MachineDeployment makes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drivers {
    /// CSI driver -> attach limit; drivers listed with 0 have none (the autoscaler sets no
    /// allocatable count for them).
    pub csi: BTreeMap<String, Option<usize>>,
    /// The DRA driver and how many GPU devices it publishes per node (`gpu-count`).
    pub dra: Option<(String, i64)>,
}

impl Drivers {
    /// The attach limits a node of this MachineDeployment will declare in its CSINode.
    pub fn csi_limits(&self) -> BTreeMap<String, usize> {
        self.csi
            .iter()
            .filter_map(|(d, l)| Some((d.clone(), (*l)?)))
            .collect()
    }
}

/// The scale-from-zero annotations and the driver annotations together, every problem of both
/// reported at once.
pub fn parse_all(
    annotations: &BTreeMap<String, String>,
) -> Result<(ScaleFromZero, Drivers), AnnotationErrors> {
    match (annotations::parse(annotations), parse(annotations)) {
        (Ok(sfz), Ok(drivers)) => Ok((sfz, drivers)),
        (a, b) => Err(AnnotationErrors(
            a.err()
                .into_iter()
                .chain(b.err())
                .flat_map(|e| e.0)
                .collect(),
        )),
    }
}

/// Reads the CSI and DRA driver annotations.
pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Drivers, AnnotationErrors> {
    let mut errors = Vec::new();
    let mut error = |key: &str, problem: Problem| {
        errors.push(AnnotationError {
            key: key.to_string(),
            value: annotations.get(key).cloned().unwrap_or_default(),
            problem,
        });
    };
    let mut out = Drivers::default();
    if let Some(raw) = annotations.get(CSI_DRIVER_ANNOTATION) {
        match parse_csi(raw) {
            Ok(csi) => out.csi = csi,
            Err(p) => error(CSI_DRIVER_ANNOTATION, p),
        }
    }
    if let Some(raw) = annotations.get(DRA_DRIVER_ANNOTATION) {
        let driver = raw.trim();
        let count = annotations
            .get(GPU_COUNT_ANNOTATION)
            .and_then(|c| c.trim().parse::<i64>().ok());
        if driver.is_empty() {
            error(DRA_DRIVER_ANNOTATION, Problem::Empty);
        } else if driver.contains('/') || validate_label_key(&format!("{driver}/x")).is_err() {
            error(
                DRA_DRIVER_ANNOTATION,
                Problem::BadEntry {
                    entry: driver.to_string(),
                    why: "a DRA driver name must be a lowercase DNS subdomain".into(),
                },
            );
        } else if !annotations.contains_key(GPU_COUNT_ANNOTATION) {
            error(
                DRA_DRIVER_ANNOTATION,
                Problem::MissingCompanion {
                    other: GPU_COUNT_ANNOTATION,
                },
            );
        } else if let Some(count) = count {
            out.dra = Some((driver.to_string(), count));
        }
        // A gpu-count that does not parse is reported by the scale-from-zero parser.
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(AnnotationErrors(errors))
    }
}

/// `driver=limit,...`; blank entries (a trailing comma) are ignored, as the autoscaler does.
fn parse_csi(raw: &str) -> Result<BTreeMap<String, Option<usize>>, Problem> {
    let mut out = BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| Problem::BadEntry {
            entry: entry.to_string(),
            why: why.to_string(),
        };
        let (driver, limit) = entry
            .split_once('=')
            .ok_or_else(|| bad("expected driver-name=volume-limit"))?;
        let (driver, limit) = (driver.trim(), limit.trim());
        // A CSI driver name is a DNS subdomain (CSIDriver's object name).
        if driver.is_empty()
            || driver.contains('/')
            || validate_label_key(&format!("{driver}/x")).is_err()
        {
            return Err(bad("the driver name must be a lowercase DNS subdomain"));
        }
        // The autoscaler parses the limit as a 32-bit integer.
        let limit: i32 = limit
            .parse()
            .map_err(|_| bad("the volume limit must be a non-negative integer"))?;
        let limit = usize::try_from(limit)
            .map_err(|_| bad("the volume limit must be a non-negative integer"))?;
        if out
            .insert(driver.to_string(), (limit > 0).then_some(limit))
            .is_some()
        {
            return Err(bad("driver listed twice"));
        }
    }
    Ok(out)
}

/// Cluster API's pause on the MachineDeployment: the `cluster.x-k8s.io/paused` annotation (any
/// value, as Cluster API and the autoscaler read it) or `spec.paused`. Its controllers do not
/// act on replica changes then, so nothing here writes them.
pub fn paused(md: &MachineDeployment) -> bool {
    md.paused || md.annotations.contains_key(PAUSED_ANNOTATION)
}

/// A RollingUpdate under way: some live Machine of the MachineDeployment is not up to date
/// (Cluster API's `UpToDate` condition False), i.e. an older MachineSet still holds Machines,
/// which is how the autoscaler recognises a rollout. OnDelete MachineDeployments never roll out
/// on their own (their outdated Machines wait for a deletion), so they never count.
pub fn mid_rollout(md: &MachineDeployment, machines: &[Arc<Machine>]) -> bool {
    !md.on_delete
        && machines
            .iter()
            .any(|m| m.deletion_timestamp.is_none() && m.up_to_date == Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wellknown::GPU_TYPE_ANNOTATION;

    fn of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn csi_drivers_read_as_the_autoscaler_reads_them() {
        let d = parse(&of(&[(
            CSI_DRIVER_ANNOTATION,
            "ebs.csi.aws.com=25, efs.csi.aws.com=0,",
        )]))
        .expect("valid");
        assert_eq!(d.csi.get("ebs.csi.aws.com"), Some(&Some(25)));
        assert_eq!(d.csi.get("efs.csi.aws.com"), Some(&None));
        assert_eq!(
            d.csi_limits(),
            BTreeMap::from([("ebs.csi.aws.com".to_string(), 25)])
        );
    }

    #[test]
    fn malformed_driver_annotations_are_reported_naming_the_annotation() {
        for (key, value) in [
            (CSI_DRIVER_ANNOTATION, "ebs.csi.aws.com"),
            (CSI_DRIVER_ANNOTATION, "ebs.csi.aws.com=-1"),
            (CSI_DRIVER_ANNOTATION, "ebs.csi.aws.com=lots"),
            (CSI_DRIVER_ANNOTATION, "=5"),
            (CSI_DRIVER_ANNOTATION, "EBS Driver=5"),
            (CSI_DRIVER_ANNOTATION, "a.b=1,a.b=2"),
            (CSI_DRIVER_ANNOTATION, "ebs.csi.aws.com=99999999999"),
            (DRA_DRIVER_ANNOTATION, ""),
            (DRA_DRIVER_ANNOTATION, "gpu.nvidia.com"),
            (DRA_DRIVER_ANNOTATION, "GPU NVIDIA"),
        ] {
            let err = parse(&of(&[(key, value)])).expect_err(value);
            assert!(err.to_string().contains(key), "{key}={value}: {err}");
        }
    }

    #[test]
    fn a_dra_driver_takes_the_gpu_count_without_a_gpu_type() {
        let a = of(&[
            (DRA_DRIVER_ANNOTATION, "gpu.nvidia.com"),
            (GPU_COUNT_ANNOTATION, "2"),
            ("capacity.cluster-autoscaler.kubernetes.io/cpu", "4"),
        ]);
        let (sfz, drivers) = parse_all(&a).expect("valid");
        assert_eq!(drivers.dra, Some(("gpu.nvidia.com".to_string(), 2)));
        // No extended resource: the devices are DRA's, not a device plugin's.
        assert!(sfz.gpu.is_none());
        // Without the DRA driver the count still needs its type.
        let err = parse_all(&of(&[(GPU_COUNT_ANNOTATION, "2")])).expect_err("no type");
        assert!(err.to_string().contains(GPU_TYPE_ANNOTATION), "{err}");
    }

    fn md(annotations: serde_json::Value, strategy: &str) -> MachineDeployment {
        let v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": "md", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "annotations": annotations},
            "spec": {"clusterName": "c", "rollout": {"strategy": {"type": strategy}},
                     "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": "md"}},
                     "template": {"spec": {"clusterName": "c", "bootstrap": {},
                                  "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": "t"}}}}
        });
        MachineDeployment::from_value(&v, crate::capi::CapiVersion::V1Beta2).expect("an MD")
    }

    fn machine(name: &str, up_to_date: &str) -> Arc<Machine> {
        let v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1",
                         "labels": {"cluster.x-k8s.io/deployment-name": "md"}},
            "spec": {"clusterName": "c", "bootstrap": {},
                     "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": name}},
            "status": {"conditions": [{"type": "UpToDate", "status": up_to_date}]}
        });
        Arc::new(Machine::from_value(&v, crate::capi::CapiVersion::V1Beta2).expect("a Machine"))
    }

    #[test]
    fn pause_and_rollout_as_cluster_api_and_the_autoscaler_read_them() {
        assert!(paused(&md(
            serde_json::json!({PAUSED_ANNOTATION: ""}),
            "RollingUpdate"
        )));
        assert!(!paused(&md(serde_json::json!({}), "RollingUpdate")));
        let fresh = [machine("a", "True"), machine("b", "True")];
        let rolling = [machine("a", "True"), machine("b", "False")];
        let rolling_update = md(serde_json::json!({}), "RollingUpdate");
        assert!(!mid_rollout(&rolling_update, &fresh));
        assert!(mid_rollout(&rolling_update, &rolling));
        // OnDelete: outdated Machines wait for a deletion; nothing rolls out on its own.
        assert!(!mid_rollout(
            &md(serde_json::json!({}), "OnDelete"),
            &rolling
        ));
    }
}
