//! Execs the real `lace` binary with containerd-style environment and stdin against a fake
//! agent on a real unix socket, and checks stdout, exit code and what the agent received.
//! Needs root (it creates network namespaces with `ip netns add`).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::Path;

use common::*;
use lace::wire::{
    del_queue, Attachment, CniError, CniResult, CniVersion, Command, ErrorCode, Response,
};
use serde_json::{json, Value};

fn env_with(base: &[(String, String)], changes: &[(&str, Option<&str>)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base.to_vec();
    for (key, value) in changes {
        env.retain(|(k, _)| k != key);
        if let Some(value) = value {
            env.push(((*key).to_owned(), (*value).to_owned()));
        }
    }
    env
}

/// The result a real agent would send for a dual-stack pod.
fn agent_result(netns: &Path) -> CniResult {
    serde_json::from_value(json!({
        "interfaces": [
            {"name": "lace5f2a9c01", "mac": "02:00:00:00:00:01"},
            {"name": "eth0", "mac": "02:00:00:00:00:02", "mtu": 1410,
             "sandbox": netns.to_str().unwrap()}
        ],
        "ips": [
            {"address": "10.244.1.7/32", "gateway": "169.254.1.1", "interface": 1},
            {"address": "fd00:244:1::7/128", "gateway": "fe80::1", "interface": 1}
        ],
        "routes": [
            {"dst": "0.0.0.0/0", "gw": "169.254.1.1"},
            {"dst": "::/0", "gw": "fe80::1"}
        ]
    }))
    .unwrap()
}

fn ok_with(result: CniResult) -> impl Fn(&lace::wire::Request) -> Reply + Send + Sync {
    move |_| Reply::Respond(Response::Ok(Some(result.clone())))
}

fn ok_empty(_: &lace::wire::Request) -> Reply {
    Reply::Respond(Response::Ok(None))
}

#[test]
fn version_answers_whatever_stdin_holds() {
    let env = vec![("CNI_COMMAND".to_owned(), "VERSION".to_owned())];
    for stdin in [
        "",
        r#"{"cniVersion":"0.3.1"}"#,
        r#"{"cniVersion":"1.1.0"}"#,
        "not json",
    ] {
        let out = run_plugin(&env, stdin);
        assert_eq!(out.code, Some(0), "{out:?}");
        assert_eq!(
            out.json(),
            json!({"cniVersion": "1.1.0", "supportedVersions":
                ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}),
            "stdin {stdin:?}"
        );
    }
}

#[test]
fn add_prints_the_agent_result_and_forwards_the_invocation() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), ok_with(agent_result(&ns.path)));
    let id = container_id();
    let env = containerd_env("ADD", &id, ns.path.to_str().unwrap());
    let conf = netconf("1.1.0", &agent.socket, dir.path());

    let out = run_plugin(&env, &conf.to_string());
    assert_eq!(out.code, Some(0), "{out:?}");
    let printed = out.json();
    assert_eq!(printed["cniVersion"], "1.1.0");
    assert_eq!(
        printed["ips"][0],
        json!({"address": "10.244.1.7/32", "gateway": "169.254.1.1", "interface": 1})
    );
    assert_eq!(
        printed["interfaces"][1]["sandbox"],
        ns.path.to_str().unwrap()
    );
    assert_eq!(printed["interfaces"][1]["mtu"], 1410);
    let back: CniResult = serde_json::from_value(printed).unwrap();
    assert_eq!(
        CniResult {
            cni_version: None,
            ..back
        },
        agent_result(&ns.path)
    );

    let requests = agent.requests();
    assert_eq!(requests.len(), 1);
    let req = &requests[0];
    assert_eq!(req.command, Command::Add);
    assert_eq!(req.container_id.as_deref(), Some(id.as_str()));
    assert_eq!(req.netns.as_deref(), Some(ns.path.as_path()));
    assert_eq!(req.ifname.as_deref(), Some("eth0"));
    assert_eq!(req.pod_namespace.as_deref(), Some("default"));
    assert_eq!(req.pod_name.as_deref(), Some("web-0"));
    assert_eq!(
        req.pod_uid.as_deref(),
        Some("7d3f1c2e-9b8a-4c5d-8e6f-0a1b2c3d4e5f")
    );
    assert_eq!(req.cni_version, CniVersion::V1_1_0);
    assert_eq!(
        Value::Object(req.config.clone()),
        conf,
        "config forwarded unchanged"
    );
    assert!(req.prev_result.is_none() && req.valid_attachments.is_none());
}

