//! What each NodePool uses: the claims that count against its limits.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::api::resources::Resources;
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::state::State;

/// Per NodePool: the summed capacity of its live claims and how many there are.
pub fn usage_by_pool(state: &State) -> BTreeMap<String, (Resources, i64)> {
    let mut out: BTreeMap<String, (Resources, i64)> = BTreeMap::new();
    for c in state.claims.read().all() {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(pool) = c.labels().get(NODEPOOL_LABEL) else {
            continue;
        };
        let entry = out.entry(pool.clone()).or_default();
        entry.1 += 1;
        let capacity = c
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .or_else(|| c.spec.resources.as_ref().and_then(|r| r.requests.as_ref()));
        if let Some(Ok(r)) = capacity.map(Resources::from_k8s) {
            entry.0.add_assign(&r);
        }
    }
    out
}
