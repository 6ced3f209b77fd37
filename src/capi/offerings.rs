//! Instance types from MachineDeployments (docs/design.md), as a pure function of the
//! MachineDeployments, their infrastructure templates and a NodeClass's selector.
//!
//! One MachineDeployment is one offering. MachineDeployments that share an instance-type label
//! form one instance type with one offering each; without the label the MachineDeployment's name
//! stands in. A MachineDeployment whose annotations are malformed is left out and reported, so
//! one bad object never hides the others.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::api::Operator;
use crate::api::nodeclass::GeneratedGroup;
use crate::api::requirements::{Requirement, Requirements};
use crate::api::resources::Resources;
use crate::api::wellknown::*;
use crate::capi::autoscaler;
use crate::capi::generate::GroupPlan;
use crate::capi::model::{LabelSelector, MachineDeployment};
use crate::capi::room;
use crate::capi::template::{self, TemplateCapacity};
use crate::scheduling::{InstanceType, Offering};

/// What one NodeClass resolves to.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub instance_types: Vec<InstanceType>,
    /// `namespace/name` of every MachineDeployment that became an offering.
    pub deployments: Vec<String>,
    /// Key of every group the NodeClass selects, offered or left out. Drift reads this, not
    /// `deployments`: a claim's group drifts it only when the group is gone or no longer
    /// selected, never because the catalog could not read it (see [`Catalog::unknown`]).
    pub selected: BTreeSet<String>,
    /// Selected groups left out because what they offer is not known (malformed annotations,
    /// an infrastructure template not read yet, missing, or failing with no capacity known),
    /// by key, with why. Their claims are neither drifted nor joined by new launches.
    pub unknown: BTreeMap<String, String>,
    /// One line per MachineDeployment that was selected but left out, naming it and why.
    pub problems: Vec<String>,
    /// One line per annotation entry an offered group's annotations carry that was ignored
    /// (as Cluster Autoscaler ignores it), naming the group, the annotation and why.
    pub skipped: Vec<String>,
    /// Offerings (by MachineDeployment) whose price a NodeOverlay set, with the price before.
    pub price_overlays: BTreeMap<String, PriceOverlaid>,
    /// Keys of the offered MachinePools without MachinePool Machines: offered for scale-up
    /// only (see [`scale_up_only`]).
    pub scale_up_only: Vec<String>,
    /// Keys of the selected groups not offered yet because their infrastructure template or
    /// pool has not been read, or a pool has not said whether it has MachinePool Machines
    /// ([`POOL_UNREAD`], [`TEMPLATE_UNREAD`]): a claim only they could serve waits for the
    /// read rather than be found unlaunchable.
    pub pending: Vec<String>,
    /// What the room of each offered group with a max-size is counted from besides its
    /// replicas (see `capi::room`): readers count the claims holding a replica of it in.
    pub owned: room::OwnedByGroup,
    /// Keys of the selected groups whose template's first read has not answered yet (a subset
    /// of `pending`): the provisioner places no claim for the NodeClass until this is empty,
    /// so a start or failover never sends claims to a dearer group meanwhile.
    pub unread: Vec<String>,
    /// `spec.generate`'s state: None without it, else whether it could be used (the error
    /// names the field).
    pub generation: Option<Result<(), String>>,
    /// Groups offered for `spec.generate` that do not exist yet, by key: created when a claim
    /// chooses one (the Generator actor).
    pub to_generate: BTreeMap<String, GroupPlan>,
    /// The generated groups of this NodeClass that exist, for its status.
    pub generated: Vec<GeneratedGroup>,
}

impl Catalog {
    /// Leaves a selected group out for a reason that says nothing of what it offers: it stays
    /// selected (no drift) and is reported on the NodeClass.
    pub(crate) fn leave_out_unknown(&mut self, md: &MachineDeployment, why: String) {
        self.selected.insert(md.key());
        self.problems.push(format!("{}: {why}", md.scalable()));
        self.unknown.insert(md.key(), why);
    }
}

