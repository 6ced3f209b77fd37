use super::*;

fn docs() -> Vec<Value> {
    vec![
        json!({"kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": "ns"}}),
        json!({"kind": "ClusterRole", "metadata": {"name": "workload"}, "rules": [
            {"apiGroups": [""], "resources": ["nodes", "pods/eviction"], "verbs": ["list", "create"]},
        ]}),
        json!({"kind": "ClusterRoleBinding", "metadata": {"name": "workload"},
            "roleRef": {"kind": "ClusterRole", "name": "workload"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
        json!({"kind": "Role", "metadata": {"name": "lease", "namespace": "ns"}, "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"],
             "resourceNames": ["the-lease"]},
        ]}),
        json!({"kind": "RoleBinding", "metadata": {"name": "lease", "namespace": "ns"},
            "roleRef": {"kind": "Role", "name": "lease"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
        // Bound to someone else: not the ServiceAccount's.
        json!({"kind": "ClusterRole", "metadata": {"name": "other"}, "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        ]}),
        json!({"kind": "ClusterRoleBinding", "metadata": {"name": "other"},
            "roleRef": {"kind": "ClusterRole", "name": "other"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "elsewhere"}]}),
    ]
}

#[test]
fn only_the_rules_bound_to_the_service_account_count() {
    let rules = bound_rules(&docs(), "ns", "sa").expect("rules");
    let granted: Vec<String> = rules
        .iter()
        .flat_map(Rule::permissions)
        .map(|p| p.to_string())
        .collect();
    assert_eq!(
        granted,
        [
            "list core/nodes",
            "create core/nodes",
            "list core/pods/eviction",
            "create core/pods/eviction",
            "get coordination.k8s.io/leases",
        ]
    );
    assert_eq!(rules[0].namespace, None);
    assert_eq!(rules[1].namespace.as_deref(), Some("ns"));
    assert_eq!(rules[1].resource_names, ["the-lease"]);
    assert!(bound_rules(&docs(), "ns", "nobody").is_err());
}

#[test]
fn the_audit_log_gives_the_users_permissions_refusals_and_writes() {
    let event = |user: &str, agent: &str, verb: &str, object: Value, code: u16| {
        json!({
            "kind": "Event", "stage": "ResponseComplete", "verb": verb,
            "requestURI": "/api/v1/x?watch=true", "userAgent": agent,
            "user": {"username": user}, "objectRef": object,
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": "2026-11-26T12:00:00Z",
            "stageTimestamp": "2026-11-26T12:00:00Z",
        })
        .to_string()
    };
    let me = "system:serviceaccount:ns:sa";
    // A watch, logged when it started and when it ended.
    let started = event(me, "a", "watch", json!({"resource": "nodes"}), 200)
        .replace("ResponseComplete", "ResponseStarted");
    let lines = [
        started,
        event(
            me,
            "a",
            "watch",
            json!({"resource": "nodes", "apiVersion": "v1"}),
            200,
        ),
        event(
            me,
            "a",
            "create",
            json!({"resource": "pods", "subresource": "eviction"}),
            201,
        ),
        event(
            me,
            "b",
            "patch",
            json!({"resource": "nodeclaims", "apiGroup": "karpenter.sh"}),
            200,
        ),
        event(me, "b", "delete", json!({"resource": "secrets"}), 403),
        event(me, "b", "delete", json!({"resource": "secrets"}), 403),
        event(
            "admin",
            "kubectl",
            "get",
            json!({"resource": "secrets"}),
            200,
        ),
        // Discovery: no object.
        event(me, "a", "get", Value::Null, 200),
    ];
    // The last line is still being written: not an event yet.
    let text = format!("{}\n{{\"kind\": \"Ev", lines.join("\n"));
    let audited = parse_audit(&text, me).expect("parses");
    assert_eq!(audited.requests, 6);
    let used: Vec<String> = audited.used.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        used,
        [
            "watch core/nodes",
            "create core/pods/eviction",
            "patch karpenter.sh/nodeclaims"
        ]
    );
    assert_eq!(
        audited.forbidden,
        BTreeMap::from([("delete /api/v1/x".to_string(), 2)])
    );
    assert_eq!(
        audited.writes["a"],
        BTreeSet::from([Permission::new("", "pods/eviction", "create")])
    );
    assert_eq!(
        audited.writes["b"],
        BTreeSet::from([Permission::new("karpenter.sh", "nodeclaims", "patch")])
    );
    assert_eq!(
        parse_audit(&format!("{}\nnot json\n", lines[0]), me)
            .err()
            .map(|e| e.0),
        Some(2)
    );
}
