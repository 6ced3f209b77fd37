use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

fn at(s: &str) -> Timestamp {
    s.parse().expect("a timestamp")
}

fn condition(type_: &str, status: &str, reason: &str, since: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: (!reason.is_empty()).then(|| reason.into()),
        last_transition_time: Some(Time(at(since))),
        ..Default::default()
    }
}

/// Node Problem Detector's kernel conditions: a hung task is worth waiting for, a deadlocked
/// container runtime is not, and anything else under `KernelDeadlock` gets the fallback.
const NPD: &str = r#"
policies:
- conditionType: Ready
  conditionStatus: "False"
  tolerationDuration: 30m
- conditionType: KernelDeadlock
  conditionStatus: "True"
  tolerationDuration: 20m
- conditionType: KernelDeadlock
  conditionStatus: "True"
  reasonRegex: DockerHung|ContainerdHung
  tolerationDuration: 2m
  priority: 80
  terminationGracePeriod: 1m
- conditionType: KernelDeadlock
  conditionStatus: "True"
  reasonRegex: Task.*Hung
  tolerationDuration: 1h
  action: Reboot
"#;

#[test]
fn no_document_means_upstreams_ready_policies() {
    let p = RepairPolicies::parse("  ").expect("the defaults");
    let described: Vec<_> = p.policies().iter().map(Policy::describe).collect();
    assert_eq!(described, ["Ready=False", "Ready=Unknown"]);
    assert!(
        p.policies()
            .iter()
            .all(|p| p.toleration == READY_TOLERATION)
    );
}

#[test]
fn a_named_reason_takes_its_own_policy_and_not_the_fallback() {
    let p = RepairPolicies::parse(NPD).expect("valid");
    let now = at("2026-11-30T10:05:00Z");
    // DockerHung for 5 minutes: its policy (2 m) is due; the fallback (20 m) is not consulted.
    let a = p.assess(
        &[condition(
            "KernelDeadlock",
            "True",
            "DockerHung",
            "2026-11-30T10:00:00Z",
        )],
        now,
    );
    let due = a.due.expect("due");
    assert_eq!(
        due.policy,
        "KernelDeadlock=True (reason ~ DockerHung|ContainerdHung)"
    );
    assert_eq!(due.overdue, Duration::from_secs(180));
    assert_eq!(due.termination_grace_period, Duration::from_secs(60));
    assert_eq!(due.rank, 1, "priority 80 ranks above 0");
    assert_eq!(a.next, None);
    // TaskHung for 5 minutes: its own policy waits an hour, the fallback's 20 m do not apply.
    let a = p.assess(
        &[condition(
            "KernelDeadlock",
            "True",
            "TaskIOHung",
            "2026-11-30T10:00:00Z",
        )],
        now,
    );
    assert!(a.unhealthy);
    assert_eq!(a.due, None);
    assert_eq!(a.next, Some(at("2026-11-30T11:00:00Z")));
}

#[test]
fn an_unforeseen_reason_gets_the_fallback() {
    let p = RepairPolicies::parse(NPD).expect("valid");
    let a = p.assess(
        &[condition(
            "KernelDeadlock",
            "True",
            "NewReason",
            "2026-11-30T10:00:00Z",
        )],
        at("2026-11-30T10:30:00Z"),
    );
    let due = a.due.expect("the fallback is due after 20 minutes");
    assert_eq!(due.policy, "KernelDeadlock=True");
    assert_eq!(due.overdue, Duration::from_secs(600));
    assert_eq!(due.termination_grace_period, Duration::ZERO, "forceful");
}

#[test]
fn the_expression_matches_the_whole_reason() {
    let p = RepairPolicies::parse(NPD).expect("valid");
    let a = p.assess(
        &[condition(
            "KernelDeadlock",
            "True",
            "NotDockerHungReally",
            "2026-11-30T10:00:00Z",
        )],
        at("2026-11-30T10:05:00Z"),
    );
    assert_eq!(a.due, None, "only the fallback applies, not due yet");
    assert_eq!(a.next, Some(at("2026-11-30T10:20:00Z")));
}

#[test]
fn conditions_without_policies_and_healthy_ones_are_not_unhealthy() {
    let p = RepairPolicies::parse(NPD).expect("valid");
    let a = p.assess(
        &[
            condition("Ready", "True", "KubeletReady", "2026-11-30T10:00:00Z"),
            condition(
                "KernelDeadlock",
                "False",
                "KernelHasNoDeadlock",
                "2026-11-30T10:00:00Z",
            ),
            condition("MemoryPressure", "True", "", "2026-11-30T10:00:00Z"),
        ],
        at("2026-11-30T12:00:00Z"),
    );
    assert_eq!(a, Assessment::default());
}

