//! Karpenter core's node health suite (`pkg/controllers/node/health/`), the parts that are pure
//! rules: the policies this provider claims and the 20 % guard's rounding. The whole flows
//! (repair, the guard, the MachineHealthCheck) are in `tests/disruption/repair.rs`.

use karpenter_capi::view::repair::{POLICIES, threshold};

#[test]
fn only_ready_false_or_unknown_calls_for_a_repair() {
    let policies: Vec<(&str, &str)> = POLICIES.iter().map(|p| (p.condition, p.status)).collect();
    assert_eq!(policies, [("Ready", "False"), ("Ready", "Unknown")]);
}

#[test]
fn a_fifth_of_a_small_pool_rounds_up_to_one_node() {
    // Upstream's case: one unhealthy node of three may be repaired (33 % > 20 %, rounded up).
    assert_eq!(threshold(3), 1);
    assert_eq!(threshold(4), 1);
    // Two of ten may; three of ten may not.
    assert_eq!(threshold(10), 2);
}
