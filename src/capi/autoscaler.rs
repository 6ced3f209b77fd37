//! Cluster Autoscaler's clusterapi annotations beyond the scale-from-zero shape: the CSI drivers
//! a MachineDeployment's nodes run with their attach limits, the DRA driver its GPUs are
//! published through, Cluster API's pause, and whether a rollout is under way. Users already
//! carry them on their MachineDeployments; this reads them the way the autoscaler does: what it
//! passes over (with a log line) is passed over here too and recorded in [`Drivers::skipped`] for
//! the NodeClass status (see `capi::annotations` for the citation convention, `CA <file>:<line>`
//! at kubernetes/autoscaler@35e8a280425c).

use std::collections::BTreeMap;

use crate::api::wellknown::GPU_COUNT_ANNOTATION;
use crate::capi::annotations::{
    self, AnnotationErrors, ScaleFromZero, Skipped, validate_label_key,
};
use crate::capi::model::{Machine, MachineDeployment};

/// `driver=limit,driver2=limit2`: the CSI drivers installed on the nodes and how many volumes
/// each may attach (0: installed, no limit stated).
pub const CSI_DRIVER_ANNOTATION: &str = "capacity.cluster-autoscaler.kubernetes.io/csi-driver";
pub(crate) use crate::capi::annotations::DRA_DRIVER_ANNOTATION;
/// Cluster API's pause: present (any value) on a scalable resource, its controllers leave it
/// alone.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// What the driver annotations say about the nodes a MachineDeployment makes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Drivers {
    /// CSI driver -> attach limit; drivers listed with 0 have none (the autoscaler sets no
    /// allocatable count for them).
    pub(crate) csi: BTreeMap<String, Option<usize>>,
    /// The DRA driver and how many GPU devices it publishes per node (`gpu-count`).
    pub(crate) dra: Option<(String, i64)>,
    /// What was passed over rather than refused, for the NodeClass status.
    pub(crate) skipped: Vec<Skipped>,
}

impl Drivers {
    /// The attach limits a node of this MachineDeployment will declare in its CSINode.
    pub(crate) fn csi_limits(&self) -> BTreeMap<String, usize> {
        self.csi
            .iter()
            .filter_map(|(d, l)| Some((d.clone(), (*l)?)))
            .collect()
    }
}