#[test]
fn add_answers_in_the_configured_version() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), ok_with(agent_result(&ns.path)));
    let env = containerd_env("ADD", &container_id(), ns.path.to_str().unwrap());

    let out = run_plugin(
        &env,
        &netconf("0.4.0", &agent.socket, dir.path()).to_string(),
    );
    let printed = out.json();
    assert_eq!(printed["cniVersion"], "0.4.0", "{out:?}");
    assert_eq!(printed["ips"][0]["version"], "4");
    assert_eq!(printed["ips"][1]["version"], "6");
    assert!(
        printed["interfaces"][1].get("mtu").is_none(),
        "mtu is a 1.1.0 field"
    );

    let out = run_plugin(
        &env,
        &netconf("1.0.0", &agent.socket, dir.path()).to_string(),
    );
    let printed = out.json();
    assert_eq!(printed["cniVersion"], "1.0.0");
    assert!(printed["ips"][0].get("version").is_none());
    assert_eq!(agent.requests()[1].cni_version, CniVersion::V1_0_0);
}

#[test]
fn add_with_agent_down_says_try_again_later_naming_the_socket() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let env = containerd_env("ADD", &container_id(), ns.path.to_str().unwrap());

    // No socket file at all.
    let missing = dir.path().join("missing.sock");
    let (code, msg) = run_plugin(&env, &netconf("1.1.0", &missing, dir.path()).to_string()).error();
    assert_eq!(code, 11);
    assert!(msg.contains(missing.to_str().unwrap()), "{msg}");

    // A socket file nobody listens on (the agent died): connection refused.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let (code, msg) = run_plugin(&env, &netconf("1.1.0", &stale, dir.path()).to_string()).error();
    assert_eq!(code, 11);
    assert!(
        msg.contains(stale.to_str().unwrap()) && msg.contains("refused"),
        "{msg}"
    );
}

#[test]
fn add_with_hung_agent_times_out_with_try_again_later() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), |_| Reply::Hang);
    let env = containerd_env("ADD", &container_id(), ns.path.to_str().unwrap());
    let mut conf = netconf("1.1.0", &agent.socket, dir.path());
    conf["timeoutSeconds"] = json!(1);
    let (code, msg) = run_plugin(&env, &conf.to_string()).error();
    assert_eq!(code, 11);
    assert!(msg.contains("did not answer within 1s"), "{msg}");
}

#[test]
fn agent_errors_are_passed_on_with_the_config_version() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), |_| {
        Reply::Respond(Response::Err(
            CniError::new(
                ErrorCode::TRY_AGAIN_LATER,
                "no NetworkBindingPolicy matches pod default/web-0",
            )
            .with_details("create a NetworkBindingPolicy selecting namespace default"),
        ))
    });
    let env = containerd_env("ADD", &container_id(), ns.path.to_str().unwrap());
    let out = run_plugin(
        &env,
        &netconf("1.0.0", &agent.socket, dir.path()).to_string(),
    );
    assert_eq!(out.code, Some(1));
    assert_eq!(
        out.json(),
        json!({"cniVersion": "1.0.0", "code": 11,
               "msg": "no NetworkBindingPolicy matches pod default/web-0",
               "details": "create a NetworkBindingPolicy selecting namespace default"})
    );
}

#[test]
fn broken_agent_answers_are_errors_not_results() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let env = containerd_env("ADD", &container_id(), ns.path.to_str().unwrap());
    let cases: Vec<(Reply, u64, &str)> = vec![
        (Reply::Raw(b"hello\n".to_vec()), 999, "invalid answer"),
        // Closed without a full line: the agent went away mid-request, retry.
        (Reply::Raw(b"{\"ok\":".to_vec()), 11, "without answering"),
        (Reply::Respond(Response::Ok(None)), 999, "without a result"),
        (
            Reply::Respond(Response::Ok(Some(
                serde_json::from_value(
                    json!({"ips": [{"address": "10.0.0.1/32", "interface": 3}]}),
                )
                .unwrap(),
            ))),
            999,
            "ips[0].interface is 3",
        ),
    ];
    for (reply, want_code, needle) in cases {
        let sub = TempDir::new();
        let reply = std::sync::Mutex::new(Some(reply));
        let agent = FakeAgent::start(sub.path(), move |_| reply.lock().unwrap().take().unwrap());
        let (code, msg) = run_plugin(
            &env,
            &netconf("1.1.0", &agent.socket, dir.path()).to_string(),
        )
        .error();
        assert_eq!(code, want_code, "{msg}");
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    }
}

