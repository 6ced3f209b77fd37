//! The kinds a CapacityBuffer may reference (PodTemplates, Deployments, StatefulSets,
//! ReplicaSets), watched only to say which object changed: the Buffers actor resolves again the
//! buffers that reference it, reading the object then. Nothing of the objects is kept.

use std::collections::HashSet;

use kube::ResourceExt;

use super::feed::Index;

/// An object a buffer may reference: (kind, namespace, name).
pub type Referent = (&'static str, String, String);

/// Which kinds have listed once; no object is kept.
#[derive(Default)]
pub struct Referents {
    listed: HashSet<&'static str>,
}

/// A change names the object; a (re-)list names nothing (every buffer is resolved when it is
/// listed anyway).
impl<K> Index<K> for Referents
where
    K: k8s_openapi::Resource + kube::Resource,
{
    type Kept = Referent;
    type Listing = Vec<Self::Kept>;
    type Changed = Option<Referent>;

    fn keep(obj: K) -> Referent {
        (K::KIND, obj.namespace().unwrap_or_default(), obj.name_any())
    }

    fn apply(&mut self, r: Referent) -> Option<Referent> {
        Some(r)
    }

    fn delete(&mut self, r: Referent) -> Option<Referent> {
        Some(r)
    }

    fn reset(&mut self, _: Vec<Referent>) -> Option<Referent> {
        self.listed.insert(K::KIND);
        None
    }

    fn synced(&self) -> bool {
        self.listed.contains(K::KIND)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::PodTemplate;
    use kube::api::ObjectMeta;

    use super::{Index, Referent, Referents};

    fn deployment(namespace: &str, name: &str) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_change_names_the_object_a_list_names_nothing() {
        let mut index = Referents::default();
        let kept = <Referents as Index<Deployment>>::keep(deployment("ns", "web"));
        let named: Referent = ("Deployment", "ns".into(), "web".into());
        assert_eq!(kept, named);
        assert_eq!(
            <Referents as Index<Deployment>>::apply(&mut index, kept.clone()),
            Some(named.clone())
        );
        assert_eq!(
            <Referents as Index<Deployment>>::delete(&mut index, kept.clone()),
            Some(named)
        );
        assert!(!<Referents as Index<Deployment>>::synced(&index));
        assert_eq!(
            <Referents as Index<Deployment>>::reset(&mut index, vec![kept]),
            None
        );
        assert!(<Referents as Index<Deployment>>::synced(&index));
        assert!(
            !<Referents as Index<PodTemplate>>::synced(&index),
            "each kind lists on its own"
        );
    }
}
