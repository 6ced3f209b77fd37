//! An observer inside the simulated cluster: it watches NodeClaims with the cluster's own client
//! and stamps, on the server's clock, when each claim appeared, launched, registered, initialized
//! and went away. The controller reports nothing about itself.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;

use crate::api::conditions;
use crate::api::nodeclaim::NodeClaim;
use crate::sim::Stats;

#[derive(Clone, Debug, Default)]
pub struct ClaimTimes {
    pub created_ms: Option<u64>,
    pub launched_ms: Option<u64>,
    pub registered_ms: Option<u64>,
    pub initialized_ms: Option<u64>,
    /// When the claim's Node was drained (`Drained=True`) during termination.
    pub drained_ms: Option<u64>,
    pub deleted_ms: Option<u64>,
    pub machine_deployment: Option<String>,
    pub machine: Option<String>,
}

#[derive(Clone, Default)]
pub struct Observer {
    claims: Arc<Mutex<HashMap<String, ClaimTimes>>>,
}

impl Observer {
    pub fn snapshot(&self) -> HashMap<String, ClaimTimes> {
        self.claims.lock().clone()
    }

    /// Watch NodeClaims until the runtime stops.
    pub async fn run(self, client: kube::Client, stats: Stats) {
        let api: Api<NodeClaim> = Api::all(client);
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = events.next().await {
            let now = stats.now_ms();
            match ev {
                Ok(watcher::Event::Apply(c)) | Ok(watcher::Event::InitApply(c)) => {
                    self.seen(&c, now)
                }
                Ok(watcher::Event::Delete(c)) => {
                    self.seen(&c, now);
                    self.claims
                        .lock()
                        .entry(c.name_any())
                        .or_default()
                        .deleted_ms
                        .get_or_insert(now);
                }
                _ => {}
            }
        }
    }

    fn seen(&self, c: &NodeClaim, now: u64) {
        let mut all = self.claims.lock();
        let t = all.entry(c.name_any()).or_default();
        t.created_ms.get_or_insert(now);
        let conds = c.conditions();
        for (ty, slot) in [
            (conditions::LAUNCHED, &mut t.launched_ms),
            (conditions::REGISTERED, &mut t.registered_ms),
            (conditions::INITIALIZED, &mut t.initialized_ms),
            (conditions::DRAINED, &mut t.drained_ms),
        ] {
            if conditions::is_true(conds, ty) {
                slot.get_or_insert(now);
            }
        }
        let ann = c.annotations();
        if let Some(md) = ann.get(crate::api::wellknown::MACHINE_DEPLOYMENT_ANNOTATION) {
            t.machine_deployment = Some(md.clone());
        }
        if let Some(m) = ann.get(crate::api::wellknown::MACHINE_ANNOTATION) {
            t.machine = Some(m.clone());
        }
    }
}