#[test]
fn status_reports_readiness() {
    let dir = TempDir::new();
    let env = vec![
        ("CNI_COMMAND".to_owned(), "STATUS".to_owned()),
        ("CNI_PATH".to_owned(), "/opt/cni/bin".to_owned()),
    ];

    let missing = dir.path().join("missing.sock");
    let (code, msg) = run_plugin(&env, &netconf("1.1.0", &missing, dir.path()).to_string()).error();
    assert_eq!(code, 50);
    assert!(
        msg.contains("not ready") && msg.contains(missing.to_str().unwrap()),
        "{msg}"
    );

    let agent = FakeAgent::start(dir.path(), ok_empty);
    run_plugin(
        &env,
        &netconf("1.1.0", &agent.socket, dir.path()).to_string(),
    )
    .assert_silent_success();
    let req = &agent.requests()[0];
    assert_eq!(
        (req.command, req.container_id.as_ref(), req.ifname.as_ref()),
        (Command::Status, None, None)
    );

    // STATUS does not exist before 1.1.0.
    for version in ["0.4.0", "1.0.0"] {
        let (code, msg) = run_plugin(
            &env,
            &netconf(version, &agent.socket, dir.path()).to_string(),
        )
        .error();
        assert_eq!(code, 1);
        assert!(msg.contains("does not allow STATUS"), "{msg}");
    }
    assert_eq!(agent.requests().len(), 1);
}

#[test]
fn status_with_hung_agent_is_not_available_within_five_seconds() {
    let dir = TempDir::new();
    let agent = FakeAgent::start(dir.path(), |_| Reply::Hang);
    let env = vec![("CNI_COMMAND".to_owned(), "STATUS".to_owned())];
    let mut conf = netconf("1.1.0", &agent.socket, dir.path());
    conf["timeoutSeconds"] = json!(600);
    let (code, msg) = run_plugin(&env, &conf.to_string()).error();
    assert_eq!(code, 50);
    // The message carries the timeout actually used: STATUS caps the configured one.
    assert!(msg.contains("did not answer within 5s"), "{msg}");
}

#[test]
fn status_passes_on_the_agents_not_ready() {
    let dir = TempDir::new();
    let agent = FakeAgent::start(dir.path(), |_| {
        Reply::Respond(Response::Err(CniError::new(
            ErrorCode::NOT_AVAILABLE,
            "IPAM state not restored yet",
        )))
    });
    let env = vec![("CNI_COMMAND".to_owned(), "STATUS".to_owned())];
    let (code, msg) = run_plugin(
        &env,
        &netconf("1.1.0", &agent.socket, dir.path()).to_string(),
    )
    .error();
    assert_eq!((code, msg.as_str()), (50, "IPAM state not restored yet"));
}

#[test]
fn gc_forwards_valid_attachments_and_refuses_without_them() {
    let dir = TempDir::new();
    let agent = FakeAgent::start(dir.path(), ok_empty);
    let env = vec![
        ("CNI_COMMAND".to_owned(), "GC".to_owned()),
        ("CNI_PATH".to_owned(), "/opt/cni/bin".to_owned()),
    ];
    let keep = vec![
        Attachment {
            container_id: container_id(),
            ifname: "eth0".into(),
        },
        Attachment {
            container_id: container_id(),
            ifname: "eth0".into(),
        },
    ];
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let mut conf = netconf("1.1.0", &agent.socket, dir.path());
        conf[key] = serde_json::to_value(&keep).unwrap();
        run_plugin(&env, &conf.to_string()).assert_silent_success();
    }
    let requests = agent.requests();
    assert_eq!(requests.len(), 2);
    for req in &requests {
        assert_eq!(req.command, Command::Gc);
        assert_eq!(req.valid_attachments.as_ref(), Some(&keep));
    }

    // Without the list GC must not run: it would read as "nothing is valid".
    let (code, msg) = run_plugin(
        &env,
        &netconf("1.1.0", &agent.socket, dir.path()).to_string(),
    )
    .error();
    assert_eq!(code, 7);
    assert!(msg.contains("cni.dev/valid-attachments"), "{msg}");
    let mut old = netconf("1.0.0", &agent.socket, dir.path());
    old["cni.dev/valid-attachments"] = json!([]);
    let (code, msg) = run_plugin(&env, &old.to_string()).error();
    assert_eq!(code, 1, "{msg}");
    assert_eq!(
        agent.requests().len(),
        2,
        "refused GCs never reach the agent"
    );
}

