use super::*;
use clap::CommandFactory;

#[test]
fn feature_gates_read_as_karpenters_and_refuse_unknown_gates() {
    assert_eq!(feature_gates_arg(""), Ok(FeatureGates::default()));
    assert!(feature_gates_arg("CapacityBuffer=true").is_ok_and(|g| g.capacity_buffer));
    assert!(feature_gates_arg(" CapacityBuffer=false ,").is_ok_and(|g| !g.capacity_buffer));
    assert!(feature_gates_arg("NodeRepair=true").is_ok_and(|g| g.node_repair));
    assert!(!FeatureGates::default().capacity_quota);
    assert!(feature_gates_arg("CapacityQuota=true").is_ok_and(|g| g.capacity_quota));
    assert!(feature_gates_arg("StaticCapacity=false").is_ok_and(|g| !g.static_capacity));
    assert!(!FeatureGates::default().pod_deletion_cost);
    assert!(feature_gates_arg("PodDeletionCostManagement=true").is_ok_and(|g| g.pod_deletion_cost));
    for bad in ["CapacityBuffer", "CapacityBuffer=yes", "Drfit=true"] {
        assert!(feature_gates_arg(bad).is_err(), "{bad}");
    }
}

/// Upstream's own default value (core's options, v1.14 and v1.15) must start the controller:
/// operators copy it from Karpenter's chart. NodeOverlay follows it; the rest changes nothing.
#[test]
fn upstreams_full_default_string_is_accepted() {
    let upstream = "NodeRepair=false,ReservedCapacity=true,SpotToSpotConsolidation=false,NodeOverlay=false,StaticCapacity=false,CapacityBuffer=false";
    let gates = feature_gates_arg(upstream).expect("upstream's default string");
    assert!(!gates.node_overlay && !gates.static_capacity && !gates.node_repair);
    let named: Vec<&str> = gates.no_effect.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(named, ["ReservedCapacity", "SpotToSpotConsolidation"]);
    let v115 = format!(
        "{upstream},TerminateFirstDrift=true,TerminateFirstRepair=false,PodDeletionCostManagement=false,Drift=true"
    );
    let v115 = feature_gates_arg(&v115).expect("v1.15's gates");
    assert!(v115.terminate_first_drift && !v115.terminate_first_repair);
    let named: Vec<&str> = v115.no_effect.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        named,
        ["ReservedCapacity", "SpotToSpotConsolidation", "Drift"]
    );
    // And through the command line as a user passes it.
    let cli = Cli::try_parse_from(["karpenter-capi", "run", "--feature-gates", upstream]);
    assert!(cli.is_ok(), "{:?}", cli.err());
}

#[test]
fn cli_is_well_formed() {
    Cli::command().debug_assert();
}

/// A controller built without the simulator must not offer it, in any help it prints.
#[cfg(not(feature = "simulator"))]
#[test]
fn help_without_the_simulator_does_not_mention_it() {
    let mut cli = Cli::command();
    let root = cli.render_long_help().to_string();
    let run = cli
        .find_subcommand_mut("run")
        .map(|run| run.render_long_help().to_string())
        .unwrap_or_default();
    assert!(run.contains("--log-level"), "{run}");
    for help in [root, run] {
        assert!(!help.to_lowercase().contains("simulat"), "{help}");
    }
}

#[test]
fn run_defaults_match_karpenter() {
    let cli = Cli::try_parse_from(["karpenter-capi", "run"]).unwrap();
    let Command::Run(run) = cli.command else {
        panic!("expected run")
    };
    assert_eq!(run.metrics_port, 8080);
    assert_eq!(run.health_probe_port, 8081);
    assert_eq!(run.controller.create_timeout, Duration::from_secs(300));
    assert_eq!(
        run.controller.registration_timeout,
        Duration::from_secs(900)
    );
    assert_eq!(run.controller.batch_idle_duration, Duration::from_secs(1));
    assert_eq!(run.controller.batch_max_duration, Duration::from_secs(10));
    assert_eq!(run.controller.min_values_policy, MinValuesPolicy::Strict);
    assert_eq!(run.controller.default_termination_grace_period, None);
}

