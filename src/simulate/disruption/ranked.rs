//! The consolidate scenario with pod deletion cost management on: the scale-down waits for the
//! ranking.

use std::time::{Duration, Instant};

use super::BackgroundSim;
use crate::api::wellknown::MANAGED_DELETION_COST_ANNOTATION;
use crate::simulate::Error;
use crate::simulate::pods::SIM_DELETION_COST_PERIOD;

/// With pod deletion cost management on: waits until the pods carrying a managed deletion cost
/// stop changing in number over more than a ranking period, so the scale-down meets the
/// ranking rather than racing its first writes.
pub(super) async fn wait_ranked(sim: &BackgroundSim, deadline: Duration) -> Result<(), Error> {
    let start = Instant::now();
    let managed = || {
        let mut n = 0;
        sim.cluster().store().visit("pods", |p| {
            n += usize::from(
                p.pointer("/metadata/annotations")
                    .and_then(|a| a.get(MANAGED_DELETION_COST_ANNOTATION))
                    .is_some_and(|v| v == "true"),
            )
        });
        n
    };
    let (mut last, mut since) = (managed(), Instant::now());
    let still = SIM_DELETION_COST_PERIOD * 2;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = managed();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if last > 0 && since.elapsed() >= still {
            say!("pod deletion cost: {last} pods ranked before the scale-down");
            return Ok(());
        }
        if start.elapsed() >= deadline {
            return Err(Error::NotSettled {
                after: deadline,
                why: format!("pod deletion costs still changing ({last} pods ranked)"),
            });
        }
    }
}
