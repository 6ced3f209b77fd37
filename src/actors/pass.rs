//! An actor's work done as one pass over what it watches: asked for by every change, run once
//! after a short delay however many asked (a burst of changes costs one pass), and run again
//! once after a backoff when a write of the pass failed (however many failed). This is the
//! coalescing, not a retry policy: the delays come from [`Backoff`].

use std::time::Duration;

use actix::prelude::*;

use super::backoff::Backoff;

/// When the next pass is due: the bookkeeping a [`Pass`] actor keeps.
pub(crate) struct Coalesced {
    delay: Duration,
    scheduled: bool,
    retry_scheduled: bool,
    /// Retry delay after a failed write; reset by one that succeeds.
    pub(crate) backoff: Backoff,
}

impl Coalesced {
    /// Passes `delay` after the first request, retries with the API backoff.
    pub(crate) fn new(delay: Duration) -> Self {
        Self {
            delay,
            scheduled: false,
            retry_scheduled: false,
            backoff: Backoff::api(),
        }
    }
}

/// An actor whose work is one coalesced pass.
pub(crate) trait Pass: Actor<Context = Context<Self>> {
    fn coalesced(&mut self) -> &mut Coalesced;

    /// The pass itself.
    fn pass(&mut self, ctx: &mut Context<Self>);

    /// Run the pass after the coalescing delay, once for every request made meanwhile.
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        let c = self.coalesced();
        if c.scheduled {
            return;
        }
        c.scheduled = true;
        ctx.run_later(c.delay, |act, ctx| {
            act.coalesced().scheduled = false;
            act.pass(ctx);
        });
    }

    /// A write failed: run the pass again after the backoff, once however many failed.
    fn retry_later(&mut self, ctx: &mut Context<Self>) {
        let c = self.coalesced();
        if c.retry_scheduled {
            return;
        }
        c.retry_scheduled = true;
        let d = c.backoff.next_delay();
        ctx.run_later(d, |act, ctx| {
            act.coalesced().retry_scheduled = false;
            act.pass(ctx);
        });
    }
}
