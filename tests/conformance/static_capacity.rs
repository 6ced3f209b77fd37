//! Karpenter core's static provisioning and deprovisioning suites (`pkg/controllers/static/`):
//! what a static NodePool launches or removes for a given count of its claims, through the plan
//! the StaticCapacity actor carries out (`view::static_capacity`). The whole flows (a restart,
//! the Ready NodePool, the template) are in `tests/disruption/static_pools.rs`.

use std::collections::HashSet;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use karpenter_capi::api::decode::Lenient;
use karpenter_capi::api::nodepool::NodePool;
use karpenter_capi::state::State;
use karpenter_capi::state::feed::Index;
use karpenter_capi::testing;
use karpenter_capi::view::static_capacity::{Count, Member, Plan, counts, plan, scale_down};
use karpenter_capi::view::{CatalogView, Inputs, Settings};

fn static_pool(replicas: i64, nodes_limit: Option<&str>) -> NodePool {
    named_static_pool("static", replicas, nodes_limit)
}

fn named_static_pool(name: &str, replicas: i64, nodes_limit: Option<&str>) -> NodePool {
    let mut np = testing::nodepool(name);
    np.spec.replicas = Some(replicas);
    np.spec.weight = None;
    np.spec.limits =
        nodes_limit.map(|l| [("nodes".to_string(), K8sQuantity(l.to_string()))].into());
    np
}

fn member(claim: &str, launched: bool, empty: bool, do_not_disrupt: bool, cost: f64) -> Member {
    Member {
        claim: claim.into(),
        launched,
        initialized: launched,
        empty,
        do_not_disrupt,
        cost,
    }
}

fn running(n: usize) -> Count {
    Count {
        running: (0..n)
            .map(|i| member(&format!("nc-{i}"), true, false, false, 1.0))
            .collect(),
        ..Count::default()
    }
}

fn create(count: usize) -> Plan {
    Plan::Create {
        count,
        capped: None,
    }
}

#[test]
fn nothing_is_created_when_the_pool_already_holds_more_than_its_replicas() {
    assert!(matches!(
        plan(&static_pool(1, None), &running(3), 0),
        Plan::Remove(_)
    ));
}

#[test]
fn claims_are_created_up_to_the_replicas() {
    assert_eq!(plan(&static_pool(3, None), &running(0), 0), create(3));
    assert_eq!(plan(&static_pool(3, None), &running(1), 0), create(2));
}

#[test]
fn claims_not_yet_registered_count_toward_the_replicas() {
    // Upstream's three claims (no Node, an unregistered Node, a provider ID only) are all
    // running: nothing more is made however often it reconciles.
    let mut c = running(3);
    c.running[0].launched = false;
    for _ in 0..10 {
        assert_eq!(plan(&static_pool(3, None), &c, 0), Plan::Hold);
    }
}

#[test]
fn limits_nodes_caps_what_is_created() {
    assert_eq!(
        plan(&static_pool(3, Some("1")), &running(0), 0),
        Plan::Create {
            count: 1,
            capped: Some(1)
        }
    );
}

#[test]
fn claims_being_created_are_reserved_against_the_limit() {
    // Two reconciles racing: the second sees the first one's creates in flight.
    let np = static_pool(5, Some("3"));
    assert_eq!(
        plan(&np, &running(0), 3),
        Plan::Create {
            count: 0,
            capped: Some(3)
        }
    );
    assert_eq!(plan(&static_pool(3, None), &running(0), 3), Plan::Hold);
}

#[test]
fn zero_replicas_create_nothing_and_remove_every_claim() {
    assert_eq!(plan(&static_pool(0, None), &running(0), 0), Plan::Hold);
    let Plan::Remove(all) = plan(&static_pool(0, None), &running(3), 0) else {
        panic!("a scale-down")
    };
    assert_eq!(all.len(), 3);
}

#[test]
fn a_large_replica_count_is_created_at_once() {
    assert_eq!(plan(&static_pool(1000, None), &running(0), 0), create(1000));
}

#[test]
fn only_running_claims_count_for_a_scale_down() {
    // Deleting claims are not removed again; disrupting ones hold their place.
    let mut c = running(2);
    c.deleting = 3;
    assert_eq!(plan(&static_pool(2, None), &c, 0), Plan::Hold);
    c.disrupting = 1;
    assert_eq!(plan(&static_pool(2, None), &c, 0), Plan::Hold);
}

#[test]
fn excess_claims_are_removed_down_to_the_replicas() {
    let Plan::Remove(gone) = plan(&static_pool(2, None), &running(5), 0) else {
        panic!("a scale-down")
    };
    assert_eq!(gone.len(), 3);
}

#[test]
fn claims_without_a_provider_id_go_first() {
    let c = [
        member("launched", true, true, false, 0.0),
        member("pending", false, false, false, 9.0),
    ];
    assert_eq!(scale_down(&c, 1), ["pending"]);
}

#[test]
fn empty_nodes_go_before_busy_ones() {
    let c = [
        member("busy", true, false, false, 0.5),
        member("daemonsets-only", true, true, false, 0.0),
    ];
    assert_eq!(scale_down(&c, 1), ["daemonsets-only"]);
    assert_eq!(scale_down(&c, 2), ["daemonsets-only", "busy"]);
}

#[test]
fn busy_nodes_go_by_disruption_cost_with_do_not_disrupt_last() {
    let c = [
        member("protected", true, false, true, 0.1),
        member("expensive", true, false, false, 8.0),
        member("cheap", true, false, false, 2.0),
    ];
    assert_eq!(scale_down(&c, 3), ["cheap", "expensive", "protected"]);
}

/// The static pools the actor holds (`counts`), of these NodePools.
fn held(pools: Vec<NodePool>) -> Vec<String> {
    let st = State::default();
    Index::reset(
        &mut *st.nodepools.write(),
        pools.into_iter().map(Lenient::Ok).collect(),
    );
    let (catalog, settings) = (CatalogView::default(), Settings::default());
    let inputs = Inputs {
        state: &st,
        catalog: &catalog,
        settings: &settings,
    };
    counts(
        inputs,
        &HashSet::new(),
        &HashSet::new(),
        jiff::Timestamp::now(),
    )
    .into_keys()
    .collect()
}

#[test]
fn only_static_pools_of_this_provider_not_being_deleted_are_held() {
    let mut foreign = named_static_pool("foreign", 1, None);
    let r = &mut foreign.spec.template.spec.node_class_ref;
    (r.group, r.kind, r.name) = (
        "test.group".into(),
        "UnmanagedNodeClass".into(),
        "test".into(),
    );
    let mut deleting = named_static_pool("deleting", 1, None);
    deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
    deleting.metadata.finalizers = Some(vec!["test/hold".into()]);
    let mut dynamic = named_static_pool("dynamic", 1, None);
    dynamic.spec.replicas = None;
    assert_eq!(
        held(vec![
            foreign,
            deleting,
            dynamic,
            named_static_pool("fixed", 1, None)
        ]),
        ["fixed"]
    );
}