#[test]
fn del_succeeds_silently_and_tolerates_a_vanished_netns() {
    let dir = TempDir::new();
    let agent = FakeAgent::start(dir.path(), ok_empty);
    let id = container_id();
    let conf = netconf("1.1.0", &agent.socket, dir.path()).to_string();

    // Netns still there: passed on.
    let ns = Netns::new();
    run_plugin(
        &containerd_env("DEL", &id, ns.path.to_str().unwrap()),
        &conf,
    )
    .assert_silent_success();
    // Netns deleted by the runtime already, then no CNI_NETNS at all: DEL still succeeds, twice.
    let gone = ns.path.clone();
    drop(ns);
    run_plugin(&containerd_env("DEL", &id, gone.to_str().unwrap()), &conf).assert_silent_success();
    let no_netns = env_with(&containerd_env("DEL", &id, ""), &[("CNI_NETNS", None)]);
    run_plugin(&no_netns, &conf).assert_silent_success();
    run_plugin(&no_netns, &conf).assert_silent_success();

    let requests = agent.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[0].netns.as_deref(), Some(gone.as_path()));
    assert!(requests[1..]
        .iter()
        .all(|r| r.netns.is_none() && r.command == Command::Del));
    assert!(requests
        .iter()
        .all(|r| r.container_id.as_deref() == Some(id.as_str())));
}

#[test]
fn del_with_agent_down_is_queued_for_the_agent() {
    let dir = TempDir::new();
    let id = container_id();
    let socket = dir.path().join("down.sock");
    let mut conf = netconf("1.1.0", &socket, dir.path());
    conf["prevResult"] = serde_json::to_value(agent_result(Path::new("/run/netns/x"))).unwrap();
    let env = containerd_env("DEL", &id, "/run/netns/does-not-exist");

    run_plugin(&env, &conf.to_string()).assert_silent_success();
    // Retried by the runtime: still fine, one queue entry per attachment.
    run_plugin(&env, &conf.to_string()).assert_silent_success();
    let queued = del_queue::pending(&dir.path().join("del-queue")).unwrap();
    assert_eq!(queued.len(), 1, "{queued:?}");
    let req = &queued[0].1;
    assert_eq!(req.command, Command::Del);
    assert_eq!(req.container_id.as_deref(), Some(id.as_str()));
    assert_eq!(req.ifname.as_deref(), Some("eth0"));
    assert_eq!(req.pod_name.as_deref(), Some("web-0"));
    assert!(req.netns.is_none());
    assert_eq!(
        req.prev_result.as_ref(),
        Some(&agent_result(Path::new("/run/netns/x")))
    );

    // If the queue cannot be written either, the runtime has to retry.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    conf["delQueueDir"] = json!(file.join("queue"));
    let (code, msg) = run_plugin(&env, &conf.to_string()).error();
    assert_eq!(code, 11);
    assert!(
        msg.contains(socket.to_str().unwrap()) && msg.contains("could not be queued"),
        "{msg}"
    );
}

#[test]
fn del_passes_on_agent_errors() {
    let dir = TempDir::new();
    let agent = FakeAgent::start(dir.path(), |_| {
        Reply::Respond(Response::Err(CniError::new(
            ErrorCode::TRY_AGAIN_LATER,
            "IPAM store locked",
        )))
    });
    let env = containerd_env("DEL", &container_id(), "");
    let (code, msg) = run_plugin(
        &env,
        &netconf("1.1.0", &agent.socket, dir.path()).to_string(),
    )
    .error();
    assert_eq!((code, msg.as_str()), (11, "IPAM store locked"));
    assert!(
        !dir.path().join("del-queue").exists(),
        "an answered DEL is not queued"
    );
}

