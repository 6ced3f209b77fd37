//! The Generator's API calls: reading a source, creating or adopting the two copies, rolling a
//! group out, and deleting only what carries a NodeClass's mark.

use std::collections::HashSet;
use std::sync::Arc;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{ApiResource, DynamicObject};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::{ORPHAN_GRACE, TemplateKind};
use crate::capi::generate::{self, GENERATED_LABEL, GroupPlan};
use crate::capi::model::MachineDeployment;
use crate::capi::version::{self, CapiVersion};

/// The source's infrastructure template, as stored.
pub(super) async fn read_source_template(
    client: &Client,
    source: &MachineDeployment,
) -> Result<Value, String> {
    let r = &source.infrastructure_ref;
    let ar = template_resource(client, &r.api_group, r.version.clone(), &r.kind).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &source.namespace, &ar);
    let t = api
        .get(&r.name)
        .await
        .map_err(|e| format!("get {} {}/{}: {e}", r.kind, source.namespace, r.name))?;
    serde_json::to_value(t).map_err(|e| e.to_string())
}

async fn template_resource(
    client: &Client,
    group: &str,
    pinned: Option<String>,
    kind: &str,
) -> Result<ApiResource, String> {
    crate::capi::template::template_resource(client, group, pinned, kind)
        .await
        .map_err(|e| e.to_string())
}

/// The new template copy of `plan` created (or adopted), and the group as `plan` makes it from
/// the source as stored now, with the API it is written through.
async fn copy_template_and_group(
    client: &Client,
    plan: &GroupPlan,
    source: &MachineDeployment,
) -> Result<(Api<DynamicObject>, ApiResource, Value), String> {
    let template = read_source_template(client, source).await?;
    let copy = plan.template_object(&template).map_err(|e| e.to_string())?;
    let r = &source.infrastructure_ref;
    let ar = template_resource(client, &r.api_group, r.version.clone(), &r.kind).await?;
    create_or_adopt(client, &ar, plan, copy).await?;
    let md_ar = source.kind.resource(source.version);
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), &source.namespace, &md_ar);
    let raw = mds
        .get(&source.name)
        .await
        .map_err(|e| format!("get MachineDeployment {}: {e}", source.key()))?;
    let raw = serde_json::to_value(raw).map_err(|e| e.to_string())?;
    let group = plan.group_object(&raw, source);
    Ok((mds, md_ar, group))
}

/// Create `plan`'s template then its MachineDeployment, each adopted if it exists already
/// with this NodeClass's mark.
pub(super) async fn create_group(
    client: Client,
    plan: GroupPlan,
    source: Arc<MachineDeployment>,
) -> Result<(), String> {
    let (_, md_ar, group) = copy_template_and_group(&client, &plan, &source).await?;
    create_or_adopt(&client, &md_ar, &plan, group).await
}

/// Create the new template copy, then point the group at it with the source's Machine
/// template (one JSON patch, with the source digest it now follows).
pub(super) async fn roll_out_group(
    client: Client,
    plan: GroupPlan,
    source: Arc<MachineDeployment>,
) -> Result<(), String> {
    let (mds, _, group) = copy_template_and_group(&client, &plan, &source).await?;
    let digest_path = format!(
        "/metadata/annotations/{}",
        generate::SOURCE_DIGEST_ANNOTATION.replace('/', "~1")
    );
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/spec/template", "value": group["spec"]["template"]},
        {"op": "add", "path": digest_path, "value": plan.source_digest},
    ]))
    .map_err(|e| e.to_string())?;
    mds.patch(&plan.name, &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .map_err(|e| format!("patch MachineDeployment {}: {e}", plan.key()))?;
    Ok(())
}

