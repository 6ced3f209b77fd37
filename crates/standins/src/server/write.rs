//! The write verbs: create, update, patch (JSON, merge and strategic merge), delete and the
//! scale subresource, with the admission, audit and violation records each write makes.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::drain_audit::{self, Removal, Violation};
use crate::errors::ApiError;
use crate::event_versions::{self};
use crate::eviction;
use crate::managed_fields;
use crate::patch::{self, PatchError};
use crate::pdb_expected::WorkloadDefs;
use crate::registry::ResourceDef;
use crate::store::{DeleteOpts, Inner, Part};

use super::{Query, Shared, Target, current, rendered};

/// Whether a create or update body is JSON (no Content-Type is read as JSON, as kube does).
pub(super) fn is_json_body(content_type: &str) -> bool {
    matches!(content_type, "" | "application/json" | "*/*")
}

/// A written object in its storage's shape (core/v1 Events are stored as events.k8s.io/v1).
pub(super) fn stored(def: &ResourceDef, mut obj: Value) -> Value {
    if event_versions::is_core_event(def) {
        event_versions::to_stored(&mut obj);
    }
    obj
}

pub(super) fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// Create, update, patch, delete and the pod actions; returns (HTTP code, body).
pub(super) fn write(
    shared: &Shared,
    target: &Target,
    query: &Query,
    verb: &str,
    content_type: &str,
    body: &Bytes,
    agent: &str,
) -> Result<(u16, Value), ApiError> {
    let def = &target.def;
    let ns = target.ns();
    let name = target.name.clone().unwrap_or_default();
    // Every object this request writes records it in managedFields, as kube-apiserver does.
    let _manager = managed_fields::writing_as(managed_fields::Manager {
        name: managed_fields::manager_name(query.get("fieldManager"), agent),
        subresource: target.sub().to_string(),
    });
    // Bodies are JSON (protobuf and CBOR are not decoded): anything else is 415, as
    // kube-apiserver answers a media type it has no serializer for; clients then resend as JSON.
    if verb != "patch" && verb != "delete" && !is_json_body(content_type) {
        return Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json",
        ));
    }
    // A dry run must not write, and nothing here can evaluate a write without making it. It is
    // asked for in the query, or for a delete in the DeleteOptions body (as kubectl does).
    let dry_in_body = verb == "delete"
        && parse_body(body)?
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| !d.is_empty());
    if dry_in_body || query.get("dryRun").is_some_and(|d| !d.is_empty()) {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the simulated API server (docs/simulated-cluster.md)",
        ));
    }
    let (code, obj) = match (verb, target.sub()) {
        ("create", "binding") => {
            let b = parse_body(body)?;
            let mut inner = shared.store.lock();
            (201, eviction::bind(&mut inner, def, ns, &name, &b)?)
        }
        ("create", "eviction") => {
            let b = parse_body(body)?;
            let pdbs = shared
                .registry
                .lookup("policy", "v1", "poddisruptionbudgets")
                .cloned();
            let workloads = WorkloadDefs::of(&shared.registry);
            let mut inner = shared.store.lock();
            let broken = audit_removal(shared, &inner, target, &name, Removal::Eviction, agent);
            let status =
                eviction::evict(&mut inner, def, pdbs.as_ref(), &workloads, ns, &name, &b)?;
            record_violations(shared, broken, ns, &name, agent);
            (201, status)
        }
        ("create", _) => {
            let obj = parse_body(body)?;
            if let Some(body_ns) = obj.pointer("/metadata/namespace").and_then(Value::as_str)
                && def.namespaced
                && !body_ns.is_empty()
                && body_ns != ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            let created = shared.store.lock().create(def, ns, stored(def, obj))?;
            (201, rendered(created, target))
        }
        ("update", "scale") => (200, update_scale(shared, target, parse_body(body)?)?),
        ("update", sub) => {
            let part = if sub == "status" {
                Part::Status
            } else {
                Part::Main
            };
            let updated =
                shared
                    .store
                    .lock()
                    .update(def, ns, &name, stored(def, parse_body(body)?), part)?;
            (200, rendered(updated, target))
        }
        ("patch", sub) => {
            check_patch_type(def, content_type)?;
            let p = parse_body(body)?;
            (200, patch_object(shared, target, sub, content_type, &p)?)
        }
        ("delete", _) => {
            let opts = delete_opts(query, &parse_body(body)?);
            let mut inner = shared.store.lock();
            let broken = audit_removal(shared, &inner, target, &name, Removal::Delete, agent);
            let gone = inner.delete(def, ns, &name, &opts)?;
            drop(inner);
            record_violations(shared, broken, ns, &name, agent);
            (200, rendered(gone, target))
        }
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "{verb} is not supported on this path"
            )));
        }
    };
    let written_name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(String::from)
        .unwrap_or(name);
    shared
        .stats
        .record_write(verb, &def.plural, target.sub(), ns, &written_name, agent);
    Ok((code, obj))
}

/// The controller's pod removals are audited against Karpenter's drain rules (`drain_audit`);
/// everybody else (the kubelet's final delete, a user) may remove pods as they like.
pub(super) fn audit_removal(
    shared: &Shared,
    inner: &Inner,
    target: &Target,
    name: &str,
    how: Removal,
    agent: &str,
) -> Vec<Violation> {
    let is_pod = target.def.builtin && target.def.group.is_empty() && target.def.plural == "pods";
    if !is_pod || !agent.starts_with(CONTROLLER_AGENT_PREFIX) {
        return Vec::new();
    }
    drain_audit::audit(
        inner,
        &shared.registry,
        &target.def,
        target.ns(),
        name,
        how,
        drain_audit::Asked {
            at: jiff::Timestamp::now(),
            claims_elsewhere: shared.claims_elsewhere.get().map(std::sync::Arc::as_ref),
        },
    )
}

