//! Validation of NodePools, NodeClaims and ClusterAPINodeClasses: everything upstream enforces
//! with schema patterns, enums and CEL, checked again in Rust so that objects that reached us
//! another way (an older CRD, the simulator, a test) fail with a message naming the field.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::cron;
use super::duration::{GoDuration, NillableDuration};
use super::nodeclaim::{
    NodeClaim, NodeClassReference, NodeSelectorRequirementWithMinValues, Operator,
};
use super::nodeclass::ClusterAPINodeClass;
use super::nodeoverlay::{NodeOverlay, price_change};
use super::nodepool::{Budget, NodePool};
use super::resources::Quantity;
use super::wellknown::{CAPACITY_TYPE_LABEL, HOSTNAME_LABEL, KARPENTER_GROUP, NODEPOOL_LABEL};

/// One problem, located by its field path (`spec.template.spec.requirements[2].values`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found in one object.
#[derive(Debug, Clone, Default, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors {
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ValidationErrors {
    fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    fn into_result(self) -> Result<(), ValidationErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// True when some error is about `field` (exactly).
    pub fn has_field(&self, field: &str) -> bool {
        self.errors.iter().any(|e| e.field == field)
    }
}

/// Which object a requirement or label belongs to: NodeClaims may carry `karpenter.sh/nodepool`
/// (the provisioner writes it), NodePools may not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    NodePool,
    NodeClaim,
}

const MAX_REQUIREMENTS: usize = 100;
const MAX_LABELS: usize = 100;
const MAX_BUDGETS: usize = 50;
const MAX_MIN_VALUES: i64 = 50;
const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

pub fn validate_nodepool(np: &NodePool) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let spec = &np.spec;
    let tmpl = &spec.template;
    if let Some(labels) = tmpl.metadata.as_ref().and_then(|m| m.labels.as_ref()) {
        check_labels(&mut errs, "spec.template.metadata.labels", labels);
    }
    let ts = &tmpl.spec;
    check_requirements(
        &mut errs,
        "spec.template.spec.requirements",
        &ts.requirements,
        Owner::NodePool,
    );
    check_taints(&mut errs, "spec.template.spec.taints", ts.taints.as_deref());
    check_taints(
        &mut errs,
        "spec.template.spec.startupTaints",
        ts.startup_taints.as_deref(),
    );
    check_node_class_ref(
        &mut errs,
        "spec.template.spec.nodeClassRef",
        &ts.node_class_ref,
    );
    check_go_duration(
        &mut errs,
        "spec.template.spec.terminationGracePeriod",
        ts.termination_grace_period,
    );
    check_nillable(&mut errs, "spec.template.spec.expireAfter", ts.expire_after);

    check_quantities(&mut errs, "spec.limits", spec.limits.as_ref());
    if let Some(w) = spec.weight
        && !(1..=100).contains(&w)
    {
        errs.push(
            "spec.weight",
            format!("weight {w} must be between 1 and 100"),
        );
    }
    if let Some(r) = spec.replicas {
        if r < 0 {
            errs.push(
                "spec.replicas",
                format!("replicas {r} must not be negative"),
            );
        }
        if spec.weight.is_some() {
            errs.push(
                "spec.weight",
                "'weight' is not supported on static NodePools",
            );
        }
        if let Some(limits) = &spec.limits
            && limits.keys().any(|k| k != "nodes")
        {
            errs.push(
                "spec.limits",
                "only 'limits.nodes' is supported on static NodePools",
            );
        }
    }
    if let Some(d) = &spec.disruption {
        check_nillable(
            &mut errs,
            "spec.disruption.consolidateAfter",
            d.consolidate_after,
        );
        if let Some(budgets) = &d.budgets {
            if budgets.len() > MAX_BUDGETS {
                errs.push(
                    "spec.disruption.budgets",
                    format!(
                        "at most {MAX_BUDGETS} budgets are allowed, got {}",
                        budgets.len()
                    ),
                );
            }
            for (i, b) in budgets.iter().enumerate() {
                check_budget(&mut errs, &format!("spec.disruption.budgets[{i}]"), b);
            }
        }
    }
    errs.into_result()
}

pub fn validate_nodeclaim(nc: &NodeClaim) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let spec = &nc.spec;
    check_requirements(
        &mut errs,
        "spec.requirements",
        &spec.requirements,
        Owner::NodeClaim,
    );
    check_taints(&mut errs, "spec.taints", spec.taints.as_deref());
    check_taints(
        &mut errs,
        "spec.startupTaints",
        spec.startup_taints.as_deref(),
    );
    check_node_class_ref(&mut errs, "spec.nodeClassRef", &spec.node_class_ref);
    check_go_duration(
        &mut errs,
        "spec.terminationGracePeriod",
        spec.termination_grace_period,
    );
    check_nillable(&mut errs, "spec.expireAfter", spec.expire_after);
    check_quantities(
        &mut errs,
        "spec.resources.requests",
        spec.resources.as_ref().and_then(|r| r.requests.as_ref()),
    );
    errs.into_result()
}

