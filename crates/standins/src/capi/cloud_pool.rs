//! The cloud behind an infrastructure machine pool (a MachinePool's infrastructure side, a
//! scaling group): what the pool reports to Cluster API, and, for a pool without MachinePool
//! Machines, its own instance list (`status.instances`): new instances get a provider ID after
//! the provider's delay (or never, `fail_fraction`), and scale-in terminates the ones the cloud
//! picks (still launching first, then the oldest).
//!
//! Two simulators run such pools: the Cluster API stand-in (`capi::machine_pool`, which also
//! plays Cluster API's MachinePool controller) and the infrastructure provider beside Cluster
//! API's real manager (`real::pool`). Both take the cloud's rules from here, so a pool behaves
//! the same whichever Cluster API runs; what each does around them (Machines, Nodes, which
//! write errors to ignore, when to look again) stays with it. It lives in `capi` beside the
//! Dev provider's kinds and provider-ID spellings it reports, which both already take from here.

use std::collections::HashMap;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{INFRA_MACHINE_KIND, ProviderIdStyle, provider_id_for};
use crate::standin::{SimRng, at, str_at};

/// One instance of a pool without MachinePool Machines, as the pool's `status.instances` lists it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub instance_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
}

/// The instances a pool without MachinePool Machines reports.
pub fn instances(infra_pool: &DynamicObject) -> Vec<Instance> {
    at(&infra_pool.data, &["status", "instances"])
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// The instances still launching, by (namespace, instance name): when each gets its provider ID
/// (`None`: never, a stuck instance). The simulator running the pools keeps it; it is the only
/// writer of their instance lists, one pass per pool at a time.
pub type Launching = Mutex<HashMap<(String, String), Option<Instant>>>;

/// How the cloud launches an instance.
#[derive(Clone, Copy, Debug)]
pub struct Launches {
    /// Time from launch to provider ID (before jitter).
    pub delay: Duration,
    /// Uniform extra delay in `[0, jitter]`.
    pub jitter: Duration,
    /// Fraction of launches that never finish.
    pub fail_fraction: f64,
    pub provider_id_style: ProviderIdStyle,
}

/// The cloud for one pass over the instances of a pool in `ns`. One instant serves the whole
/// pass, so an instance launched with no delay gets its provider ID in the pass that launched it.
pub struct Cloud<'a> {
    rng: &'a SimRng,
    launching: &'a Launching,
    launches: Launches,
    ns: String,
    now: Instant,
}

impl<'a> Cloud<'a> {
    pub fn new(rng: &'a SimRng, launching: &'a Launching, launches: Launches, ns: &str) -> Self {
        Self {
            rng,
            launching,
            launches,
            ns: ns.to_string(),
            now: Instant::now(),
        }
    }

    /// Scale-in: takes the instances beyond `desired` out of `list` and forgets their launches.
    /// Returns them, for whoever plays the end of their Nodes.
    pub fn scale_in(&self, list: &mut Vec<Instance>, desired: i64) -> Vec<Instance> {
        let surplus = list.len() as i64 - desired;
        if surplus <= 0 {
            return Vec::new();
        }
        // Still launching first, then the oldest (the list is in launch order).
        let mut order: Vec<usize> = (0..list.len()).collect();
        order.sort_by_key(|&i| (list[i].provider_id.is_some(), i));
        let mut victims: Vec<usize> = order.into_iter().take(surplus as usize).collect();
        // From the back, so each index still points at its instance when removed.
        victims.sort_unstable_by(|a, b| b.cmp(a));
        victims
            .into_iter()
            .map(|i| {
                let gone = list.remove(i);
                self.launching.lock().remove(&self.key(&gone.instance_name));
                gone
            })
            .collect()
    }

    /// Scale-out: launches instances named after `pool` until `list` has `desired`. Returns how
    /// long until each new instance that will come up gets its provider ID.
    pub fn launch(&self, list: &mut Vec<Instance>, desired: i64, pool: &str) -> Vec<Duration> {
        let mut due_in = Vec::new();
        for _ in 0..(desired - list.len() as i64).max(0) {
            let instance_name = format!("{pool}-{}", self.rng.suffix());
            let delay = (!self.rng.chance(self.launches.fail_fraction))
                .then(|| self.rng.delay(self.launches.delay, self.launches.jitter));
            due_in.extend(delay);
            self.launching
                .lock()
                .insert(self.key(&instance_name), delay.map(|d| self.now + d));
            list.push(Instance {
                instance_name,
                provider_id: None,
            });
        }
        due_in
    }

