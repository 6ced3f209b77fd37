//! JSON patches with a compare-and-swap guard. Every write that must not clobber a concurrent
//! writer starts with a `test` of the value it was computed from, so a lost race is a clean
//! conflict (re-read, re-plan) rather than a silent overwrite.

use serde_json::{Value, json};

/// Escape a map key for a JSON pointer (`/` and `~` are special).
pub(crate) fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[derive(Clone, Debug, Default)]
pub(crate) struct JsonPatch {
    ops: Vec<Value>,
}

impl JsonPatch {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Guard the whole patch on the object's resourceVersion.
    pub(crate) fn guarded(resource_version: Option<&str>) -> Self {
        let mut p = Self::new();
        if let Some(rv) = resource_version {
            p.test("/metadata/resourceVersion", json!(rv));
        }
        p
    }

    pub(crate) fn test(&mut self, path: &str, value: Value) -> &mut Self {
        self.ops
            .push(json!({"op": "test", "path": path, "value": value}));
        self
    }

    /// `add` replaces an existing member, so it doubles as "set".
    pub(crate) fn set(&mut self, path: &str, value: Value) -> &mut Self {
        self.ops
            .push(json!({"op": "add", "path": path, "value": value}));
        self
    }

    pub(crate) fn remove(&mut self, path: &str) -> &mut Self {
        self.ops.push(json!({"op": "remove", "path": path}));
        self
    }

    /// Set `key` in the string map at `map_path` (e.g. `/metadata/labels`), creating the map
    /// when the object has none (a JSON patch cannot add into a missing parent). `map_exists`
    /// says whether the object (as last read, which the guard pins) has a non-empty map there.
    pub(crate) fn set_entry(
        &mut self,
        map_exists: bool,
        map_path: &str,
        key: &str,
        value: &str,
    ) -> &mut Self {
        if map_exists || self.created(map_path) {
            self.set(&format!("{map_path}/{}", escape(key)), json!(value))
        } else {
            self.set(map_path, json!({ key: value }))
        }
    }

    fn created(&self, map_path: &str) -> bool {
        self.ops
            .iter()
            .any(|op| op["op"] == "add" && op["path"] == map_path)
    }

    pub(crate) fn into_patch(self) -> Result<kube::api::Patch<()>, serde_json::Error> {
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(self.ops))?;
        Ok(kube::api::Patch::Json(patch))
    }
}

/// Send a guarded JSON patch to a cluster-scoped object of `kind` (API resource `resource`), to
/// its status subresource when `status`, with the object named in both kinds of error.
pub(crate) async fn send<K>(
    shared: &super::Shared,
    (kind, resource): (&'static str, &'static str),
    name: &str,
    patch: JsonPatch,
    status: bool,
) -> Result<K, super::Error>
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let patch = patch.into_patch().map_err(|source| super::Error::Patch {
        kind,
        name: name.to_string(),
        source,
    })?;
    let api: kube::Api<K> = kube::Api::all(shared.client_for::<K>());
    let params = kube::api::PatchParams::default();
    let sent = if status {
        api.patch_status(name, &params, &patch).await
    } else {
        api.patch(name, &params, &patch).await
    };
    sent.map_err(super::api_err(&shared.metrics, "patch", resource, name))
}

/// Merge-patch `status.conditions` of a cluster-scoped object, best effort: a failure is logged
/// and the caller's next refresh writes again (the conditions are recomputed from the state).
pub(crate) async fn write_conditions<K>(client: kube::Client, name: String, conditions: Value)
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: kube::Api<K> = kube::Api::all(client);
    let body = json!({"status": {"conditions": conditions}});
    let patch = kube::api::Patch::Merge(&body);
    if let Err(e) = api
        .patch_status(&name, &kube::api::PatchParams::default(), &patch)
        .await
    {
        tracing::warn!(kind = %K::kind(&()), name = %name, error = %e, "updating status conditions failed");
    }
}

/// What a [`write_conditions_guarded`] came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarded {
    Written,
    /// The object changed since the copy the conditions were computed from: compute again
    /// from a newer copy.
    Conflict,
    /// Gone, or the write failed (logged): the caller's next refresh writes again.
    Dropped,
}

/// Merge-patch `status.conditions` of a cluster-scoped object that another writer shares (a
/// ClusterAPINodeClass's: the Catalog writes `Ready`, the NodePools actor `NodesUpToDate` and
/// the rollout counts). A merge patch replaces the list whole, so the write carries the
/// resourceVersion of the copy `conditions` were computed from: a writer a step behind gets a
/// conflict instead of dropping the other's condition, and computes again from its index once
/// that has caught up (no read of its own, which the chart's RBAC does not grant).
pub async fn write_conditions_guarded<K>(
    client: kube::Client,
    name: String,
    resource_version: Option<String>,
    conditions: Value,
) -> Guarded
where
    K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>,
{
    let ar = kube::core::ApiResource::erase::<K>(&());
    let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(client, &ar);
    let body = json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"conditions": conditions},
    });
    let sent = api
        .patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&body),
        )
        .await;
    match sent {
        Ok(_) => Guarded::Written,
        Err(kube::Error::Api(s)) if s.code == 409 => Guarded::Conflict,
        Err(kube::Error::Api(s)) if s.code == 404 => Guarded::Dropped,
        Err(e) => {
            tracing::warn!(kind = %K::kind(&()), name = %name, error = %e, "updating status conditions failed");
            Guarded::Dropped
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_pointer_keys() {
        assert_eq!(
            escape("cluster.x-k8s.io/delete-machine"),
            "cluster.x-k8s.io~1delete-machine"
        );
        assert_eq!(escape("a~b"), "a~0b");
    }

    #[test]
    fn set_entry_creates_a_missing_map_once() {
        let mut p = JsonPatch::guarded(Some("7"));
        p.set_entry(false, "/metadata/annotations", "a/b", "1");
        p.set_entry(false, "/metadata/annotations", "c", "2");
        let ops = serde_json::to_value(&p.ops).unwrap();
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(
            ops[1],
            json!({"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}})
        );
        assert_eq!(
            ops[2],
            json!({"op": "add", "path": "/metadata/annotations/c", "value": "2"})
        );
        assert!(p.into_patch().is_ok());
    }
}
