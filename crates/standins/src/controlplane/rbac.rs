//! The Helm chart's RBAC on a real control plane, and a client that holds nothing else.
//!
//! [`install`] renders the chart with `helm template` as a user installs it, applies its
//! ServiceAccount, Roles, ClusterRoles and their bindings with `kubectl apply` as the
//! administrator, waits until the API server's authorizer grants every rule, and mints a token
//! for the ServiceAccount through the TokenRequest API. The [`ServiceAccountAccess`] it returns
//! authenticates as that ServiceAccount only, so a request the chart does not allow is refused
//! with 403 as in a cluster. [`audited`] reads back, from kube-apiserver's audit log, which
//! permissions one user exercised and which of its requests were refused, so a test can hold the
//! chart to exactly what the controller uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use serde_json::{Value, json};

use super::{ControlPlane, audit};

/// The kinds `install` applies from the rendered chart; everything else (the Deployment, the
/// Service, ...) is the test's to stand in for.
const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// How long the ServiceAccount's token lives: a week, longer than any test or a
/// `simulate --serve` session is kept up (the token is not renewed).
const TOKEN_SECONDS: i64 = 7 * 24 * 3600;

/// How long the authorizer may take to see new bindings (it reads them from its own watch).
const GRANT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running {what}: {source}")]
    Run {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed ({status}):\n{stderr}")]
    Failed {
        what: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("helm template's output: {0}")]
    Rendered(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{} names no cluster", .0.display())]
    NoCluster(PathBuf),
    #[error("reading a kubeconfig: {0}")]
    Kubeconfig(#[from] KubeconfigError),
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "after {waited:?} the API server still refuses {user} these granted permissions: {missing:?}"
    )]
    NotGranted {
        user: String,
        waited: Duration,
        missing: Vec<Permission>,
    },
    #[error("the TokenRequest for ServiceAccount {0} came back without a token")]
    NoToken(String),
    #[error("{} line {line}: {source}", log.display())]
    Audit {
        log: PathBuf,
        line: usize,
        #[source]
        source: super::audit::Error,
    },
}

/// The chart as a user installs it.
#[derive(Debug, Clone)]
pub struct Install<'a> {
    pub helm: &'a Path,
    pub kubectl: &'a Path,
    pub chart: &'a Path,
    pub release: &'a str,
    pub namespace: &'a str,
    /// Extra `helm template` arguments (`--set key=value`, ...).
    pub helm_args: &'a [&'a str],
}

/// One thing RBAC can grant: a verb on a resource (`pods/eviction` for a subresource) of an API
/// group (`""` for the core group).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permission {
    pub group: String,
    pub resource: String,
    pub verb: String,
}

impl Permission {
    pub fn new(group: &str, resource: &str, verb: &str) -> Self {
        Permission {
            group: group.into(),
            resource: resource.into(),
            verb: verb.into(),
        }
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}/{}", self.verb, group, self.resource)
    }
}

/// A rule of a rendered Role or ClusterRole bound to the ServiceAccount.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `ClusterRole/<name>` or `Role/<namespace>/<name>`.
    pub role: String,
    /// The Role's namespace; None for a ClusterRole.
    pub namespace: Option<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
}

impl Rule {
    /// Every (group, resource, verb) this rule grants.
    pub fn permissions(&self) -> impl Iterator<Item = Permission> + '_ {
        self.api_groups.iter().flat_map(move |g| {
            self.resources
                .iter()
                .flat_map(move |r| self.verbs.iter().map(move |v| Permission::new(g, r, v)))
        })
    }
}

/// The chart's ServiceAccount on the control plane: its token in a kubeconfig, and what the chart
/// granted it.
#[derive(Debug, Clone)]
pub struct ServiceAccountAccess {
    pub namespace: String,
    pub name: String,
    /// A kubeconfig with the ServiceAccount's bearer token, for a controller process or
    /// `app::client_from_kubeconfig_with`. It lives in the control plane's directory.
    pub kubeconfig: PathBuf,
    /// The rules of the Roles and ClusterRoles bound to the ServiceAccount.
    pub rules: Vec<Rule>,
}

impl ServiceAccountAccess {
    /// The user name the API server sees.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    /// Every permission the chart grants the ServiceAccount.
    pub fn granted(&self) -> BTreeSet<Permission> {
        self.rules.iter().flat_map(Rule::permissions).collect()
    }

    /// A client authenticated as the ServiceAccount, bound to the caller's runtime.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        let config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&self.kubeconfig)?,
            &KubeConfigOptions::default(),
        )
        .await?;
        kube::Client::try_from(config).map_err(|source| Error::Kube {
            what: "a client for the ServiceAccount".into(),
            source,
        })
    }
}

