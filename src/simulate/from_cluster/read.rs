//! Reading the source cluster once, read-only: every request is a list or a get (discovery
//! included), by kind, for the kinds the controller reads and nothing else (never a Secret).
//! Kinds a cluster may not serve (Karpenter's before it is installed, MachinePools with the
//! feature off, NodeOverlays) read as none; a cluster larger than this process can load is
//! refused before its pods are read in full.

use std::collections::{BTreeMap, BTreeSet};

use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::{ApiResource, DynamicObject};
use serde_json::{Value, json};

use crate::capi::version::{self as capi_version, CapiVersion};

/// The User-Agent of every request to the source cluster, so its server (and a test) can tell
/// them apart.
pub const AGENT: &str = "karpenter-capi-from-cluster";

/// The largest cluster loaded: the simulated copy holds every object in this process's memory
/// and the controller runs beside it on the same machine. The largest size measured: on two
/// cores it is read and loaded in 5 s (quiet) to 32 s (loaded) and held in 1.4 GB
/// (docs/benchmarks.md); a larger limit waits for a measurement at that size.
pub const MAX_NODES: usize = 2_000;
pub const MAX_PODS: usize = 20_000;

/// Objects per list page.
const PAGE: u32 = 500;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Client(String),
    #[error("reading {kind} from the source cluster: {source}")]
    Read {
        kind: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading {kind} {namespace}/{name} (the infrastructure template of {owner}): {source}")]
    Template {
        kind: String,
        namespace: String,
        name: String,
        owner: String,
        #[source]
        source: kube::Error,
    },
    #[error("finding the Cluster API version the source serves: {0}")]
    Version(#[from] capi_version::Error),
    #[error(
        "the source cluster has more than {limit} {kind} ({found} read before stopping): \
         `simulate --from-cluster` loads at most {MAX_NODES} Nodes and {MAX_PODS} pods, which \
         it holds in memory with the controller beside them on one machine"
    )]
    TooLarge {
        kind: &'static str,
        found: usize,
        limit: usize,
    },
}

/// A kind read: where the simulated server serves it, and its objects as the source has them.
#[derive(Clone, Debug)]
pub struct Kind {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    pub objects: Vec<Value>,
}

/// Everything read from the source.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub capi_version: CapiVersion,
    /// In load order: what others refer to first.
    pub kinds: Vec<Kind>,
    /// What could not be read and was left out, in words (a template that is gone).
    pub notes: Vec<String>,
}

impl Snapshot {
    pub fn count(&self, plural: &str) -> usize {
        self.kinds
            .iter()
            .filter(|k| k.plural == plural)
            .map(|k| k.objects.len())
            .sum()
    }

    pub fn objects(&self, plural: &str) -> impl Iterator<Item = &Value> {
        self.kinds
            .iter()
            .filter(move |k| k.plural == plural)
            .flat_map(|k| k.objects.iter())
    }
}

/// A client for the source that sends this module's User-Agent.
pub async fn client(path: &std::path::Path) -> Result<Client, Error> {
    let options = crate::app::ClientOptions {
        agent: AGENT.to_string(),
        ..crate::app::ClientOptions::default()
    };
    crate::app::client_from_kubeconfig_with(path, &options)
        .await
        .map_err(Error::Client)
}

/// One kind to read: (group, version, kind, plural, namespaced, served everywhere).
type Wanted = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    bool,
);

const WORKLOAD_FIRST: &[Wanted] = &[
    (
        "karpenter.cluster.x-k8s.io",
        "v1alpha1",
        "ClusterAPINodeClass",
        "clusterapinodeclasses",
        false,
        false,
    ),
    ("karpenter.sh", "v1", "NodePool", "nodepools", false, false),
    (
        "karpenter.sh",
        "v1alpha1",
        "NodeOverlay",
        "nodeoverlays",
        false,
        false,
    ),
];

const WORKLOAD_LAST: &[Wanted] = &[
    (
        "karpenter.sh",
        "v1",
        "NodeClaim",
        "nodeclaims",
        false,
        false,
    ),
    ("apps", "v1", "DaemonSet", "daemonsets", true, true),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
        true,
    ),
];

/// Read the source: `workload` holds Nodes, pods and Karpenter's kinds, `management` the
/// Cluster API objects (the same cluster when both are one).
pub async fn read(workload: &Client, management: &Client) -> Result<Snapshot, Error> {
    let nodes = list(
        workload,
        &wanted(("", "v1", "Node", "nodes", false, true)),
        Some(MAX_NODES),
    )
    .await?;
    let pods = list(
        workload,
        &wanted(("", "v1", "Pod", "pods", true, true)),
        Some(MAX_PODS),
    )
    .await?;
    let v = capi_version::discover(management, None).await?;
    let mut kinds = Vec::new();
    for w in WORKLOAD_FIRST {
        kinds.push(list(workload, &wanted(*w), None).await?);
    }
    let capi = |kind: &'static str, plural: &'static str, required: bool| {
        wanted(("cluster.x-k8s.io", v.as_str(), kind, plural, true, required))
    };
    let mds = list(
        management,
        &capi("MachineDeployment", "machinedeployments", true),
        None,
    )
    .await?;
    let pools = list(
        management,
        &capi("MachinePool", "machinepools", false),
        None,
    )
    .await?;
    let mut notes = Vec::new();
    kinds.extend(
        templates(
            management,
            v,
            mds.objects.iter().chain(&pools.objects),
            &mut notes,
        )
        .await?,
    );
    kinds.push(mds);
    kinds.push(list(management, &capi("MachineSet", "machinesets", true), None).await?);
    kinds.push(pools);
    kinds.push(list(management, &capi("Machine", "machines", true), None).await?);
    kinds.push(nodes);
    for w in WORKLOAD_LAST {
        kinds.push(list(workload, &wanted(*w), None).await?);
    }
    kinds.push(pods);
    Ok(Snapshot {
        capi_version: v,
        kinds,
        notes,
    })
}

