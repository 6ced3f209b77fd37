//! The values inside the scale-from-zero annotations, one parser or check each: quantities,
//! Go integers, prices, the labels and taints lists (entry by entry, what is skipped and why),
//! label keys and values, and GPU types. `Parser` in the parent puts them together.

use std::collections::BTreeMap;

use super::{Dropped, Problem, Taint, TaintEffect};
use crate::api::resources::Quantity;
use crate::api::wellknown::NVIDIA_GPU_RESOURCE;

/// A gpu-type with a `/` names an extended resource, so it must be a valid resource name (a
/// qualified name); without one it is the GPU model, published as a label value.
pub(super) fn gpu_type_problem(gpu_type: &str) -> Option<String> {
    if gpu_type.contains('/') {
        validate_label_key(gpu_type)
            .err()
            .map(|e| format!("not a valid extended resource name: {e}"))
    } else {
        validate_label_value(gpu_type)
            .err()
            .map(|e| format!("not a valid GPU model (a label value): {e}"))
    }
}

/// Labels a MachineDeployment may not set on its nodes: the node's own name, and Karpenter's
/// domain (the controller sets those itself), except `karpenter.sh/capacity-type`, which is how a
/// MachineDeployment declares its capacity type.
pub(super) fn restricted_label(key: &str) -> Option<String> {
    let domain = key.split_once('/').map_or("", |(d, _)| d);
    if key == crate::api::wellknown::HOSTNAME_LABEL {
        return Some(format!("label {key:?} is restricted: it is set per node"));
    }
    if (domain == "karpenter.sh" || domain.ends_with(".karpenter.sh"))
        && key != crate::api::wellknown::CAPACITY_TYPE_LABEL
    {
        return Some(format!(
            "label {key:?} is restricted: the karpenter.sh domain is set by the controller"
        ));
    }
    None
}

/// See the module documentation for the rule.
pub(super) fn gpu_resource(gpu_type: &str) -> String {
    if gpu_type.contains('/') {
        gpu_type.to_string()
    } else {
        NVIDIA_GPU_RESOURCE.to_string()
    }
}

pub(super) fn parse_quantity(raw: &str) -> Result<Quantity, Problem> {
    let q: Quantity = raw.parse()?;
    if q.is_negative() {
        return Err(Problem::Negative);
    }
    Ok(q)
}

/// A base-10 integer as Go's `strconv.ParseInt`/`Atoi` read one, which is how the autoscaler
/// reads counts and sizes: an optional `+` or `-`, then ASCII digits only, within 64 bits.
pub(super) fn parse_go_int(raw: &str) -> Result<i64, Problem> {
    let digits = raw.strip_prefix(['+', '-']).unwrap_or(raw);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::NotAnInteger);
    }
    // Rust's own parse takes the same sign; only an overflow can fail here.
    raw.parse::<i64>().map_err(|_| Problem::NotAnInteger)
}

pub(super) fn non_negative(n: i64) -> Result<i64, Problem> {
    if n < 0 { Err(Problem::Negative) } else { Ok(n) }
}

pub(super) fn parse_price(raw: &str) -> Result<f64, Problem> {
    // Only plain decimals: Rust would also accept "inf", "NaN" and "1e400".
    let plain = !raw.is_empty()
        && raw
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'+');
    let price: f64 = if plain {
        raw.parse().map_err(|_| Problem::NotAPrice)?
    } else {
        return Err(Problem::NotAPrice);
    };
    if !price.is_finite() {
        return Err(Problem::NotAPrice);
    }
    if price < 0.0 {
        return Err(Problem::Negative);
    }
    Ok(price)
}

/// `k=v,k2=v2`; blank entries (a trailing comma) are ignored. CA clusterapi_unstructured.go:
/// 215-224 (kubernetes/autoscaler@35e8a280425c) passes over an entry without `=` and lets a
/// later entry for a key win, and never refuses the annotation; so here a bad entry is passed
/// over (and recorded), never the group. It does not check the rest; here an entry a Node could
/// not carry, or a label this controller sets itself, is passed over as well.
pub(super) fn parse_labels(raw: &str) -> (BTreeMap<String, String>, Vec<Dropped>) {
    let mut labels = BTreeMap::new();
    let mut dropped = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match parse_label(entry) {
            Ok((key, value)) => {
                if let Some(earlier) = labels.insert(key.to_string(), value.to_string())
                    && earlier != value
                {
                    dropped.push((
                        format!("{key}={earlier}"),
                        "a later entry sets the same label, and wins (as in Cluster Autoscaler)"
                            .to_string(),
                    ));
                }
            }
            Err(why) => dropped.push((entry.to_string(), why)),
        }
    }
    (labels, dropped)
}

pub(super) fn parse_label(entry: &str) -> Result<(&str, &str), String> {
    let (key, value) = entry
        .split_once('=')
        .ok_or_else(|| "expected key=value".to_string())?;
    let (key, value) = (key.trim(), value.trim());
    validate_label_key(key)?;
    validate_label_value(value)?;
    match restricted_label(key) {
        Some(why) => Err(why),
        None => Ok((key, value)),
    }
}

