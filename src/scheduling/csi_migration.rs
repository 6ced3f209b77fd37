//! In-tree volume plugins migrated to CSI: a volume of an in-tree plugin (a StorageClass whose
//! provisioner is `kubernetes.io/aws-ebs`, a PersistentVolume with an `awsElasticBlockStore`
//! source...) is attached by the plugin's CSI driver since CSI migration, so it counts against
//! that driver's CSINode attach limit. Upstream Karpenter asks k8s.io/csi-translation-lib; this
//! is the same table (its `plugins` package names).

use k8s_openapi::api::core::v1::PersistentVolumeSpec;

/// In-tree plugin name -> CSI driver name.
const MIGRATED: &[(&str, &str)] = &[
    ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
    ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
    ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
    ("kubernetes.io/azure-file", "file.csi.azure.com"),
    ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
    ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
    ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
];

/// The CSI driver a StorageClass provisioner stands for: the migrated driver of an in-tree
/// plugin name, else the provisioner itself (already a CSI driver, or one no limit names).
pub(crate) fn driver_of_provisioner(provisioner: &str) -> &str {
    MIGRATED
        .iter()
        .find(|(in_tree, _)| *in_tree == provisioner)
        .map_or(provisioner, |(_, csi)| csi)
}

/// The CSI driver that attaches a PersistentVolume: `spec.csi.driver`, or the migrated driver
/// of its in-tree source; None for volumes no CSI driver attaches (NFS, local, hostPath...).
pub(crate) fn driver_of_volume(spec: &PersistentVolumeSpec) -> Option<String> {
    if let Some(csi) = &spec.csi {
        return Some(csi.driver.clone());
    }
    let in_tree = [
        (
            spec.aws_elastic_block_store.is_some(),
            "kubernetes.io/aws-ebs",
        ),
        (spec.gce_persistent_disk.is_some(), "kubernetes.io/gce-pd"),
        (spec.azure_disk.is_some(), "kubernetes.io/azure-disk"),
        (spec.azure_file.is_some(), "kubernetes.io/azure-file"),
        (spec.cinder.is_some(), "kubernetes.io/cinder"),
        (
            spec.vsphere_volume.is_some(),
            "kubernetes.io/vsphere-volume",
        ),
        (
            spec.portworx_volume.is_some(),
            "kubernetes.io/portworx-volume",
        ),
    ];
    in_tree
        .iter()
        .find(|(present, _)| *present)
        .map(|(_, plugin)| driver_of_provisioner(plugin).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn in_tree_provisioners_translate_and_csi_ones_stay() {
        assert_eq!(
            driver_of_provisioner("kubernetes.io/aws-ebs"),
            "ebs.csi.aws.com"
        );
        assert_eq!(
            driver_of_provisioner("kubernetes.io/gce-pd"),
            "pd.csi.storage.gke.io"
        );
        assert_eq!(driver_of_provisioner("ebs.csi.aws.com"), "ebs.csi.aws.com");
        assert_eq!(driver_of_provisioner("other"), "other");
    }

    #[test]
    fn in_tree_volume_sources_name_their_migrated_driver() {
        let spec = |v| serde_json::from_value::<PersistentVolumeSpec>(v).unwrap();
        let ebs = spec(json!({"awsElasticBlockStore": {"volumeID": "vol-1"}}));
        assert_eq!(driver_of_volume(&ebs).as_deref(), Some("ebs.csi.aws.com"));
        let azure = spec(json!({"azureDisk": {"diskName": "d", "diskURI": "u"}}));
        assert_eq!(
            driver_of_volume(&azure).as_deref(),
            Some("disk.csi.azure.com")
        );
        let csi = spec(json!({"csi": {"driver": "x.csi", "volumeHandle": "h"}}));
        assert_eq!(driver_of_volume(&csi).as_deref(), Some("x.csi"));
        let nfs = spec(json!({"nfs": {"server": "s", "path": "/p"}}));
        assert_eq!(driver_of_volume(&nfs), None);
    }
}
