//! `karpenter-capi init`: where the first NodePool comes from. Reads the management cluster's
//! MachineDeployments and MachinePools, judges each with the catalog's own rules (`capi::offerings::offering`,
//! the membership label), and proposes a ClusterAPINodeClass and a NodePool covering the usable
//! ones, with the `kubectl label` / `kubectl annotate` commands that would make the others
//! usable. Read-only: it prints, it never writes.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use crate::api::wellknown::{
    CAPACITY_ANNOTATION_PREFIX, CAPACITY_TYPE_LABEL, CLUSTER_NAME_LABEL, MAX_SIZE_ANNOTATION,
    MEMBER_LABEL, NODECLASS_GROUP, NODECLASS_KIND, PRICE_ANNOTATION,
};
use crate::capi::annotations;
use crate::capi::model::MachineDeployment;
use crate::capi::offerings::{Context, offering};
use crate::capi::template::read_templates;
use crate::cli::{InitArgs, InitOutput};
use crate::explain::RunError;
use crate::explain::cluster::read_capi;
use crate::scheduling::Offering;

/// One MachineDeployment judged.
#[derive(Debug, Serialize)]
pub(crate) struct Verdict {
    pub(crate) machine_deployment: String,
    pub(crate) usable: bool,
    /// Why it cannot serve as an offering now (empty when usable).
    pub(crate) problems: Vec<String>,
    /// Things that work but deserve attention (no price, no max size, taints).
    pub(crate) warnings: Vec<String>,
    /// Commands that would make it usable (placeholders in angle brackets to fill in).
    pub(crate) fixes: Vec<String>,
    /// For usable ones: the instance type and capacity type it becomes.
    pub(crate) instance_type: Option<String>,
    pub(crate) capacity_type: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Proposal {
    pub(crate) verdicts: Vec<Verdict>,
    /// The ClusterAPINodeClass and NodePool to apply.
    pub(crate) objects: Vec<Value>,
    /// MachineDeployments `--cluster-name` left out: (`namespace/name`, why).
    pub(crate) excluded: Vec<(String, String)>,
    pub(crate) notes: Vec<String>,
}

/// What the proposed NodePool must declare so that the usable MachineDeployments can serve it.
#[derive(Default)]
struct Needs {
    capacity_types: BTreeSet<String>,
    taints: BTreeSet<(String, Option<String>, String)>,
}

impl Verdict {
    fn new(machine_deployment: String) -> Self {
        Verdict {
            machine_deployment,
            usable: false,
            problems: Vec::new(),
            warnings: Vec::new(),
            fixes: Vec::new(),
            instance_type: None,
            capacity_type: None,
        }
    }
}

/// Judge the MachineDeployments and build the proposal (pure; `run` does the reading).
pub(crate) fn propose(
    mds: &[Arc<MachineDeployment>],
    cx: &Context<'_>,
    name: &str,
    cluster_name: Option<&str>,
    namespace: Option<&str>,
    excluded: Vec<(String, String)>,
) -> Proposal {
    let mut needs = Needs::default();
    // Sorted so that the report and its fixes read the same on every run.
    let mut sorted: Vec<&Arc<MachineDeployment>> = mds.iter().collect();
    sorted.sort_by_key(|md| md.key());
    let verdicts: Vec<Verdict> = sorted
        .into_iter()
        .map(|md| judge(md, cx, &mut needs))
        .collect();
    let notes = notes(&verdicts, &excluded, cluster_name, namespace);
    Proposal {
        objects: objects(name, cluster_name, &needs.capacity_types, &needs.taints),
        verdicts,
        excluded,
        notes,
    }
}

/// One MachineDeployment judged by the catalog's own rules, so that what `init` calls usable is
/// what the controller will offer.
fn judge(md: &MachineDeployment, cx: &Context<'_>, needs: &mut Needs) -> Verdict {
    let target = kubectl_target(md);
    let mut v = Verdict::new(md.key());
    if md.deletion_timestamp.is_some() {
        // Nothing to fix: it is going away whatever labels it gets.
        v.problems.push("being deleted".into());
        return v;
    }
    if !md.labels.contains_key(MEMBER_LABEL) {
        v.problems.push(format!("no {MEMBER_LABEL} label"));
        v.fixes
            .push(format!("kubectl label {target} {MEMBER_LABEL}="));
    }
    match offering(md, cx) {
        Ok((instance_type, _, o)) => judge_offering(&mut v, md, cx, instance_type, o, needs),
        Err(problem) => judge_problem(&mut v, md, &target, problem),
    }
    v
}

/// The resource as kubectl names it (`machinedeployment` or `machinepool`), for the fix commands.
fn kubectl_target(md: &MachineDeployment) -> String {
    format!(
        "{} {} -n {}",
        md.kind.as_str().to_lowercase(),
        md.name,
        md.namespace
    )
}

/// A MachineDeployment the catalog can offer: warn about what works but surprises, and record
/// what the NodePool must declare to use it.
fn judge_offering(
    v: &mut Verdict,
    md: &MachineDeployment,
    cx: &Context<'_>,
    instance_type: String,
    o: Offering,
    needs: &mut Needs,
) {
    if crate::capi::offerings::scale_up_only(md, cx.templates) {
        v.warnings.push(
            "no MachinePool Machines: offered for scale-up only (no instance can be removed by name; a deleted claim's instance is cordoned and handed back to the pool)".into(),
        );
    }
    if o.price == 0.0 {
        v.warnings.push(format!(
            "no {PRICE_ANNOTATION} annotation: priced 0, so it is always the cheapest"
        ));
    }
    if o.max_size.is_none() {
        v.warnings.push(format!(
            "no {MAX_SIZE_ANNOTATION} annotation: no upper bound on its replicas"
        ));
    }
    if !o.taints.is_empty() {
        // Declared even when the label is still missing, so the NodePool needs no edit once it
        // is added.
        for t in &o.taints {
            needs
                .taints
                .insert((t.key.clone(), t.value.clone(), t.effect.clone()));
        }
        v.warnings.push(
            "its nodes carry taints: only a NodePool declaring them (as the proposed one does) may use it"
                .into(),
        );
    }
    v.usable = v.problems.is_empty();
    if v.usable {
        needs.capacity_types.insert(o.capacity_type.clone());
    }
    v.instance_type = Some(instance_type);
    v.capacity_type = Some(o.capacity_type);
}

/// A MachineDeployment the catalog cannot offer: the commands that would make it offerable.
fn judge_problem(v: &mut Verdict, md: &MachineDeployment, target: &str, problem: String) {
    if problem.starts_with("no ") {
        // Missing annotations: ask for all of them, with placeholders to fill in.
        v.fixes.push(format!(
            "kubectl annotate {target} {CAPACITY_ANNOTATION_PREFIX}cpu=<CPUS> {CAPACITY_ANNOTATION_PREFIX}memory=<MEMORY> {MAX_SIZE_ANNOTATION}=<MAX> {PRICE_ANNOTATION}=<PRICE_PER_HOUR>"
        ));
    } else if let Err(errors) = annotations::parse(&md.annotations) {
        // Malformed annotations: name each one to overwrite.
        for e in errors.iter() {
            v.fixes.push(format!(
                "kubectl annotate --overwrite {target} {}=<VALID VALUE>",
                e.key
            ));
        }
    }
    v.problems.push(problem);
}

/// What the per-MachineDeployment verdicts cannot say: the scope's limits and why the proposal
/// may be empty or not yet usable.
fn notes(
    verdicts: &[Verdict],
    excluded: &[(String, String)],
    cluster_name: Option<&str>,
    namespace: Option<&str>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if namespace.is_some() {
        notes.push(
            "a ClusterAPINodeClass cannot select by namespace: run the controller with \
             --cluster-api-namespace to keep it to this namespace"
                .to_string(),
        );
    }
    let scope = match namespace {
        Some(ns) => format!("in namespace {ns}"),
        None => "in any namespace".to_string(),
    };
    if verdicts.is_empty() && excluded.is_empty() {
        notes.push(format!(
            "no MachineDeployment found {scope}: create one for each node shape first"
        ));
    } else if verdicts.is_empty() {
        notes.push(format!(
            "every MachineDeployment {scope} belongs to another cluster than --cluster-name {} \
             (listed above): check the name, or leave the flag out",
            cluster_name.unwrap_or_default()
        ));
    } else if !verdicts.iter().any(|v| v.usable) {
        notes.push(
            "no MachineDeployment is usable yet: the ClusterAPINodeClass stays not Ready until the \
             commands above are run"
                .to_string(),
        );
    }
    notes
}

fn objects(
    name: &str,
    cluster_name: Option<&str>,
    capacity_types: &BTreeSet<String>,
    taints: &BTreeSet<(String, Option<String>, String)>,
) -> Vec<Value> {
    let mut nodeclass = json!({
        "apiVersion": format!("{NODECLASS_GROUP}/v1alpha1"),
        "kind": NODECLASS_KIND,
        "metadata": {"name": name},
        "spec": {},
    });
    if let Some(c) = cluster_name {
        nodeclass["spec"]["scalableResourceSelector"] =
            json!({"matchLabels": {CLUSTER_NAME_LABEL: c}});
    }
    let mut template_spec = json!({
        "nodeClassRef": {"group": NODECLASS_GROUP, "kind": NODECLASS_KIND, "name": name},
        "requirements": [],
    });
    if !capacity_types.is_empty() {
        template_spec["requirements"] = json!([{
            "key": CAPACITY_TYPE_LABEL,
            "operator": "In",
            "values": capacity_types.iter().collect::<Vec<_>>(),
        }]);
    }
    if !taints.is_empty() {
        template_spec["taints"] = Value::Array(
            taints
                .iter()
                .map(|(key, value, effect)| {
                    let mut t = json!({"key": key, "effect": effect});
                    if let Some(v) = value {
                        t["value"] = json!(v);
                    }
                    t
                })
                .collect(),
        );
    }
    let nodepool = json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": {"spec": template_spec}},
    });
    vec![nodeclass, nodepool]
}

