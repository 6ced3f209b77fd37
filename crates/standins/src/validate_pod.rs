//! What kube-apiserver checks of a new pod that the controller's inputs touch: quantities that
//! decode (400 when one does not, as the request cannot be decoded into a Pod), resource names,
//! requests within limits and extended resources with a limit equal to the request, node
//! selector labels and the operators of node and pod affinity selectors (422 with one cause per
//! field). Mirrors `ValidatePodCreate` in `pkg/apis/core/validation` for those fields only.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::{Map, Value};

use super::errors::ApiError;
use super::quantity::parse_milli;

type Causes = Vec<(&'static str, String, String)>;

/// Checks a pod about to be created.
pub fn check_create(pod: &Value) -> Result<(), ApiError> {
    undecodable_quantity(pod)?;
    let mut causes = Causes::new();
    let spec = &pod["spec"];
    for kind in ["initContainers", "containers"] {
        for (i, c) in spec[kind].as_array().into_iter().flatten().enumerate() {
            resources(
                &c["resources"],
                &format!("spec.{kind}[{i}].resources"),
                &mut causes,
            );
        }
    }
    if let Some(selector) = spec["nodeSelector"].as_object() {
        labels(selector, "spec.nodeSelector", &mut causes);
    }
    affinity(&spec["affinity"], &mut causes);
    if causes.is_empty() {
        return Ok(());
    }
    let name = pod
        .pointer("/metadata/name")
        .or_else(|| pod.pointer("/metadata/generateName"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Err(ApiError::invalid_fields("", "Pod", name, &causes))
}

/// Upstream `resource.ParseQuantity`'s grammar; anything else fails to decode.
fn quantity_grammar() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(crate::wellknown::QUANTITY_PATTERN).expect("a constant pattern compiles")
    })
}

fn undecodable_quantity(pod: &Value) -> Result<(), ApiError> {
    let spec = &pod["spec"];
    let containers = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten());
    for c in containers {
        for part in ["requests", "limits"] {
            for q in c["resources"][part]
                .as_object()
                .into_iter()
                .flat_map(Map::values)
            {
                let ok = match q {
                    Value::String(s) => quantity_grammar().is_match(s),
                    Value::Number(_) => true,
                    _ => false,
                };
                if !ok {
                    return Err(ApiError::bad_request(format!(
                        "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression '{}'",
                        r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
                    )));
                }
            }
        }
    }
    Ok(())
}

fn milli(q: &Value) -> Option<i128> {
    match q {
        Value::String(s) => parse_milli(s),
        Value::Number(n) => n.as_f64().map(|f| (f * 1000.0).ceil() as i128),
        _ => None,
    }
}

fn shown(q: &Value) -> String {
    q.as_str()
        .map(String::from)
        .unwrap_or_else(|| q.to_string())
}

/// `validateResourceRequirements` for one container.
fn resources(r: &Value, path: &str, causes: &mut Causes) {
    let empty = Map::new();
    let limits = r["limits"].as_object().unwrap_or(&empty);
    let requests = r["requests"].as_object().unwrap_or(&empty);
    for (part, values) in [("limits", limits), ("requests", requests)] {
        for (name, q) in values {
            let field = format!("{path}.{part}[{name}]");
            if let Some(why) = resource_name_problem(name) {
                causes.push(invalid(&field, &format!("{name:?}"), why));
            }
            if milli(q).is_some_and(|m| m < 0) {
                causes.push(invalid(
                    &field,
                    &format!("{:?}", shown(q)),
                    "must be greater than or equal to 0",
                ));
            }
        }
    }
    for (name, request) in requests {
        let overcommits = !is_extended(name) && !name.starts_with("hugepages-");
        match limits.get(name) {
            None if !overcommits => causes.push((
                "FieldValueRequired",
                format!("{path}.limits"),
                "Required value: Limit must be set for non overcommitable resources".to_string(),
            )),
            None => {}
            Some(limit) => {
                let (Some(req), Some(lim)) = (milli(request), milli(limit)) else {
                    continue;
                };
                let (bad, words) = if overcommits {
                    (req > lim, "less than or equal to")
                } else {
                    (req != lim, "equal to")
                };
                if bad {
                    causes.push(invalid(
                        &format!("{path}.requests"),
                        &format!("{:?}", shown(request)),
                        &format!("must be {words} {name} limit of {}", shown(limit)),
                    ));
                }
            }
        }
    }
}

