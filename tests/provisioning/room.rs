//! A MachineDeployment's room under its max-size counts the claims just created for it (issue
//! 40): two plans in quick succession target md-0, one Machine short of its max size, while the
//! Scaler's replica write for the first has not landed. Only the first plan's claim goes there;
//! the second plan finds no room, rather than make a claim the Scaler turns away at max size
//! (which, with nowhere else to go, would be deleted: "no offering can launch this claim").
//! And one plan needing more of md-0 than it has left: the claim beyond the last slot is not
//! created at all; its pod is told why.

use std::time::Duration;

use karpenter_capi::app::USER_AGENT;
use karpenter_capi::sim::cluster::PodShape;
use karpenter_capi::simulate::launch::seed_of;

use crate::common::Env;

const MAX_SIZE: usize = 2;

/// Pods of Deployment `name` the controller told it has no room for.
fn told_no_room(env: &Env, name: &str) -> bool {
    env.events("FailedScheduling").iter().any(|e| {
        e["regarding"]["name"]
            .as_str()
            .is_some_and(|p| p.starts_with(name))
    })
}

#[actix::test]
async fn a_claim_not_in_the_replicas_yet_takes_the_last_slot_of_its_machine_deployment() {
    let env = Env::builder()
        .cluster(super::autoscaler::cluster())
        .seeds(vec![seed_of(0, MAX_SIZE)])
        .short_batches()
        .start()
        .await;
    // One 3-CPU pod per 4-CPU node: each pod needs a node of its own.
    let shape = || PodShape::new("3", "256Mi");
    env.deployment("first", 1, shape()).await;
    env.until("the first pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(env.replicas("md-0"), 1, "one Machine short of max-size");
    // The controller's replica writes hang (an etcd stall): the next claim's replica is not
    // in md-0's spec.replicas while the second plan is made.
    let faults = env.sim.cluster().server().faults();
    faults.set_agent(Some(USER_AGENT));
    faults.set_write_latency("machinedeployments", Duration::from_secs(5));
    env.deployment("second", 1, shape()).await;
    env.until("the second pod's claim created", |e| {
        e.claims_created() == 2
    })
    .await;
    env.deployment("third", 1, shape()).await;
    env.until("the third pod told there is no room", |e| {
        told_no_room(e, "third")
    })
    .await;
    faults.clear();
    env.until("the second pod bound on md-0's last Machine", |e| {
        e.bound_pods() == 2 && e.replicas("md-0") == MAX_SIZE as i64
    })
    .await;
    assert_eq!(
        env.claims_created(),
        2,
        "no claim made for a slot the first one holds"
    );
    assert!(
        env.events("InsufficientCapacity").is_empty(),
        "no claim found unlaunchable and deleted: {:?}",
        env.events("InsufficientCapacity")
    );
    assert_eq!(env.replicas("md-0"), MAX_SIZE as i64);
    env.assert_clean();
}

/// One solve plans two claims for md-0, one Machine short of its max size (the solver does not
/// count its own new claims against max-size): the first takes the last slot at its creation,
/// and the second, which no offering has room for any more, is not created (upstream creates
/// no claim it knows cannot launch) rather than created and deleted by its own actor. Its pod
/// is told why, and the next solve, once md-0's replica write lands, finds no room either.
#[actix::test]
async fn a_planned_claim_no_offering_has_room_for_is_not_created() {
    let env = Env::builder()
        .cluster(super::autoscaler::cluster())
        .seeds(vec![seed_of(0, MAX_SIZE)])
        .short_batches()
        .start()
        .await;
    let shape = || PodShape::new("3", "256Mi");
    env.deployment("first", 1, shape()).await;
    env.until("the first pod bound", |e| e.bound_pods() == 1)
        .await;
    assert_eq!(env.replicas("md-0"), 1, "one Machine short of max-size");
    // Two pods in one batch, each needing a node of its own: one solve plans two claims.
    env.deployment("pair", 2, shape()).await;
    env.until("a pod of the pair told there is no room", |e| {
        told_no_room(e, "pair")
    })
    .await;
    env.until("the other bound on md-0's last Machine", |e| {
        e.bound_pods() == 2 && e.replicas("md-0") == MAX_SIZE as i64
    })
    .await;
    assert_eq!(
        env.claims_created(),
        2,
        "no claim created for the pod md-0 has no room for"
    );
    assert!(
        env.events("InsufficientCapacity").is_empty(),
        "no claim found unlaunchable and deleted: {:?}",
        env.events("InsufficientCapacity")
    );
    let told = env.events("FailedScheduling");
    assert!(
        told.iter().any(|e| e["note"]
            .as_str()
            .is_some_and(|n| n.contains("was not created"))),
        "the pod told its claim was not created: {told:?}"
    );
    assert!(
        env.metrics.nodeclaims_not_created.get() >= 1,
        "counted in karpenter_capi_nodeclaims_not_created_total"
    );
    assert_eq!(env.replicas("md-0"), MAX_SIZE as i64);
    env.assert_clean();
}
