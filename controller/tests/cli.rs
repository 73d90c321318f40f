//! The `lace-controller` binary's start-up errors: each names what is wrong and the fix, and
//! the process exits non-zero before it talks to any API server.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lace-controller"))
        .args(args)
        // No cluster here: no in-cluster environment, no kubeconfig.
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("LACE_SRV6_LOCATOR_PREFIX")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_or_unusable_prefix_is_refused_naming_the_fix() {
    // As the chart renders an unset controller.srv6LocatorPrefix.
    let (code, err) = run(&[
        "--srv6-locator-prefix=",
        "--metrics-addr=127.0.0.1:0",
        "--health-addr=127.0.0.1:0",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Error: --srv6-locator-prefix is empty: set the chart value controller.srv6LocatorPrefix to the IPv6 prefix node locators are carved from, e.g. 2001:db8:100::/48 (/95 or shorter)"),
        "{err}"
    );
    let (code, err) = run(&[]);
    assert_eq!(code, 1);
    assert!(err.contains("--srv6-locator-prefix is empty"), "{err}");
    let (code, err) = run(&["--srv6-locator-prefix=2001:db8::/96"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--srv6-locator-prefix 2001:db8::/96 leaves no bits for node locators"),
        "{err}"
    );
    let (code, err) = run(&["--srv6-locator-prefix=10.0.0.0/8"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("\"10.0.0.0/8\" is not an IPv6 prefix"),
        "{err}"
    );
}

#[test]
fn the_chart_flags_are_accepted_and_a_missing_cluster_is_named() {
    // The flags of chart/templates/controller.yaml, on free ports.
    let (code, err) = run(&[
        "--srv6-locator-prefix=2001:db8:100::/48",
        "--metrics-addr=127.0.0.1:0",
        "--health-addr=127.0.0.1:0",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("loading the Kubernetes client configuration (in-cluster ServiceAccount, or KUBECONFIG)"),
        "{err}"
    );
    let (code, err) = run(&[
        "--srv6-locator-prefix=2001:db8:100::/48",
        "--metrics-addr=256.0.0.1:1",
    ]);
    assert_eq!(code, 2, "clap rejects the address: {err}");
}