/// Renders the chart, applies its RBAC, waits until it is in force, and mints the
/// ServiceAccount's token.
pub async fn install(
    cp: &ControlPlane,
    chart: &Install<'_>,
) -> Result<ServiceAccountAccess, Error> {
    let docs: Vec<Value> = render(chart)?
        .into_iter()
        .filter(|d| RBAC_KINDS.iter().any(|k| d["kind"] == *k))
        .collect();
    let account = docs
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .and_then(|d| d["metadata"]["name"].as_str())
        .ok_or_else(|| Error::Rendered("no ServiceAccount (serviceAccount.create=false?)".into()))?
        .to_string();
    let rules = bound_rules(&docs, chart.namespace, &account)?;
    apply(cp, chart, &docs)?;
    let access = ServiceAccountAccess {
        namespace: chart.namespace.into(),
        kubeconfig: cp
            .dir()
            .join(format!("{}-{account}.kubeconfig", chart.namespace)),
        name: account,
        rules,
    };
    let admin = cp.client();
    wait_granted(&admin, &access).await?;
    let token = mint_token(&admin, &access).await?;
    write_kubeconfig(cp, &access.kubeconfig, &token)?;
    Ok(access)
}

/// `helm template`: every object the chart renders.
pub fn render(chart: &Install<'_>) -> Result<Vec<Value>, Error> {
    let mut args = vec![
        "template".to_string(),
        chart.release.to_string(),
        chart.chart.display().to_string(),
        "--namespace".to_string(),
        chart.namespace.to_string(),
    ];
    args.extend(chart.helm_args.iter().map(|a| a.to_string()));
    let out = run(chart.helm, &args, "helm template")?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&out).map_err(|e| Error::Rendered(format!("not YAML: {e}")))?;
    Ok(docs.into_iter().filter(Value::is_object).collect())
}

/// The rules of the rendered Roles and ClusterRoles bound to `account` of `namespace`.
fn bound_rules(docs: &[Value], namespace: &str, account: &str) -> Result<Vec<Rule>, Error> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut rules = Vec::new();
    for binding in docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
    {
        let binds_account = binding["subjects"].as_array().is_some_and(|subjects| {
            subjects.iter().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == namespace
            })
        });
        if !binds_account {
            continue;
        }
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        let binding_ns = binding["metadata"]["namespace"].as_str();
        let role = docs
            .iter()
            .find(|d| d["kind"] == role_kind && d["metadata"]["name"] == role_name)
            .ok_or_else(|| {
                Error::Rendered(format!(
                    "a binding names {role_kind} {role_name}, not rendered"
                ))
            })?;
        // A RoleBinding grants a ClusterRole's rules in its own namespace only.
        let scope = binding_ns.map(String::from);
        let label = match &scope {
            Some(ns) => format!("{role_kind}/{ns}/{role_name}"),
            None => format!("{role_kind}/{role_name}"),
        };
        for rule in role["rules"].as_array().into_iter().flatten() {
            rules.push(Rule {
                role: label.clone(),
                namespace: scope.clone(),
                api_groups: strings(&rule["apiGroups"]),
                resources: strings(&rule["resources"]),
                verbs: strings(&rule["verbs"]),
                resource_names: strings(&rule["resourceNames"]),
            });
        }
    }
    if rules.is_empty() {
        return Err(Error::Rendered(format!(
            "no rules bound to ServiceAccount {namespace}/{account}"
        )));
    }
    Ok(rules)
}

/// `kubectl apply` as the administrator: the release namespace, then the RBAC documents.
fn apply(cp: &ControlPlane, chart: &Install<'_>, docs: &[Value]) -> Result<(), Error> {
    let namespace = json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": chart.namespace},
    });
    // JSON documents are YAML documents.
    let text: Vec<String> = std::iter::once(&namespace)
        .chain(docs)
        .map(Value::to_string)
        .collect();
    let file = cp.dir().join(format!("{}-rbac.yaml", chart.release));
    std::fs::write(&file, text.join("\n---\n")).map_err(|source| Error::Io {
        what: format!("writing {}", file.display()),
        source,
    })?;
    let args = [
        "--kubeconfig".to_string(),
        cp.kubeconfig().display().to_string(),
        "apply".to_string(),
        "-f".to_string(),
        file.display().to_string(),
    ];
    run(chart.kubectl, &args, "kubectl apply (the chart's RBAC)").map(drop)
}