/// `key=value:Effect` or `key:Effect`, comma separated; blank entries are ignored. CA
/// clusterapi_unstructured.go:258-276 (kubernetes/autoscaler@35e8a280425c) passes over an entry
/// it cannot read (its parseTaint, :658-696, refuses more than one `:` or `=`, and a key or value
/// that is not a valid label key or value) and lets a later entry with the same key and effect
/// replace the earlier one; so here too a bad entry is passed over (and recorded), never the
/// group. It keeps an entry with no effect, or an effect that is none of the three, with that
/// effect; the scheduler ignores such a taint (it acts on NoSchedule and NoExecute, and scores
/// PreferNoSchedule), so passing it over here changes nothing but says so.
pub(super) fn parse_taints(raw: &str) -> (Vec<Taint>, Vec<Dropped>) {
    let mut taints = Vec::new();
    let mut dropped = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match parse_taint(entry) {
            Ok(taint) => {
                if let Some(earlier) = upsert_taint(&mut taints, taint.clone())
                    && earlier != taint
                {
                    dropped.push((
                        earlier.to_string(),
                        "a later entry has the same key and effect, and replaces it (as in \
                         Cluster Autoscaler)"
                            .to_string(),
                    ));
                }
            }
            Err(why) => dropped.push((entry.to_string(), why)),
        }
    }
    (taints, dropped)
}

pub(super) fn parse_taint(entry: &str) -> Result<Taint, String> {
    const FORM: &str = "expected key=value:Effect or key:Effect";
    let parts: Vec<&str> = entry.split(':').collect();
    let (key_value, effect) = match parts.as_slice() {
        [key_value, effect] => (*key_value, effect.trim()),
        [_] => {
            return Err(format!(
                "no effect ({FORM}); a taint without one keeps no pod off a node"
            ));
        }
        _ => return Err(format!("more than one ':' ({FORM})")),
    };
    let (key, value) = match key_value.split('=').collect::<Vec<_>>().as_slice() {
        [key] => (key.trim(), None),
        [key, value] => (key.trim(), Some(value.trim())),
        _ => return Err(format!("more than one '=' ({FORM})")),
    };
    validate_label_key(key)?;
    if let Some(v) = value {
        validate_label_value(v)?;
    }
    let effect = match effect {
        "" => {
            return Err(format!(
                "no effect ({FORM}); a taint without one keeps no pod off a node"
            ));
        }
        other => TaintEffect::parse(other).ok_or_else(|| {
            format!(
                "effect {other:?} is not NoSchedule, PreferNoSchedule or NoExecute; the \
                 scheduler ignores a taint with any other effect"
            )
        })?,
    };
    Ok(Taint {
        key: key.to_string(),
        value: value.filter(|v| !v.is_empty()).map(str::to_string),
        effect,
    })
}

/// Puts `taint` in place of the one with its key and effect, else at the end, as CA
/// clusterapi_unstructured.go:265-275 (kubernetes/autoscaler@35e8a280425c) merges taints; returns
/// the one it replaced.
pub(super) fn upsert_taint(taints: &mut Vec<Taint>, taint: Taint) -> Option<Taint> {
    match taints
        .iter_mut()
        .find(|t| t.key == taint.key && t.effect == taint.effect)
    {
        Some(slot) => Some(std::mem::replace(slot, taint)),
        None => {
            taints.push(taint);
            None
        }
    }
}

/// A Kubernetes qualified name: optional DNS-subdomain prefix (<= 253) and `/`, then a name of
/// 1..=63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub(crate) fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        validate_dns_subdomain(prefix).map_err(|why| format!("key {key:?}: prefix {why}"))?;
    }
    if name.is_empty() {
        return Err(format!("key {key:?}: name part must not be empty"));
    }
    validate_name_part(name).map_err(|why| format!("key {key:?}: {why}"))
}

/// Empty, or 1..=63 characters of the name-part alphabet.
pub(crate) fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    validate_name_part(value).map_err(|why| format!("value {value:?}: {why}"))
}

pub(super) fn validate_name_part(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("longer than 63 characters".into());
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if !s.starts_with(alnum) || !s.ends_with(alnum) {
        return Err("must start and end with a letter or digit".into());
    }
    if let Some(c) = s
        .chars()
        .find(|&c| !(alnum(c) || c == '-' || c == '_' || c == '.'))
    {
        return Err(format!("character {c:?} is not allowed"));
    }
    Ok(())
}

pub(super) fn validate_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    for label in s.split('.') {
        let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.starts_with(lower_alnum)
            && label.ends_with(lower_alnum)
            && label.chars().all(|c| lower_alnum(c) || c == '-');
        if !ok {
            return Err(format!("{s:?} is not a lowercase DNS subdomain"));
        }
    }
    Ok(())
}