pub(super) fn record_violations(
    shared: &Shared,
    broken: Vec<Violation>,
    ns: &str,
    name: &str,
    agent: &str,
) {
    for v in broken {
        tracing::warn!(pod = %format!("{ns}/{name}"), violation = ?v, "simulated server: drain rule broken");
        shared.stats.record_violation(v, ns, name, agent);
    }
}

/// The User-Agent the controller's clients send (`karpenter-capi/<version>`, maybe with a
/// suffix naming the replica).
pub(super) const CONTROLLER_AGENT_PREFIX: &str = "karpenter-capi";

pub(super) fn delete_opts(query: &Query, body: &Value) -> DeleteOpts {
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or_else(|| query.get("propagationPolicy"));
    let orphan_flag = body
        .get("orphanDependents")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    DeleteOpts {
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
        orphan: policy == Some("Orphan") || orphan_flag,
        grace_period: body
            .get("gracePeriodSeconds")
            .and_then(Value::as_i64)
            .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok())),
    }
}

/// The patch types a resource accepts, in kube-apiserver's order: strategic merge only for
/// built-in kinds; server-side apply (`application/apply-patch+yaml`) is not implemented.
pub(super) fn patch_types(def: &ResourceDef) -> &'static [&'static str] {
    if def.builtin {
        &[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ]
    } else {
        &[
            "application/json-patch+json",
            "application/merge-patch+json",
        ]
    }
}

/// 415 with kube-apiserver's message when `content_type` is not a patch type `def` accepts
/// (checked before the object is looked up, as the real handler does).
pub(super) fn check_patch_type(def: &ResourceDef, content_type: &str) -> Result<(), ApiError> {
    let accepted = patch_types(def);
    if accepted.contains(&content_type) {
        return Ok(());
    }
    Err(ApiError::unsupported_media_type(format!(
        "the body of the request was in an unknown format - accepted media types include: {}",
        accepted.join(", ")
    )))
}

/// Applies `p` to `doc`, the caller's own copy of the object (patched in place, not copied again).
pub(super) fn apply_patch(
    def: &ResourceDef,
    content_type: &str,
    mut doc: Value,
    p: &Value,
) -> Result<Value, ApiError> {
    check_patch_type(def, content_type)?;
    let to_api = |e: PatchError| match e {
        PatchError::Malformed(m) => ApiError::bad_request(m),
        PatchError::Failed(m) => ApiError::invalid(m),
    };
    match content_type {
        "application/merge-patch+json" => {
            patch::merge_patch(&mut doc, p);
            Ok(doc)
        }
        "application/json-patch+json" => patch::json_patch(doc, p).map_err(to_api),
        _ => {
            patch::strategic_merge(&mut doc, p).map_err(to_api)?;
            Ok(doc)
        }
    }
}

pub(super) fn patch_object(
    shared: &Shared,
    target: &Target,
    sub: &str,
    content_type: &str,
    p: &Value,
) -> Result<Value, ApiError> {
    let def = &target.def;
    let name = target.name.clone().unwrap_or_default();
    if sub == "scale" {
        let scale = scale_of(&current(shared, target)?);
        let patched = apply_patch(def, content_type, scale, p)?;
        return update_scale(shared, target, patched);
    }
    let mut inner = shared.store.lock();
    let cur = inner
        .get(def, target.ns(), &name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, &name))?;
    let patched = stored(
        def,
        apply_patch(def, content_type, rendered(cur, target), p)?,
    );
    let part = if sub == "status" {
        Part::Status
    } else {
        Part::Main
    };
    let updated = inner.update(def, target.ns(), &name, patched, part)?;
    Ok(rendered(updated, target))
}

/// The autoscaling/v1 Scale view of an object with a scale subresource.
pub(super) fn scale_of(obj: &Value) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or_default();
    let pick = |f: &str| meta.get(f).cloned().unwrap_or(Value::Null);
    let selector = match obj.pointer("/status/selector") {
        Some(Value::String(s)) => s.clone(),
        _ => crate::selectors::match_labels_query(obj),
    };
    let mut scale_meta = json!({
        "name": pick("name"), "uid": pick("uid"), "resourceVersion": pick("resourceVersion"),
        "creationTimestamp": pick("creationTimestamp"),
    });
    if let Some(ns) = meta.get("namespace") {
        scale_meta["namespace"] = ns.clone();
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": scale_meta,
        "spec": {"replicas": obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0)},
        "status": {
            "replicas": obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
            "selector": selector,
        }
    })
}

pub(super) fn update_scale(
    shared: &Shared,
    target: &Target,
    scale: Value,
) -> Result<Value, ApiError> {
    let def = &target.def;
    let name = target.name.clone().unwrap_or_default();
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .filter(|r| *r >= 0)
        .ok_or_else(|| ApiError::invalid(format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: must be greater than or equal to 0")))?;
    let mut inner = shared.store.lock();
    let cur = inner
        .get(def, target.ns(), &name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, &name))?;
    let mut new = cur;
    if let Some(rv) = scale.pointer("/metadata/resourceVersion") {
        crate::store::set_meta(&mut new, "resourceVersion", rv.clone());
    }
    match new.get_mut("spec").and_then(Value::as_object_mut) {
        Some(spec) => {
            spec.insert("replicas".into(), json!(replicas));
        }
        None => {
            if let Some(o) = new.as_object_mut() {
                o.insert("spec".into(), json!({"replicas": replicas}));
            }
        }
    }
    let updated = inner.update(def, target.ns(), &name, new, Part::Main)?;
    Ok(scale_of(&updated))
}