/// With `--karpenter-objects management`, the proposed objects go to the management cluster,
/// bound to the Cluster the controller serves.
fn bind(p: &mut Proposal, b: &crate::view::binding::Binding) {
    for o in &mut p.objects {
        let mut labels = std::collections::BTreeMap::new();
        b.label(&mut labels);
        o["metadata"]["labels"] = json!(labels);
    }
    p.notes.push(format!(
        "--karpenter-objects management: apply these to the management cluster; they are bound to Cluster {}/{} by their labels",
        b.namespace, b.cluster
    ));
}

/// The proposal as YAML documents; with `comments`, the report leads as YAML comments.
pub(crate) fn render_yaml(p: &Proposal, comments: bool) -> Result<String, String> {
    let mut out = String::new();
    if comments {
        for line in report(p).lines() {
            let _ = writeln!(out, "# {line}");
        }
    }
    for o in &p.objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(o).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// The report for people: every MachineDeployment, what is wrong, how to fix it.
pub(crate) fn report(p: &Proposal) -> String {
    let mut out = String::new();
    let usable = p.verdicts.iter().filter(|v| v.usable).count();
    let _ = writeln!(
        out,
        "{usable} of {} MachineDeployments can serve as offerings",
        p.verdicts.len()
    );
    for (md, why) in &p.excluded {
        let _ = writeln!(out, "not considered: {md}: {why}");
    }
    for v in &p.verdicts {
        if v.usable {
            let _ = writeln!(
                out,
                "usable: {} (instance type {}, {})",
                v.machine_deployment,
                v.instance_type.as_deref().unwrap_or("?"),
                v.capacity_type.as_deref().unwrap_or("?")
            );
        } else {
            let _ = writeln!(
                out,
                "not usable: {}: {}",
                v.machine_deployment,
                v.problems.join("; ")
            );
        }
        for w in &v.warnings {
            let _ = writeln!(out, "  warning: {w}");
        }
        for f in &v.fixes {
            let _ = writeln!(out, "  fix: {f}");
        }
    }
    for n in &p.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// `karpenter-capi init`: read, judge, print (text: report then YAML; yaml: YAML only with the
/// report as comments).
pub async fn run(args: &InitArgs) -> Result<String, RunError> {
    crate::app::check_binding(&args.cluster_api)?;
    let (_, management) =
        crate::app::clients(args.kubeconfig.as_deref(), &args.cluster_api).await?;
    let namespace = args
        .namespace
        .as_deref()
        .or(args.cluster_api.cluster_api_namespace.as_deref());
    let cluster_name = args.cluster_api.cluster_name.as_deref();
    let capi = read_capi(
        &management,
        crate::app::capi_version(args.cluster_api.cluster_api_version),
        namespace,
        cluster_name,
    )
    .await?;
    let mds: Vec<Arc<MachineDeployment>> = capi.deployments.into_iter().map(Arc::new).collect();
    let (templates, _) = read_templates(&management, &mds).await;
    let never = |_: &str| false;
    let cx = Context {
        templates: &templates,
        unavailable: &never,
    };
    let mut p = propose(
        &mds,
        &cx,
        &args.name,
        cluster_name,
        namespace,
        capi.excluded,
    );
    for (md, why) in capi.unreadable {
        let mut v = Verdict::new(md);
        v.problems.push(format!("cannot be read: {why}"));
        p.verdicts.push(v);
    }
    if let Some(b) = crate::app::binding(&args.cluster_api) {
        bind(&mut p, &b);
    }
    match args.output {
        InitOutput::Yaml => render_yaml(&p, true).map_err(RunError::Render),
        InitOutput::Text => {
            let yaml = render_yaml(&p, false).map_err(RunError::Render)?;
            Ok(format!(
                "{}\nApply with `kubectl apply -f -` (or run `karpenter-capi init -o yaml | kubectl apply -f -`):\n{yaml}",
                report(&p)
            ))
        }
    }
}