    /// Gives each instance of `list` whose launch is due its provider ID (`zone`: where the pool
    /// launches, for the provider IDs that name one).
    pub fn finish_launches(&self, list: &mut [Instance], zone: Option<&str>) {
        for instance in list.iter_mut().filter(|i| i.provider_id.is_none()) {
            let key = self.key(&instance.instance_name);
            let due = self.launching.lock().get(&key).copied();
            // An instance listed before this simulator started is up already (the simulators
            // never restart within a run).
            if due.is_none_or(|at| at.is_some_and(|at| at <= self.now)) {
                instance.provider_id = Some(provider_id_for(
                    self.launches.provider_id_style,
                    self.rng,
                    &instance.instance_name,
                    zone,
                ));
                self.launching.lock().remove(&key);
            }
        }
    }

    /// How soon the next launch among `list`'s instances is due, if one will be.
    pub fn next_due(&self, list: &[Instance]) -> Option<Duration> {
        let launching = self.launching.lock();
        list.iter()
            .filter(|i| i.provider_id.is_none())
            .filter_map(|i| {
                launching
                    .get(&self.key(&i.instance_name))
                    .copied()
                    .flatten()
            })
            .map(|at| at.saturating_duration_since(self.now))
            .min()
    }

    fn key(&self, instance_name: &str) -> (String, String) {
        (self.ns.clone(), instance_name.to_string())
    }
}

/// The zone MachinePool `mp`'s instances launch in: its first failure domain.
pub fn pool_zone(mp: &DynamicObject) -> Option<&str> {
    mp.data
        .pointer("/spec/failureDomains/0")
        .and_then(Value::as_str)
}

/// The provider IDs of the launched instances in `list`, sorted as CAPD sorts its pools'
/// `spec.providerIDList`.
pub fn instance_provider_ids(list: &[Instance]) -> Vec<String> {
    let mut ids: Vec<String> = list.iter().filter_map(|i| i.provider_id.clone()).collect();
    ids.sort();
    ids
}

/// The provider IDs set on `machines` (Machines or infrastructure machines), sorted as
/// [`instance_provider_ids`].
pub fn machine_provider_ids<'o>(
    machines: impl IntoIterator<Item = &'o DynamicObject>,
) -> Vec<String> {
    let mut ids: Vec<String> = machines
        .into_iter()
        .filter_map(|m| str_at(&m.data, &["spec", "providerID"]))
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    ids.sort();
    ids
}

/// An infrastructure pool's contract status: how many instances it has, launched or not; ready
/// and provisioned from the first pass on (the scaling group itself exists); and, `with_machines`,
/// the machine kind that tells Cluster API to surface the instances as Machines.
pub fn infra_pool_status(replicas: i64, with_machines: bool) -> Value {
    let mut status = json!({
        "replicas": replicas,
        "ready": true,
        "initialization": {"provisioned": true},
    });
    if with_machines {
        status["infrastructureMachineKind"] = json!(INFRA_MACHINE_KIND);
    }
    status
}

/// Writes what an infrastructure pool reports to Cluster API: `spec.providerIDList` and the
/// fields of `status`, each only when it differs from what `infra` holds, so a pass woken by the
/// pool's own write converges instead of looping.
pub async fn write_report(
    api: &Api<DynamicObject>,
    infra: &DynamicObject,
    provider_ids: &[String],
    status: Value,
) -> Result<(), kube::Error> {
    let name = infra.name_any();
    if at(&infra.data, &["spec", "providerIDList"]) != Some(&json!(provider_ids)) {
        let patch = json!({"spec": {"providerIDList": provider_ids}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let current = at(&infra.data, &["status"]);
    let changed = status.as_object().is_some_and(|fields| {
        fields
            .iter()
            .any(|(k, v)| current.and_then(|c| c.get(k)) != Some(v))
    });
    if changed {
        let patch = json!({ "status": status });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}
