use super::*;

/// Something whose series a test can create with default labels, so that the exposition
/// shows every family with its labels (and every histogram with its buckets).
pub(super) trait Touch {
    fn touch(&self);
}

impl<L, M, C> Touch for Family<L, M, C>
where
    L: Clone + std::hash::Hash + Eq + Default,
    C: prometheus_client::metrics::family::MetricConstructor<M>,
{
    fn touch(&self) {
        drop(self.get_or_create(&L::default()));
    }
}

impl<N, A> Touch for Gauge<N, A> {
    fn touch(&self) {}
}

impl Touch for Counter {
    fn touch(&self) {}
}

impl Touch for Histogram {
    fn touch(&self) {}
}

pub(super) fn touch(metric: &impl Touch) {
    metric.touch();
}

/// The full exposition with one series in every family, then every declared series name:
/// names, help texts, types, labels and buckets as a dashboard sees them.
/// A family's series come out in hash order, so each family's are sorted.
fn exposition(m: &Metrics) -> String {
    let text = m.encode().replace(env!("CARGO_PKG_VERSION"), "VERSION");
    let mut out = String::new();
    let mut series: Vec<&str> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            series.sort_unstable();
            for s in series.drain(..) {
                out.push_str(s);
                out.push('\n');
            }
            out.push_str(line);
            out.push('\n');
        } else {
            series.push(line);
        }
    }
    out.push_str("# declared\n");
    for name in m.series_names() {
        out.push_str(name);
        out.push('\n');
    }
    out
}

/// Every family keeps its name, help, type, labels and buckets: `tests/fixtures/metrics.txt`
/// was written by the registration before it came from one table. Set
/// `KARPENTER_CAPI_WRITE_FIXTURE=1` to rewrite it after a deliberate change.
#[test]
fn exposition_unchanged() {
    let m = Metrics::new();
    m.touch_all();
    let got = exposition(&m);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/metrics.txt");
    if std::env::var_os("KARPENTER_CAPI_WRITE_FIXTURE").is_some() {
        if let Err(e) = std::fs::write(path, &got) {
            panic!("writing {path}: {e}");
        }
        return;
    }
    let want = include_str!("../../tests/fixtures/metrics.txt");
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "line {} of the exposition differs", i + 1);
    }
    assert_eq!(got.lines().count(), want.lines().count(), "{got}");
}

/// Karpenter v1.15's disruption labels (kubernetes-sigs/karpenter#3179, #3015): the
/// termination mode from the claim's grace period, the policy in snake case, in upstream's
/// label order, and the pods counter beside the claims counter with the same labels.
#[test]
fn disrupted_labels_as_karpenter_v1_15() {
    use crate::api::nodeclaim::NodeClaim;
    use crate::api::nodepool::ConsolidationPolicy;
    let claim = |grace: Option<&str>| -> NodeClaim {
        let mut spec = serde_json::json!({
            "nodeClassRef": {"group": "g", "kind": "K", "name": "n"},
            "requirements": [],
        });
        if let Some(g) = grace {
            spec["terminationGracePeriod"] = g.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "labels": {"karpenter.sh/capacity-type": "spot"}},
            "spec": spec,
        }))
        .expect("a NodeClaim")
    };
    assert_eq!(termination_mode(&claim(None)), "graceful");
    assert_eq!(termination_mode(&claim(Some("0s"))), "forceful");
    assert_eq!(termination_mode(&claim(Some("1h"))), "eventual");
    assert_eq!(
        [
            ConsolidationPolicy::WhenEmpty,
            ConsolidationPolicy::WhenEmptyOrUnderutilized,
            ConsolidationPolicy::Balanced
        ]
        .map(consolidation_policy),
        ["when_empty", "when_empty_or_underutilized", "balanced"]
    );

    let m = Metrics::new();
    let empty = DisruptedLabels::of(
        "empty",
        "default",
        &claim(Some("30m")),
        Some(ConsolidationPolicy::WhenEmptyOrUnderutilized),
    );
    m.nodeclaims_disrupted.get_or_create(&empty).inc();
    m.pods_disruption_initiated.get_or_create(&empty).inc_by(3);
    let expired = DisruptedLabels::of("expired", "default", &claim(None), None);
    m.nodeclaims_disrupted.get_or_create(&expired).inc();
    let text = m.encode();
    for line in [
        "karpenter_nodeclaims_disrupted_total{reason=\"empty\",nodepool=\"default\",capacity_type=\"spot\",consolidation_policy=\"when_empty_or_underutilized\",termination_mode=\"eventual\"} 1",
        "karpenter_pods_disruption_initiated_total{reason=\"empty\",nodepool=\"default\",capacity_type=\"spot\",consolidation_policy=\"when_empty_or_underutilized\",termination_mode=\"eventual\"} 3",
        "karpenter_nodeclaims_disrupted_total{reason=\"expired\",nodepool=\"default\",capacity_type=\"spot\",consolidation_policy=\"\",termination_mode=\"graceful\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}\n{text}");
    }
}

#[test]
fn exposes_karpenter_names() {
    let m = Metrics::new();
    m.nodeclaims_created
        .get_or_create(&CreatedLabels {
            reason: "provisioning".into(),
            nodepool: "default".into(),
            min_values_relaxed: "false".into(),
        })
        .inc();
    Metrics::observe(
        &m.claim_launch_seconds,
        "ns/md-a",
        Duration::from_millis(120),
    );
    let text = m.encode();
    assert!(
        text.contains(
            "karpenter_nodeclaims_created_total{reason=\"provisioning\",nodepool=\"default\",min_values_relaxed=\"false\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("karpenter_capi_nodeclaim_launch_duration_seconds_count{machine_deployment=\"ns/md-a\"} 1"), "{text}");
    assert!(text.contains("karpenter_build_info"), "{text}");
    // Every series the exposition carries is a declared one, and empty families are
    // declared too.
    let declared = m.series_names();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        assert!(declared.iter().any(|d| d == name), "{name} not declared");
    }
    assert!(
        declared
            .iter()
            .any(|d| d == "karpenter_nodeclaims_disrupted_total")
    );
    assert!(declared.iter().any(|d| d == "karpenter_nodepools_usage"));
}
