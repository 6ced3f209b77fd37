//! CustomResourceDefinitions generated from our types, rendered as YAML for `deploy/crds` and
//! the `crds` command.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::capacity_buffer::CapacityBuffer;
use super::capacity_quota::CapacityQuota;
use super::nodeclaim::NodeClaim;
use super::nodeclass::ClusterAPINodeClass;
use super::nodeoverlay::NodeOverlay;
use super::nodepool::NodePool;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rendering CRD {name} as YAML: {source}")]
    Yaml {
        name: String,
        #[source]
        source: serde_saphyr::SerializeError,
    },
    #[error("writing {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Every CRD this project serves, in a stable order. CapacityBuffer is SIG Autoscaling's, shared
/// with Cluster Autoscaler; it is generated here as upstream Karpenter ships it.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        (NodePool::crd(), true),
        (NodeClaim::crd(), false),
        (ClusterAPINodeClass::crd(), true),
        (NodeOverlay::crd(), true),
        (CapacityBuffer::crd(), true),
        (CapacityQuota::crd(), true),
    ]
    .into_iter()
    .map(|(crd, strict)| upstream_validation(tidy(crd), strict))
    .collect()
}

/// Upstream's pattern for `resource.Quantity` strings (limits, requests, capacity).
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
/// Upstream's pattern for requirement values (a label value).
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// Upstream's pattern for a condition reason when the reason is required.
pub const REASON_PATTERN: &str = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";

/// Validation upstream's CRDs carry that the Rust types cannot express through schemars:
/// - every Quantity (`x-kubernetes-int-or-string`) gets upstream's quantity pattern;
/// - requirement `values` get `maxLength: 63` and the label-value pattern. Upstream puts both on
///   the array (where kube-apiserver does not apply them to the elements); they are kept there
///   to match, and repeated on the items, where they take effect;
/// - with `strict_conditions` (NodePool, ClusterAPINodeClass, as upstream), conditions require
///   `reason` and `message`, and `reason` is non-empty. NodeClaim's upstream schema leaves them
///   optional, so it stays so.
fn upstream_validation(
    crd: CustomResourceDefinition,
    strict_conditions: bool,
) -> CustomResourceDefinition {
    use serde_json::{Value, json};
    fn walk(v: &mut Value, key: Option<&str>, strict: bool) {
        let Value::Object(m) = v else {
            return;
        };
        if m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            m.entry("pattern").or_insert(json!(QUANTITY_PATTERN));
        }
        if key == Some("requirements")
            && let Some(values) = m
                .get_mut("items")
                .and_then(|i| i.pointer_mut("/properties/values"))
                .and_then(Value::as_object_mut)
        {
            values.insert("maxLength".into(), json!(63));
            values.insert("pattern".into(), json!(LABEL_VALUE_PATTERN));
            if let Some(items) = values.get_mut("items").and_then(Value::as_object_mut) {
                items.insert("maxLength".into(), json!(63));
                items.insert("pattern".into(), json!(LABEL_VALUE_PATTERN));
            }
        }
        if key == Some("conditions")
            && strict
            && let Some(item) = m.get_mut("items").and_then(Value::as_object_mut)
        {
            item.insert(
                "required".into(),
                json!(["lastTransitionTime", "message", "reason", "status", "type"]),
            );
            if let Some(reason) = item
                .get_mut("properties")
                .and_then(|p| p.get_mut("reason"))
                .and_then(Value::as_object_mut)
            {
                reason.insert("minLength".into(), json!(1));
                reason.insert("pattern".into(), json!(REASON_PATTERN));
                // The type's serde default (`""`) cannot meet `minLength: 1`, and kube-apiserver
                // rejects a CRD whose default fails its own schema (found by
                // tests/control_plane.rs); upstream has no default here either.
                reason.remove("default");
            }
        }
        let keys: Vec<String> = m.keys().cloned().collect();
        for k in keys {
            if let Some(child) = m.get_mut(&k) {
                match child {
                    Value::Object(_) => walk(child, Some(&k), strict),
                    Value::Array(a) => a.iter_mut().for_each(|c| walk(c, None, strict)),
                    _ => {}
                }
            }
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut value, None, strict_conditions);
    serde_json::from_value(value).unwrap_or(crd)
}

/// Removes the `null` that schemars lists among the values of an optional enum: the field is
/// already `nullable`, and the API server would otherwise have to accept `null` as a value.
fn tidy(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::Array(values)) = m.get_mut("enum") {
                    values.retain(|x| !x.is_null());
                }
                m.values_mut().for_each(walk);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// The file name a CRD is written to: `<group>_<plural>.yaml`, as upstream names them.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

fn render_one(crd: &CustomResourceDefinition) -> Result<String, Error> {
    serde_saphyr::to_string(crd).map_err(|source| Error::Yaml {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })
}

/// All CRDs as one multi-document YAML stream (`---` separated).
pub fn render_yaml() -> Result<String, Error> {
    let docs = render_each()?;
    let mut out = String::new();
    for (_, yaml) in docs {
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

/// Each CRD with its file name.
pub fn render_each() -> Result<Vec<(String, String)>, Error> {
    all()
        .iter()
        .map(|crd| Ok((file_name(crd), render_one(crd)?)))
        .collect()
}

/// Writes one file per CRD into `dir` (created if missing).
pub fn write_dir(dir: &Path) -> Result<(), Error> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (name, yaml) in render_each()? {
        let path = dir.join(name);
        std::fs::write(&path, yaml).map_err(io(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_named_document() {
        let each = render_each().unwrap();
        let names: Vec<_> = each.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "karpenter.sh_nodepools.yaml",
                "karpenter.sh_nodeclaims.yaml",
                "karpenter.cluster.x-k8s.io_clusterapinodeclasses.yaml",
                "karpenter.sh_nodeoverlays.yaml",
                "autoscaling.x-k8s.io_capacitybuffers.yaml",
                "autoscaling.x-k8s.io_capacityquotas.yaml"
            ]
        );
        let all = render_yaml().unwrap();
        assert_eq!(all.matches("---\n").count(), 6);
        assert!(all.contains("name: nodepools.karpenter.sh"));
        let dir = tempfile::tempdir().unwrap();
        write_dir(dir.path()).unwrap();
        let written =
            std::fs::read_to_string(dir.path().join("karpenter.sh_nodeclaims.yaml")).unwrap();
        assert_eq!(written, each[1].1);
    }

    /// kube-apiserver validates each `default` against its own schema and rejects the CRD
    /// otherwise; this holds the string bounds where no API server is at hand (the real one
    /// checks everything in tests/control_plane.rs).
    #[test]
    fn every_string_default_meets_its_own_length_bounds() {
        fn walk(v: &serde_json::Value, at: &str, bad: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(serde_json::Value::String(d)) = m.get("default") {
                        let len = d.chars().count() as u64;
                        let min = m.get("minLength").and_then(|x| x.as_u64()).unwrap_or(0);
                        let max = m.get("maxLength").and_then(|x| x.as_u64());
                        if len < min || max.is_some_and(|max| len > max) {
                            bad.push(at.to_string());
                        }
                    }
                    for (k, c) in m {
                        walk(c, &format!("{at}.{k}"), bad);
                    }
                }
                serde_json::Value::Array(a) => a.iter().for_each(|c| walk(c, at, bad)),
                _ => {}
            }
        }
        for crd in all() {
            let mut bad = Vec::new();
            walk(&serde_json::to_value(&crd).unwrap(), "", &mut bad);
            assert!(bad.is_empty(), "{:?}: {bad:?}", crd.metadata.name);
        }
    }
}
