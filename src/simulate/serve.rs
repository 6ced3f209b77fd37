//! `simulate --serve`: the simulated cluster kept running for other tools (kubectl, a
//! `karpenter-capi run` in another process) until SIGINT or SIGTERM, with its kubeconfig at
//! `--kubeconfig-out`. See docs/simulated-cluster.md ("Serving the simulated cluster").

use std::future::Future;
use std::path::Path;

use super::{BackgroundSim, Error, Kept, launch, pods, sim_settings};
use crate::cli::{Scenario, SimulateArgs};
use crate::metrics::Metrics;

/// `--no-controller` or `--scenario none`: seed the cluster as the scenario would, create its
/// workload, start the in-process controller unless told not to, and serve (no report: nothing
/// settles without a controller, and `none` has nothing to measure).
pub async fn without_report(args: &SimulateArgs) -> Result<(), Error> {
    let signal = crate::app::shutdown_signal();
    if args.serve.no_controller && phased(args.scenario) {
        return Err(Error::Usage(format!(
            "the {:?} scenario drives the controller through its phases and cannot run with \
             --no-controller; use --scenario default, pods, launch or none",
            args.scenario
        )));
    }
    let sim = super::start_sim(args).await?;
    let controller = match args.serve.no_controller {
        true => None,
        false => {
            let create_timeout = args.create_timeout;
            Some(super::start_controller(&sim, sim_settings(create_timeout), Metrics::new()).await?)
        }
    };
    if args.scenario == Scenario::None && args.nodes > 0 {
        super::standup::stand_up(&sim, args, controller.is_some()).await?;
    } else {
        create_workload(&sim, args).await?;
    }
    hold(Kept::new(sim, controller), signal).await;
    Ok(())
}

/// Scenarios made of phases that wait for the controller's work (so they need it in-process).
fn phased(scenario: Scenario) -> bool {
    matches!(
        scenario,
        Scenario::Drain
            | Scenario::Consolidate
            | Scenario::Drift
            | Scenario::Expire
            | Scenario::Buffer
            | Scenario::Static
            | Scenario::Repair
            | Scenario::FullPool
            | Scenario::Quota
            | Scenario::Generate
    )
}

/// What each scenario puts in the cluster before its controller acts: `none` only the
/// MachineDeployments the simulated infrastructure offers (no NodePool: users bring theirs),
/// `launch` also the NodeClass, NodePool and NodeClaims, `default`/`pods` the NodeClass,
/// NodePool and Deployments of pending pods.
async fn create_workload(sim: &BackgroundSim, args: &SimulateArgs) -> Result<(), Error> {
    match args.scenario {
        Scenario::None => pods::seed_machine_deployments(sim, args).await,
        Scenario::Launch => {
            let pool = launch::seed(sim, args).await?;
            let mds = args.machine_deployments.max(1);
            eprintln!(
                "creating {} NodeClaims over {}",
                args.claims,
                super::node_groups::named(args.scalable, mds)
            );
            launch::create_claims_on(sim, pool, args.claims, mds).await
        }
        _ => {
            pods::seed_machine_deployments(sim, args).await?;
            pods::seed_nodepool(sim, |_| {}).await?;
            pods::create_deployments(sim, args, |_, _| {}).await
        }
    }
}

/// Serve until `signal` (SIGINT or SIGTERM), then stop the controller and the cluster. The
/// kubeconfig at `--kubeconfig-out` stays: it names a fixed port with `--port`, so a restarted
/// cluster is reachable with it again.
pub async fn hold(kept: Kept, signal: impl Future<Output = &'static str>) {
    let kubeconfig = kept.sim.kubeconfig();
    let shown = display_path(&kubeconfig);
    eprintln!(
        "serving the simulated cluster at {} until SIGINT or SIGTERM (Ctrl-C)\n  \
         kubeconfig: {shown}\n  \
         kubectl --kubeconfig {shown} get nodeclaims,machines,nodes",
        kept.sim.cluster().url()
    );
    if kept.controller.is_none() {
        eprintln!("  karpenter-capi run --kubeconfig {shown}");
    }
    let name = signal.await;
    eprintln!("{name}: stopping the simulated cluster (the kubeconfig stays at {shown})");
    // Dropping stops the controller, then the cluster.
    drop(kept);
}

/// The path as a user can paste it from anywhere (absolute when it can be resolved).
fn display_path(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}
