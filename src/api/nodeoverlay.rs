//! NodeOverlay (karpenter.sh/v1alpha1): adjusts the price of, and adds extended-resource
//! capacity to, the instance types its requirements select, ordered by weight. On Cluster API,
//! where prices come from an annotation someone typed, this is where negotiated prices,
//! reserved discounts and GPU slices are stated once.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::nodeclaim::Operator;

/// Upstream's condition type: the overlay passed runtime validation and conflicts with no
/// overlay of the same weight.
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
/// Reason when runtime validation refuses the overlay.
pub const REASON_RUNTIME_VALIDATION: &str = "RuntimeValidation";
/// Reason when an overlay of the same weight already changes what this one would.
pub const REASON_CONFLICT: &str = "Conflict";

/// NodeOverlaySpec: which instance types, and what changes on them.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1alpha1",
    kind = "NodeOverlay",
    plural = "nodeoverlays",
    singular = "nodeoverlay",
    status = "NodeOverlayStatus",
    category = "karpenter",
    shortname = "overlays",
    derive = "PartialEq",
    derive = "Default",
    doc = "NodeOverlay adjusts prices and capacity of the instance types it selects",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","priority":1,"jsonPath":".spec.weight"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "message": "cannot set both 'price' and 'priceAdjustment'",
        "rule": "!has(self.price) || !has(self.priceAdjustment)"
    }
]))]
pub struct NodeOverlaySpec {
    /// Which instance types (and offerings) the overlay applies to: well-known labels, the
    /// offering's labels, or `karpenter.sh/capacity-type`.
    #[schemars(
        length(max = 100),
        transform = overlay_requirements_cel
    )]
    pub requirements: Vec<OverlayRequirement>,
    /// A change to the price: `+x`/`-x` (absolute) or `+x%`/`-x%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(([+-]{1}(\d*\.?\d+))|(\+{1}\d*\.?\d+%)|(^(-\d{1,2}(\.\d+)?%)$)|(-100%))$"
    ))]
    pub price_adjustment: Option<String>,
    /// The price itself, replacing what the catalog states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\d+(\.\d+)?$"))]
    pub price: Option<String>,
    /// Extended resources added to the selected instance types (never cpu, memory,
    /// ephemeral-storage or pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "message": "invalid resource restricted",
            "rule": "self.all(x, !(x in ['cpu', 'memory', 'ephemeral-storage', 'pods']))"
        }
    ]))]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// Higher weights win; absent means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub weight: Option<i32>,
}

/// One requirement of an overlay (no `minValues`, unlike a NodePool's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OverlayRequirement {
    /// The label key that the selector applies to.
    #[schemars(
        length(max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
        ),
        extend("x-kubernetes-validations" = [
            {
                "message": "label domain \"karpenter.sh\" is restricted",
                "rule": "self in [\"karpenter.sh/capacity-type\", \"karpenter.sh/nodepool\"] || !self.find(\"^([^/]+)\").endsWith(\"karpenter.sh\")"
            },
            {
                "message": "label \"kubernetes.io/hostname\" is restricted",
                "rule": "self != \"kubernetes.io/hostname\""
            }
        ])
    )]
    pub key: String,
    /// Represents a key's relationship to a set of values.
    pub operator: Operator,
    /// Values for In/NotIn; one integer for Gt/Lt/Gte/Lte; none for Exists/DoesNotExist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub values: Option<Vec<String>>,
}

impl OverlayRequirement {
    pub fn values(&self) -> &[String] {
        self.values.as_deref().unwrap_or_default()
    }
}

/// Upstream's CEL rules on an overlay's requirement list (they differ from a NodePool's: NotIn
/// needs values too, and there is no minValues).
fn overlay_requirements_cel(schema: &mut schemars::Schema) {
    schema.insert("x-kubernetes-list-type".into(), "atomic".into());
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([
            {
                "message": "requirements with operator 'NotIn' must have a value defined",
                "rule": "self.all(x, x.operator == 'NotIn' ? x.values.size() != 0 : true)"
            },
            {
                "message": "requirements with operator 'In' must have a value defined",
                "rule": "self.all(x, x.operator == 'In' ? x.values.size() != 0 : true)"
            },
            {
                "message": "requirements operator 'Gt', 'Lt', 'Gte' or 'Lte' must have a single positive integer value",
                "rule": "self.all(x, (x.operator == 'Gt' || x.operator == 'Lt' || x.operator == 'Gte' || x.operator == 'Lte') ? (x.values.size() == 1 && int(x.values[0]) >= 0) : true)"
            }
        ]),
    );
}

/// NodeOverlayStatus defines the observed state of NodeOverlay.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeOverlayStatus {
    /// Conditions contains signals for health and readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

impl NodeOverlay {
    /// The weight, 0 when absent (as upstream orders them).
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }

    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }
}

/// How an overlay changes a price.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PriceChange {
    /// `price`: the price itself.
    Set(f64),
    /// `priceAdjustment: +x` / `-x`.
    Add(f64),
    /// `priceAdjustment: +x%` / `-x%`.
    Percent(f64),
}

impl PriceChange {
    /// The price after the change, never below zero (upstream clamps there).
    pub fn apply(self, price: f64) -> f64 {
        let p = match self {
            PriceChange::Set(p) => p,
            PriceChange::Add(d) => price + d,
            PriceChange::Percent(pct) => price * (1.0 + pct / 100.0),
        };
        p.max(0.0)
    }
}

impl std::fmt::Display for PriceChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PriceChange::Set(p) => write!(f, "price {p}"),
            PriceChange::Add(d) => write!(f, "priceAdjustment {d:+}"),
            PriceChange::Percent(p) => write!(f, "priceAdjustment {p:+}%"),
        }
    }
}

