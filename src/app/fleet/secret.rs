//! Where each Cluster's workload kubeconfig is read.

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Where a Cluster's workload kubeconfig is read: the Secret of the Cluster's namespace named by
/// `name` with `{cluster}` replaced by the Cluster's name, at `key`. By default Cluster API's own
/// `<cluster>-kubeconfig`, key `value`; an operator who provisions a least-privilege kubeconfig
/// per Cluster names it here, and the fleet never needs Cluster API's admin credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeconfigSecret {
    pub name: String,
    pub key: String,
}

impl Default for KubeconfigSecret {
    fn default() -> Self {
        KubeconfigSecret {
            name: Self::CLUSTER_API_NAME.to_string(),
            key: "value".to_string(),
        }
    }
}

impl KubeconfigSecret {
    /// Cluster API's own kubeconfig Secret.
    pub const CLUSTER_API_NAME: &'static str = crate::cli::CLUSTER_API_KUBECONFIG_SECRET;

    /// The Secret of Cluster `cluster`.
    pub fn name_for(&self, cluster: &str) -> String {
        self.name.replace(crate::cli::CLUSTER_PLACEHOLDER, cluster)
    }
}

/// The workload cluster's client configuration from the Cluster's kubeconfig Secret
/// ([`KubeconfigSecret`]).
pub(super) async fn workload_config(
    management: &Client,
    secret: &KubeconfigSecret,
    ns: &str,
    name: &str,
) -> Result<kube::Config, String> {
    let secret_name = secret.name_for(name);
    let what = format!("Secret {ns}/{secret_name}");
    let found = Api::<Secret>::namespaced(management.clone(), ns)
        .get_opt(&secret_name)
        .await
        .map_err(|e| format!("{what}: {e}"))?
        .ok_or_else(|| format!("{what} not found"))?;
    let key = &secret.key;
    let value = found
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| format!("{what} has no key `{key}`"))?;
    let text = std::str::from_utf8(&value.0).map_err(|e| format!("{what}: {key}: {e}"))?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| format!("{what}: {key}: {e}"))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{what}: {key}: {e}"))
}
