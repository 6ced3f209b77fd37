//! Termination: draining a node the way Karpenter does before its Machine is released
//! (DESIGN.md section 3, `NodeClaimActor --Drain(node)--> Terminator`). The decisions are pure
//! (`drain::plan`); the actor carries them out.

pub mod drain;