#[test]
fn check_needs_prev_result_and_forwards_it() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), ok_empty);
    let env = containerd_env("CHECK", &container_id(), ns.path.to_str().unwrap());
    let mut conf = netconf("0.4.0", &agent.socket, dir.path());

    let (code, msg) = run_plugin(&env, &conf.to_string()).error();
    assert_eq!(code, 7);
    assert!(msg.contains("prevResult"), "{msg}");

    // A 0.4.0 prevResult, as the runtime cached it (with ips[].version).
    conf["prevResult"] = agent_result(&ns.path).to_json(CniVersion::V0_4_0);
    run_plugin(&env, &conf.to_string()).assert_silent_success();
    let requests = agent.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].command, Command::Check);
    assert_eq!(
        requests[0].prev_result.as_ref().map(|r| &r.ips),
        Some(&agent_result(&ns.path).ips)
    );

    drop(agent);
    let (code, _) = run_plugin(&env, &conf.to_string()).error();
    assert_eq!(code, 11, "CHECK with the agent down");
}

#[test]
fn malformed_inputs_get_the_right_code_and_never_reach_the_agent() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), ok_with(agent_result(&ns.path)));
    let regular_file = dir.path().join("not-a-netns");
    std::fs::write(&regular_file, "").unwrap();
    let good_conf = netconf("1.1.0", &agent.socket, dir.path());
    let base = containerd_env("ADD", &container_id(), ns.path.to_str().unwrap());
    let with_conf = |key: &str, value: Value| {
        let mut conf = good_conf.clone();
        conf[key] = value;
        conf.to_string()
    };
    let good = good_conf.to_string();

    struct Case<'a> {
        env: Vec<(&'a str, Option<&'a str>)>,
        stdin: String,
        code: u64,
        needle: &'a str,
    }
    let case = |env: Vec<(&'static str, Option<&'static str>)>,
                stdin: &str,
                code: u64,
                needle: &'static str| Case {
        env,
        stdin: stdin.to_owned(),
        code,
        needle,
    };
    let file = regular_file.to_str().unwrap().to_owned();
    let file: &'static str = Box::leak(file.into_boxed_str());
    let cases = vec![
        // stdin
        case(vec![], "{\"cniVersion\": ", 6, "not valid JSON"),
        case(vec![], "", 6, "stdin is empty"),
        case(vec![], "[]", 6, "JSON object"),
        case(
            vec![],
            &with_conf("cniVersion", json!("0.3.1")),
            1,
            "\"0.3.1\"",
        ),
        case(
            vec![],
            &with_conf("cniVersion", json!("2.0.0")),
            1,
            "supports 0.4.0, 1.0.0, 1.1.0",
        ),
        case(
            vec![],
            &with_conf("cniVersion", Value::Null),
            1,
            "no cniVersion",
        ),
        case(vec![], &with_conf("type", json!("bridge")), 7, "\"bridge\""),
        case(
            vec![],
            &with_conf("name", json!("bad name")),
            7,
            "\"bad name\"",
        ),
        case(
            vec![],
            &with_conf("agentSocket", json!(42)),
            7,
            "agentSocket",
        ),
        case(
            vec![],
            &with_conf("agentSocket", json!("relative.sock")),
            7,
            "absolute path",
        ),
        case(
            vec![],
            &with_conf("logLevel", json!("chatty")),
            7,
            "logLevel",
        ),
        case(
            vec![],
            &with_conf("ipam", json!({"type": "host-local"})),
            2,
            "ipam",
        ),
        // CNI_COMMAND
        case(
            vec![("CNI_COMMAND", None)],
            &good,
            4,
            "CNI_COMMAND is not set",
        ),
        case(
            vec![("CNI_COMMAND", Some("add"))],
            &good,
            4,
            "CNI_COMMAND=\"add\"",
        ),
        // CNI_CONTAINERID
        case(
            vec![("CNI_CONTAINERID", None)],
            &good,
            4,
            "CNI_CONTAINERID is not set",
        ),
        case(
            vec![("CNI_CONTAINERID", Some("../etc"))],
            &good,
            4,
            "\"../etc\"",
        ),
        // CNI_IFNAME
        case(
            vec![("CNI_IFNAME", None)],
            &good,
            4,
            "CNI_IFNAME is not set",
        ),
        case(
            vec![("CNI_IFNAME", Some(""))],
            &good,
            4,
            "CNI_IFNAME: interface name is empty",
        ),
        case(
            vec![("CNI_IFNAME", Some("eth0123456789012"))],
            &good,
            4,
            "at most 15",
        ),
        case(vec![("CNI_IFNAME", Some("a/b"))], &good, 4, "'/'"),
        case(vec![("CNI_IFNAME", Some("a b"))], &good, 4, "' '"),
        case(vec![("CNI_IFNAME", Some("a:1"))], &good, 4, "':'"),
        case(
            vec![("CNI_IFNAME", Some("."))],
            &good,
            4,
            "\".\" is not allowed",
        ),
        case(
            vec![("CNI_IFNAME", Some(".."))],
            &good,
            4,
            "\"..\" is not allowed",
        ),
        // CNI_NETNS
        case(vec![("CNI_NETNS", None)], &good, 4, "CNI_NETNS is not set"),
        case(
            vec![("CNI_NETNS", Some("run/netns/x"))],
            &good,
            4,
            "not an absolute path",
        ),
        case(
            vec![("CNI_NETNS", Some("/run/netns/lace-no-such-netns"))],
            &good,
            4,
            "does not exist",
        ),
        case(
            vec![("CNI_NETNS", Some(file))],
            &good,
            4,
            "not a namespace (nsfs) file",
        ),
        case(
            vec![("CNI_NETNS", Some("/tmp"))],
            &good,
            4,
            "it is a directory",
        ),
        case(
            vec![("CNI_NETNS", Some("/proc/self/ns/mnt"))],
            &good,
            4,
            "is a mnt namespace",
        ),
        case(
            vec![("CNI_NETNS", Some("/proc/self/ns/net"))],
            &good,
            4,
            "host's own network namespace",
        ),
        // CNI_ARGS
        case(
            vec![("CNI_ARGS", Some("K8S_POD_NAMESPACE"))],
            &good,
            4,
            "not KEY=VALUE",
        ),
        case(
            vec![("CNI_ARGS", Some("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;FOO=1"))],
            &good,
            4,
            "FOO",
        ),
        case(
            vec![("CNI_ARGS", Some("IgnoreUnknown=1;K8S_POD_NAME=web-0"))],
            &good,
            4,
            "no K8S_POD_NAMESPACE",
        ),
        case(
            vec![(
                "CNI_ARGS",
                Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=default"),
            )],
            &good,
            4,
            "no K8S_POD_NAME",
        ),
        case(
            vec![("CNI_ARGS", Some("K8S_POD_NAMESPACE=Default;K8S_POD_NAME=x"))],
            &good,
            4,
            "\"Default\"",
        ),
    ];
    for c in &cases {
        let env = env_with(&base, &c.env);
        let out = run_plugin(&env, &c.stdin);
        let (code, msg) = out.error();
        assert_eq!(code, c.code, "{:?} / {:?}: {msg}", c.env, c.stdin);
        assert!(
            msg.contains(c.needle),
            "{:?} / {:?}: {msg:?} lacks {:?}",
            c.env,
            c.stdin,
            c.needle
        );
    }
    assert!(
        agent.requests().is_empty(),
        "invalid input reached the agent: {:?}",
        agent.requests()
    );
    // The same environment with nothing broken does reach it (the cases above are not failing
    // for some shared reason).
    assert_eq!(run_plugin(&base, &good).code, Some(0));
    assert_eq!(agent.requests().len(), 1);
}

