//! Discovery documents (`/api`, `/apis`, `/apis/{group}/{version}`, `/version`) in the
//! unaggregated form that kube's `Discovery::run()` and kubectl's fallback path read.

use serde_json::{Value, json};

use super::registry::{Registry, ResourceDef};

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-karpenter-capi-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]
    })
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let groups = registry.groups();
    let (g, vs) = groups.iter().find(|(g, _)| g == name)?;
    let mut doc = group_json(g, vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

const ALL_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn resource_entries(def: &ResourceDef) -> Vec<Value> {
    let mut out = vec![json!({
        "name": def.plural,
        "singularName": def.singular,
        "namespaced": def.namespaced,
        "kind": def.kind,
        "verbs": ALL_VERBS,
        "shortNames": def.short_names,
        "categories": if def.builtin { json!([]) } else { json!(["all"]) },
    })];
    if def.status {
        out.push(json!({
            "name": format!("{}/status", def.plural), "singularName": "", "namespaced": def.namespaced,
            "kind": def.kind, "verbs": ["get", "patch", "update"]
        }));
    }
    if def.scale {
        out.push(json!({
            "name": format!("{}/scale", def.plural), "singularName": "", "namespaced": def.namespaced,
            "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]
        }));
    }
    for action in &def.actions {
        let (group, version, kind) = match action.as_str() {
            "eviction" => ("policy", "v1", "Eviction"),
            _ => ("", "v1", "Binding"),
        };
        out.push(json!({
            "name": format!("{}/{action}", def.plural), "singularName": "", "namespaced": def.namespaced,
            "group": group, "version": version, "kind": kind, "verbs": ["create"]
        }));
    }
    out
}

/// The APIResourceList of one group version, or None when it is not served.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources: Vec<Value> = registry
        .in_group_version(group, version)
        .flat_map(resource_entries)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// Whether an Accept header leaves room for a plain (unaggregated) JSON answer.
pub fn accepts_plain_json(accept: Option<&str>) -> bool {
    let Some(accept) = accept else { return true };
    accept.split(',').any(|part| {
        let mut params = part.split(';').map(str::trim);
        let media = params.next().unwrap_or_default();
        let aggregated =
            params.any(|p| p.starts_with("g=apidiscovery.k8s.io") || p.starts_with("as="));
        !aggregated && matches!(media, "application/json" | "*/*" | "application/*" | "")
    })
}

/// The OpenAPI v3 index (`/openapi/v3`): one document per served group version, as
/// kube-apiserver lists them. kubectl reads it to learn that the server validates fields itself
/// (`fieldValidation`), and otherwise refuses to `apply` or `create` without `--validate=false`.
pub fn openapi_v3_index(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    let mut add = |gv_path: String| {
        let url = format!("/openapi/v3/{gv_path}");
        paths.insert(gv_path, json!({"serverRelativeURL": url}));
    };
    add("api/v1".into());
    for (group, versions) in registry.groups() {
        for v in versions {
            add(format!("apis/{group}/{v}"));
        }
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of one group version, or None when it is not served. It describes
/// the operations (with their `x-kubernetes-group-version-kind` and query parameters, enough for
/// kubectl's field-validation check) but no schemas: the simulated server validates no fields of
/// custom resources (docs/simulated-cluster.md).
pub fn openapi_v3_group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for def in registry.in_group_version(group, version) {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let collection = if def.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", def.plural)
        } else {
            format!("{prefix}/{}", def.plural)
        };
        let gvk = json!({"group": group, "version": version, "kind": def.kind});
        let op = |action: &str, params: &[&str]| {
            let parameters: Vec<Value> = params
                .iter()
                .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
                .collect();
            json!({
                "operationId": format!("{action}{}", def.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}},
            })
        };
        let writes = ["dryRun", "fieldManager", "fieldValidation"];
        paths.insert(
            collection.clone(),
            json!({"get": op("list", &["labelSelector", "fieldSelector", "limit", "continue", "watch"]),
                   "post": op("post", &writes)}),
        );
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"get": op("get", &[]), "put": op("put", &writes), "patch": op("patch", &writes),
                   "delete": op("delete", &["dryRun", "gracePeriodSeconds", "propagationPolicy"])}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": version_info_git()},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

fn version_info_git() -> Value {
    version()["gitVersion"].clone()
}