/// Runs a tool; its stdout, or an error with its stderr.
fn run(bin: &Path, args: &[String], what: &str) -> Result<String, Error> {
    let out = Command::new(bin)
        .args(args)
        // The tools are told every cluster by flag; a developer's KUBECONFIG must not leak in.
        .env_remove("KUBECONFIG")
        .output()
        .map_err(|source| Error::Run {
            what: format!("{what} ({})", bin.display()),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: what.into(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until a SubjectAccessReview allows every granted permission: the authorizer reads
/// bindings from its own watch, so a request made right after `kubectl apply` could be refused
/// for a moment, which a test would take for a missing rule.
async fn wait_granted(admin: &kube::Client, access: &ServiceAccountAccess) -> Result<(), Error> {
    let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(admin.clone());
    let user = access.username();
    let groups = vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{}", access.namespace),
        "system:authenticated".to_string(),
    ];
    let began = Instant::now();
    let mut pending: Vec<(Option<String>, Option<String>, Permission)> = access
        .rules
        .iter()
        .flat_map(|r| {
            let name = r.resource_names.first().cloned();
            r.permissions()
                .map(move |p| (r.namespace.clone(), name.clone(), p))
        })
        .collect();
    loop {
        let mut still = Vec::new();
        for (namespace, name, p) in pending {
            let (resource, subresource) = match p.resource.split_once('/') {
                Some((r, s)) => (r.to_string(), Some(s.to_string())),
                None => (p.resource.clone(), None),
            };
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.clone()),
                    groups: Some(groups.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(p.group.clone()),
                        resource: Some(resource),
                        subresource,
                        verb: Some(p.verb.clone()),
                        namespace: namespace.clone(),
                        name: name.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .map_err(|source| Error::Kube {
                    what: format!("reviewing {p} for {user}"),
                    source,
                })?;
            if !answer.status.is_some_and(|s| s.allowed) {
                still.push((namespace, name, p));
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        if began.elapsed() >= GRANT_TIMEOUT {
            return Err(Error::NotGranted {
                user,
                waited: began.elapsed(),
                missing: still.into_iter().map(|(_, _, p)| p).collect(),
            });
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A bound token for the ServiceAccount (the TokenRequest API, as the kubelet gets a pod's
/// projected token), for the API server's own audience.
async fn mint_token(admin: &kube::Client, access: &ServiceAccountAccess) -> Result<String, Error> {
    let accounts: kube::Api<ServiceAccount> =
        kube::Api::namespaced(admin.clone(), &access.namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(&access.name, &PostParams::default(), &request)
        .await
        .map_err(|source| Error::Kube {
            what: format!(
                "a token for ServiceAccount {}/{}",
                access.namespace, access.name
            ),
            source,
        })?;
    answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::NoToken(format!("{}/{}", access.namespace, access.name)))
}

/// A kubeconfig for the admin kubeconfig's cluster, with the ServiceAccount's token.
fn write_kubeconfig(cp: &ControlPlane, at: &Path, token: &str) -> Result<(), Error> {
    let admin = Kubeconfig::read_from(cp.kubeconfig())?;
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| Error::NoCluster(cp.kubeconfig().to_path_buf()))?;
    // JSON strings are YAML strings: this quotes whatever characters they hold.
    let q = |s: &str| Value::String(s.to_string()).to_string();
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: control-plane
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: service-account
  user:
    token: {token}
contexts:
- name: default
  context:
    cluster: control-plane
    user: service-account
current-context: default
",
        server = q(cluster.server.as_deref().unwrap_or_default()),
        ca = q(cluster.certificate_authority.as_deref().unwrap_or_default()),
        token = q(token),
    );
    std::fs::write(at, text).map_err(|source| Error::Io {
        what: format!("writing {}", at.display()),
        source,
    })
}

/// What one user did, as kube-apiserver's audit log recorded it.
#[derive(Debug, Default, Clone)]
pub struct Audited {
    /// Every permission the user's requests exercised (resource requests only; discovery's
    /// non-resource URLs are every authenticated user's).
    pub used: BTreeSet<Permission>,
    /// The refused requests (403), as `verb path`, with how many times each was refused.
    pub forbidden: BTreeMap<String, usize>,
    /// The permissions each User-Agent exercised with writes (every verb but get, list and
    /// watch): which replica wrote what, when replicas share the user.
    pub writes: BTreeMap<String, BTreeSet<Permission>>,
    /// How many requests the log holds for the user (a watch is logged when it starts and again
    /// when it ends: one request).
    pub requests: usize,
}

/// Reads the control plane's audit log for `user`'s requests.
pub fn audited(cp: &ControlPlane, user: &str) -> Result<Audited, Error> {
    let log = cp.audit_log();
    let text = std::fs::read_to_string(log).map_err(|source| Error::Io {
        what: format!("reading {}", log.display()),
        source,
    })?;
    parse_audit(&text, user).map_err(|(line, source)| Error::Audit {
        log: log.to_path_buf(),
        line,
        source,
    })
}

/// `user`'s requests in an audit log's text (JSON lines); an error names the line.
fn parse_audit(text: &str, user: &str) -> Result<Audited, (usize, audit::Error)> {
    let mut out = Audited::default();
    // A last line without its newline is still being written: only whole lines are events.
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    for (i, line) in whole.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let event = audit::Event::parse(line).map_err(|e| (i + 1, e))?;
        if event.username != user {
            continue;
        }
        if event.is_request() {
            out.requests += 1;
        }
        let verb = event.verb.as_str();
        if event.code == Some(403) {
            let uri = event.request_uri.as_str();
            let path = uri.split_once('?').map_or(uri, |(path, _)| path);
            *out.forbidden.entry(format!("{verb} {path}")).or_default() += 1;
            continue;
        }
        if event.resource.is_empty() {
            continue;
        }
        let resource = match event.subresource.as_str() {
            "" => event.resource.clone(),
            sub => format!("{}/{sub}", event.resource),
        };
        let permission = Permission::new(&event.api_group, &resource, verb);
        if !matches!(verb, "get" | "list" | "watch") {
            out.writes
                .entry(event.user_agent.clone())
                .or_default()
                .insert(permission.clone());
        }
        out.used.insert(permission);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
