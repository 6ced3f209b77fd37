//! How many entries an actor keeps per API object, by map: every map keyed by a claim, pod,
//! template or MachineDeployment must shrink back when its objects go (tests ask this).

use std::collections::BTreeMap;

/// Ask an actor for the sizes of its per-object maps.
#[derive(actix::Message)]
#[rtype(result = "BTreeMap<&'static str, usize>")]
pub struct Tracked;
