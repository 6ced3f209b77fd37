//! A MachineDeployment that does not exist yet because it is a generated group a claim chose
//! (`capi::generate`): the Scaler asks the Generator to create it, once, and its claims wait
//! for it rather than being turned down; then it is scaled as any other.

use std::time::{Duration, Instant};

use actix::prelude::*;

use super::Scaler;
use crate::actors::generator::Ensure;
use crate::actors::messages::Rejection;

/// After the Generator answered (or while it works), how long the group may take to reach the
/// index before it is asked for again.
const GENERATED_WAIT: Duration = Duration::from_secs(30);

impl Scaler {
    /// True while the group is on its way: the claims asking for it wait.
    pub(super) fn await_generated(&mut self, ctx: &mut Context<Self>) -> bool {
        if self.asked.is_empty() || self.shared.catalog.to_generate(&self.md).is_none() {
            return false;
        }
        if self
            .generating
            .is_some_and(|at| at.elapsed() < GENERATED_WAIT)
        {
            return true;
        }
        let Some(generator) = self.shared.router.generator() else {
            return false;
        };
        self.generating = Some(Instant::now());
        let key = self.md.clone();
        ctx.spawn(generator.send(Ensure { key: key.clone() }).into_actor(self).map(
            move |answer, act, ctx| {
                let answer = answer.unwrap_or_else(|e| Err(e.to_string()));
                match answer {
                    Ok(()) => {
                        act.generating = Some(Instant::now());
                        act.replan(ctx);
                    }
                    Err(why) => {
                        tracing::warn!(machine_deployment = %key, %why, "generated node group not created; its claims choose again");
                        act.generating = None;
                        act.reject_all(Rejection::NotGenerated);
                    }
                }
            },
        ));
        true
    }
}