pub fn validate_nodeclass(nc: &ClusterAPINodeClass) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    if let Some(sel) = &nc.spec.scalable_resource_selector {
        check_label_selector(&mut errs, "spec.scalableResourceSelector", sel);
    }
    if let Some(t) = nc.spec.create_timeout
        && t.0.is_zero()
    {
        errs.push("spec.createTimeout", "must be greater than zero");
    }
    errs.into_result()
}

/// Upstream's runtime validation of a NodeOverlay (requirement keys and values, no well-known
/// resource in `capacity`) plus what its CRD patterns refuse (weight, the price grammar), each
/// naming the field: an overlay that fails is reported on its status and never applied.
pub fn validate_nodeoverlay(o: &NodeOverlay) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::default();
    let spec = &o.spec;
    let reqs: Vec<NodeSelectorRequirementWithMinValues> = spec
        .requirements
        .iter()
        .map(|r| NodeSelectorRequirementWithMinValues {
            key: r.key.clone(),
            operator: r.operator,
            values: r.values.clone(),
            min_values: None,
        })
        .collect();
    check_requirements(&mut errs, "spec.requirements", &reqs, Owner::NodeClaim);
    for (i, r) in reqs.iter().enumerate() {
        if r.operator == Operator::NotIn && r.values().is_empty() {
            errs.push(
                format!("spec.requirements[{i}].values"),
                format!(
                    "key {} with operator NotIn must have a value defined",
                    r.key
                ),
            );
        }
    }
    if let Some(capacity) = &spec.capacity {
        for name in capacity.keys() {
            if WELL_KNOWN_RESOURCES.contains(&name.as_str()) {
                errs.push(
                    format!("spec.capacity[{name:?}]"),
                    format!("invalid capacity: {name} in resource, restricted"),
                );
            }
        }
    }
    check_quantities(&mut errs, "spec.capacity", spec.capacity.as_ref());
    if let Some(w) = spec.weight
        && !(1..=10000).contains(&w)
    {
        errs.push(
            "spec.weight",
            format!("weight {w} must be between 1 and 10000"),
        );
    }
    if let Err(e) = price_change(spec) {
        errs.push(e.field, format!("{:?} {}", e.value, e.why));
    }
    errs.into_result()
}

/// The resources an overlay may not change: upstream's well-known ones.
const WELL_KNOWN_RESOURCES: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];

fn check_requirements(
    errs: &mut ValidationErrors,
    path: &str,
    reqs: &[NodeSelectorRequirementWithMinValues],
    owner: Owner,
) {
    if reqs.len() > MAX_REQUIREMENTS {
        errs.push(
            path,
            format!(
                "at most {MAX_REQUIREMENTS} requirements are allowed, got {}",
                reqs.len()
            ),
        );
    }
    for (i, r) in reqs.iter().enumerate() {
        let p = format!("{path}[{i}]");
        check_label_key(errs, &format!("{p}.key"), &r.key, owner);
        check_operator_values(errs, &format!("{p}.values"), r.operator, r.values());
        if let Some(m) = r.min_values {
            if !(1..=MAX_MIN_VALUES).contains(&m) {
                errs.push(
                    format!("{p}.minValues"),
                    format!("minValues {m} must be between 1 and {MAX_MIN_VALUES}"),
                );
            } else if r.operator == Operator::In && (r.values().len() as i64) < m {
                errs.push(
                    format!("{p}.minValues"),
                    format!(
                        "minValues {m} needs at least that many values for operator In, got {}",
                        r.values().len()
                    ),
                );
            }
        }
    }
}

fn check_operator_values(errs: &mut ValidationErrors, path: &str, op: Operator, values: &[String]) {
    match op {
        Operator::In if values.is_empty() => {
            errs.push(path, "operator In needs at least one value");
        }
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
            errs.push(
                path,
                format!("operator {op} takes no values, got {}", values.len()),
            );
        }
        Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte => {
            let ok = matches!(values, [v] if v.parse::<i64>().is_ok_and(|n| n >= 0));
            if !ok {
                errs.push(
                    path,
                    format!("operator {op} needs exactly one integer value >= 0, got {values:?}"),
                );
            }
        }
        Operator::In | Operator::NotIn => {
            for (j, v) in values.iter().enumerate() {
                if let Err(e) = label_value(v) {
                    errs.push(format!("{path}[{j}]"), e);
                }
            }
        }
        _ => {}
    }
}

