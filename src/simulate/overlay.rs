//! `simulate --scenario overlay`: the pods scenario with two NodeOverlays created before the
//! controller starts. One states a negotiated price for the largest size, below the smallest
//! size's price, so that every claim (also those a smaller, cheaper size would hold without the
//! overlay) launches on it; the other carries a malformed price. The report
//! counts the claims by instance type (all on the overlaid type when the overlay reached
//! provisioning) and shows each overlay's `Ready` condition (the malformed one refused, naming
//! the field, or refused by the API server outright where it checks the CRD's pattern).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::pods::{self, PodReport, SIZES};
use super::{Error, Kept};
use crate::api::wellknown::INSTANCE_TYPE_LABEL;
use crate::cli::SimulateArgs;

/// The overlay that makes the largest size the cheapest.
pub const NEGOTIATED: &str = "negotiated-price";
/// The overlay with a price the CRD's pattern refuses.
pub const MALFORMED: &str = "malformed-price";
/// The negotiated price per hour.
pub const NEGOTIATED_PRICE: &str = "0.05";
/// What the malformed overlay says instead of a price adjustment.
const MALFORMED_ADJUSTMENT: &str = "-15 percent";

#[derive(Clone, Debug, Default, Serialize)]
pub struct OverlayStatus {
    pub name: String,
    /// How the API server answered the create (`created`, or its refusal).
    pub create: String,
    pub ready: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct OverlaySection {
    /// The size the negotiated price applies to, its price before, and after.
    pub overlaid_type: String,
    pub base_price: f64,
    pub overlay_price: f64,
    /// Claims made, by instance type.
    pub claims_by_type: BTreeMap<String, usize>,
    /// Every claim launched on the overlaid type.
    pub picked_overlay_cheapest: bool,
    /// The malformed overlay was refused (by the API server, or on its status naming the
    /// field) and never applied.
    pub malformed_refused: bool,
    pub overlays: Vec<OverlayStatus>,
}

pub struct OverlayReport {
    pub pods: PodReport,
    pub overlay: OverlaySection,
}

impl OverlayReport {
    pub fn invariants_ok(&self) -> bool {
        self.pods.launch.invariants_ok
            && self.overlay.picked_overlay_cheapest
            && self.overlay.malformed_refused
    }

    pub fn to_json(&self) -> String {
        let section = serde_json::to_value(&self.overlay).unwrap_or(Value::Null);
        self.pods
            .to_json_with("overlay", section, self.invariants_ok())
    }
}

impl std::fmt::Display for OverlayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.pods)?;
        let o = &self.overlay;
        writeln!(
            f,
            "  overlay:  {NEGOTIATED} prices {} at {} (from {}); claims by type: {}; all on {}: {}",
            o.overlaid_type,
            o.overlay_price,
            o.base_price,
            o.claims_by_type
                .iter()
                .map(|(t, n)| format!("{t} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            o.overlaid_type,
            o.picked_overlay_cheapest
        )?;
        for s in &o.overlays {
            writeln!(
                f,
                "            {}: {}; Ready {} {} {}",
                s.name,
                s.create,
                s.ready.as_deref().unwrap_or("-"),
                s.reason.as_deref().unwrap_or("-"),
                s.message.as_deref().unwrap_or("")
            )?;
        }
        write!(f, "  malformed overlay refused: {}", o.malformed_refused)
    }
}