#[test]
fn logs_go_to_stderr_or_the_log_file_never_stdout() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), ok_with(agent_result(&ns.path)));
    let env = containerd_env("ADD", &container_id(), ns.path.to_str().unwrap());
    let mut conf = netconf("1.1.0", &agent.socket, dir.path());
    conf["logLevel"] = json!("debug");

    let out = run_plugin(&env, &conf.to_string());
    assert_eq!(out.json()["cniVersion"], "1.1.0");
    assert!(
        out.stderr.contains("DEBUG") && out.stderr.contains("request to"),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("INFO") && out.stderr.contains("ADD"),
        "{out:?}"
    );

    let log = dir.path().join("cni.log");
    conf["logFile"] = json!(log);
    let out = run_plugin(&env, &conf.to_string());
    assert_eq!(out.json()["cniVersion"], "1.1.0");
    assert!(out.stderr.is_empty(), "{out:?}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.lines().count() >= 2 && logged.contains("request to"),
        "{logged}"
    );

    // Failures are logged too, at the default level, and stdout stays one JSON document.
    let missing = netconf("1.1.0", &dir.path().join("gone.sock"), dir.path());
    let out = run_plugin(&env, &missing.to_string());
    assert_eq!(out.error().0, 11);
    assert!(
        out.stderr.contains("ERROR") && out.stderr.contains("gone.sock"),
        "{out:?}"
    );
}

