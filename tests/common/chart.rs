//! The Helm chart read without Helm, as tests/deploy and tests/docs_claims.rs read it. The
//! templates are written so that, with every line holding a template action removed, what is
//! left is valid YAML: their fixed parts (rules, hardening, probes) can be checked without Helm.
//! tests/docs_claims.rs includes this file alone, so it imports nothing from `common`.

use serde_json::Value;

/// The chart, relative to the repository.
pub const CHART: &str = "deploy/helm/karpenter-capi";

/// The YAML documents of `text`, empty ones left out; `origin` names it in a failure.
pub fn yaml_docs(text: &str, origin: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{origin}: not valid YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// The YAML documents of a Helm template, its lines holding template actions removed.
pub fn stripped_docs(template: &str, origin: &str) -> Vec<Value> {
    let kept: Vec<&str> = template.lines().filter(|l| !l.contains("{{")).collect();
    yaml_docs(&kept.join("\n"), origin)
}

/// The strings of a YAML list; none when `v` is not a list.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
