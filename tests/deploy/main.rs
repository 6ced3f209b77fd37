//! What needs files or tools from outside the repository (upstream CRDs and examples,
//! kubectl, helm, promtool): the API against upstream, the chart and manifests, kubectl against
//! the simulated cluster (`init` runs on both backends, in the control_plane test binary), the
//! chart's PrometheusRule against a live /metrics and promtool. Its tests are listed through
//! `trials!` (tests/assets) so a missing asset shows as an ignored test with its reason.

#[macro_use]
#[path = "../assets/mod.rs"]
mod assets;
#[path = "../common/mod.rs"]
mod common;

mod alerts;
mod api;
mod deploy;
mod kubectl;

fn main() -> std::process::ExitCode {
    let mut tests = Vec::new();
    tests.extend(alerts::tests());
    tests.extend(api::tests());
    tests.extend(deploy::tests());
    tests.extend(kubectl::tests());
    assets::main(tests)
}