#[test]
fn a_panic_still_yields_a_cni_error() {
    if !cfg!(debug_assertions) {
        return; // the hook that forces a panic exists only in debug builds
    }
    let env = vec![
        ("LACE_CNI_TEST_PANIC".to_owned(), "1".to_owned()),
        ("CNI_COMMAND".to_owned(), "ADD".to_owned()),
    ];
    let (code, msg) = run_plugin(&env, "{}").error();
    assert_eq!(code, 999);
    assert!(msg.contains("panic requested"), "{msg}");
}

/// containerd's loopback network, as libcni hands it to the plugin.
const CONTAINERD_LOOPBACK: &str =
    r#"{"cniVersion":"0.3.1","name":"cni-loopback","type":"loopback"}"#;

/// What the agent answers a loopback ADD (see the agent's `loopback_add`).
fn lo_result(netns: &Path) -> CniResult {
    serde_json::from_value(json!({
        "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00",
                        "sandbox": netns.to_str().unwrap()}],
        "ips": [{"address": "127.0.0.1/8", "interface": 0},
                {"address": "::1/128", "interface": 0}]
    }))
    .unwrap()
}

fn loopback_env(command: &str, id: &str, netns: &str) -> Vec<(String, String)> {
    env_with(
        &containerd_env(command, id, netns),
        &[("CNI_IFNAME", Some("lo"))],
    )
}

#[test]
fn loopback_add_goes_to_the_agent_named_in_the_settings_file_and_answers_like_the_reference_plugin()
{
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), ok_with(lo_result(&ns.path)));
    let copy = install_loopback_copy(dir.path(), Some(&agent.socket));
    let id = container_id();
    let out = run_binary(
        &copy,
        &loopback_env("ADD", &id, ns.path.to_str().unwrap()),
        CONTAINERD_LOOPBACK,
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    // The reference plugin's 0.3.1 shape (libcni 1.1 reads it; `dns` may be absent).
    assert_eq!(
        out.json(),
        json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00",
                            "sandbox": ns.path.to_str().unwrap()}],
            "ips": [{"version": "4", "address": "127.0.0.1/8", "interface": 0},
                    {"version": "6", "address": "::1/128", "interface": 0}]
        })
    );
    let req = &agent.requests()[0];
    assert_eq!(req.command, Command::LoopbackAdd);
    assert_eq!(req.netns.as_deref(), Some(ns.path.as_path()));
    assert_eq!(req.container_id.as_deref(), Some(id.as_str()));
    assert_eq!(req.pod_name.as_deref(), Some("web-0"));
    assert_eq!(req.cni_version, CniVersion::V0_3_1);

    // Every version the reference plugin speaks, in its own shape.
    for (version, check) in [
        ("0.2.0", json!({"ip": "127.0.0.1/8"})),
        ("1.0.0", json!("lo")),
        ("1.1.0", json!("lo")),
    ] {
        let conf = json!({"cniVersion": version, "name": "cni-loopback", "type": "loopback"});
        let out = run_binary(
            &copy,
            &loopback_env("ADD", &id, ns.path.to_str().unwrap()),
            &conf.to_string(),
        );
        let printed = out.json();
        assert_eq!(printed["cniVersion"], version, "{out:?}");
        if version == "0.2.0" {
            assert_eq!(printed["ip4"], check, "{printed}");
            assert_eq!(printed["ip6"]["ip"], "::1/128", "{printed}");
        } else {
            assert_eq!(printed["interfaces"][0]["name"], check, "{printed}");
            assert!(printed["ips"][0].get("version").is_none(), "{printed}");
        }
    }
    // A previous result is passed on, as the reference plugin does.
    let mut chained: Value = serde_json::from_str(CONTAINERD_LOOPBACK).unwrap();
    chained["prevResult"] = agent_result(&ns.path).to_json(CniVersion::V0_4_0);
    let out = run_binary(
        &copy,
        &loopback_env("ADD", &id, ns.path.to_str().unwrap()),
        &chained.to_string(),
    );
    assert_eq!(out.json()["ips"][0]["address"], "10.244.1.7/32", "{out:?}");
}

