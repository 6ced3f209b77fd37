//! What each NodePool uses: the claims that count against its limits, and what a claim not
//! launched yet counts for (its requests, raised to the largest type it may launch as), which
//! CapacityQuotas count the same way.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::api::nodeclaim::NodeClaim;
use crate::api::requirements::Requirement;
use crate::api::resources::{Quantity, Resources};
use crate::api::wellknown::NODEPOOL_LABEL;
use crate::scheduling;
use crate::state::State;

/// Per NodePool: the summed capacity of its live claims and how many there are.
pub(crate) fn usage_by_pool(state: &State) -> BTreeMap<String, (Resources, i64)> {
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
        if let Some(r) = capacity(c) {
            entry.0.add_assign(&r);
        }
    }
    out
}

/// What a claim counts for in its pool's usage: its capacity once launched, its requests
/// before; None when neither parses.
pub(crate) fn capacity(c: &NodeClaim) -> Option<Resources> {
    let capacity = c
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .or_else(|| c.spec.resources.as_ref().and_then(|r| r.requests.as_ref()))?;
    Resources::from_k8s(capacity).ok()
}

/// What a claim not launched yet may still add to its pool's usage beyond `counted` (its
/// requests): it launches as one of the instance types it allows, so it is counted as the
/// largest of them, key by key, as upstream's scheduler subtracts a new claim's largest instance
/// type from the remaining limits. Otherwise a second solve while the first one's claims are
/// launching could overshoot a pool's limits.
pub(crate) fn launch_headroom(
    allowed: Option<&Requirement>,
    counted: &Resources,
    types: &[scheduling::InstanceType],
) -> Resources {
    let largest = types
        .iter()
        .filter(|t| allowed.is_none_or(|r| r.has(&t.name)))
        .fold(Resources::new(), |acc, t| acc.max_with(&t.capacity));
    let mut extra = Resources::new();
    for (key, value) in largest.sub(counted).iter() {
        if *value > Quantity::ZERO {
            extra = extra.with(key, *value);
        }
    }
    extra
}

/// What a claim asks for (`spec.resources.requests`): what counts for it before it launches.
pub(crate) fn claim_requests(c: &NodeClaim) -> Resources {
    c.spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| Resources::from_k8s(r).ok())
        .unwrap_or_default()
}