async fn create_or_adopt(
    client: &Client,
    ar: &ApiResource,
    plan: &GroupPlan,
    object: Value,
) -> Result<(), String> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(&plan.name)
        .to_string();
    let what = format!("{} {}/{name}", ar.kind, plan.namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &plan.namespace, ar);
    let obj: DynamicObject = serde_json::from_value(object).map_err(|e| format!("{what}: {e}"))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {
            tracing::info!(object = %what, nodeclass = %plan.nodeclass, shape = %plan.shape.name(), "generated");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api
                .get(&name)
                .await
                .map_err(|e| format!("get {what}: {e}"))?;
            if existing.labels().get(GENERATED_LABEL) == Some(&plan.nodeclass) {
                Ok(())
            } else {
                Err(format!(
                    "{what} exists and was not generated by ClusterAPINodeClass {}; left alone",
                    plan.nodeclass
                ))
            }
        }
        Err(e) => Err(format!("create {what}: {e}")),
    }
}

/// Delete a generated group, only as the index saw it (a scale-up since then conflicts), then
/// its template.
pub(super) async fn delete_group(client: Client, md: Arc<MachineDeployment>) -> Result<(), String> {
    if generate::generated_by(&md.labels).is_none() {
        return Err(format!("{} carries no generated mark", md.key()));
    }
    let ar = md.kind.resource(md.version);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &md.namespace, &ar);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some(md.resource_version.clone()),
            uid: Some(md.uid.clone()),
        }),
        ..DeleteParams::background()
    };
    match api.delete(&md.name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(format!("delete {}: {e}", md.key())),
    }
    let r = &md.infrastructure_ref;
    let tar = template_resource(&client, &r.api_group, r.version.clone(), &r.kind).await?;
    delete_marked_template(&client, &tar, &md.namespace, &r.name).await
}

/// Delete a template only if it carries the mark.
async fn delete_marked_template(
    client: &Client,
    ar: &ApiResource,
    ns: &str,
    name: &str,
) -> Result<(), String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    let t = match api.get_opt(name).await {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(()),
        Err(e) => return Err(format!("get {} {ns}/{name}: {e}", ar.kind)),
    };
    if !t.labels().contains_key(GENERATED_LABEL) {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: t.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => {
            tracing::info!(kind = %ar.kind, template = %format!("{ns}/{name}"), "removed generated template");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(format!("delete {} {ns}/{name}: {e}", ar.kind)),
    }
}

pub(super) async fn sweep_templates(
    client: Client,
    kind: &TemplateKind,
    referenced: &HashSet<String>,
    creating: &HashSet<String>,
) -> Result<(), String> {
    let ar = template_resource(&client, &kind.group, kind.version.clone(), &kind.kind).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &kind.namespace, &ar);
    let list = api
        .list(&ListParams::default().labels(GENERATED_LABEL))
        .await
        .map_err(|e| e.to_string())?;
    // A MachineSet of an older revision still names its template until Cluster API scales it
    // away (a rollout).
    let mut referenced = referenced.clone();
    for version in [CapiVersion::V1Beta1, CapiVersion::V1Beta2] {
        let sets: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &kind.namespace,
            &version::machine_set_resource(version),
        );
        let Ok(sets) = sets.list(&ListParams::default()).await else {
            continue;
        };
        for ms in sets.items {
            if let Some(n) = ms
                .data
                .pointer("/spec/template/spec/infrastructureRef/name")
                .and_then(Value::as_str)
            {
                referenced.insert(format!("{}/{}/{n}", kind.namespace, kind.kind));
            }
        }
        break;
    }
    let now = jiff::Timestamp::now();
    for t in list.items {
        let name = t.name_any();
        let key = format!("{}/{name}", kind.namespace);
        let old_enough =
            t.metadata.creation_timestamp.as_ref().is_some_and(|c| {
                now.duration_since(c.0).as_secs() >= ORPHAN_GRACE.as_secs() as i64
            });
        if referenced.contains(&format!("{}/{}/{name}", kind.namespace, kind.kind))
            || creating.contains(&key)
            || !old_enough
        {
            continue;
        }
        delete_marked_template(&client, &ar, &kind.namespace, &name).await?;
    }
    Ok(())
}
