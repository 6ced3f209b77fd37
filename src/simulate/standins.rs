//! Where the controller and the stand-ins (crates/standins) meet. The stand-ins' crate cannot
//! name the controller's types, so a scenario hands its Cluster API version over, and reads the
//! simulated cluster's back, through these conversions; and the tests here hold the two crates'
//! separate statements of the same things to agreement: the project's CRDs the stand-ins serve
//! (read from deploy/crds) against the controller's types, the controller's user agent, and
//! upstream's names.

use crate::capi::version::CapiVersion;
use crate::sim::capi::CapiVersion as StandinVersion;

impl From<CapiVersion> for StandinVersion {
    fn from(v: CapiVersion) -> Self {
        match v {
            CapiVersion::V1Beta1 => StandinVersion::V1Beta1,
            CapiVersion::V1Beta2 => StandinVersion::V1Beta2,
        }
    }
}

impl From<StandinVersion> for CapiVersion {
    fn from(v: StandinVersion) -> Self {
        match v {
            StandinVersion::V1Beta1 => CapiVersion::V1Beta1,
            StandinVersion::V1Beta2 => CapiVersion::V1Beta2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_is_the_same_version_on_both_sides() {
        for v in CapiVersion::ALL {
            let standin = StandinVersion::from(v);
            assert_eq!(standin.to_string(), v.to_string());
            assert_eq!(standin.api_version(), v.api_version());
            assert_eq!(CapiVersion::from(standin), v);
        }
    }

    /// The stand-ins serve the CRD files the user installs; they must be what the controller's
    /// types generate (else `cargo run -- crds --output-dir deploy/crds`).
    #[test]
    fn the_stand_ins_serve_the_controllers_crds() {
        let served = crate::sim::project_crds::all().expect("deploy/crds parses");
        let generated = crate::api::crds::all();
        assert_eq!(served.len(), generated.len());
        for (s, g) in served.iter().zip(&generated) {
            assert!(
                s == g,
                "deploy/crds for {} is stale: run `cargo run -- crds --output-dir deploy/crds`",
                g.spec.names.kind
            );
        }
    }

    #[test]
    fn the_stand_ins_know_the_controllers_user_agent() {
        assert_eq!(crate::sim::CONTROLLER_USER_AGENT, crate::app::USER_AGENT);
    }

    /// Upstream's names, stated by each crate on its own: a difference is a misspelling on one
    /// side, to be checked against upstream.
    #[test]
    fn both_crates_spell_upstreams_names_alike() {
        use crate::api::wellknown as c;
        use crate::sim::wellknown as s;
        let pairs = [
            (s::ZONE_LABEL, c::ZONE_LABEL),
            (s::ARCH_LABEL, c::ARCH_LABEL),
            (s::OS_LABEL, c::OS_LABEL),
            (s::HOSTNAME_LABEL, c::HOSTNAME_LABEL),
            (s::NOT_READY_TAINT_KEY, c::NOT_READY_TAINT_KEY),
            (
                s::ANN_DEFAULT_CLASS,
                crate::scheduling::volumes::ANN_DEFAULT_CLASS,
            ),
            (s::QUANTITY_PATTERN, crate::api::crds::QUANTITY_PATTERN),
            (
                s::LABEL_VALUE_PATTERN,
                crate::api::crds::LABEL_VALUE_PATTERN,
            ),
            (s::NODEPOOL_LABEL, c::NODEPOOL_LABEL),
            (s::DO_NOT_DISRUPT_ANNOTATION, c::DO_NOT_DISRUPT_ANNOTATION),
            (
                s::TERMINATION_TIMESTAMP_ANNOTATION,
                c::TERMINATION_TIMESTAMP_ANNOTATION,
            ),
            (s::UNREGISTERED_TAINT_KEY, c::UNREGISTERED_TAINT_KEY),
            (s::CLUSTER_NAME_LABEL, c::CLUSTER_NAME_LABEL),
            (s::DEPLOYMENT_NAME_LABEL, c::DEPLOYMENT_NAME_LABEL),
            (s::SET_NAME_LABEL, c::SET_NAME_LABEL),
            (s::POOL_NAME_LABEL, c::POOL_NAME_LABEL),
            (
                s::EXCLUDE_NODE_DRAINING_ANNOTATION,
                c::EXCLUDE_NODE_DRAINING_ANNOTATION,
            ),
            (s::DELETE_MACHINE_ANNOTATION, c::DELETE_MACHINE_ANNOTATION),
            (s::MACHINE_POOL_KIND, c::MACHINE_POOL_KIND),
            (s::MIN_SIZE_ANNOTATION, c::MIN_SIZE_ANNOTATION),
            (s::CPU_ANNOTATION, c::CPU_ANNOTATION),
            (s::MEMORY_ANNOTATION, c::MEMORY_ANNOTATION),
            (s::EPHEMERAL_DISK_ANNOTATION, c::EPHEMERAL_DISK_ANNOTATION),
            (s::MAX_PODS_ANNOTATION, c::MAX_PODS_ANNOTATION),
            (s::GPU_COUNT_ANNOTATION, c::GPU_COUNT_ANNOTATION),
            (s::LABELS_ANNOTATION, c::LABELS_ANNOTATION),
            (s::TAINTS_ANNOTATION, c::TAINTS_ANNOTATION),
        ];
        for (standin, controller) in pairs {
            assert_eq!(standin, controller);
        }
        assert_eq!(s::DEFAULT_MAX_PODS, c::DEFAULT_MAX_PODS);
        for key in [
            "node-role.kubernetes.io/x",
            "a.node.cluster.x-k8s.io/y",
            "example.com/z",
        ] {
            assert_eq!(s::capi_propagates(key), c::capi_propagates(key), "{key}");
        }
    }
}
