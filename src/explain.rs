//! `karpenter-capi explain`: why a pod is pending or where it went, what a NodeClaim waits
//! for, what a NodePool can launch, what stops a node's disruption and what its removal would
//! take. Read-only, against a live cluster, and answered by the
//! controller's own code: the cluster is read once into the controller's indexes and catalog
//! view ([`cluster`]), then the snapshot builder, the solver (with
//! [`crate::scheduling::explain`]), the catalog and the disruption view decide, as they would in
//! the controller. Each report is serializable (`-o json`) and displays as text.

pub mod cluster;
pub(crate) mod node;
pub(crate) mod nodeclaim;
pub(crate) mod nodepool;
pub(crate) mod pod;

use serde::Serialize;

use crate::scheduling::Offering;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing {what}: {source}")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("Cluster API: {0}")]
    Capi(String),
    #[error("{kind} {name} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("{0}")]
    BadArgument(String),
}

/// One offering as a report shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct OfferingView {
    pub(crate) machine_deployment: String,
    pub(crate) instance_type: String,
    pub(crate) zone: Option<String>,
    pub(crate) capacity_type: String,
    pub(crate) price: f64,
    pub(crate) available: bool,
    /// Why it is unavailable, when it is.
    pub(crate) unavailable_reason: Option<String>,
    pub(crate) replicas: i32,
    pub(crate) max_size: Option<i32>,
    /// The NodeOverlay that set the price, and the price before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) price_overlay: Option<PriceOverlayView>,
}

/// Where an offering's price came from, when a NodeOverlay set it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct PriceOverlayView {
    pub(crate) overlay: String,
    pub(crate) base_price: f64,
}

impl OfferingView {
    pub(crate) fn new(instance_type: &str, o: &Offering) -> Self {
        Self {
            machine_deployment: o.machine_deployment.clone(),
            instance_type: instance_type.to_string(),
            zone: o.zone.clone(),
            capacity_type: o.capacity_type.clone(),
            price: o.price,
            available: o.available,
            unavailable_reason: (!o.available)
                .then(|| crate::scheduling::explain::unavailable_reason(o)),
            replicas: o.replicas,
            max_size: o.max_size,
            price_overlay: None,
        }
    }

    /// The same, saying which NodeOverlay set the price for `pool` (as the catalog records it).
    pub(crate) fn overlaid(
        mut self,
        catalog: &crate::view::catalog::CatalogView,
        pool: Option<&str>,
    ) -> Self {
        self.price_overlay = catalog
            .price_overlay(&self.machine_deployment, pool)
            .map(|p| PriceOverlayView {
                overlay: p.overlay,
                base_price: p.base_price,
            });
        self
    }

    /// One line: `md  type  zone  capacity-type  $price/h  replicas/max  available`.
    pub(crate) fn line(&self) -> String {
        format!(
            "{} (type {}, zone {}, {}, ${:.4}/h, {} replicas{}){}",
            self.machine_deployment,
            self.instance_type,
            self.zone.as_deref().unwrap_or("-"),
            self.capacity_type,
            self.price,
            self.replicas,
            self.max_size
                .map(|m| format!(" of max {m}"))
                .unwrap_or_default(),
            match &self.unavailable_reason {
                Some(r) => format!(": unavailable, {r}"),
                None => String::new(),
            }
        ) + &self
            .price_overlay
            .as_ref()
            .map(|p| {
                format!(
                    "; price {} after overlay {} (was {})",
                    self.price, p.overlay, p.base_price
                )
            })
            .unwrap_or_default()
    }
}

/// `kube` timestamps as RFC 3339, for reports.
pub(crate) fn ts(t: jiff::Timestamp) -> String {
    t.to_string()
}