#[test]
fn several_due_the_highest_priority_drives_and_the_shortest_grace_bounds_the_drain() {
    let p = RepairPolicies::parse(NPD).expect("valid");
    let a = p.assess(
        &[
            // Ready=False for two hours: overdue by 90 minutes at priority 0.
            condition("Ready", "False", "KubeletNotReady", "2026-11-30T10:00:00Z"),
            // ContainerdHung for 3 minutes: overdue by one at priority 80.
            condition(
                "KernelDeadlock",
                "True",
                "ContainerdHung",
                "2026-11-30T11:57:00Z",
            ),
        ],
        at("2026-11-30T12:00:00Z"),
    );
    let due = a.due.expect("due");
    assert_eq!(due.condition, "KernelDeadlock");
    assert_eq!(due.reason, "ContainerdHung");
    assert_eq!(due.overdue, Duration::from_secs(60));
    assert_eq!(
        due.termination_grace_period,
        Duration::ZERO,
        "Ready's forceful drain is the shortest"
    );
    assert!(!due.reboot_asked);
}

#[test]
fn a_reboot_is_asked_only_when_every_due_policy_asks_it() {
    let p = RepairPolicies::parse(NPD).expect("valid");
    let a = p.assess(
        &[condition(
            "KernelDeadlock",
            "True",
            "TaskHung",
            "2026-11-30T10:00:00Z",
        )],
        at("2026-11-30T11:00:00Z"),
    );
    assert!(a.due.expect("due").reboot_asked);
}

#[test]
fn a_condition_without_a_transition_time_counts_but_is_never_due() {
    let p = RepairPolicies::ready(Duration::from_secs(60));
    let mut c = condition(
        "Ready",
        "Unknown",
        "NodeStatusUnknown",
        "2026-11-30T10:00:00Z",
    );
    c.last_transition_time = None;
    let a = p.assess(&[c], at("2026-11-30T12:00:00Z"));
    assert!(a.unhealthy);
    assert_eq!((a.due, a.next), (None, None));
}

#[test]
fn bad_documents_are_refused_naming_the_policy_and_field() {
    let refused = |doc: &str| RepairPolicies::parse(doc).expect_err(doc).to_string();
    let one = |fields: &str| {
        format!(
            "policies:\n- conditionType: Ready\n  conditionStatus: \"False\"\n  tolerationDuration: 1m\n- conditionType: Ready\n  conditionStatus: \"False\"\n{fields}"
        )
    };
    assert!(
        refused(&one(
            "  reasonRegex: \"(unclosed\"\n  tolerationDuration: 1m\n"
        ))
        .starts_with(
            "--repair-policies: policies[1].reasonRegex: \"(unclosed\": regex parse error"
        ),
    );
    assert_eq!(
        refused(&one(
            "  reasonRegex: X\n  tolerationDuration: 1m\n  priority: 101\n"
        )),
        "--repair-policies: policies[1].priority: 101 must be between 0 and 100"
    );
    assert_eq!(
        refused(&one("  reasonRegex: X\n  tolerationDuration: soon\n")),
        "--repair-policies: policies[1].tolerationDuration: invalid duration \"soon\": expected a number followed by a unit (h, m, s, ms, us, ns)"
    );
    assert_eq!(
        refused(&one(
            "  reasonRegex: X\n  tolerationDuration: 1m\n  action: Restart\n"
        )),
        "--repair-policies: policies[1].action: \"Restart\" must be Replace or Reboot"
    );
    assert_eq!(
        refused(&one("  tolerationDuration: 1m\n")),
        "--repair-policies: the policies for Ready=False need exactly one fallback (a policy without reasonRegex, action Replace), so a reason none of them names is still repaired; found 2"
    );
    assert_eq!(
        refused(
            "policies:\n- conditionType: Ready\n  conditionStatus: \"False\"\n  reasonRegex: X\n  tolerationDuration: 1m\n"
        ),
        "--repair-policies: the policies for Ready=False need exactly one fallback (a policy without reasonRegex, action Replace), so a reason none of them names is still repaired; found 0"
    );
    assert_eq!(
        refused(
            "policies:\n- conditionType: Ready\n  conditionStatus: \"False\"\n  tolerationDuration: 1m\n  action: Reboot\n"
        ),
        "--repair-policies: policies[0].action: a fallback policy (no reasonRegex) must be Replace"
    );
    assert_eq!(
        refused(
            "policies:\n- conditionType: Ready\n  conditionStatus: \"false\"\n  tolerationDuration: 1m\n"
        ),
        "--repair-policies: policies[0].conditionStatus: \"false\" must be True, False or Unknown"
    );
    assert_eq!(
        refused("policies: []\n"),
        "--repair-policies has no policy: list at least one under `policies`"
    );
    assert!(
        refused("policies:\n- conditionType: Ready\n  conditionStatus: \"False\"\n  tolerationDuration: 1m\n  toleration: 1m\n")
            .starts_with("--repair-policies is not a YAML or JSON document of policies:"),
        "an unknown field is refused, not ignored"
    );
}

#[test]
fn only_the_default_ready_policies_leave_a_ready_node_unlooked_at() {
    assert!(
        RepairPolicies::parse("")
            .expect("defaults")
            .ready_is_healthy()
    );
    assert!(
        !RepairPolicies::parse(NPD)
            .expect("valid")
            .ready_is_healthy()
    );
}
