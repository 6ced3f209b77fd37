//! How a Node stands against its claim, as registration, initialization, termination and
//! disruption all read it: Ready, and initialized (no startup or ephemeral taints left, every
//! requested extended resource offered).

use k8s_openapi::api::core::v1::{Node, Taint};

use crate::api::nodeclaim::NodeClaim;
use crate::api::resources::Quantity;
use crate::api::wellknown::EPHEMERAL_TAINT_KEYS;

/// The Node's `Ready` condition is True.
pub(crate) fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Why a registered Node is not initialized yet: the `Initialized=Unknown` reason upstream
/// writes, and a message for people.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotInitialized {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

fn not_initialized(reason: &'static str, message: String) -> Result<(), NotInitialized> {
    Err(NotInitialized { reason, message })
}

fn taint_text(t: &Taint) -> String {
    match t.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}={v}:{}", t.key, t.effect),
        _ => format!("{}:{}", t.key, t.effect),
    }
}

/// Why a registered Node is not initialized yet, or Ok. Checked in upstream's order, so the
/// reason shown is the one upstream would show.
pub(crate) fn node_initialized(node: &Node, c: &NodeClaim) -> Result<(), NotInitialized> {
    if !node_ready(node) {
        return not_initialized("NodeNotReady", "the Node is not Ready yet".into());
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    if let Some(t) = c
        .spec
        .startup_taints
        .iter()
        .flatten()
        .find_map(|st| taints.iter().find(|t| same_taint(t, st)))
    {
        return not_initialized(
            "StartupTaintsExist",
            format!("startup taint {} is still on the Node", taint_text(t)),
        );
    }
    if let Some(t) = taints
        .iter()
        .find(|t| EPHEMERAL_TAINT_KEYS.contains(&t.key.as_str()))
    {
        return not_initialized(
            "KnownEphemeralTaintsExist",
            format!("ephemeral taint {} is still on the Node", taint_text(t)),
        );
    }
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let requests = c.spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    let nonzero = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        Quantity::from_k8s(q).is_ok_and(|q| !q.is_zero())
    };
    for (name, wanted) in requests.into_iter().flatten() {
        if matches!(
            name.as_str(),
            "cpu" | "memory" | "pods" | "ephemeral-storage"
        ) {
            continue;
        }
        // A zero request asks for nothing a device plugin has to register.
        if !nonzero(wanted) {
            continue;
        }
        if !allocatable.and_then(|a| a.get(name)).is_some_and(nonzero) {
            return not_initialized(
                "ResourceNotRegistered",
                format!("{name} is requested but the Node does not offer it yet"),
            );
        }
    }
    Ok(())
}

/// The same taint for registration and initialization: key and effect (the value may differ).
pub(crate) fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::api::wellknown::NOT_READY_TAINT_KEY;

    fn claim(spec: Value) -> NodeClaim {
        let mut body = json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c"},
            "spec": {"requirements": [],
                     "nodeClassRef": {"group": "g", "kind": "K", "name": "n"}},
        });
        if let (Some(to), Value::Object(from)) = (body["spec"].as_object_mut(), spec) {
            to.extend(from);
        }
        serde_json::from_value(body).expect("a valid NodeClaim")
    }

    fn node(ready: &str, taints: Value, allocatable: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": taints},
            "status": {"allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": ready}]},
        }))
        .expect("a valid Node")
    }

    fn reason(node: &Node, c: &NodeClaim) -> Option<&'static str> {
        node_initialized(node, c).err().map(|w| w.reason)
    }

    #[test]
    fn waiting_gives_upstreams_reasons_in_upstreams_order() {
        let startup = json!({"startupTaints": [{"key": "cni", "effect": "NoSchedule"}]});
        let both = json!([{"key": "cni", "effect": "NoSchedule"},
                          {"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}]);
        let c = claim(startup.clone());
        assert_eq!(
            reason(&node("False", both.clone(), json!({})), &c),
            Some("NodeNotReady")
        );
        assert_eq!(
            reason(&node("True", both, json!({})), &c),
            Some("StartupTaintsExist"),
            "a startup taint is named before an ephemeral one"
        );
        let ephemeral = json!([{"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}]);
        assert_eq!(
            reason(&node("True", ephemeral, json!({})), &c),
            Some("KnownEphemeralTaintsExist")
        );
        let gpu = claim(json!({"resources": {"requests": {"nvidia.com/gpu": "1"}}}));
        let none = node("True", json!([]), json!({"nvidia.com/gpu": "0"}));
        let why = node_initialized(&none, &gpu).expect_err("no GPU yet");
        assert_eq!(why.reason, "ResourceNotRegistered");
        assert!(why.message.contains("nvidia.com/gpu"), "{}", why.message);
        assert_eq!(
            reason(
                &node("True", json!([]), json!({"nvidia.com/gpu": "1"})),
                &gpu
            ),
            None
        );
    }

    #[test]
    fn a_zero_request_needs_no_registered_resource() {
        let c = claim(json!({"resources": {"requests": {"example.com/fpga": "0"}}}));
        assert_eq!(reason(&node("True", json!([]), json!({})), &c), None);
    }
}