#[test]
fn min_values_policy_takes_upstreams_spelling_in_any_case() {
    for (arg, want) in [
        ("BestEffort", MinValuesPolicy::BestEffort),
        ("besteffort", MinValuesPolicy::BestEffort),
        ("strict", MinValuesPolicy::Strict),
    ] {
        let cli = Cli::try_parse_from([
            "karpenter-capi",
            "run",
            "--min-values-policy",
            arg,
            "--default-termination-grace-period",
            "98h",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(run.controller.min_values_policy, want, "{arg}");
        assert_eq!(
            run.controller.default_termination_grace_period,
            Some(Duration::from_secs(98 * 3600))
        );
    }
}

#[test]
fn scheduler_config_is_parsed_and_checked_at_the_flag() {
    let run = |extra: &[&str]| {
        let mut args = vec!["karpenter-capi", "run"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).map(|cli| match cli.command {
            Command::Run(run) => run.controller.scheduler_config,
            _ => panic!("expected run"),
        })
    };
    // Upstream's default: no default constraints.
    assert_eq!(run(&[]).unwrap(), SchedulerConfigArg(None));
    let set = run(&[
        "--scheduler-config",
        "podTopologySpread: {defaultConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]}",
    ])
    .unwrap();
    assert_eq!(set.0.map(|d| d.constraints().len()), Some(1));
    let err = run(&[
        "--scheduler-config",
        "podTopologySpread: {defaultConstraints: [{maxSkew: 1, topologyKey: a, whenUnsatisfiable: DoNotSchedule, labelSelector: {}}]}",
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("defaultConstraints[0].labelSelector"), "{err}");
}

#[test]
fn repair_policies_are_parsed_and_checked_at_the_flag() {
    let run = |extra: &[&str]| {
        let mut args = vec!["karpenter-capi", "run"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).map(|cli| match cli.command {
            Command::Run(run) => run.controller.repair_policies,
            _ => panic!("expected run"),
        })
    };
    let described = |p: RepairPoliciesArg| {
        (p.0.policies().iter())
            .map(|p| p.describe())
            .collect::<Vec<_>>()
    };
    // Upstream's default: Ready False or Unknown.
    assert_eq!(
        described(run(&[]).unwrap()),
        ["Ready=False", "Ready=Unknown"]
    );
    let set = run(&[
        "--repair-policies",
        r#"{"policies": [{"conditionType": "Ready", "conditionStatus": "Unknown", "tolerationDuration": "5m"},
            {"conditionType": "Ready", "conditionStatus": "Unknown", "reasonRegex": "NodeStatusNeverUpdated", "tolerationDuration": "15m"}]}"#,
    ])
    .unwrap();
    assert_eq!(
        described(set),
        [
            "Ready=Unknown",
            "Ready=Unknown (reason ~ NodeStatusNeverUpdated)"
        ]
    );
    let err = run(&[
        "--repair-policies",
        "policies: [{conditionType: Ready, conditionStatus: 'False', tolerationDuration: 5m, priority: 200}]",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("policies[0].priority: 200 must be between 0 and 100"),
        "{err}"
    );
}

#[test]
fn explain_and_init_take_run_client_flags_and_an_output_format() {
    let cli = Cli::try_parse_from([
        "karpenter-capi",
        "explain",
        "nodeclaim",
        "c1",
        "--cluster-name",
        "prod",
        "--create-timeout",
        "20m",
        "-o",
        "json",
    ])
    .unwrap();
    let Command::Explain(cmd) = cli.command else {
        panic!("expected explain")
    };
    let ExplainCommand::Nodeclaim { name, args } = *cmd else {
        panic!("expected nodeclaim")
    };
    assert_eq!(name, "c1");
    assert_eq!(args.output, ExplainOutput::Json);
    assert_eq!(args.cluster_api.cluster_name.as_deref(), Some("prod"));
    assert_eq!(args.controller.create_timeout, Duration::from_secs(1200));
    let cli = Cli::try_parse_from([
        "karpenter-capi",
        "init",
        "--namespace",
        "capi",
        "-o",
        "yaml",
    ])
    .unwrap();
    let Command::Init(init) = cli.command else {
        panic!("expected init")
    };
    assert_eq!(init.output, InitOutput::Yaml);
    assert_eq!(init.namespace.as_deref(), Some("capi"));
    assert_eq!(init.name, "default");
    assert!(Cli::try_parse_from(["karpenter-capi", "explain", "pod"]).is_err());
    assert!(Cli::try_parse_from(["karpenter-capi", "init", "--namespace", "Bad_NS"]).is_err());
}

#[test]
fn create_timeout_accepts_go_durations_and_rejects_garbage() {
    let cli = Cli::try_parse_from(["karpenter-capi", "run", "--create-timeout", "20m"]).unwrap();
    let Command::Run(run) = cli.command else {
        panic!("expected run")
    };
    assert_eq!(run.controller.create_timeout, Duration::from_secs(1200));
    let err =
        Cli::try_parse_from(["karpenter-capi", "run", "--create-timeout", "soon"]).unwrap_err();
    assert!(err.to_string().contains("--create-timeout"), "{err}");
}

fn run_args(extra: &[&str]) -> Result<RunArgs, clap::Error> {
    let mut all = vec!["karpenter-capi", "run"];
    all.extend_from_slice(extra);
    match Cli::try_parse_from(all)?.command {
        Command::Run(run) => Ok(*run),
        _ => panic!("expected run"),
    }
}

/// Management in-cluster with the workload cluster from a file is the arrangement of one
/// controller per workload cluster beside Cluster API; it excludes the other ways to name
/// the management cluster.
#[test]
fn cluster_api_in_cluster_takes_a_workload_kubeconfig_and_excludes_other_management_flags() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().to_str().unwrap();
    let run = run_args(&["--kubeconfig", path, "--cluster-api-in-cluster"]).unwrap();
    assert!(run.cluster_api.cluster_api_in_cluster);
    assert_eq!(run.kubeconfig.as_deref(), Some(file.path()));
    assert!(!run_args(&[]).unwrap().cluster_api.cluster_api_in_cluster);
    for other in [
        ["--cluster-api-kubeconfig", path],
        ["--cluster-api-url", "https://mgmt.example:6443"],
    ] {
        let mut argv = vec!["--cluster-api-in-cluster"];
        argv.extend_from_slice(&other);
        let err = run_args(&argv).unwrap_err();
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::ArgumentConflict,
            "{other:?}"
        );
    }
}

#[test]
fn kubeconfig_check_interval_defaults_to_ten_seconds_and_zero_turns_it_off() {
    assert_eq!(
        run_args(&[]).unwrap().kubeconfig_check_interval,
        Duration::from_secs(10)
    );
    assert_eq!(
        run_args(&["--kubeconfig-check-interval", "0"])
            .unwrap()
            .kubeconfig_check_interval,
        Duration::ZERO
    );
    assert!(run_args(&["--kubeconfig-check-interval", "10"]).is_err());
}

/// `--legacy-node-repair` (env `LEGACY_NODE_REPAIR`, as upstream's option) is off by default:
/// node repair runs as v1.15's budgeted disruption unless it is given.
#[test]
fn legacy_node_repair_is_off_by_default() {
    let gates = ["--feature-gates", "NodeRepair=true"];
    let run = run_args(&gates).unwrap();
    assert!(run.controller.feature_gates.node_repair);
    assert!(!run.controller.legacy_node_repair);
    let legacy = run_args(&[gates[0], gates[1], "--legacy-node-repair"]).unwrap();
    assert!(legacy.controller.legacy_node_repair);
}
