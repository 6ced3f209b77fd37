//! `run --fleet`'s flags: one process serving every Cluster a selector chooses, each through a
//! kubeconfig Secret of its own (`app::fleet`).

use clap::Args;

/// What a `--fleet-kubeconfig-secret` template puts the Cluster's name in place of.
pub(crate) const CLUSTER_PLACEHOLDER: &str = "{cluster}";
/// Cluster API's own kubeconfig Secret of a Cluster, as a `--fleet-kubeconfig-secret` template.
pub(crate) const CLUSTER_API_KUBECONFIG_SECRET: &str = "{cluster}-kubeconfig";

/// A `--fleet-kubeconfig-secret` template: it must name the Cluster, or every Cluster would
/// read one workload cluster's credentials, and make a Secret name.
pub(crate) fn kubeconfig_secret_template(s: &str) -> Result<String, String> {
    if !s.contains(CLUSTER_PLACEHOLDER) {
        return Err(format!(
            "{s:?} does not contain {{cluster}}: each Cluster needs a Secret of its own (e.g. {{cluster}}-karpenter-capi)"
        ));
    }
    let sample = s.replace(CLUSTER_PLACEHOLDER, "c");
    let valid = sample.len() <= 253
        && sample
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && sample.starts_with(|c: char| c.is_ascii_alphanumeric())
        && sample.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid {
        return Err(format!(
            "{s:?} does not make a Secret name: lower-case letters, digits, '-' and '.', beginning and ending with a letter or digit"
        ));
    }
    Ok(s.to_string())
}

#[derive(Clone, Debug, Args)]
pub(crate) struct FleetArgs {
    /// Fleet mode: serve every Cluster API Cluster of the management cluster
    /// (--cluster-api-in-cluster or --cluster-api-kubeconfig) that --fleet-selector chooses (in
    /// --cluster-api-namespace, else all namespaces), each through its `<cluster>-kubeconfig`
    /// Secret, with one Lease per Cluster in --leader-election-namespace shared by the replicas.
    /// Refuses --kubeconfig, --cluster-name, --dry-run and --disable-leader-election (checked
    /// when the fleet starts, not by clap, for which FLEET=false from the environment would
    /// conflict with them too).
    #[arg(id = "fleet", long = "fleet", env = "FLEET", default_value_t = false)]
    pub(crate) enabled: bool,
    /// Fleet mode: the label selector Clusters must match (e.g. `karpenter=enabled`; default:
    /// every Cluster).
    #[arg(
        long = "fleet-selector",
        value_name = "FLEET_SELECTOR",
        env = "FLEET_SELECTOR",
        requires = "fleet"
    )]
    pub(crate) selector: Option<String>,
    /// Fleet mode: the Secret, in each Cluster's namespace, holding its workload kubeconfig;
    /// `{cluster}` stands for the Cluster's name. The default is Cluster API's own (an admin
    /// credential it rotates); name a least-privilege one per Cluster instead, e.g.
    /// `{cluster}-karpenter-capi` (docs/deploy.md).
    #[arg(long = "fleet-kubeconfig-secret", value_name = "FLEET_KUBECONFIG_SECRET", env = "FLEET_KUBECONFIG_SECRET", default_value = CLUSTER_API_KUBECONFIG_SECRET, value_parser = kubeconfig_secret_template)]
    pub(crate) kubeconfig_secret: String,
    /// Fleet mode: the key of that Secret holding the kubeconfig.
    #[arg(
        long = "fleet-kubeconfig-secret-key",
        value_name = "FLEET_KUBECONFIG_SECRET_KEY",
        env = "FLEET_KUBECONFIG_SECRET_KEY",
        default_value = "value"
    )]
    pub(crate) kubeconfig_secret_key: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_kubeconfig_secret_template_names_the_cluster_and_makes_a_secret_name() {
        assert!(kubeconfig_secret_template("{cluster}-karpenter-capi").is_ok());
        assert!(kubeconfig_secret_template(CLUSTER_API_KUBECONFIG_SECRET).is_ok());
        for bad in [
            "karpenter-kubeconfig",
            "{cluster}_kc",
            "-{cluster}",
            "{cluster}/x",
        ] {
            let err = kubeconfig_secret_template(bad).expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
    }
}