/// Why a price string is refused, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {value:?} {why}")]
pub struct PriceError {
    pub field: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// The overlay's price change, if any. The grammar is upstream's CRD patterns (a server with
/// the CRD refuses anything else; one without it, or an object stored before, is caught here),
/// and a number too large for a float is refused too: upstream would parse it to infinity.
pub fn price_change(spec: &NodeOverlaySpec) -> Result<Option<PriceChange>, PriceError> {
    let err = |field, value: &str, why| PriceError {
        field,
        value: value.to_string(),
        why,
    };
    if let (Some(_), Some(_)) = (&spec.price, &spec.price_adjustment) {
        return Err(err(
            "spec.price",
            spec.price.as_deref().unwrap_or_default(),
            "cannot be set with spec.priceAdjustment",
        ));
    }
    if let Some(p) = &spec.price {
        if !is_decimal(p, false) {
            return Err(err(
                "spec.price",
                p,
                "is not a non-negative decimal number (e.g. 0.19)",
            ));
        }
        return finite(p.parse().ok())
            .map(|v| Some(PriceChange::Set(v)))
            .ok_or_else(|| err("spec.price", p, "is too large"));
    }
    let Some(a) = &spec.price_adjustment else {
        return Ok(None);
    };
    let malformed = || {
        err(
            "spec.priceAdjustment",
            a,
            "is not +x, -x, +x% or -x% (at most -100%)",
        )
    };
    let (sign, rest) = match a.chars().next() {
        Some('+') => (1.0, &a[1..]),
        Some('-') => (-1.0, &a[1..]),
        _ => return Err(malformed()),
    };
    match rest.strip_suffix('%') {
        Some(pct) => {
            if !is_decimal(pct, true) {
                return Err(malformed());
            }
            // Upstream's pattern: a decrease has at most two integer digits, or is -100%.
            if sign < 0.0
                && pct != "100"
                && pct
                    .split('.')
                    .next()
                    .is_none_or(|i| i.len() > 2 || i.is_empty())
            {
                return Err(malformed());
            }
            let v = finite(pct.parse().ok())
                .ok_or_else(|| err("spec.priceAdjustment", a, "is too large"))?;
            Ok(Some(PriceChange::Percent(sign * v)))
        }
        None => {
            if !is_decimal(rest, true) {
                return Err(malformed());
            }
            let v = finite(rest.parse().ok())
                .ok_or_else(|| err("spec.priceAdjustment", a, "is too large"))?;
            Ok(Some(PriceChange::Add(sign * v)))
        }
    }
}

fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite())
}

/// Digits with an optional fraction: `\d+(\.\d+)?`, or with `leading_dot` also `\d*\.\d+`.
fn is_decimal(s: &str, leading_dot: bool) -> bool {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    let int_ok = digits(int) || (leading_dot && int.is_empty() && frac.is_some());
    int_ok && frac.is_none_or(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(price: Option<&str>, adj: Option<&str>) -> NodeOverlaySpec {
        NodeOverlaySpec {
            price: price.map(str::to_string),
            price_adjustment: adj.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn prices_parse_as_upstream_patterns_allow() {
        let ok = |p: Option<&str>, a: Option<&str>| price_change(&spec(p, a)).unwrap();
        assert_eq!(ok(Some("0.19"), None), Some(PriceChange::Set(0.19)));
        assert_eq!(ok(Some("3"), None), Some(PriceChange::Set(3.0)));
        assert_eq!(ok(None, Some("+1.5")), Some(PriceChange::Add(1.5)));
        assert_eq!(ok(None, Some("-.5")), Some(PriceChange::Add(-0.5)));
        assert_eq!(ok(None, Some("+10%")), Some(PriceChange::Percent(10.0)));
        assert_eq!(ok(None, Some("-15.5%")), Some(PriceChange::Percent(-15.5)));
        assert_eq!(ok(None, Some("-100%")), Some(PriceChange::Percent(-100.0)));
        assert_eq!(ok(None, None), None);
    }

    #[test]
    fn malformed_prices_name_the_field() {
        for (p, a, field) in [
            (Some("cheap"), None, "spec.price"),
            (Some("-1"), None, "spec.price"),
            (Some(".5"), None, "spec.price"),
            (Some("1."), None, "spec.price"),
            (None, Some("10%"), "spec.priceAdjustment"),
            (None, Some("-150%"), "spec.priceAdjustment"),
            (None, Some("+x"), "spec.priceAdjustment"),
            (None, Some("+"), "spec.priceAdjustment"),
            (Some("1"), Some("+1"), "spec.price"),
        ] {
            let e = price_change(&spec(p, a)).unwrap_err();
            assert_eq!(e.field, field, "{p:?} {a:?}");
        }
        let huge = format!("1{}", "0".repeat(400));
        assert_eq!(
            price_change(&spec(Some(&huge), None)).unwrap_err().why,
            "is too large"
        );
    }

    #[test]
    fn adjustments_apply_as_upstream_and_clamp_at_zero() {
        assert_eq!(PriceChange::Set(0.19).apply(1.0), 0.19);
        assert!((PriceChange::Add(0.5).apply(1.0) - 1.5).abs() < 1e-12);
        assert_eq!(PriceChange::Add(-5.0).apply(1.0), 0.0);
        assert!((PriceChange::Percent(-25.0).apply(2.0) - 1.5).abs() < 1e-12);
        assert_eq!(PriceChange::Percent(-100.0).apply(2.0), 0.0);
    }
}