mod generated;
pub(crate) use generated::add_generated;

/// The price a NodeOverlay set on one offering (kept so `explain` can say where a price came
/// from).
#[derive(Clone, Debug, PartialEq)]
pub struct PriceOverlaid {
    pub overlay: String,
    pub base_price: f64,
    pub(crate) change: crate::api::nodeoverlay::PriceChange,
}

/// Why a MachineDeployment whose capacity comes from its infrastructure template is left out
/// until the template has been read once: after a start or a failover the first catalog must
/// not offer it half-known, nor treat it as gone.
pub(crate) const TEMPLATE_UNREAD: &str = "its infrastructure template has not been read yet; offered \
     once it is";

/// Inputs for one MachineDeployment besides the object itself.
pub struct Context<'a> {
    /// Infrastructure template capacity by MachineDeployment key, where it could be read.
    pub templates: &'a HashMap<String, TemplateCapacity>,
    /// MachineDeployments temporarily unavailable (a launch failed or timed out recently).
    pub unavailable: &'a dyn Fn(&str) -> bool,
}

/// Why a MachinePool is left out until its infrastructure pool has been read and either reports
/// a machine kind or is provisioned without one: only then is it known whether its instances can
/// be removed by name (MachinePool Machines) or not.
pub(crate) const POOL_UNREAD: &str = "its infrastructure pool has not been read or provisioned yet, so \
     whether it has MachinePool Machines is not known; offered once it is";

/// True for a MachinePool whose infrastructure pool is provisioned and reports no
/// `status.infrastructureMachineKind`: its instances live only in `spec.providerIDList`, no
/// Machine names one, so none can be removed by name. Such a pool is offered for scale-up only:
/// its claims bind to provider IDs that newly appear, are never chosen for consolidation or
/// drift, and a deleted one hands its instance back to the pool rather than lower replicas
/// blindly (the cloud would choose which instance goes).
pub(crate) fn scale_up_only(
    md: &MachineDeployment,
    templates: &HashMap<String, TemplateCapacity>,
) -> bool {
    md.is_pool()
        && templates
            .get(&md.key())
            .is_some_and(|t| t.provisioned && t.machine_kind.is_none())
}

/// True when a MachineDeployment is a member and the NodeClass's selector picks it.
pub(crate) fn selected(md: &MachineDeployment, selector: Option<&LabelSelector>) -> bool {
    not_selected(md, selector).is_none()
}

/// Why a NodeClass does not select a MachineDeployment, if it does not.
pub(crate) fn not_selected(
    md: &MachineDeployment,
    selector: Option<&LabelSelector>,
) -> Option<String> {
    if !md.labels.contains_key(MEMBER_LABEL) {
        return Some(format!("no {MEMBER_LABEL} label"));
    }
    if md.deletion_timestamp.is_some() {
        return Some("being deleted".into());
    }
    // A generated group is its NodeClass's alone, and only while it serves a shape of the
    // current source (`generated`).
    if let Some(nodeclass) = crate::capi::generate::generated_by(&md.labels) {
        return Some(format!("generated by ClusterAPINodeClass {nodeclass}"));
    }
    if selector.is_some_and(|s| !s.matches(&md.labels)) {
        return Some("its labels do not match spec.scalableResourceSelector".into());
    }
    None
}

pub fn build(
    selector: Option<&LabelSelector>,
    mds: &[Arc<MachineDeployment>],
    cx: &Context<'_>,
) -> Catalog {
    let mut sorted: Vec<&MachineDeployment> = mds
        .iter()
        .filter(|md| selected(md, selector))
        .map(|md| md.as_ref())
        .collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    build_selected(&sorted, cx)
}

