//! A NodeClass resolved against the node groups: the groups the catalog cannot offer whatever
//! their annotations say, the offerings of the rest, and whether the NodeClass is ready.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use kube::ResourceExt;

use crate::api::nodeclass::ClusterAPINodeClass;
use crate::capi::model::{LabelSelector, MachineDeployment};
use crate::capi::offerings::{self, Context as OfferingContext};
use crate::state::machines::Unreadable;

/// What the catalog knows of each group's infrastructure template and object beyond the
/// groups themselves, by key: the groups it cannot offer whatever their annotations say.
pub(crate) struct LeftOut<'a> {
    /// Those the model cannot read.
    pub(crate) unreadable: &'a BTreeMap<String, Unreadable>,
    /// Those whose infrastructure template does not exist (`Kind namespace/name not found`).
    pub(crate) missing_templates: &'a HashMap<String, String>,
    /// Those whose template's first read has not answered yet.
    pub(crate) unread_templates: &'a HashSet<String>,
    /// Those whose template reads fail (other than not found) and never succeeded, with the
    /// last error.
    pub(crate) failing_templates: &'a HashMap<String, String>,
    /// Those whose replicas their Cluster's topology sets (`capi::topology`), with why.
    pub(crate) replicas_held: &'a HashMap<String, String>,
    /// NodeClasses whose `spec.generate` patches do not apply to their source's template, with
    /// why (the Generator's check).
    pub(crate) generation_refused: &'a HashMap<String, String>,
}

impl LeftOut<'_> {
    /// Why a node group cannot be offered whatever its annotations say: its replicas are not
    /// the controller's to write, or (a MachineDeployment only: `capi::offerings::offering`
    /// judges pools by what their infrastructure pool said) its template is not known yet.
    fn held(&self, md: &MachineDeployment) -> Option<String> {
        let key = md.key();
        if let Some(why) = self.replicas_held.get(&key) {
            return Some(why.clone());
        }
        if let Some(why) = self.missing_templates.get(&key) {
            return Some(format!(
                "infrastructure template {why}: Cluster API cannot create its Machines"
            ));
        }
        if md.is_pool() {
            return None;
        }
        if self.unread_templates.contains(&key) {
            return Some(offerings::TEMPLATE_UNREAD.to_string());
        }
        let error = self.failing_templates.get(&key)?;
        // Complete annotations stand on their own while the template cannot be read; a
        // malformed value is reported as such by the offering itself.
        let annotated = crate::capi::autoscaler::parse_scalable(md)
            .map(|(sfz, _)| sfz.cpu.is_some() && sfz.memory.is_some())
            .unwrap_or(true);
        (!annotated).then(|| {
            format!(
                "its capacity is not known: its infrastructure template could not be read ({error}) and the annotations do not give cpu and memory; offered once a read succeeds"
            )
        })
    }
}

/// What one NodeClass resolves to, and whether it is ready (the Catalog actor publishes this;
/// `explain` computes it the same way from a one-off read). A NodeClass whose fields validation
/// refuses (objects stored before the CRD refused them) resolves to nothing; MachineDeployments
/// it selects that cannot be read are problems like malformed annotations, and stay selected
/// (`offerings::Catalog::unknown`): what cannot be read is never taken for gone.
pub(crate) fn resolve_nodeclass(
    nc: &ClusterAPINodeClass,
    mds: &[Arc<MachineDeployment>],
    left_out: &LeftOut<'_>,
    cx: &OfferingContext<'_>,
) -> (offerings::Catalog, Result<(), String>) {
    if let Err(e) = crate::api::validate_nodeclass(nc) {
        return (offerings::Catalog::default(), Err(e.to_string()));
    }
    let selector = nc
        .spec
        .scalable_resource_selector
        .as_ref()
        .map(LabelSelector::try_from);
    let sel = match selector.transpose() {
        Ok(sel) => sel,
        Err(e) => {
            return (
                offerings::Catalog::default(),
                Err(format!("spec.scalableResourceSelector: {e}")),
            );
        }
    };
    let mut usable = Vec::with_capacity(mds.len());
    let mut held = Vec::new();
    for md in mds {
        match left_out.held(md) {
            None => usable.push(md.clone()),
            Some(why) => held.push((md, why)),
        }
    }
    let mut c = offerings::build(sel.as_ref(), &usable, cx);
    for (md, why) in held {
        if !offerings::selected(md, sel.as_ref()) {
            continue;
        }
        if why == offerings::TEMPLATE_UNREAD {
            c.pending.push(md.key());
        }
        c.leave_out_unknown(md, why);
    }
    for (key, u) in left_out.unreadable {
        let member = u.labels.contains_key(crate::api::wellknown::MEMBER_LABEL);
        if member && sel.as_ref().is_none_or(|s| s.matches(&u.labels)) {
            let why = format!("cannot be read: {}", u.error);
            c.problems.push(format!("MachineDeployment {key}: {why}"));
            c.selected.insert(key.clone());
            c.unknown.insert(key.clone(), why);
        }
    }
    if let Some(g) = &nc.spec.generate {
        let name = nc.name_any();
        let refused = left_out.generation_refused.get(&name).map(String::as_str);
        offerings::add_generated(&name, g, refused, mds, cx, &mut c);
    }
    c.unread = c
        .selected
        .iter()
        .filter(|k| left_out.unread_templates.contains(*k))
        .cloned()
        .collect();
    let ready = readiness(&c);
    (c, ready)
}

pub(super) fn readiness(c: &offerings::Catalog) -> Result<(), String> {
    if c.deployments.is_empty() {
        let mut m = "selects no usable MachineDeployment (a MachineDeployment needs the node.cluster.x-k8s.io/karpenter-member label and must match spec.scalableResourceSelector)".to_string();
        if !c.problems.is_empty() {
            m.push_str(": ");
            m.push_str(&c.problems.join("; "));
        }
        return Err(m);
    }
    Ok(())
}
