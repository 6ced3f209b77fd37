//! VolumeAttachments by node: what a drain waits for before the node's Machine goes (the
//! attach-detach controller deletes an attachment once the volume is detached from the node).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use super::feed::Index;

/// One attachment: its name and the PersistentVolume it attaches (None for inline volumes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Attachment {
    pub(crate) name: String,
    pub(crate) persistent_volume: Option<String>,
}

#[derive(Default)]
pub(crate) struct VolumeAttachments {
    /// node -> attachment name -> PersistentVolume name.
    by_node: HashMap<String, BTreeMap<String, Option<String>>>,
    /// attachment name -> node (to move or drop an attachment on change).
    node_of: HashMap<String, String>,
    synced: bool,
}

impl VolumeAttachments {
    pub(crate) fn synced(&self) -> bool {
        self.synced
    }

    pub(crate) fn on_node(&self, node: &str) -> Vec<Attachment> {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|(name, pv)| Attachment {
                name: name.clone(),
                persistent_volume: pv.clone(),
            })
            .collect()
    }

    /// Apply one watched attachment; returns the nodes whose attachments changed.
    pub(crate) fn apply(&mut self, va: &VolumeAttachment) -> Vec<String> {
        let name = va.name_any();
        let mut changed = self.remove(&name);
        let node = va.spec.node_name.clone();
        if node.is_empty() {
            return changed;
        }
        self.by_node
            .entry(node.clone())
            .or_default()
            .insert(name.clone(), va.spec.source.persistent_volume_name.clone());
        self.node_of.insert(name, node.clone());
        if !changed.contains(&node) {
            changed.push(node);
        }
        changed
    }

    /// Forget an attachment; returns the node it was on.
    pub(crate) fn remove(&mut self, name: &str) -> Vec<String> {
        let Some(node) = self.node_of.remove(name) else {
            return Vec::new();
        };
        if let Some(m) = self.by_node.get_mut(&node) {
            m.remove(name);
            if m.is_empty() {
                self.by_node.remove(&node);
            }
        }
        vec![node]
    }

    /// A full re-list; returns every node whose attachments may have changed.
    pub(crate) fn replace_all(&mut self, all: &[VolumeAttachment]) -> Vec<String> {
        let mut touched: Vec<String> = self.by_node.keys().cloned().collect();
        self.by_node.clear();
        self.node_of.clear();
        for va in all {
            touched.extend(self.apply(va));
        }
        touched.sort();
        touched.dedup();
        self.synced = true;
        touched
    }
}

/// Whole attachments are buffered during a re-list (they are small); each change says which
/// nodes' attachments changed.
impl Index<VolumeAttachment> for VolumeAttachments {
    type Kept = VolumeAttachment;
    type Listing = Vec<Self::Kept>;
    type Changed = Vec<String>;

    fn keep(obj: VolumeAttachment) -> VolumeAttachment {
        obj
    }

    fn apply(&mut self, va: VolumeAttachment) -> Vec<String> {
        VolumeAttachments::apply(self, &va)
    }

    fn delete(&mut self, va: VolumeAttachment) -> Vec<String> {
        self.remove(&va.name_any())
    }

    fn reset(&mut self, all: Vec<VolumeAttachment>) -> Vec<String> {
        self.replace_all(&all)
    }

    fn synced(&self) -> bool {
        VolumeAttachments::synced(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn va(name: &str, node: &str, pv: Option<&str>) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": "csi.example", "nodeName": node, "source": {"persistentVolumeName": pv}},
        }))
        .expect("volume attachment")
    }

    #[test]
    fn attachments_follow_their_node() {
        let mut idx = VolumeAttachments::default();
        assert_eq!(idx.apply(&va("a", "n1", Some("pv-a"))), vec!["n1"]);
        idx.apply(&va("b", "n1", None));
        assert_eq!(idx.on_node("n1").len(), 2);
        // Moved to another node: both nodes changed.
        let mut changed = idx.apply(&va("a", "n2", Some("pv-a")));
        changed.sort();
        assert_eq!(changed, vec!["n1", "n2"]);
        assert_eq!(idx.remove("b"), vec!["n1"]);
        assert!(idx.on_node("n1").is_empty());
        assert_eq!(
            idx.on_node("n2"),
            vec![Attachment {
                name: "a".into(),
                persistent_volume: Some("pv-a".into())
            }]
        );
        let touched = idx.replace_all(&[]);
        assert_eq!(touched, vec!["n2"]);
        assert!(idx.synced());
    }
}