/// The scenario, handing back the cluster and the controller (`--serve` keeps them).
pub async fn run_kept(args: &SimulateArgs) -> Result<(OverlayReport, Kept), Error> {
    let sim = super::start_sim(args).await?;
    super::announce(&sim, args, "nodeoverlays,pods,nodeclaims,nodes");
    pods::seed_machine_deployments(&sim, args).await?;
    pods::seed_nodepool(&sim, |_| {}).await?;
    let mds = args.machine_deployments.clamp(1, SIZES.len());
    let (overlaid_type, _, _, base) = SIZES[mds - 1];
    let creates = sim
        .run(move |c| async move { create_overlays(c.client(), overlaid_type).await })
        .await??;
    let p = pods::provision_on(sim, args, |_, _| {}, |_| {}).await?;
    let mut report = p.measure();
    report.launch.scenario = "overlay".into();
    let store = p.sim.cluster().store();
    let mut claims_by_type: BTreeMap<String, usize> = BTreeMap::new();
    for c in store.list("nodeclaims", None) {
        let t = c
            .pointer("/metadata/labels")
            .and_then(|l| l.get(INSTANCE_TYPE_LABEL))
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        *claims_by_type.entry(t).or_default() += 1;
    }
    // Through the API, not the store: on the real backend the store mirrors only some kinds.
    let overlays = p
        .sim
        .run(move |c| async move { overlay_statuses(c.client(), creates).await })
        .await?;
    let malformed_refused = overlays.iter().any(|s| {
        s.name == MALFORMED
            && (s.create != "created"
                || (s.ready.as_deref() == Some("False")
                    && s.message
                        .as_deref()
                        .is_some_and(|m| m.contains("spec.priceAdjustment"))))
    });
    let picked_overlay_cheapest =
        !claims_by_type.is_empty() && claims_by_type.keys().all(|t| t == overlaid_type);
    let overlay = OverlaySection {
        overlaid_type: overlaid_type.to_string(),
        base_price: base.parse().unwrap_or_default(),
        overlay_price: NEGOTIATED_PRICE.parse().unwrap_or_default(),
        claims_by_type,
        picked_overlay_cheapest,
        malformed_refused,
        overlays,
    };
    Ok((
        OverlayReport {
            pods: report,
            overlay,
        },
        p.kept(),
    ))
}

/// Each overlay's `Ready` condition as the API serves it, beside how its create was answered.
async fn overlay_statuses(
    client: kube::Client,
    creates: Vec<(String, String)>,
) -> Vec<OverlayStatus> {
    let api: kube::Api<crate::api::NodeOverlay> = kube::Api::all(client);
    let mut out = Vec::new();
    for (name, create) in creates {
        let ready = api.get_opt(&name).await.ok().flatten().and_then(|o| {
            o.conditions()
                .iter()
                .find(|c| c.type_ == crate::api::conditions::READY)
                .cloned()
        });
        out.push(OverlayStatus {
            ready: ready.as_ref().map(|c| c.status.as_str().to_string()),
            reason: ready.as_ref().map(|c| c.reason.clone()),
            message: ready.map(|c| c.message),
            name,
            create,
        });
    }
    out
}

/// Creates the two overlays; returns how the API server answered each.
async fn create_overlays(
    client: kube::Client,
    overlaid_type: &str,
) -> Result<Vec<(String, String)>, Error> {
    let api: kube::Api<crate::api::NodeOverlay> = kube::Api::all(client);
    let objects = [
        json!({
            "apiVersion": "karpenter.sh/v1alpha1",
            "kind": "NodeOverlay",
            "metadata": {"name": NEGOTIATED},
            "spec": {
                "weight": 10,
                "requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [overlaid_type]}],
                "price": NEGOTIATED_PRICE,
            }
        }),
        json!({
            "apiVersion": "karpenter.sh/v1alpha1",
            "kind": "NodeOverlay",
            "metadata": {"name": MALFORMED},
            "spec": {
                "requirements": [{"key": INSTANCE_TYPE_LABEL, "operator": "Exists"}],
                "priceAdjustment": MALFORMED_ADJUSTMENT,
            }
        }),
    ];
    let mut out = Vec::new();
    for o in objects {
        let name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let overlay: crate::api::NodeOverlay =
            serde_json::from_value(o).map_err(|e| Error::Usage(e.to_string()))?;
        let answer = match api.create(&Default::default(), &overlay).await {
            Ok(_) => "created".to_string(),
            Err(kube::Error::Api(e)) if e.code == 422 => format!("refused: {}", e.message),
            Err(source) => {
                return Err(Error::Kube {
                    what: format!("creating NodeOverlay {name}"),
                    source,
                });
            }
        };
        out.push((name, answer));
    }
    Ok(out)
}