/// The scale-from-zero annotations and the driver annotations together, every problem of both
/// reported at once. What each passed over is in its own `skipped`.
pub(crate) fn parse_all(
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

/// [`parse_all`] of a MachineDeployment's or MachinePool's annotations, with its own
/// `spec.template.spec.taints` merged into the taints as Cluster Autoscaler 1.36 merges them
/// ([`ScaleFromZero::with_template_taints`]).
pub(crate) fn parse_scalable(
    md: &MachineDeployment,
) -> Result<(ScaleFromZero, Drivers), AnnotationErrors> {
    let (sfz, drivers) = parse_all(&md.annotations)?;
    Ok((sfz.with_template_taints(&md.template_taints), drivers))
}

/// Reads the CSI and DRA driver annotations. Nothing in them is refused, as the autoscaler
/// refuses nothing in them: a malformed `gpu-count` is the scale-from-zero parser's error.
pub(crate) fn parse(annotations: &BTreeMap<String, String>) -> Result<Drivers, AnnotationErrors> {
    let mut out = Drivers::default();
    let mut skip = |key: &str, entry: &str, reason: String| {
        out.skipped.push(Skipped {
            key: key.to_string(),
            entry: entry.to_string(),
            reason,
        });
    };
    let mut csi = BTreeMap::new();
    if let Some(raw) = annotations.get(CSI_DRIVER_ANNOTATION) {
        let (drivers, dropped) = parse_csi(raw);
        csi = drivers;
        for (entry, reason) in dropped {
            skip(CSI_DRIVER_ANNOTATION, &entry, reason);
        }
    }
    let mut dra = None;
    if let Some(raw) = annotations.get(DRA_DRIVER_ANNOTATION) {
        let driver = raw.trim();
        let count = annotations.get(GPU_COUNT_ANNOTATION).map(|c| c.trim());
        // CA clusterapi_unstructured.go:389-391 (kubernetes/autoscaler@35e8a280425c): an empty
        // driver publishes no devices; :397 neither does a zero or absent gpu-count.
        if driver.is_empty() {
            skip(
                DRA_DRIVER_ANNOTATION,
                raw,
                "empty: no DRA devices are published, as Cluster \
                         Autoscaler does"
                    .into(),
            );
        } else if driver.contains('/') || validate_label_key(&format!("{driver}/x")).is_err() {
            // The autoscaler does not check the name, but a driver's name is a DNS subdomain
            // (ResourceSlice validation), so one that is not matches no device class anyway.
            skip(
                DRA_DRIVER_ANNOTATION,
                raw,
                "not a lowercase DNS subdomain, so no driver's name: no DRA devices are published"
                    .into(),
            );
        } else {
            match count.filter(|c| !c.is_empty()) {
                None => skip(
                    DRA_DRIVER_ANNOTATION,
                    raw,
                    format!(
                        "no {GPU_COUNT_ANNOTATION}: no DRA devices are published, as Cluster \
                         Autoscaler does"
                    ),
                ),
                // A count that does not parse is the scale-from-zero parser's error; Rust's
                // integer parse takes Go's leading `+` as well.
                Some(c) => dra = c.parse::<i64>().ok().map(|n| (driver.to_string(), n)),
            }
        }
    }
    out.csi = csi;
    out.dra = dra;
    Ok(out)
}

/// CSI driver -> attach limit, as in [`Drivers::csi`].
type CsiLimits = BTreeMap<String, Option<usize>>;

/// `driver=limit,...`, read as CA clusterapi_unstructured.go:600-655
/// (kubernetes/autoscaler@35e8a280425c) reads it: entries trimmed, blank ones ignored, and an
/// entry without `=`, with an empty driver name, or with a limit that is not a non-negative
/// 32-bit integer (Go's ParseInt: a leading `+` is fine) passed over, never the whole list.
/// Driver names are not checked, as there: one no volume names is harmless. A driver listed
/// twice: the later entry wins.
fn parse_csi(raw: &str) -> (CsiLimits, Vec<(String, String)>) {
    let mut out = BTreeMap::new();
    let mut dropped = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let mut drop = |why: &str| dropped.push((entry.to_string(), why.to_string()));
        let Some((driver, limit)) = entry.split_once('=') else {
            drop("expected driver-name=volume-limit");
            continue;
        };
        let (driver, limit) = (driver.trim(), limit.trim());
        if driver.is_empty() {
            drop("empty driver name");
            continue;
        }
        let Ok(limit) = limit.parse::<i32>() else {
            drop("the volume limit is not a 32-bit integer");
            continue;
        };
        let Ok(limit) = usize::try_from(limit) else {
            drop("the volume limit is negative");
            continue;
        };
        let limit = (limit > 0).then_some(limit);
        if let Some(earlier) = out.insert(driver.to_string(), limit)
            && earlier != limit
        {
            let earlier = earlier.unwrap_or(0);
            dropped.push((
                format!("{driver}={earlier}"),
                "a later entry names the same driver, and wins".to_string(),
            ));
        }
    }
    (out, dropped)
}

/// Cluster API's pause on the MachineDeployment: the `cluster.x-k8s.io/paused` annotation (any
/// value, as Cluster API and the autoscaler read it) or `spec.paused`. Its controllers do not
/// act on replica changes then, so nothing here writes them.
pub(crate) fn paused(md: &MachineDeployment) -> bool {
    md.paused || md.annotations.contains_key(PAUSED_ANNOTATION)
}

/// Cluster API's pause on a Cluster: `spec.paused` or the `cluster.x-k8s.io/paused` annotation.
/// Every Cluster API controller leaves the Cluster's objects alone then (its MachineDeployments
/// and MachineSets included), so a paused Cluster pauses each of its MachineDeployments.
pub(crate) fn cluster_paused(cluster: &kube::api::DynamicObject) -> bool {
    let spec_paused = cluster
        .data
        .pointer("/spec/paused")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    spec_paused
        || cluster
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
}