/// The catalog of node groups already chosen (in this order).
pub(crate) fn build_selected(sorted: &[&MachineDeployment], cx: &Context<'_>) -> Catalog {
    let mut catalog = Catalog::default();
    let mut by_type: BTreeMap<String, Vec<(Resources, CsiLimits, Offering)>> = BTreeMap::new();
    for &md in sorted {
        catalog.selected.insert(md.key());
        match offering(md, cx) {
            Ok((name, capacity, o)) => {
                if scale_up_only(md, cx.templates) {
                    catalog.scale_up_only.push(o.machine_deployment.clone());
                }
                catalog.deployments.push(o.machine_deployment.clone());
                if o.max_size.is_some() {
                    catalog.owned.insert(md.key(), room::Owned::of(md));
                }
                // Parsed already by `offering`, which refused the MachineDeployment if bad.
                let (csi, skipped) = match autoscaler::parse_scalable(md) {
                    Ok((sfz, drivers)) => {
                        let mut skipped = sfz.skipped;
                        skipped.extend(drivers.skipped.iter().cloned());
                        (drivers.csi_limits(), skipped)
                    }
                    Err(_) => Default::default(),
                };
                catalog
                    .skipped
                    .extend(skipped.iter().map(|s| format!("{}: {s}", md.scalable())));
                by_type.entry(name).or_default().push((capacity, csi, o));
            }
            Err(problem) => {
                if problem == POOL_UNREAD {
                    catalog.pending.push(md.key());
                }
                catalog.leave_out_unknown(md, problem);
            }
        }
    }
    catalog.instance_types = by_type
        .into_iter()
        .map(|(name, offerings)| instance_type(name, offerings))
        .collect();
    catalog
}

