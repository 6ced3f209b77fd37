//! With `--karpenter-objects management`, the objects that name this Cluster
//! (`cluster.x-k8s.io/cluster-name`) but cannot be bound to it: their
//! `karpenter.cluster.x-k8s.io/cluster-namespace` label is missing or no namespace name. The
//! watches never see them (their selector names both labels), so without this check a NodePool
//! missing one label would just do nothing. The CRDs cannot refuse them: CEL rules in a CRD
//! read no `metadata.labels`. Each is named in a Warning Event (`InvalidClusterBinding`, object
//! and field) in the management cluster, at activation and every [`PERIOD`] after (the Events'
//! own repeat window keeps that from writing the same Event again).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::ListParams;
use kube::core::ClusterResourceScope;

use super::Shared;
use crate::api::nodeclaim::NodeClaim;
use crate::api::nodeclass::ClusterAPINodeClass;
use crate::api::nodeoverlay::NodeOverlay;
use crate::api::nodepool::NodePool;
use crate::view::binding::{Binding, BindingError};

/// How often the management cluster is looked at again.
const PERIOD: Duration = Duration::from_secs(60);

pub(crate) struct Bindings {
    shared: Arc<Shared>,
}

/// Start the check when Karpenter's objects are in the management cluster.
pub(crate) fn start(shared: &Arc<Shared>) {
    if shared.settings.karpenter_objects.is_some() {
        let bindings = Bindings {
            shared: shared.clone(),
        };
        shared.router.actors().start(bindings);
    }
}

super::registry::stoppable!(Bindings);

impl Actor for Bindings {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.look(ctx);
        ctx.run_interval(PERIOD, Self::look);
    }
}

impl Bindings {
    fn look(&mut self, ctx: &mut Context<Self>) {
        let Some(binding) = self.shared.settings.karpenter_objects.clone() else {
            return;
        };
        let shared = self.shared.clone();
        ctx.spawn(
            async move {
                for (object, e) in misbound(&shared, &binding).await {
                    tracing::warn!(error = %e, "Karpenter object not bound to its Cluster");
                    shared
                        .events
                        .warning(object, "InvalidClusterBinding", e.to_string());
                }
            }
            .into_actor(self),
        );
    }
}

/// Every object of Karpenter's kinds naming this Cluster whose binding is broken.
async fn misbound(shared: &Shared, b: &Binding) -> Vec<(ObjectReference, BindingError)> {
    let mut found = misbound_of::<NodePool>(shared, b).await;
    found.extend(misbound_of::<ClusterAPINodeClass>(shared, b).await);
    found.extend(misbound_of::<NodeOverlay>(shared, b).await);
    found.extend(misbound_of::<NodeClaim>(shared, b).await);
    found
}

async fn misbound_of<K>(shared: &Shared, b: &Binding) -> Vec<(ObjectReference, BindingError)>
where
    K: kube::Resource<DynamicType = (), Scope = ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let params = ListParams::default().labels(&b.name_selector());
    let listed = match shared.api::<K>().list_metadata(&params).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, kind = %K::kind(&()), "listing objects naming this Cluster failed; looking again later");
            return Vec::new();
        }
    };
    let kind = K::kind(&()).into_owned();
    (listed.items.into_iter())
        .filter_map(|o| {
            let name = o.metadata.name.clone().unwrap_or_default();
            let labels = o.metadata.labels.clone().unwrap_or_default();
            let e = b.check(&kind, &name, &labels).err()?;
            let object = ObjectReference {
                api_version: Some(K::api_version(&()).into_owned()),
                kind: Some(kind.clone()),
                name: Some(name),
                uid: o.metadata.uid.clone(),
                ..Default::default()
            };
            Some((object, e))
        })
        .collect()
}
