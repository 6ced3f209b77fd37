//! The NodeClaim watch's side of the index. Claims are decoded one by one (`Lenient`): one the
//! types cannot read must not stop the watch, and must not look deleted either.

use std::sync::Arc;

use kube::ResourceExt;

use super::Claims;
use crate::api::decode::{Lenient, Malformed};
use crate::api::nodeclaim::NodeClaim;
use crate::state::feed::Index;

/// A claim change, as the Supervisor hears of it.
#[derive(Debug)]
pub enum ClaimChange {
    /// A claim was added or changed: `old` is what the index held before (or still holds, when
    /// a write response of ours is ahead of the event).
    Applied {
        old: Option<Arc<NodeClaim>>,
        new: Arc<NodeClaim>,
    },
    /// A claim's new version does not decode. Its last good version stays in the index (its
    /// actor keeps its Machine; dropping it would look like the claim was deleted and release
    /// capacity a workload may be using).
    Malformed(Box<Malformed>),
    /// A claim left the API: the deleted object, or, when it does not decode, the last good
    /// version the index held (if any).
    Deleted {
        name: String,
        last: Option<Arc<NodeClaim>>,
    },
    /// A re-list was swapped in: the claims it left out (gone meanwhile), and those listed that
    /// do not decode (their last good versions kept).
    Relisted {
        gone: Vec<Arc<NodeClaim>>,
        malformed: Vec<Malformed>,
    },
}

impl Index<Lenient<NodeClaim>> for Claims {
    type Kept = Lenient<NodeClaim>;
    type Listing = Vec<Lenient<NodeClaim>>;
    type Changed = ClaimChange;

    fn keep(obj: Lenient<NodeClaim>) -> Self::Kept {
        obj
    }

    fn apply(&mut self, obj: Self::Kept) -> ClaimChange {
        match obj {
            Lenient::Ok(c) => {
                let new = Arc::new(c);
                let old = Claims::apply(self, new.clone());
                ClaimChange::Applied { old, new }
            }
            Lenient::Bad(m) => ClaimChange::Malformed(m),
        }
    }

    fn delete(&mut self, obj: Self::Kept) -> ClaimChange {
        let name = match &obj {
            Lenient::Ok(c) => c.name_any(),
            Lenient::Bad(m) => m.metadata.name.clone().unwrap_or_default(),
        };
        let last = self.remove(&name);
        // The deleted object itself may not decode; its last good version says which Scaler
        // held a request for it.
        let last = match obj {
            Lenient::Ok(c) => Some(Arc::new(c)),
            Lenient::Bad(_) => last,
        };
        ClaimChange::Deleted { name, last }
    }

    fn reset(&mut self, all: Self::Listing) -> ClaimChange {
        let mut fresh = Vec::with_capacity(all.len());
        let mut malformed = Vec::new();
        for obj in all {
            match obj {
                Lenient::Ok(c) => fresh.push(c),
                Lenient::Bad(m) => malformed.push(*m),
            }
        }
        // A claim that exists but no longer decodes is not gone: keep its last good version so
        // its actor and its Machine stay.
        fresh.extend(malformed.iter().filter_map(|m| {
            m.metadata
                .name
                .as_deref()
                .and_then(|n| self.get(n))
                .map(|c| (*c).clone())
        }));
        let gone = self.replace_all(fresh);
        ClaimChange::Relisted { gone, malformed }
    }

    fn synced(&self) -> bool {
        Claims::synced(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> NodeClaim {
        let v = serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"nodeClassRef": {"group": "g", "kind": "k", "name": "nc"},
                     "requirements": []}
        });
        serde_json::from_value(v).expect("a NodeClaim")
    }

    fn bad(name: &str) -> Lenient<NodeClaim> {
        let mut m = Malformed {
            metadata: Default::default(),
            path: "spec".into(),
            error: "broken".into(),
            conditions: None,
        };
        m.metadata.name = Some(name.into());
        Lenient::Bad(Box::new(m))
    }

    /// A claim that no longer decodes keeps its last good version through a re-list and a
    /// change; one the re-list leaves out is gone.
    #[test]
    fn a_relist_keeps_the_last_good_version_of_an_unreadable_claim() {
        let mut idx = Claims::default();
        for n in ["a", "b", "c"] {
            Index::apply(&mut idx, Lenient::Ok(claim(n)));
        }
        let ClaimChange::Relisted { gone, malformed } =
            Index::reset(&mut idx, vec![Lenient::Ok(claim("a")), bad("b")])
        else {
            panic!("a re-list says so");
        };
        assert_eq!(gone.iter().map(|c| c.name_any()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(malformed.len(), 1);
        assert!(idx.contains("b"), "b's last good version stays");
        assert!(matches!(
            Index::apply(&mut idx, bad("a")),
            ClaimChange::Malformed(_)
        ));
        assert!(idx.contains("a"));
        let ClaimChange::Deleted { name, last } = Index::delete(&mut idx, bad("b")) else {
            panic!("a delete says so");
        };
        assert_eq!(name, "b");
        assert!(
            last.is_some(),
            "the last good version says which Scaler held it"
        );
        assert!(!idx.contains("b"));
    }
}