/// A kind to read, and whether a source that does not serve it is an error.
struct Want {
    kind: Kind,
    required: bool,
}

fn wanted(w: Wanted) -> Want {
    let (group, version, kind, plural, namespaced, required) = w;
    Want {
        kind: Kind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            objects: Vec::new(),
        },
        required,
    }
}

fn resource(k: &Kind) -> ApiResource {
    let api_version = match k.group.as_str() {
        "" => k.version.clone(),
        g => format!("{g}/{}", k.version),
    };
    ApiResource {
        group: k.group.clone(),
        version: k.version.clone(),
        api_version,
        kind: k.kind.clone(),
        plural: k.plural.clone(),
    }
}

/// Every object of a kind, a page at a time; more than `cap` is refused as too large, before
/// the rest is read.
async fn list(client: &Client, want: &Want, cap: Option<usize>) -> Result<Kind, Error> {
    let mut kind = want.kind.clone();
    let ar = resource(&kind);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(t) = token.take() {
            params = params.continue_token(&t);
        }
        let page = match api.list(&params).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 && !want.required => return Ok(kind),
            Err(source) => {
                return Err(Error::Read {
                    kind: format!("{} ({})", kind.kind, ar.api_version),
                    source,
                });
            }
        };
        kind.objects
            .extend(page.items.into_iter().map(|o| typed(o, &ar)));
        if let Some(limit) = cap.filter(|l| kind.objects.len() > *l) {
            return Err(Error::TooLarge {
                kind: if kind.plural == "nodes" {
                    "Nodes"
                } else {
                    "pods"
                },
                found: kind.objects.len(),
                limit,
            });
        }
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok(kind),
        }
    }
}

/// An object as JSON with its apiVersion and kind (list items come without them).
fn typed(o: DynamicObject, ar: &ApiResource) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(ar.api_version));
        m.insert("kind".into(), json!(ar.kind));
    }
    v
}

/// The templates to read: by (apiVersion, kind), each (namespace, name, the owner in words).
type Refs = BTreeMap<(String, String), BTreeSet<(String, String, String)>>;

/// The infrastructure template (or pool) each MachineDeployment and MachinePool refers to,
/// each read once, grouped by kind. One that is gone is noted and left out: the controller
/// then sees what it would see on the source.
async fn templates(
    client: &Client,
    v: CapiVersion,
    owners: impl Iterator<Item = &Value>,
    notes: &mut Vec<String>,
) -> Result<Vec<Kind>, Error> {
    let mut refs: Refs = BTreeMap::new();
    for o in owners {
        let r = &o["spec"]["template"]["spec"]["infrastructureRef"];
        let (Some(kind), Some(name)) = (r["kind"].as_str(), r["name"].as_str()) else {
            continue;
        };
        let ns = o["metadata"]["namespace"].as_str().unwrap_or_default();
        let owner = format!(
            "{} {ns}/{}",
            o["kind"].as_str().unwrap_or_default(),
            o["metadata"]["name"].as_str().unwrap_or_default()
        );
        let api_version = match (v, r["apiVersion"].as_str(), r["apiGroup"].as_str()) {
            (_, Some(av), _) => av.to_string(),
            (_, None, Some(group)) => {
                let version = capi_version::infrastructure_version(client, group).await?;
                format!("{group}/{version}")
            }
            _ => continue,
        };
        refs.entry((api_version, kind.to_string()))
            .or_default()
            .insert((ns.to_string(), name.to_string(), owner));
    }
    let mut kinds = Vec::new();
    for ((api_version, kind), objects) in refs {
        let Some(found) = discover(client, &api_version, &kind).await? else {
            notes.push(format!(
                "{kind} ({api_version}) is not served: its templates left out"
            ));
            continue;
        };
        let ar = resource(&found);
        let mut read = found;
        let mut seen = BTreeSet::new();
        for (ns, name, owner) in objects {
            if !seen.insert((ns.clone(), name.clone())) {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            match api.get_opt(&name).await {
                Ok(Some(o)) => read.objects.push(typed(o, &ar)),
                Ok(None) => notes.push(format!("{kind} {ns}/{name} of {owner} is gone")),
                Err(source) => {
                    return Err(Error::Template {
                        kind,
                        namespace: ns,
                        name,
                        owner,
                        source,
                    });
                }
            }
        }
        kinds.push(read);
    }
    Ok(kinds)
}

/// The plural and scope of `kind` in `api_version`, by discovery (None when not served).
async fn discover(client: &Client, api_version: &str, kind: &str) -> Result<Option<Kind>, Error> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let list = match client.list_api_group_resources(api_version).await {
        Ok(l) => l,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
        Err(source) => {
            return Err(Error::Read {
                kind: format!("the resources of {api_version}"),
                source,
            });
        }
    };
    Ok(list
        .resources
        .into_iter()
        .find(|r| r.kind == kind && !r.name.contains('/'))
        .map(|r| Kind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: r.name,
            namespaced: r.namespaced,
            objects: Vec::new(),
        }))
}
