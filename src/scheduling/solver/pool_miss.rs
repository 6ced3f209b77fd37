//! Why a NodePool could not open a claim for a pod, and the one error the pod gets from every
//! pool's reason.

use super::template::{Pool, unknown_label};
use super::{Ctx, Solver, ports_conflict};
use crate::api::requirements::Requirements;
use crate::scheduling::error::PodError;
use crate::scheduling::selector::untolerated;

/// Why one NodePool could not open a claim for a pod.
pub(super) enum PoolMiss {
    Incompatible(String),
    Limit(String),
    /// A CapacityQuota (its name) has no room on a resource.
    Quota(String, String),
    NoFit(String),
}

impl Solver<'_> {
    /// Why no instance type of the pool takes the pod, in the terms its author can act on: the
    /// requirements, host ports or requests that rule the types out.
    pub(super) fn no_fit_details(
        &self,
        pool: &Pool,
        ctx: &Ctx,
        matching: usize,
        fitting: usize,
    ) -> String {
        if pool.types.is_empty() {
            return "the NodePool has no instance type with an available offering".into();
        }
        if matching == 0 {
            return format!(
                "none of {} instance types matches the requirements {}",
                pool.types.len(),
                describe(ctx.reqs)
            );
        }
        debug_assert_eq!(fitting, 0);
        if !ctx.pod.host_ports.is_empty()
            && pool
                .types
                .iter()
                .all(|t| ports_conflict(&t.daemon_ports, &ctx.pod.host_ports))
        {
            return "its host ports are taken by DaemonSet pods on every instance type".into();
        }
        let requests: Vec<String> = ctx
            .pod
            .requests
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let short: Vec<&str> = (0..self.dims.len())
            .filter(|&d| {
                let want = ctx.prep.amounts.get(d);
                want > 0 && pool.types.iter().all(|t| t.avail.get(d) < want)
            })
            .map(|d| self.dims.name(d))
            .collect();
        if short.is_empty() {
            format!(
                "requests {} (plus DaemonSet overhead) fit no single instance type",
                requests.join(", ")
            )
        } else {
            format!(
                "requests {} (plus DaemonSet overhead) exceed every instance type on {}",
                requests.join(", "),
                short.join(", ")
            )
        }
    }
}

/// Whether the pool may take the pod at all, whatever instance type: the cheap checks, whose
/// reasons are also the plainest to report.
pub(super) fn pool_admits(pool: &Pool, ctx: &Ctx) -> Result<(), PoolMiss> {
    if let Some(why) = &pool.broken {
        return Err(PoolMiss::Incompatible(why.clone()));
    }
    if let Some(t) = untolerated(&ctx.pod.tolerations, pool.taints, ctx.prefer_blocks) {
        return Err(PoolMiss::Incompatible(format!(
            "taint {}={}:{} is not tolerated",
            t.key,
            t.value.as_deref().unwrap_or(""),
            t.effect
        )));
    }
    if let Err(e) = pool.reqs.compatible(ctx.reqs) {
        return Err(PoolMiss::Incompatible(format!(
            "incompatible requirements, {e}"
        )));
    }
    if let Some(key) = unknown_label(pool, ctx.reqs) {
        return Err(PoolMiss::Incompatible(format!(
            "label {key:?} is not provided by the NodePool or its instance types"
        )));
    }
    if pool.nodes_remaining.is_some_and(|n| n < 1) {
        return Err(PoolMiss::Limit("nodes".into()));
    }
    Ok(())
}

fn describe(reqs: &Requirements) -> String {
    let parts: Vec<String> = reqs.iter().map(|r| format!("{} {r}", r.key())).collect();
    format!("[{}]", parts.join(", "))
}

/// One error for the pod from every pool's miss: a limit or a fit problem of the first pool
/// that otherwise matched, else the list of why no pool matched.
pub(super) fn summarise(misses: Vec<(&str, PoolMiss)>) -> PodError {
    if misses.is_empty() {
        return PodError::NoNodePoolMatches {
            details: "there are no NodePools".into(),
        };
    }
    let mut reasons = Vec::new();
    for (pool, miss) in misses {
        match miss {
            PoolMiss::Limit(resource) => {
                return PodError::LimitReached {
                    nodepool: pool.to_string(),
                    resource,
                };
            }
            PoolMiss::Quota(quota, resource) => {
                return PodError::QuotaReached { quota, resource };
            }
            PoolMiss::NoFit(details) => {
                return PodError::NoInstanceTypeFits {
                    nodepool: pool.to_string(),
                    details,
                };
            }
            PoolMiss::Incompatible(why) => reasons.push(format!("NodePool {pool:?}: {why}")),
        }
    }
    PodError::NoNodePoolMatches {
        details: reasons.join("; "),
    }
}
