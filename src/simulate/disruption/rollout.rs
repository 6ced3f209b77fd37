//! The drift scenario's second phase: a Cluster API rollout of the node group (MachineDeployment
//! or MachinePool) with the most Machines, waited out until every Machine is up to date and the
//! cluster is stable.
//!
//! A MachineDeployment gets a new infrastructure template; Cluster API's MachineSets replace its
//! Machines and the controller's claims follow. A MachinePool gets a new Kubernetes version: its
//! provider makes instances of it and deletes the outdated Machines (every pool Machine says
//! `UpToDate=True` throughout, so "up to date" is read from the Machine's `spec.version`), and the
//! controller drifts the claims bound under the old pool template and replaces them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use crate::api::wellknown::DEPLOYMENT_NAME_LABEL;
use crate::api::wellknown::{MACHINE_POOL_KIND, POOL_NAME_LABEL};
use crate::simulate::launch::{self};
use crate::simulate::{BackgroundSim, Error};

use super::readings::*;
use super::report::*;
use super::{live_or_deleting, wait_stable};

/// The version the rolled-out MachinePool moves to.
const POOL_ROLLOUT_VERSION: &str = "v1.33.1";

/// The node group rolled out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    Deployment(String),
    Pool(String),
}

impl Group {
    fn of(m: &Value) -> Option<Group> {
        let labels = &m["metadata"]["labels"];
        if let Some(md) = labels[DEPLOYMENT_NAME_LABEL].as_str() {
            return Some(Group::Deployment(md.to_string()));
        }
        labels[POOL_NAME_LABEL]
            .as_str()
            .map(|mp| Group::Pool(mp.to_string()))
    }

    /// The key a claim records for it (the scalable reference's).
    fn claim_key(&self) -> String {
        match self {
            Group::Deployment(md) => format!("{}/{md}", launch::NAMESPACE),
            Group::Pool(mp) => format!("{MACHINE_POOL_KIND}/{}/{mp}", launch::NAMESPACE),
        }
    }

    /// How the report names it: a MachineDeployment by name, a MachinePool as `MachinePool/name`.
    fn report_name(&self) -> String {
        match self {
            Group::Deployment(md) => md.clone(),
            Group::Pool(mp) => format!("{MACHINE_POOL_KIND}/{mp}"),
        }
    }
}

/// Roll out the node group with the most Machines, wait until its Machines are all up to date
/// and the claims that were on it are gone, and the cluster is stable.
pub(super) async fn roll_out(
    sim: &BackgroundSim,
    deadline: Duration,
) -> Result<RolloutFigures, Error> {
    let store = sim.cluster().store();
    let machines = store.list("machines", None);
    let mut per_group: BTreeMap<Group, usize> = BTreeMap::new();
    for m in machines.iter().filter(|m| !deleting(m)) {
        if let Some(g) = Group::of(m) {
            *per_group.entry(g).or_default() += 1;
        }
    }
    let Some((group, _)) = per_group
        .iter()
        .max_by_key(|(g, n)| (**n, std::cmp::Reverse(*g)))
    else {
        return Ok(RolloutFigures::default());
    };
    let group = group.clone();
    let claim_key = group.claim_key();
    let claims_on_group: BTreeSet<String> = store
        .list("nodeclaims", None)
        .iter()
        .filter(|c| !deleting(c))
        .filter(|c| {
            c["metadata"]["annotations"][crate::api::wellknown::MACHINE_DEPLOYMENT_ANNOTATION]
                .as_str()
                == Some(claim_key.as_str())
        })
        .map(name_of)
        .collect();
    let how = match &group {
        Group::Deployment(_) => "new infrastructure template".to_string(),
        Group::Pool(_) => format!("Kubernetes {POOL_ROLLOUT_VERSION}"),
    };
    say!(
        "rolling out {} ({} claims on it): {how}",
        group.report_name(),
        claims_on_group.len()
    );
    start_rollout(sim, group.clone()).await?;
    sim.mark("rollout started");
    let originals = claims_on_group.clone();
    let target = group.clone();
    wait_stable(
        sim,
        "rollout",
        deadline,
        Duration::from_secs(3),
        move |sim| {
            let (live, fresh) = up_to_date(sim, &target);
            if fresh < live {
                return Some(format!(
                    "{fresh} of {live} Machines of {} up to date",
                    target.report_name()
                ));
            }
            let left = live_or_deleting(sim, &originals);
            (left > 0).then(|| format!("{left} claims on old Machines left"))
        },
    )
    .await?;
    let (live, fresh) = up_to_date(sim, &group);
    let left = live_or_deleting(sim, &claims_on_group);
    Ok(RolloutFigures {
        machine_deployment: group.report_name(),
        claims_before: claims_on_group.len(),
        claims_replaced: claims_on_group.len() - left,
        machines: live,
        machines_up_to_date: fresh,
        ..Default::default()
    })
}

/// Starts the rollout as a user would: a MachineDeployment gets a new infrastructure template
/// (created first; Cluster API clones it into each new Machine), a MachinePool a new Kubernetes
/// version (an upgrade).
async fn start_rollout(sim: &BackgroundSim, group: Group) -> Result<(), Error> {
    sim.run(move |c| async move {
        let (resource, name, patch) = match &group {
            Group::Deployment(name) => {
                let template = format!("{name}-v2");
                let templates: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
                    c.client(),
                    launch::NAMESPACE,
                    &crate::sim::cluster::infra_template_resource(),
                );
                let body =
                    crate::sim::cluster::infrastructure_template(launch::NAMESPACE, &template);
                match templates.create(&Default::default(), &body).await {
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(source) => {
                        return Err(Error::Kube {
                            what: format!("creating infrastructure template {template}"),
                            source,
                        });
                    }
                    Ok(_) => {}
                }
                (
                    c.capi_version().machine_deployment(),
                    name,
                    json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": template}}}}}),
                )
            }
            Group::Pool(name) => (
                c.capi_version().machine_pool(),
                name,
                json!({"spec": {"template": {"spec": {"version": POOL_ROLLOUT_VERSION}}}}),
            ),
        };
        let api: kube::Api<kube::core::DynamicObject> =
            kube::Api::namespaced_with(c.client(), launch::NAMESPACE, &resource);
        crate::sim::standin::merge_patch(&api, name, &patch)
            .await
            .map_err(|source| Error::Kube {
                what: format!("rolling out {}", group.report_name()),
                source,
            })
    })
    .await?
}

/// Live Machines of `group` and how many are up to date: a MachineDeployment's carry
/// `UpToDate=True` (v1beta2 conditions, or v1beta1's `status.v1beta2.conditions`), a
/// MachinePool's run the new version.
fn up_to_date(sim: &BackgroundSim, group: &Group) -> (usize, usize) {
    let store = sim.cluster().store();
    let live: Vec<Value> = store
        .list("machines", None)
        .into_iter()
        .filter(|m| !deleting(m) && Group::of(m).as_ref() == Some(group))
        .collect();
    let fresh = live
        .iter()
        .filter(|m| {
            if let Group::Pool(_) = group {
                return m.pointer("/spec/version").and_then(Value::as_str)
                    == Some(POOL_ROLLOUT_VERSION);
            }
            // A v1beta1 Machine has both lists: its v1beta1 conditions (no `UpToDate`) and
            // the v1beta2 ones beside them.
            ["/status/conditions", "/status/v1beta2/conditions"]
                .iter()
                .filter_map(|at| m.pointer(at).and_then(Value::as_array))
                .flatten()
                .any(|c| c["type"] == "UpToDate" && c["status"] == "True")
        })
        .count();
    (live.len(), fresh)
}