/// Upstream's label-domain rules for requirement keys and template labels.
fn check_label_key(errs: &mut ValidationErrors, path: &str, key: &str, owner: Owner) {
    if let Err(e) = qualified_name(key) {
        errs.push(path, e);
        return;
    }
    let domain = key.split('/').next().unwrap_or(key);
    if domain.ends_with(KARPENTER_GROUP) && key != CAPACITY_TYPE_LABEL && key != NODEPOOL_LABEL {
        errs.push(
            path,
            format!("label domain \"karpenter.sh\" is restricted (key {key:?})"),
        );
    }
    if key == NODEPOOL_LABEL && owner == Owner::NodePool {
        errs.push(path, "label \"karpenter.sh/nodepool\" is restricted");
    }
    if key == HOSTNAME_LABEL {
        errs.push(path, "label \"kubernetes.io/hostname\" is restricted");
    }
}

fn check_labels(errs: &mut ValidationErrors, path: &str, labels: &BTreeMap<String, String>) {
    if labels.len() > MAX_LABELS {
        errs.push(
            path,
            format!(
                "at most {MAX_LABELS} labels are allowed, got {}",
                labels.len()
            ),
        );
    }
    for (k, v) in labels {
        let p = format!("{path}[{k:?}]");
        check_label_key(errs, &p, k, Owner::NodePool);
        if let Err(e) = label_value(v) {
            errs.push(p, e);
        }
    }
}

fn check_taints(errs: &mut ValidationErrors, path: &str, taints: Option<&[Taint]>) {
    for (i, t) in taints.unwrap_or_default().iter().enumerate() {
        let p = format!("{path}[{i}]");
        if t.key.is_empty() {
            errs.push(format!("{p}.key"), "taint key may not be empty");
        } else if let Err(e) = qualified_name(&t.key) {
            errs.push(format!("{p}.key"), e);
        }
        if let Some(v) = t.value.as_deref().filter(|v| !v.is_empty())
            && let Err(e) = qualified_name(v)
        {
            errs.push(format!("{p}.value"), e);
        }
        if !EFFECTS.contains(&t.effect.as_str()) {
            errs.push(
                format!("{p}.effect"),
                format!(
                    "taint effect {:?} must be one of {}",
                    t.effect,
                    EFFECTS.join(", ")
                ),
            );
        }
    }
}

fn check_node_class_ref(errs: &mut ValidationErrors, path: &str, r: &NodeClassReference) {
    for (name, value) in [("group", &r.group), ("kind", &r.kind), ("name", &r.name)] {
        if value.is_empty() {
            errs.push(format!("{path}.{name}"), format!("{name} may not be empty"));
        }
    }
    if r.group.contains('/') {
        errs.push(
            format!("{path}.group"),
            format!("group {:?} must be an API group without a version", r.group),
        );
    }
}

/// Upstream's duration fields only take whole seconds (`^([0-9]+(s|m|h))+$`).
fn check_go_duration(errs: &mut ValidationErrors, path: &str, d: Option<GoDuration>) {
    if let Some(d) = d
        && d.0.subsec_nanos() != 0
    {
        errs.push(
            path,
            format!("duration {d} must be a whole number of seconds"),
        );
    }
}

fn check_nillable(errs: &mut ValidationErrors, path: &str, d: Option<NillableDuration>) {
    if let Some(NillableDuration::After(d)) = d {
        check_go_duration(errs, path, Some(GoDuration(d)));
    }
}

/// Resource quantities (limits, requests): each must be a quantity and not negative (the
/// schema's pattern accepts a sign; a negative limit or request has no meaning).
fn check_quantities<'a>(
    errs: &mut ValidationErrors,
    path: &str,
    list: Option<impl IntoIterator<Item = (&'a String, &'a K8sQuantity)>>,
) {
    for (name, q) in list.into_iter().flatten() {
        let field = format!("{path}.{name}");
        match Quantity::from_k8s(q) {
            Ok(v) if v.is_negative() => {
                errs.push(field, format!("quantity {} must not be negative", q.0));
            }
            Ok(_) => {}
            Err(e) => errs.push(field, e.to_string()),
        }
    }
}

fn check_budget(errs: &mut ValidationErrors, path: &str, b: &Budget) {
    if !budget_nodes_ok(&b.nodes) {
        errs.push(
            format!("{path}.nodes"),
            format!(
                "nodes {:?} must be a count (\"5\") or a percentage from 0% to 100% (\"10%\")",
                b.nodes
            ),
        );
    }
    match (&b.schedule, &b.duration) {
        (Some(_), None) => errs.push(
            format!("{path}.duration"),
            "'schedule' must be set with 'duration'",
        ),
        (None, Some(_)) => errs.push(
            format!("{path}.schedule"),
            "'schedule' must be set with 'duration'",
        ),
        _ => {}
    }
    if let Some(s) = &b.schedule
        && let Err(e) = cron::parse(s)
    {
        errs.push(format!("{path}.schedule"), e.reason);
    }
    if let Some(d) = b.duration
        && d.0.as_nanos() % 60_000_000_000 != 0
    {
        errs.push(
            format!("{path}.duration"),
            format!("duration {d} must be whole minutes or hours (cron has no seconds)"),
        );
    }
    let mut seen = BTreeSet::new();
    for (j, r) in b.reasons.iter().flatten().enumerate() {
        if !seen.insert(*r) {
            errs.push(
                format!("{path}.reasons[{j}]"),
                format!("duplicate reason {}", r.as_str()),
            );
        }
    }
}

