use super::*;

#[test]
fn a_lease_name_is_short_and_unique_per_cluster() {
    assert_eq!(lease_name("default", "c1"), "karpenter-capi-default.c1");
    let long = "x".repeat(60);
    let a = lease_name("team-a", &long);
    let b = lease_name("team-b", &long);
    assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
    assert_ne!(a, b, "two long names stay apart");
    assert!(!a.ends_with('-') && a.starts_with("karpenter-capi-team-a."));
}

#[test]
fn a_kubeconfig_secret_template_names_each_cluster() {
    let default = KubeconfigSecret::default();
    assert_eq!(default.name_for("c1"), "c1-kubeconfig");
    let own = KubeconfigSecret {
        name: "{cluster}-karpenter-capi".into(),
        key: "kubeconfig".into(),
    };
    assert_eq!(own.name_for("prod-eu"), "prod-eu-karpenter-capi");
}

#[test]
fn a_fleet_refuses_the_flags_of_one_cluster_by_name() {
    use crate::cli::{Cli, Command};
    use clap::Parser;
    let args = |extra: &[&str]| {
        let mut argv = vec!["karpenter-capi", "run"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).expect("parses").command {
            Command::Run(run) => run,
            _ => panic!("expected run"),
        }
    };
    // Parsed without a clap conflict (a chart sets FLEET=false beside them).
    let run = args(&["--kubeconfig", "Cargo.toml"]);
    assert!(!run.fleet.enabled);
    for (flags, named) in [
        (
            &["--fleet", "--kubeconfig", "Cargo.toml"][..],
            "--kubeconfig",
        ),
        (&["--fleet", "--cluster-name", "c1"][..], "--cluster-name"),
        (&["--fleet", "--dry-run"][..], "--dry-run"),
        (
            &["--fleet", "--disable-leader-election"][..],
            "--disable-leader-election",
        ),
    ] {
        let err = refuse_single_cluster_flags(&args(flags)).expect_err(named);
        assert!(err.to_string().contains(named), "{err}");
    }
    assert!(refuse_single_cluster_flags(&args(&["--fleet"])).is_ok());
}

#[test]
fn a_deleting_or_paused_cluster_is_not_served() {
    let mut c: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": "default"},
        "spec": {},
    }))
    .expect("a Cluster");
    assert_eq!(skip_reason(&c), None);
    c.data["spec"]["paused"] = serde_json::json!(true);
    assert_eq!(skip_reason(&c), Some("the Cluster is paused"));
    c.data["spec"]["paused"] = serde_json::json!(false);
    c.annotations_mut()
        .insert("cluster.x-k8s.io/paused".into(), String::new());
    assert_eq!(skip_reason(&c), Some("the Cluster is paused"));
}
