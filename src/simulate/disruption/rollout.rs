//! The drift scenario's second phase: a Cluster API rollout of the MachineDeployment with the
//! most Machines, waited out until every Machine is up to date and the cluster is stable.

use super::*;

/// Roll out the MachineDeployment with the most Machines (a new infrastructure template name),
/// wait until its Machines are all up to date and the cluster is stable.
pub(super) async fn roll_out(
    sim: &BackgroundSim,
    deadline: Duration,
) -> Result<RolloutFigures, Error> {
    let store = sim.cluster().store();
    let machines = store.list("machines", None);
    let mut per_md: BTreeMap<String, usize> = BTreeMap::new();
    for m in machines.iter().filter(|m| !deleting(m)) {
        if let Some(md) = m["metadata"]["labels"][DEPLOYMENT_NAME_LABEL].as_str() {
            *per_md.entry(md.to_string()).or_default() += 1;
        }
    }
    let Some((md, _)) = per_md
        .iter()
        .max_by_key(|(name, n)| (**n, std::cmp::Reverse(*name)))
    else {
        return Ok(RolloutFigures::default());
    };
    let md = md.clone();
    let claims_on_md: BTreeSet<String> = store
        .list("nodeclaims", None)
        .iter()
        .filter(|c| !deleting(c))
        .filter(|c| {
            c["metadata"]["annotations"][crate::api::wellknown::MACHINE_DEPLOYMENT_ANNOTATION]
                .as_str()
                .is_some_and(|v| v.rsplit('/').next() == Some(md.as_str()))
        })
        .map(name_of)
        .collect();
    eprintln!(
        "rolling out MachineDeployment {md} ({} claims on it): new infrastructure template",
        claims_on_md.len()
    );
    let name = md.clone();
    sim.run(move |c| async move {
        let api: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
            c.client(),
            launch::NAMESPACE,
            &c.capi_version().machine_deployment(),
        );
        // The new template first, as a user would: Cluster API clones it into each Machine.
        let template = format!("{name}-v2");
        let templates: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
            c.client(),
            launch::NAMESPACE,
            &crate::sim::cluster::infra_template_resource(),
        );
        let body = crate::sim::cluster::infrastructure_template(launch::NAMESPACE, &template);
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
        let patch =
            json!({"spec": {"template": {"spec": {"infrastructureRef": {"name": template}}}}});
        crate::sim::standin::merge_patch(&api, &name, &patch)
            .await
            .map_err(|source| Error::Kube {
                what: format!("rolling out MachineDeployment {name}"),
                source,
            })
    })
    .await??;
    sim.mark("rollout started");
    let originals = claims_on_md.clone();
    let target = md.clone();
    wait_stable(
        sim,
        "rollout",
        deadline,
        Duration::from_secs(3),
        move |sim| {
            let (live, fresh) = up_to_date(sim, &target);
            if fresh < live {
                return Some(format!("{fresh} of {live} Machines of {target} up to date"));
            }
            let left = live_or_deleting(sim, &originals);
            (left > 0).then(|| format!("{left} claims on old Machines left"))
        },
    )
    .await?;
    let (live, fresh) = up_to_date(sim, &md);
    let left = live_or_deleting(sim, &claims_on_md);
    Ok(RolloutFigures {
        machine_deployment: md,
        claims_before: claims_on_md.len(),
        claims_replaced: claims_on_md.len() - left,
        machines: live,
        machines_up_to_date: fresh,
        ..Default::default()
    })
}

/// Live Machines of `md` and how many carry `UpToDate=True` (v1beta2 conditions, or v1beta1's
/// `status.v1beta2.conditions`).
fn up_to_date(sim: &BackgroundSim, md: &str) -> (usize, usize) {
    let store = sim.cluster().store();
    let live: Vec<Value> = store
        .list("machines", None)
        .into_iter()
        .filter(|m| !deleting(m) && m["metadata"]["labels"][DEPLOYMENT_NAME_LABEL] == md)
        .collect();
    let fresh = live
        .iter()
        .filter(|m| {
            let conds = m
                .pointer("/status/conditions")
                .or_else(|| m.pointer("/status/v1beta2/conditions"));
            conds.and_then(Value::as_array).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "UpToDate" && c["status"] == "True")
            })
        })
        .count();
    (live.len(), fresh)
}