/// "10%" (0-100) or a non-negative count.
pub fn budget_nodes_ok(nodes: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match nodes.strip_suffix('%') {
        Some(pct) => digits(pct) && pct.len() <= 3 && pct.parse::<u32>().is_ok_and(|p| p <= 100),
        None => digits(nodes),
    }
}

fn check_label_selector(errs: &mut ValidationErrors, path: &str, sel: &LabelSelector) {
    for (k, v) in sel.match_labels.iter().flatten() {
        let p = format!("{path}.matchLabels[{k:?}]");
        if let Err(e) = qualified_name(k) {
            errs.push(&p, e);
        }
        if let Err(e) = label_value(v) {
            errs.push(p, e);
        }
    }
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        if let Err(m) = qualified_name(&e.key) {
            errs.push(format!("{p}.key"), m);
        }
        let n = e.values.as_ref().map_or(0, Vec::len);
        match e.operator.as_str() {
            "In" | "NotIn" if n == 0 => errs.push(
                format!("{p}.values"),
                format!("operator {} needs at least one value", e.operator),
            ),
            "Exists" | "DoesNotExist" if n > 0 => errs.push(
                format!("{p}.values"),
                format!("operator {} takes no values, got {n}", e.operator),
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.push(
                format!("{p}.operator"),
                format!("operator {other:?} must be one of In, NotIn, Exists, DoesNotExist"),
            ),
        }
    }
}

/// A label key: optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let labels_ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !labels_ok {
            return Err(format!(
                "key {key:?}: prefix {p:?} must be a lowercase DNS subdomain"
            ));
        }
    }
    if name.is_empty() || name.len() > 63 || !name_chars_ok(name) {
        return Err(format!(
            "key {key:?}: name part must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ));
    }
    Ok(())
}

/// Whether `s` is a DNS label (RFC 1123), as namespace names are.
pub fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A label value: empty, or at most 63 characters of [A-Za-z0-9-_.] starting and ending
/// alphanumeric.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 || !name_chars_ok(value) {
        return Err(format!(
            "value {value:?} must be at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ));
    }
    Ok(())
}

fn name_chars_ok(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&f), Some(&l)) => {
            alnum(f)
                && alnum(l)
                && bytes
                    .iter()
                    .all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values() {
        for ok in [
            "a",
            "kubernetes.io/arch",
            "node.cluster.x-k8s.io",
            "a.b/c_d.e-f",
            "A9",
        ] {
            assert!(qualified_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "-a",
            "a-",
            "UPPER.io/a",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(qualified_name(bad).is_err(), "{bad}");
        }
        assert!(label_value("").is_ok());
        assert!(label_value("on-demand").is_ok());
        assert!(label_value("bad value").is_err());
        assert!(label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn negative_or_unreadable_quantities_name_their_field() {
        let mut np: NodePool = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "np"},
            "spec": {"limits": {"cpu": "-1", "memory": "lots", "nodes": "3"},
                     "template": {"spec": {"requirements": [], "nodeClassRef": {
                         "group": "karpenter.cluster.x-k8s.io", "kind": "ClusterAPINodeClass",
                         "name": "default"}}}}
        }))
        .expect("decodes");
        let e = validate_nodepool(&np).expect_err("invalid");
        assert!(e.has_field("spec.limits.cpu"), "{e}");
        assert!(e.has_field("spec.limits.memory"), "{e}");
        assert!(!e.has_field("spec.limits.nodes"), "{e}");
        np.spec.limits = None;
        assert!(validate_nodepool(&np).is_ok());
    }

    #[test]
    fn budget_nodes() {
        for ok in ["0", "5", "100", "0%", "10%", "100%", "007"] {
            assert!(budget_nodes_ok(ok), "{ok}");
        }
        for bad in ["", "%", "101%", "1000%", "-1", "5.5", "ten", "10 %"] {
            assert!(!budget_nodes_ok(bad), "{bad}");
        }
    }

    #[test]
    fn display_lists_every_error() {
        let mut e = ValidationErrors::default();
        e.push("spec.a", "first");
        e.push("spec.b", "second");
        assert_eq!(e.to_string(), "spec.a: first; spec.b: second");
        assert!(e.has_field("spec.b"));
    }
}