/// `IsExtendedResourceName`: a qualified name outside the `kubernetes.io` domains.
fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// `ValidateContainerResourceName`.
fn resource_name_problem(name: &str) -> Option<&'static str> {
    const STANDARD: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];
    if STANDARD.contains(&name) || name.starts_with("hugepages-") {
        return None;
    }
    if !name.contains('/') {
        return Some("must be a standard resource for containers");
    }
    if qualified_name_problem(name).is_some() {
        return Some("must be a standard resource type or fully qualified");
    }
    None
}

fn labels(m: &Map<String, Value>, path: &str, causes: &mut Causes) {
    for (k, v) in m {
        if let Some(why) = qualified_name_problem(k) {
            causes.push(invalid(path, &format!("{k:?}"), &why));
        }
        let value = v.as_str().unwrap_or_default();
        if let Some(why) = label_value_problem(value) {
            causes.push(invalid(path, &format!("{value:?}"), why));
        }
    }
}

/// Node affinity's node selector requirements and pod (anti-)affinity's label selectors.
fn affinity(a: &Value, causes: &mut Causes) {
    let base = "spec.affinity.nodeAffinity";
    let required = &a["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    for (t, term) in required["nodeSelectorTerms"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path =
            format!("{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{t}]");
        node_requirements(
            &term["matchExpressions"],
            &format!("{path}.matchExpressions"),
            causes,
        );
    }
    let preferred = a["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].as_array();
    for (t, p) in preferred.into_iter().flatten().enumerate() {
        let path =
            format!("{base}.preferredDuringSchedulingIgnoredDuringExecution[{t}].preference");
        node_requirements(
            &p["preference"]["matchExpressions"],
            &format!("{path}.matchExpressions"),
            causes,
        );
    }
    for kind in ["podAffinity", "podAntiAffinity"] {
        let terms = a[kind]["requiredDuringSchedulingIgnoredDuringExecution"].as_array();
        for (t, term) in terms.into_iter().flatten().enumerate() {
            let path = format!(
                "spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{t}].labelSelector.matchExpressions"
            );
            for (i, r) in term["labelSelector"]["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                requirement(
                    r,
                    &format!("{path}[{i}]"),
                    &["In", "NotIn", "Exists", "DoesNotExist"],
                    causes,
                );
            }
        }
    }
}

