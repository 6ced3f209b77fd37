//! The running actors of which a controller has one each (the Provisioner, the Catalog, the
//! Terminator, ...), looked up by their type. The Router reaches them and the controller stops
//! them through it, so neither holds a field per actor: an actor is registered as it starts
//! (`Registry::start`; a leader's actor calls it from a `start` in its own file) and handles
//! `Stop` in its own file.

use std::any::{Any, TypeId};

use actix::dev::ToEnvelope;
use actix::{Actor, Addr, Handler, Message, Recipient};
use parking_lot::RwLock;

use super::messages::Stop;

/// One running actor: its `Addr<A>` (type-erased, found again by `TypeId`) and how to stop it.
struct Running {
    actor: TypeId,
    addr: Box<dyn Any + Send + Sync>,
    stop: Recipient<Stop>,
}

/// The running actors, in the order they started.
#[derive(Default)]
pub(crate) struct Registry {
    running: RwLock<Vec<Running>>,
}

impl Registry {
    /// Start `actor` on the current arbiter and register it (replacing a stopped one of its type).
    pub(crate) fn start<A>(&self, actor: A) -> Addr<A>
    where
        A: Actor<Context = actix::Context<A>> + Handler<Stop>,
    {
        let addr = actor.start();
        let entry = Running {
            actor: TypeId::of::<A>(),
            addr: Box::new(addr.clone()),
            stop: addr.clone().recipient(),
        };
        let mut running = self.running.write();
        match running.iter_mut().find(|r| r.actor == entry.actor) {
            Some(slot) => *slot = entry,
            None => running.push(entry),
        }
        addr
    }

    /// The running actor of type `A`, if one runs here.
    pub(crate) fn get<A: Actor>(&self) -> Option<Addr<A>> {
        self.running
            .read()
            .iter()
            .find(|r| r.actor == TypeId::of::<A>())
            .and_then(|r| r.addr.downcast_ref::<Addr<A>>())
            .cloned()
    }

    /// Send `msg` to the actor of type `A`; dropped when none runs here.
    pub(crate) fn send<A, M>(&self, msg: M)
    where
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        let running = self.running.read();
        let addr = running
            .iter()
            .find(|r| r.actor == TypeId::of::<A>())
            .and_then(|r| r.addr.downcast_ref::<Addr<A>>());
        if let Some(addr) = addr {
            addr.do_send(msg);
        }
    }

    /// Stop every registered actor, in the order they started, and forget them.
    pub(crate) fn stop_all(&self) {
        let running = std::mem::take(&mut *self.running.write());
        for r in running {
            r.stop.do_send(Stop);
        }
    }
}

/// The `Stop` handler of an actor that has nothing to do before it stops; invoked in the actor's
/// own file (`stoppable!(Terminator);`).
macro_rules! stoppable {
    ($t:ty) => {
        impl actix::Handler<$crate::actors::messages::Stop> for $t {
            type Result = ();
            fn handle(&mut self, _: $crate::actors::messages::Stop, ctx: &mut Self::Context) {
                use actix::ActorContext;
                ctx.stop();
            }
        }
    };
}
pub(crate) use stoppable;

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter(u32);
    impl Actor for Counter {
        type Context = actix::Context<Self>;
    }
    stoppable!(Counter);

    #[derive(Message)]
    #[rtype(result = "u32")]
    struct Add(u32);
    impl Handler<Add> for Counter {
        type Result = u32;
        fn handle(&mut self, m: Add, _: &mut Self::Context) -> u32 {
            self.0 += m.0;
            self.0
        }
    }

    struct Other;
    impl Actor for Other {
        type Context = actix::Context<Self>;
    }
    stoppable!(Other);

    #[actix::test]
    async fn finds_by_type_and_stops_all() {
        let registry = Registry::default();
        assert!(registry.get::<Counter>().is_none());
        let counter = registry.start(Counter(0));
        registry.start(Other);
        registry.send::<Counter, _>(Add(2));
        let found = registry.get::<Counter>().map(|a| a == counter);
        assert_eq!(found, Some(true));
        assert_eq!(counter.send(Add(1)).await.ok(), Some(3));
        registry.stop_all();
        assert!(registry.get::<Counter>().is_none());
        assert!(registry.get::<Other>().is_none());
        // The Stop reached it: its mailbox closes.
        assert!(counter.send(Add(1)).await.is_err());
    }
}