/// `karpenter-capi explain ...`: read the cluster and render the report.
pub async fn run(cmd: crate::cli::ExplainCommand) -> Result<String, RunError> {
    use crate::cli::{ExplainCommand, ExplainOutput};
    let args = match &cmd {
        ExplainCommand::Pod { args, .. }
        | ExplainCommand::Nodeclaim { args, .. }
        | ExplainCommand::Nodepool { args, .. }
        | ExplainCommand::Node { args, .. } => args,
    };
    crate::app::check_binding(&args.cluster_api)?;
    let (workload, management) =
        crate::app::clients(args.kubeconfig.as_deref(), &args.cluster_api).await?;
    let settings = crate::app::settings(&args.controller, &args.cluster_api);
    let cluster = cluster::read(
        workload,
        management,
        crate::app::capi_version(args.cluster_api.cluster_api_version),
        settings,
    )
    .await?;
    let json = args.output == ExplainOutput::Json;
    let render = |text: String, value: serde_json::Result<serde_json::Value>| {
        if json {
            value
                .map(|v| format!("{v:#}\n"))
                .map_err(|e| RunError::Render(e.to_string()))
        } else {
            Ok(text)
        }
    };
    match &cmd {
        ExplainCommand::Pod { target, .. } => {
            let r = pod::explain(&cluster, target)?;
            render(r.to_string(), serde_json::to_value(&r))
        }
        ExplainCommand::Nodeclaim { name, .. } => {
            let r = nodeclaim::explain(&cluster, name)?;
            render(r.to_string(), serde_json::to_value(&r))
        }
        ExplainCommand::Nodepool { name, .. } => {
            let r = nodepool::explain(&cluster, name)?;
            render(r.to_string(), serde_json::to_value(&r))
        }
        ExplainCommand::Node { name, remove, .. } => {
            let r = node::explain(&cluster, name, *remove)?;
            render(r.to_string(), serde_json::to_value(&r))
        }
    }
}

/// Everything `explain` and `init` can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Clients(#[from] crate::app::Error),
    #[error(transparent)]
    Explain(#[from] Error),
    #[error("rendering the report: {0}")]
    Render(String),
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;
    use crate::api::requirements::Requirements;
    use crate::api::resources::{Quantity, Resources};
    use crate::api::wellknown::INSTANCE_TYPE_LABEL;
    use crate::capi::offerings::Catalog;
    use crate::scheduling::InstanceType;
    use crate::view::catalog::CatalogView;

    fn one_type(name: &str, price: f64) -> InstanceType {
        InstanceType {
            name: name.into(),
            requirements: Requirements::default(),
            capacity: Resources::new().with("cpu", Quantity::from_units(4)),
            overhead: Resources::default(),
            offerings: vec![Offering {
                machine_deployment: format!("ns/md-{name}"),
                zone: None,
                capacity_type: "on-demand".into(),
                price,
                available: true,
                labels: BTreeMap::from([(INSTANCE_TYPE_LABEL.to_string(), name.to_string())]),
                taints: Vec::new(),
                replicas: 0,
                max_size: None,
            }],
            csi_limits: Default::default(),
        }
    }

    /// The launch takes the offering that is cheapest after the overlay, and the report says
    /// which overlay set its price and what it was before.
    #[test]
    fn an_overlaid_price_is_chosen_and_explained() {
        let overlay: crate::api::NodeOverlay = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
            "metadata": {"name": "negotiated"},
            "spec": {"requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": ["big"]}], "price": "0.19"},
        }))
        .unwrap();
        let mut catalog = Catalog {
            instance_types: vec![one_type("small", 0.3), one_type("big", 0.5)],
            ..Default::default()
        };
        crate::capi::overlay::apply(&[&overlay], &mut [&mut catalog], &[]);
        let view = CatalogView::default();
        view.insert("nc", catalog, None);
        let choice = view
            .resolve(
                "nc",
                None,
                &Requirements::default(),
                &Resources::new(),
                &HashSet::new(),
                &[],
            )
            .unwrap();
        assert_eq!((choice.instance_type.as_str(), choice.price), ("big", 0.19));
        let types = view.instance_types("nc");
        let big = types.iter().find(|t| t.name == "big").unwrap();
        let line = OfferingView::new("big", &big.offerings[0])
            .overlaid(&view, None)
            .line();
        assert!(
            line.ends_with("; price 0.19 after overlay negotiated (was 0.5)"),
            "{line}"
        );
        let small = types.iter().find(|t| t.name == "small").unwrap();
        let line = OfferingView::new("small", &small.offerings[0])
            .overlaid(&view, None)
            .line();
        assert!(!line.contains("overlay"), "{line}");
    }
}