fn node_requirements(exprs: &Value, path: &str, causes: &mut Causes) {
    for (i, r) in exprs.as_array().into_iter().flatten().enumerate() {
        requirement(
            r,
            &format!("{path}[{i}]"),
            &["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
            causes,
        );
    }
}

/// `ValidateNodeSelectorRequirement` / `ValidateLabelSelectorRequirement`.
fn requirement(r: &Value, path: &str, ops: &[&str], causes: &mut Causes) {
    let op = r["operator"].as_str().unwrap_or_default();
    let n = r["values"].as_array().map_or(0, Vec::len);
    let values = format!("{path}.values");
    match op {
        "In" | "NotIn" if n == 0 => causes.push((
            "FieldValueRequired",
            values,
            "Required value: must be specified when `operator` is 'In' or 'NotIn'".into(),
        )),
        "Exists" | "DoesNotExist" if n > 0 => causes.push((
            "FieldValueForbidden",
            values,
            "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'".into(),
        )),
        "Gt" | "Lt" if ops.contains(&op) && n != 1 => causes.push((
            "FieldValueRequired",
            values,
            "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'".into(),
        )),
        // Node selectors say so in their own words; label selectors list what is supported.
        _ if !ops.contains(&op) && ops.contains(&"Gt") => causes.push(invalid(
            &format!("{path}.operator"),
            &format!("{op:?}"),
            "not a valid selector operator",
        )),
        _ if !ops.contains(&op) => causes.push((
            "FieldValueNotSupported",
            format!("{path}.operator"),
            format!(
                "Unsupported value: {op:?}: supported values: {}",
                ops.iter()
                    .map(|o| format!("{o:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        _ => {}
    }
    let key = r["key"].as_str().unwrap_or_default();
    if let Some(why) = qualified_name_problem(key) {
        causes.push(invalid(&format!("{path}.key"), &format!("{key:?}"), &why));
    }
}

fn invalid(field: &str, value: &str, why: &str) -> (&'static str, String, String) {
    (
        "FieldValueInvalid",
        field.to_string(),
        format!("Invalid value: {value}: {why}"),
    )
}

/// `IsValidLabelValue`.
fn label_value_problem(v: &str) -> Option<&'static str> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(crate::wellknown::LABEL_VALUE_PATTERN).expect("a constant pattern compiles")
    });
    if v.len() > 63 {
        Some("must be no more than 63 bytes")
    } else if !re.is_match(v) {
        Some(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        )
    } else {
        None
    }
}

/// `IsQualifiedName`: an optional DNS-subdomain prefix and a name of at most 63 characters.
fn qualified_name_problem(k: &str) -> Option<String> {
    static NAME: OnceLock<Regex> = OnceLock::new();
    static PREFIX: OnceLock<Regex> = OnceLock::new();
    let name_re = NAME.get_or_init(|| {
        Regex::new("^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
            .expect("a constant pattern compiles")
    });
    let prefix_re = PREFIX.get_or_init(|| {
        Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
            .expect("a constant pattern compiles")
    });
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !prefix_re.is_match(p))
    {
        return Some("prefix part must be a lowercase RFC 1123 subdomain".into());
    }
    if name.is_empty() || name.len() > 63 || !name_re.is_match(name) {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, and be at most 63 characters".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    fn container(resources: Value) -> Value {
        pod(json!({"containers": [{"name": "c", "resources": resources}]}))
    }

    #[test]
    fn quantities_that_do_not_decode_are_a_bad_request() {
        let e = check_create(&container(json!({"requests": {"cpu": "lots"}}))).unwrap_err();
        assert_eq!(e.code, 400, "{e}");
        assert!(
            check_create(&container(
                json!({"requests": {"cpu": "1.5", "memory": "1e3"}})
            ))
            .is_ok()
        );
    }

    #[test]
    fn extended_resources_need_an_equal_limit_and_requests_stay_within_limits() {
        let e = check_create(&container(json!({"requests": {"nvidia.com/gpu": "1"}}))).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .contains("spec.containers[0].resources.limits: Required value"),
            "{e}"
        );
        let gpu = json!({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}});
        assert!(check_create(&container(gpu)).is_ok());
        let e = check_create(&container(
            json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
        ))
        .unwrap_err();
        assert!(
            e.message
                .contains("must be less than or equal to cpu limit of 1"),
            "{e}"
        );
        let e = check_create(&container(
            json!({"requests": {"gpu": "1"}, "limits": {"gpu": "1"}}),
        ))
        .unwrap_err();
        assert!(
            e.message
                .contains("must be a standard resource for containers"),
            "{e}"
        );
    }

    #[test]
    fn selectors_are_checked() {
        let long = "v".repeat(64);
        let e = check_create(&pod(json!({"nodeSelector": {"team": long}}))).unwrap_err();
        assert!(
            e.message.contains("spec.nodeSelector: Invalid value"),
            "{e}"
        );
        let term = |op: &str, values: Value| {
            pod(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "team", "operator": op, "values": values}]}]}}}}))
        };
        let e = check_create(&term("Maybe", json!(["a"]))).unwrap_err();
        assert!(
            e.message
                .contains("Invalid value: \"Maybe\": not a valid selector operator"),
            "{e}"
        );
        assert!(check_create(&term("In", json!([]))).is_err());
        assert!(check_create(&term("Gt", json!(["1", "2"]))).is_err());
        assert!(check_create(&term("In", json!(["a"]))).is_ok());
        assert!(
            check_create(&pod(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}}})))
            .is_ok()
        );
    }
}
