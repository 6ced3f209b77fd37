//! CustomResourceDefinitions generated from our types, rendered as YAML for `deploy/crds` and
//! the `crds` command.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use super::nodeclaim::NodeClaim;
use super::nodeclass::ClusterAPINodeClass;
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

/// Every CRD this project serves, in a stable order.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        NodePool::crd(),
        NodeClaim::crd(),
        ClusterAPINodeClass::crd(),
    ]
    .into_iter()
    .map(tidy)
    .collect()
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
    fn renders_three_named_documents() {
        let each = render_each().unwrap();
        let names: Vec<_> = each.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "karpenter.sh_nodepools.yaml",
                "karpenter.sh_nodeclaims.yaml",
                "karpenter.cluster.x-k8s.io_clusterapinodeclasses.yaml"
            ]
        );
        let all = render_yaml().unwrap();
        assert_eq!(all.matches("---\n").count(), 3);
        assert!(all.contains("name: nodepools.karpenter.sh"));
        let dir = tempfile::tempdir().unwrap();
        write_dir(dir.path()).unwrap();
        let written =
            std::fs::read_to_string(dir.path().join("karpenter.sh_nodeclaims.yaml")).unwrap();
        assert_eq!(written, each[1].1);
    }
}