/// A RollingUpdate under way: some live Machine of the MachineDeployment is not up to date
/// (Cluster API's `UpToDate` condition False), i.e. an older MachineSet still holds Machines,
/// which is how the autoscaler recognises a rollout. OnDelete MachineDeployments never roll out
/// on their own (their outdated Machines wait for a deletion), so they never count.
pub(crate) fn mid_rollout(md: &MachineDeployment, machines: &[&Machine]) -> bool {
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

    // CA clusterapi_unstructured.go:600-655 (kubernetes/autoscaler@35e8a280425c) passes over a
    // bad entry and keeps the rest: TestParseCSIDriverAnnotation's mixed case
    // (clusterapi_unstructured_test.go:825-826).
    #[test]
    fn a_bad_csi_entry_is_skipped_and_the_rest_kept() {
        let d = parse(&of(&[(
            CSI_DRIVER_ANNOTATION,
            "ebs.csi.aws.com=25,invalid-format,efs.csi.aws.com=16,=10,disk.csi.azure.com=0",
        )]))
        .expect("never refused");
        assert_eq!(
            d.csi,
            BTreeMap::from([
                ("ebs.csi.aws.com".to_string(), Some(25)),
                ("efs.csi.aws.com".to_string(), Some(16)),
                ("disk.csi.azure.com".to_string(), None),
            ])
        );
        let skipped: Vec<&str> = d.skipped.iter().map(|s| s.entry.as_str()).collect();
        assert_eq!(skipped, ["invalid-format", "=10"]);
        assert!(d.skipped.iter().all(|s| s.key == CSI_DRIVER_ANNOTATION));
        assert!(d.skipped[0].to_string().contains(CSI_DRIVER_ANNOTATION));
    }

    // TestParseCSIDriverAnnotation's single-entry cases (clusterapi_unstructured_test.go:
    // 712-860): each bad one leaves no driver, and no error.
    #[test]
    fn csi_entries_the_autoscaler_passes_over_are_skipped() {
        for bad in [
            "ebs.csi.aws.com25",
            "=25",
            "ebs.csi.aws.com=abc",
            "ebs.csi.aws.com=-5",
            "ebs.csi.aws.com=25.5",
            "ebs.csi.aws.com=2147483648",
        ] {
            let d = parse(&of(&[(CSI_DRIVER_ANNOTATION, bad)])).expect(bad);
            assert!(d.csi.is_empty(), "{bad}");
            assert_eq!(d.skipped.len(), 1, "{bad}");
            assert_eq!(d.skipped[0].entry, bad);
        }
        for (good, limit) in [
            ("ebs.csi.aws.com=2147483647", Some(2_147_483_647)),
            ("ebs.csi.aws.com=+5", Some(5)),
            ("ebs.csi.aws.com=0", None),
        ] {
            let d = parse(&of(&[(CSI_DRIVER_ANNOTATION, good)])).expect(good);
            assert_eq!(d.csi.get("ebs.csi.aws.com"), Some(&limit), "{good}");
            assert!(d.skipped.is_empty(), "{good}");
        }
        // Listed twice: the later entry wins, and the earlier is reported.
        let d = parse(&of(&[(CSI_DRIVER_ANNOTATION, "a.b=1,a.b=2")])).expect("valid");
        assert_eq!(d.csi.get("a.b"), Some(&Some(2)));
        assert_eq!(d.skipped.len(), 1);
    }

    // CA clusterapi_unstructured.go:389-397 (kubernetes/autoscaler@35e8a280425c): an empty
    // driver, or no gpu-count, publishes no devices; nothing is refused.
    #[test]
    fn a_dra_driver_that_publishes_nothing_is_skipped_not_refused() {
        for pairs in [
            vec![(DRA_DRIVER_ANNOTATION, "")],
            vec![(DRA_DRIVER_ANNOTATION, "gpu.nvidia.com")],
            vec![
                (DRA_DRIVER_ANNOTATION, "GPU NVIDIA"),
                (GPU_COUNT_ANNOTATION, "1"),
            ],
        ] {
            let d = parse(&of(&pairs)).expect("never refused");
            assert_eq!(d.dra, None, "{pairs:?}");
            assert_eq!(d.skipped.len(), 1, "{pairs:?}");
            assert_eq!(d.skipped[0].key, DRA_DRIVER_ANNOTATION);
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
        assert!(sfz.skipped.is_empty() && drivers.skipped.is_empty());
        // Without the DRA driver a count alone publishes nothing (CA
        // clusterapi_unstructured.go:336), and says so.
        let (sfz, drivers) = parse_all(&of(&[(GPU_COUNT_ANNOTATION, "2")])).expect("ignored");
        assert!(sfz.gpu.is_none() && drivers.dra.is_none());
        assert_eq!(sfz.skipped.len(), 1);
        assert!(sfz.skipped[0].reason.contains(GPU_TYPE_ANNOTATION));
        // A DRA count with Go's leading `+`.
        let (_, drivers) = parse_all(&of(&[
            (DRA_DRIVER_ANNOTATION, "gpu.nvidia.com"),
            (GPU_COUNT_ANNOTATION, "+2"),
        ]))
        .expect("valid");
        assert_eq!(drivers.dra, Some(("gpu.nvidia.com".to_string(), 2)));
    }

    fn md(annotations: serde_json::Value, strategy: &str) -> MachineDeployment {
        md_with_taints(annotations, strategy, serde_json::Value::Null)
    }

    fn md_with_taints(
        annotations: serde_json::Value,
        strategy: &str,
        taints: serde_json::Value,
    ) -> MachineDeployment {
        let v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": "md", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "annotations": annotations},
            "spec": {"clusterName": "c", "rollout": {"strategy": {"type": strategy}},
                     "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": "md"}},
                     "template": {"spec": {"clusterName": "c", "bootstrap": {}, "taints": taints,
                                  "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": "t"}}}}
        });
        MachineDeployment::from_value(&v, crate::capi::CapiVersion::V1Beta2).expect("an MD")
    }

    // CA clusterapi_unstructured.go:229-283 (kubernetes/autoscaler@35e8a280425c), with
    // TestNodeGroupTemplateNodeInfo's case (clusterapi_nodegroup_test.go:1727-1751): the
    // MachineDeployment's own taints, overridden by the annotation's with the same key and
    // effect.
    #[test]
    fn parse_scalable_merges_the_template_taints() {
        let md = md_with_taints(
            serde_json::json!({
                "capacity.cluster-autoscaler.kubernetes.io/taints": "dedicated=override:NoSchedule"
            }),
            "RollingUpdate",
            serde_json::json!([
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule", "propagation": "Always"},
                {"key": "boot", "effect": "NoExecute", "propagation": "OnInitialization"},
            ]),
        );
        let (sfz, _) = parse_scalable(&md).expect("valid");
        let taints: Vec<String> = sfz.taints.iter().map(ToString::to_string).collect();
        assert_eq!(taints, ["dedicated=override:NoSchedule", "boot:NoExecute"]);
    }

    fn machine(name: &str, up_to_date: &str) -> std::sync::Arc<Machine> {
        let v = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1",
                         "labels": {"cluster.x-k8s.io/deployment-name": "md"}},
            "spec": {"clusterName": "c", "bootstrap": {},
                     "infrastructureRef": {"apiGroup": "infra", "kind": "K", "name": name}},
            "status": {"conditions": [{"type": "UpToDate", "status": up_to_date}]}
        });
        std::sync::Arc::new(
            Machine::from_value(&v, crate::capi::CapiVersion::V1Beta2).expect("a Machine"),
        )
    }

    #[test]
    fn pause_and_rollout_as_cluster_api_and_the_autoscaler_read_them() {
        assert!(paused(&md(
            serde_json::json!({PAUSED_ANNOTATION: ""}),
            "RollingUpdate"
        )));
        assert!(!paused(&md(serde_json::json!({}), "RollingUpdate")));
        let (a, b, outdated) = (
            machine("a", "True"),
            machine("b", "True"),
            machine("b", "False"),
        );
        let fresh = [&*a, &*b];
        let rolling = [&*a, &*outdated];
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