/// One MachineDeployment as (instance type name, capacity, offering), or why it cannot be one
/// (membership aside: see [`not_selected`]).
pub(crate) fn offering(
    md: &MachineDeployment,
    cx: &Context<'_>,
) -> Result<(String, Resources, Offering), String> {
    let key = md.key();
    if md.is_pool()
        && cx
            .templates
            .get(&key)
            .is_none_or(|t| t.machine_kind.is_none() && !t.provisioned)
    {
        return Err(POOL_UNREAD.to_string());
    }
    // The driver annotations are checked like the rest (`build` reads the CSI limits); the
    // group's own `spec.template.spec.taints` are merged in as Cluster Autoscaler 1.36 does.
    let (sfz, _drivers) =
        autoscaler::parse_scalable(md).map_err(|e| format!("malformed annotation: {e}"))?;
    let shape = template::merge(cx.templates.get(&key), &sfz);
    for needed in ["cpu", "memory"] {
        if shape.capacity.get(needed).is_zero() {
            return Err(format!(
                "no {needed} capacity: set the {CAPACITY_ANNOTATION_PREFIX}{needed} annotation or publish status.capacity on the infrastructure template"
            ));
        }
    }
    // Labels the node will carry: propagated template labels, then the labels annotation.
    let mut labels: BTreeMap<String, String> = md
        .template_labels
        .iter()
        .filter(|(k, _)| capi_propagates(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.extend(shape.labels.clone());
    let name = labels
        .get(INSTANCE_TYPE_LABEL)
        .cloned()
        .unwrap_or_else(|| md.name.clone());
    labels.insert(INSTANCE_TYPE_LABEL.to_string(), name.clone());
    let capacity_type = labels
        .get(CAPACITY_TYPE_LABEL)
        .cloned()
        .unwrap_or_else(|| CAPACITY_TYPE_ON_DEMAND.to_string());
    labels.insert(CAPACITY_TYPE_LABEL.to_string(), capacity_type.clone());
    let replicas = md.spec_replicas.unwrap_or(0);
    // A handed-back instance is taken again without a replica raise (see the Scaler's
    // `instances`), so a pool at max-size that has one still offers it. Claims not in the
    // replicas yet are counted in where the catalog is read (`capi::room`).
    let owned = room::Owned::of(md);
    let below_max = room::has_room(replicas, sfz.max_size, owned.handed_back, 0);
    let o = Offering {
        machine_deployment: key.clone(),
        zone: labels.get(ZONE_LABEL).cloned(),
        capacity_type,
        price: sfz.price.unwrap_or(0.0),
        // Paused (Cluster API's pause): no replica is written, so nothing launches there.
        available: below_max && !(cx.unavailable)(&key) && !autoscaler::paused(md),
        labels,
        taints: shape.taints.iter().map(|t| t.to_k8s()).collect(),
        replicas,
        max_size: sfz.max_size,
    };
    Ok((name, shape.capacity, o))
}

/// CSI attach limits by driver (the csi-driver annotation).
type CsiLimits = BTreeMap<String, usize>;

/// Merge the offerings of one instance type. Capacity is the smallest each resource is offered
/// with, and so is each CSI attach limit, so a pod that fits the type fits every offering of it.
fn instance_type(name: String, offerings: Vec<(Resources, CsiLimits, Offering)>) -> InstanceType {
    let mut capacity: Option<Resources> = None;
    let mut csi_limits = CsiLimits::new();
    for (c, csi, _) in &offerings {
        capacity = Some(match capacity {
            None => c.clone(),
            Some(acc) => min_each(&acc, c),
        });
        for (driver, limit) in csi {
            let l = csi_limits.entry(driver.clone()).or_insert(*limit);
            *l = (*l).min(*limit);
        }
    }
    let offerings: Vec<Offering> = offerings.into_iter().map(|(_, _, o)| o).collect();
    InstanceType {
        requirements: type_requirements(&offerings),
        name,
        capacity: capacity.unwrap_or_default(),
        overhead: Resources::default(),
        offerings,
        csi_limits,
    }
}

fn min_each(a: &Resources, b: &Resources) -> Resources {
    let keys: BTreeSet<&str> = a
        .iter()
        .map(|(k, _)| k)
        .chain(b.iter().map(|(k, _)| k))
        .collect();
    let mut out = Resources::default();
    for k in keys {
        out.set(k, a.get(k).min(b.get(k)));
    }
    out
}

/// Labels every offering shares become `In [v]`; zone and capacity type list every value.
fn type_requirements(offerings: &[Offering]) -> Requirements {
    let mut shared: Option<BTreeMap<String, String>> = None;
    for o in offerings {
        shared = Some(match shared {
            None => o.labels.clone(),
            Some(acc) => acc
                .into_iter()
                .filter(|(k, v)| o.labels.get(k) == Some(v))
                .collect(),
        });
    }
    let mut shared = shared.unwrap_or_default();
    shared.remove(ZONE_LABEL);
    shared.remove(CAPACITY_TYPE_LABEL);
    let mut reqs = Requirements::from_labels(&shared);
    for (key, values) in [
        (
            ZONE_LABEL,
            offerings
                .iter()
                .filter_map(|o| o.zone.clone())
                .collect::<BTreeSet<_>>(),
        ),
        (
            CAPACITY_TYPE_LABEL,
            offerings
                .iter()
                .map(|o| o.capacity_type.clone())
                .collect::<BTreeSet<_>>(),
        ),
    ] {
        // No offering in any zone: its nodes carry no zone label, so a pod that requires a
        // zone must not be planned onto it (a claim's single-valued zone requirement would
        // otherwise become a label the node was never in).
        if values.is_empty() && key == ZONE_LABEL {
            reqs.add(Requirement::does_not_exist(ZONE_LABEL));
            continue;
        }
        if values.is_empty() {
            continue;
        }
        let values: Vec<String> = values.into_iter().collect();
        if let Ok(r) = Requirement::new(key, Operator::In, &values) {
            reqs.add(r);
        }
    }
    reqs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::version::CapiVersion;
    use serde_json::json;

    fn md(name: &str, annotations: serde_json::Value, member: bool) -> Arc<MachineDeployment> {
        let mut labels = json!({});
        if member {
            labels = json!({ MEMBER_LABEL: "" });
        }
        let v = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "MachineDeployment",
            "metadata": {"name": name, "namespace": "default", "uid": name, "resourceVersion": "1",
                          "labels": labels, "annotations": annotations},
            "spec": {"clusterName": "c", "replicas": 0,
                     "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": name}},
                     "template": {"metadata": {"labels": {"node.cluster.x-k8s.io": "workload-target"}},
                                  "spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "x"},
                                           "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DevMachineTemplate", "name": name}}}}
        });
        Arc::new(MachineDeployment::from_value(&v, CapiVersion::V1Beta1).unwrap())
    }

    fn sized(cpu: &str, mem: &str, labels: &str, price: &str) -> serde_json::Value {
        json!({
            CPU_ANNOTATION: cpu, MEMORY_ANNOTATION: mem, LABELS_ANNOTATION: labels,
            PRICE_ANNOTATION: price, MAX_SIZE_ANNOTATION: "10",
        })
    }

    fn build_all(mds: &[Arc<MachineDeployment>]) -> Catalog {
        let templates = HashMap::new();
        let never = |_: &str| false;
        build(
            None,
            mds,
            &Context {
                templates: &templates,
                unavailable: &never,
            },
        )
    }

    /// A member MachinePool `mp` sized like `sized`.
    fn pool() -> Arc<MachineDeployment> {
        let v = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "mp", "namespace": "default", "uid": "mp", "resourceVersion": "1",
                         "labels": {MEMBER_LABEL: ""}, "annotations": sized("2", "4Gi", "", "0.1")},
            "spec": {"clusterName": "c", "replicas": 0,
                     "template": {"spec": {"infrastructureRef": {
                         "apiGroup": "infrastructure.cluster.x-k8s.io",
                         "kind": "DevMachinePool", "name": "mp"}}}},
        });
        Arc::new(MachineDeployment::from_pool_value(&v, CapiVersion::V1Beta2).unwrap())
    }

    #[test]
    fn a_pool_is_offered_once_its_infrastructure_pool_says_which_kind_it_is() {
        let mp = pool();
        let never = |_: &str| false;
        let with = |t: Option<TemplateCapacity>| {
            let templates: HashMap<String, TemplateCapacity> =
                t.into_iter().map(|t| (mp.key(), t)).collect();
            let cx = Context {
                templates: &templates,
                unavailable: &never,
            };
            build(None, std::slice::from_ref(&mp), &cx)
        };
        // Unread, or read before it is provisioned: held, not offered.
        for t in [None, Some(TemplateCapacity::default())] {
            let c = with(t);
            assert!(c.deployments.is_empty());
            assert_eq!(c.pending, vec![mp.key()]);
        }
        // MachinePool Machines: offered in full.
        let c = with(Some(TemplateCapacity {
            machine_kind: Some("DevMachine".into()),
            ..TemplateCapacity::default()
        }));
        assert_eq!(c.deployments, vec![mp.key()]);
        assert!(c.scale_up_only.is_empty() && c.pending.is_empty());
        // Provisioned without a machine kind: offered for scale-up only.
        let c = with(Some(TemplateCapacity {
            provisioned: true,
            ..TemplateCapacity::default()
        }));
        assert_eq!(c.deployments, vec![mp.key()]);
        assert_eq!(c.scale_up_only, vec![mp.key()]);
    }

    #[test]
    fn shared_instance_type_label_makes_one_type_with_two_offerings() {
        let mds = [
            md(
                "a",
                sized(
                    "2",
                    "4Gi",
                    "node.kubernetes.io/instance-type=m,topology.kubernetes.io/zone=z1",
                    "0.5",
                ),
                true,
            ),
            md(
                "b",
                sized(
                    "2",
                    "4Gi",
                    "node.kubernetes.io/instance-type=m,topology.kubernetes.io/zone=z2",
                    "0.4",
                ),
                true,
            ),
            md("c", sized("8", "32Gi", "", "2"), true),
        ];
        let cat = build_all(&mds);
        assert!(cat.problems.is_empty(), "{:?}", cat.problems);
        let names: Vec<_> = cat.instance_types.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, vec!["c", "m"]);
        let m = &cat.instance_types[1];
        assert_eq!(m.offerings.len(), 2);
        let zones = m.requirements.values(ZONE_LABEL).unwrap();
        assert_eq!(
            zones.iter().cloned().collect::<Vec<_>>(),
            vec!["z1".to_string(), "z2".to_string()]
        );
        assert_eq!(
            m.offerings[0]
                .labels
                .get(CAPACITY_TYPE_LABEL)
                .map(String::as_str),
            Some("on-demand")
        );
        assert_eq!(
            m.offerings[0]
                .labels
                .get("node.cluster.x-k8s.io")
                .map(String::as_str),
            Some("workload-target")
        );
        assert_eq!(
            m.cheapest(&Requirements::default())
                .map(|o| o.machine_deployment.as_str()),
            Some("default/b")
        );
    }

    #[test]
    fn malformed_annotation_is_reported_and_others_survive() {
        let mds = [
            md("bad", sized("two", "4Gi", "", "1"), true),
            md("good", sized("2", "4Gi", "", "1"), true),
        ];
        let cat = build_all(&mds);
        assert_eq!(cat.instance_types.len(), 1);
        assert_eq!(cat.problems.len(), 1);
        assert!(
            cat.problems[0].contains("default/bad") && cat.problems[0].contains(CPU_ANNOTATION),
            "{}",
            cat.problems[0]
        );
    }

    #[test]
    fn non_members_and_missing_capacity_are_left_out() {
        let mds = [
            md("other", sized("2", "4Gi", "", "1"), false),
            md("empty", json!({}), true),
        ];
        let cat = build_all(&mds);
        assert!(cat.instance_types.is_empty());
        assert_eq!(cat.problems.len(), 1, "{:?}", cat.problems);
        assert!(cat.problems[0].contains("no cpu capacity"));
    }

    #[test]
    fn max_size_and_marks_make_offerings_unavailable() {
        let full = md(
            "full",
            json!({CPU_ANNOTATION: "2", MEMORY_ANNOTATION: "4Gi", MAX_SIZE_ANNOTATION: "0"}),
            true,
        );
        let marked = md("marked", sized("2", "4Gi", "", "1"), true);
        let templates = HashMap::new();
        let unavailable = |k: &str| k == "default/marked";
        let cat = build(
            None,
            &[full, marked],
            &Context {
                templates: &templates,
                unavailable: &unavailable,
            },
        );
        assert!(
            cat.instance_types
                .iter()
                .all(|t| t.offerings.iter().all(|o| !o.available))
        );
    }

    #[test]
    fn max_pods_and_the_pause_as_the_autoscaler_reads_them() {
        let shaped = |extra: serde_json::Value| {
            let mut a = json!({CPU_ANNOTATION: "2", MEMORY_ANNOTATION: "4Gi"});
            crate::testing::merge(&mut a, extra);
            build_all(&[md("m", a, true)])
        };
        let pods = |extra| shaped(extra).instance_types[0].capacity.get(RESOURCE_PODS);
        assert_eq!(
            pods(json!({})),
            crate::api::resources::Quantity::from_units(110)
        );
        assert_eq!(
            pods(json!({MAX_PODS_ANNOTATION: "7"})),
            crate::api::resources::Quantity::from_units(7)
        );
        // 0 is unset to the autoscaler, so the default stands.
        assert_eq!(
            pods(json!({MAX_PODS_ANNOTATION: "0"})),
            crate::api::resources::Quantity::from_units(110)
        );
        let paused = shaped(json!({crate::capi::autoscaler::PAUSED_ANNOTATION: "true"}));
        assert!(
            paused.instance_types[0]
                .offerings
                .iter()
                .all(|o| !o.available)
        );
        let csi = shaped(
            json!({crate::capi::autoscaler::CSI_DRIVER_ANNOTATION: "ebs.csi.aws.com=25,efs.csi.aws.com=0"}),
        );
        assert_eq!(
            csi.instance_types[0].csi_limits,
            BTreeMap::from([("ebs.csi.aws.com".to_string(), 25)])
        );
        // A malformed entry is passed over, as Cluster Autoscaler passes it over: the group is
        // offered without that limit, and the entry is reported naming the annotation.
        let bad = shaped(json!({
            crate::capi::autoscaler::CSI_DRIVER_ANNOTATION: "ebs.csi.aws.com=x,efs.csi.aws.com=3"
        }));
        assert!(bad.problems.is_empty(), "{:?}", bad.problems);
        assert_eq!(bad.deployments, ["default/m"]);
        assert_eq!(bad.instance_types.len(), 1);
        assert_eq!(
            bad.instance_types[0].csi_limits,
            BTreeMap::from([("efs.csi.aws.com".to_string(), 3)])
        );
        assert_eq!(bad.skipped.len(), 1, "{:?}", bad.skipped);
        assert!(
            bad.skipped[0].contains("default/m")
                && bad.skipped[0].contains(&format!(
                    "annotation {}: \"ebs.csi.aws.com=x\" ignored: ",
                    crate::capi::autoscaler::CSI_DRIVER_ANNOTATION
                )),
            "{:?}",
            bad.skipped
        );
        // A well-formed group reports nothing ignored.
        assert!(csi.skipped.is_empty(), "{:?}", csi.skipped);
    }

    /// A type none of whose offerings is in a zone has nodes without a zone label, so its
    /// requirements say so (`DoesNotExist`) and a pod that requires a zone is never planned onto
    /// it; a type offered in zones lists them (`In`).
    #[test]
    fn zone_less_offerings_require_the_zone_label_absent() {
        let cat = build_all(&[
            md(
                "zoned",
                sized(
                    "2",
                    "4Gi",
                    "node.kubernetes.io/instance-type=zoned,topology.kubernetes.io/zone=z1",
                    "1",
                ),
                true,
            ),
            md(
                "zoned-2",
                sized(
                    "2",
                    "4Gi",
                    "node.kubernetes.io/instance-type=zoned,topology.kubernetes.io/zone=z2",
                    "1",
                ),
                true,
            ),
            md("zoneless", sized("2", "4Gi", "", "1"), true),
        ]);
        assert!(cat.problems.is_empty(), "{:?}", cat.problems);
        let of = |name: &str| {
            cat.instance_types
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("no type {name}"))
        };
        let zoneless = of("zoneless")
            .requirements
            .get(ZONE_LABEL)
            .expect("a zone requirement");
        assert_eq!(zoneless.operator(), Operator::DoesNotExist);
        assert!(zoneless.allows_absent() && !zoneless.has("z1"));
        let zoned = of("zoned")
            .requirements
            .get(ZONE_LABEL)
            .expect("a zone requirement");
        assert_eq!(zoned.operator(), Operator::In);
        assert_eq!(
            zoned
                .finite_values()
                .map(|v| v.iter().cloned().collect::<Vec<_>>()),
            Some(vec!["z1".to_string(), "z2".to_string()])
        );
        assert!(!zoned.allows_absent());
        // A pod requiring a zone is compatible with the zoned type only.
        let wants_z1 = Requirements::from_labels(&BTreeMap::from([(
            ZONE_LABEL.to_string(),
            "z1".to_string(),
        )]));
        assert!(of("zoneless").requirements.compatible(&wants_z1).is_err());
        assert!(of("zoned").requirements.compatible(&wants_z1).is_ok());
    }
}