#[test]
fn loopback_check_goes_to_the_agent_and_del_status_gc_need_no_agent() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let agent = FakeAgent::start(dir.path(), ok_empty);
    let copy = install_loopback_copy(dir.path(), Some(&agent.socket));
    let id = container_id();
    let conf = |v: &str| json!({"cniVersion": v, "name": "cni-loopback", "type": "loopback"});
    let out = run_binary(
        &copy,
        &loopback_env("CHECK", &id, ns.path.to_str().unwrap()),
        &conf("1.0.0").to_string(),
    );
    out.assert_silent_success();
    assert_eq!(agent.requests()[0].command, Command::LoopbackCheck);
    // CHECK does not exist before 0.4.0 (as in the reference plugin's library).
    let out = run_binary(
        &copy,
        &loopback_env("CHECK", &id, ns.path.to_str().unwrap()),
        CONTAINERD_LOOPBACK,
    );
    let (code, msg) = out.error();
    assert_eq!(code, 1);
    assert!(msg.contains("CHECK") && msg.contains("0.4.0"), "{msg}");

    // DEL: nothing asked of the agent, with or without the namespace, any number of times.
    drop(agent);
    for netns in [ns.path.to_str().unwrap(), "", "/run/netns/lace-gone"] {
        run_binary(&copy, &loopback_env("DEL", &id, netns), CONTAINERD_LOOPBACK)
            .assert_silent_success();
    }
    for command in ["STATUS", "GC"] {
        let env = env_with(
            &loopback_env(command, &id, ""),
            &[
                ("CNI_CONTAINERID", None),
                ("CNI_NETNS", None),
                ("CNI_IFNAME", None),
            ],
        );
        run_binary(&copy, &env, &conf("1.1.0").to_string()).assert_silent_success();
    }
}

#[test]
fn loopback_add_names_the_socket_and_where_it_came_from_when_the_agent_is_away() {
    let dir = TempDir::new();
    let ns = Netns::new();
    let env = loopback_env("ADD", &container_id(), ns.path.to_str().unwrap());
    // With the settings file: its socket.
    let socket = dir.path().join("gone.sock");
    let copy = install_loopback_copy(dir.path(), Some(&socket));
    let (code, msg) = run_binary(&copy, &env, CONTAINERD_LOOPBACK).error();
    assert_eq!(code, 11, "{msg}");
    assert!(
        msg.contains(socket.to_str().unwrap()) && msg.contains("lace-loopback.json"),
        "{msg}"
    );
    // Without: the default socket, and the file that was looked for.
    std::fs::remove_file(dir.path().join("bin/lace-loopback.json")).unwrap();
    let out = run_binary(&copy, &env, CONTAINERD_LOOPBACK);
    let (code, msg) = out.error();
    assert_eq!(code, 11, "{msg}");
    assert!(
        msg.contains("/run/lace/cni.sock") && msg.contains("there is no"),
        "{msg}"
    );
    // The host's own namespace is refused before anything is asked.
    let (code, msg) = run_binary(
        &copy,
        &loopback_env("ADD", &container_id(), "/proc/self/ns/net"),
        CONTAINERD_LOOPBACK,
    )
    .error();
    assert_eq!(code, 4, "{msg}");
}

#[test]
fn loopback_add_explains_an_agent_older_than_the_plugin() {
    let dir = TempDir::new();
    let ns = Netns::new();
    // What an agent that does not know the loopback verbs answers (its decode error).
    let agent = FakeAgent::start(dir.path(), |_| {
        Reply::Respond(Response::Err(CniError::new(
            ErrorCode::DECODE,
            "bad request: message is not valid JSON of the expected shape: unknown variant \
             `LOOPBACK_ADD`, expected one of `ADD`, `DEL`, `CHECK`, `STATUS`, `GC`",
        )))
    });
    let copy = install_loopback_copy(dir.path(), Some(&agent.socket));
    let (code, msg) = run_binary(
        &copy,
        &loopback_env("ADD", &container_id(), ns.path.to_str().unwrap()),
        CONTAINERD_LOOPBACK,
    )
    .error();
    assert_eq!(code, 999, "{msg}");
    assert!(msg.contains("upgrade the Lace agent"), "{msg}");
}
