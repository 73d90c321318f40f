//! The CNI path end to end against a real kernel: the real `lace` plugin binary, exec'd with
//! containerd's environment and stdin, talking to a real `lace-agent run --manifests ...`
//! that programs a "node" network namespace; pods are network namespaces of their own.
//!
//! Needs root and a kernel with VRF (the agent creates the Network's VRF at ADD), so it runs
//! in the VM: build first (`cargo build -p lace -p lace-cni`), then run the test binary with
//! `--test-threads=1` (the tests share `/run/netns`). The kernel state is observed with `ip`
//! (not the code under test), the agent's IPAM with its state file, and traffic with `ping`.
//!
//! The manifests are `examples/cluster` (node-1: Network `default` has function 1, so VRF
//! `lv-default`, table 1000001, blocks 10.244.64.0/24 and fd00:244:0:100::/64).
//!
//! Every pod is set up as containerd sets up a sandbox: the `loopback` network first, then
//! Lace's, each answer read as the runtime's libcni reads it (`cni_bed::libcni`).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod cni_bed;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_bed::{
    addresses, ip, ip_ok, plugin_conf, Bed, Libcni, Ns, PodNamespaces, DEADLINE, LOOPBACK_CONFLIST,
    TABLE, VRF,
};
use serde_json::{json, Value};
#[test]
fn lifecycle_add_check_del_del() {
    let bed = Bed::new("lc");
    let a = Ns::new(format!("lace-ct-a-{}", bed.tag));
    let b = Ns::new(format!("lace-ct-b-{}", bed.tag));

    let first_a = bed.add("ctr-a", &a);
    let rb = bed.add("ctr-b", &b);
    // A retried ADD (the runtime lost the answer) finds the first attempt's interfaces,
    // replaces them and keeps the addresses.
    let ra = bed.add("ctr-a", &a);
    assert_eq!(addresses(&ra), addresses(&first_a), "{ra}");
    assert_ne!(
        ra["interfaces"][1]["mac"], first_a["interfaces"][1]["mac"],
        "the pod side was not recreated: {ra}"
    );
    assert_eq!(ra["cniVersion"], "1.1.0");
    let (ips_a, ips_b) = (addresses(&ra), addresses(&rb));
    assert_eq!(ips_a, ["10.244.64.1/32", "fd00:244:0:100::1/128"], "{ra}");
    assert_eq!(ips_b, ["10.244.64.2/32", "fd00:244:0:100::2/128"], "{rb}");
    assert_eq!(ra["ips"][0]["gateway"], "169.254.1.1");
    assert_eq!(ra["ips"][1]["gateway"], "fe80::1");
    let host_a = ra["interfaces"][0]["name"].as_str().unwrap().to_owned();
    assert!(host_a.starts_with("lp-") && host_a.len() <= 15, "{host_a}");
    // MTU: 9000 on the uplink minus 64 bytes of SRv6 overhead.
    assert_eq!(ra["interfaces"][1]["mtu"], 8936);

    // The kernel, as `ip` sees it.
    let pod_addr = ip(&["-n", &a.0, "addr", "show", "dev", "eth0"]);
    assert!(pod_addr.contains("inet 10.244.64.1/32"), "{pod_addr}");
    assert!(
        pod_addr.contains("inet6 fd00:244:0:100::1/128"),
        "{pod_addr}"
    );
    assert!(pod_addr.contains("mtu 8936"), "{pod_addr}");
    let pod_routes = ip(&["-n", &a.0, "route", "show"]);
    assert!(
        pod_routes.contains("default via 169.254.1.1 dev eth0"),
        "{pod_routes}"
    );
    let pod_routes6 = ip(&["-n", &a.0, "-6", "route", "show"]);
    assert!(
        pod_routes6.contains("default via fe80::1 dev eth0"),
        "{pod_routes6}"
    );
    let host = ip(&["-n", &bed.node.0, "link", "show", "dev", &host_a]);
    assert!(
        host.contains(&format!("master {VRF}")) && host.contains("state UP"),
        "{host}"
    );
    let vrf = ip(&["-n", &bed.node.0, "-d", "link", "show", "dev", VRF]);
    assert!(vrf.contains(&format!("vrf table {TABLE}")), "{vrf}");
    let routes = bed.vrf_routes();
    for want in [
        "10.244.64.1",
        "10.244.64.2",
        "fd00:244:0:100::1",
        "fd00:244:0:100::2",
    ] {
        assert!(
            routes.contains(want),
            "{want} not routed in table {TABLE}: {routes:?}"
        );
    }
    let proxy_arp = ip(&[
        "netns",
        "exec",
        &bed.node.0,
        "sysctl",
        "-n",
        &format!("net.ipv4.conf.{host_a}.proxy_arp"),
    ]);
    assert_eq!(proxy_arp.trim(), "1");

    // Real traffic between the two pods through the node's VRF, both families.
    for (fam, dst) in [("-4", "10.244.64.2"), ("-6", "fd00:244:0:100::2")] {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &a.0, "ping", fam, "-c", "1", "-W", "3", dst,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ping {dst} from pod a failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // And a TCP exchange each way of the conversation, both families: the server in pod b
    // answers with the address it saw, which must be pod a's (no NAT inside a Network).
    for (listen, connect, seen) in [
        (
            "TCP4-LISTEN:7200,bind=10.244.64.2",
            "TCP4:10.244.64.2:7200",
            "10.244.64.1",
        ),
        (
            "TCP6-LISTEN:7200,bind=[fd00:244:0:100::2]",
            "TCP6:[fd00:244:0:100::2]:7200",
            "fd00:244:0:100::1",
        ),
    ] {
        let seen: std::net::IpAddr = seen.parse().unwrap();
        assert_eq!(tcp_peer(&a, &b, listen, connect), seen, "{connect}");
    }

    // CHECK passes on what ADD made...
    let check_conf = bed.netconf(json!({"prevResult": ra}));
    let (ok, out) = bed.cni("CHECK", "ctr-a", &a.path(), &a.0, check_conf.clone());
    assert!(ok, "CHECK failed: {out}");
    // ...and names what is broken.
    ip(&["-n", &a.0, "route", "del", "default"]);
    let (ok, out) = bed.cni("CHECK", "ctr-a", &a.path(), &a.0, check_conf.clone());
    assert!(!ok && out["code"] == 100, "{out}");
    assert!(
        out["msg"].as_str().unwrap().contains("169.254.1.1"),
        "{out}"
    );
    ip(&[
        "-n",
        &a.0,
        "route",
        "add",
        "default",
        "via",
        "169.254.1.1",
        "dev",
        "eth0",
    ]);
    // The host side out of its VRF: the agent's drift repair puts it back within about a
    // second, so CHECK may come after the repair and pass; take it out again until a CHECK
    // sees it out (each try is one `ip` and one plugin exec: far quicker than the repair).
    let (mut seen, mut failed_checks) = (Vec::new(), 1);
    let caught = (0..10).any(|_| {
        ip(&["-n", &bed.node.0, "link", "set", &host_a, "nomaster"]);
        let (ok, out) = bed.cni("CHECK", "ctr-a", &a.path(), &a.0, check_conf.clone());
        failed_checks += usize::from(!ok);
        seen.push(out.clone());
        !ok && out["msg"].as_str().is_some_and(|m| m.contains(VRF))
    });
    assert!(
        caught,
        "no CHECK named the VRF the host side left: {seen:?}"
    );
    // Repaired by the agent (drift), so CHECK passes again.
    let repaired = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let ok = bed
            .cni("CHECK", "ctr-a", &a.path(), &a.0, check_conf.clone())
            .0;
        failed_checks += usize::from(!ok);
        ok
    });
    assert!(
        repaired,
        "the agent did not put the host side back into its VRF"
    );

    // STATUS is ready.
    let (ok, out) = bed.cni("STATUS", "", "", "x", bed.netconf(json!({})));
    assert!(ok, "STATUS: {out}");
    assert!(bed
        .metrics()
        .contains("lace_addresses_in_use{network=\"default\"} 4"));

    // DEL, DEL again, DEL with the netns gone.
    bed.del("ctr-a", &a.path());
    assert!(
        !ip_ok(&["-n", &bed.node.0, "link", "show", "dev", &host_a]),
        "host veth left"
    );
    assert!(
        !ip_ok(&["-n", &a.0, "link", "show", "dev", "eth0"]),
        "pod interface left"
    );
    bed.del("ctr-a", &a.path());
    drop(b);
    bed.del("ctr-b", "/run/netns/lace-ct-gone");
    bed.del("never-added", "");
    assert!(
        bed.ipam_addresses().is_empty(),
        "{:?}",
        bed.ipam_addresses()
    );
    assert!(bed.host_links().is_empty(), "{:?}", bed.host_links());
    assert!(bed.vrf_routes().is_empty(), "{:?}", bed.vrf_routes());
    // Released addresses are handed out again.
    assert_eq!(addresses(&bed.add("ctr-c", &a))[0], "10.244.64.1/32");
    bed.del("ctr-c", &a.path());
    let metrics = bed.metrics();
    assert!(
        metrics.contains("lace_cni_requests_total{verb=\"ADD\",result=\"ok\"} 4"),
        "{metrics}"
    );
    for phase in ["ipam", "pod", "host"] {
        assert!(
            metrics.contains(&format!(
                "lace_cni_add_phase_seconds_count{{phase=\"{phase}\"}} 4\n"
            )),
            "{metrics}"
        );
    }
    assert!(
        metrics.contains(&format!(
            "lace_cni_requests_total{{verb=\"CHECK\",result=\"100\"}} {failed_checks}\n"
        )),
        "{metrics}"
    );
}

/// Runs a one-connection socat server (`listen`) in `server` that answers with the peer
/// address it saw, connects to it from `client` (`connect`, retried while the server starts)
/// and returns the answer (socat writes IPv6 exploded, in brackets).
fn tcp_peer(client: &Ns, server: &Ns, listen: &str, connect: &str) -> std::net::IpAddr {
    let mut srv = Command::new("ip")
        // -t: the client half-closes at once; wait for the forked echo all the same.
        .args(["netns", "exec", &server.0, "socat", "-t5", "-T5", listen])
        .arg("SYSTEM:echo $SOCAT_PEERADDR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let answer = loop {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &client.0, "socat", "-t5", "-T5", "-", connect,
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() && !answer.is_empty() || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if answer.is_empty() {
        // No connection came through: the listener would wait forever.
        srv.kill().unwrap();
    }
    let srv = srv.wait_with_output().unwrap();
    assert!(
        srv.status.success(),
        "socat server {listen} (client got {answer:?}): {}",
        String::from_utf8_lossy(&srv.stderr)
    );
    let bare = answer.trim_matches(|c| c == '[' || c == ']');
    bare.parse()
        .unwrap_or_else(|e| panic!("{connect}: answer {answer:?} is no address: {e}"))
}

/// Pods added at once (`LACE_CNI_PODS`, default 40), then deleted at once. Not 100: in the
/// VM (2 CPUs, emulated) each ADD costs about a second of CPU, and on a loaded machine the
/// last of 100 waited past the plugin's 60 s answer timeout; LACE_CNI_PODS=100 for a stress
/// run on real hardware.
#[test]
fn concurrent_adds_never_share_an_address() {
    let n: usize = std::env::var("LACE_CNI_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let bed = Bed::new("cc");
    let pods = PodNamespaces::new(&format!("lace-ct-{}-", bed.tag), n);
    let results: Vec<Vec<String>> = std::thread::scope(|s| {
        let threads: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let bed = &bed;
                s.spawn(move || addresses(&bed.add(&format!("ctr-{i}"), pod)))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut all = BTreeSet::new();
    for a in results.into_iter().flatten() {
        assert!(all.insert(a.clone()), "{a} handed out twice");
    }
    assert_eq!(all.len(), 2 * n);
    assert_eq!(bed.ipam_addresses(), all);
    assert_eq!(bed.host_links().len(), n);
    assert_eq!(bed.vrf_routes().len(), 2 * n);
    // The DELs at once too, as a node draining its pods sends them.
    del_all(&bed, &pods);
    assert!(bed.ipam_addresses().is_empty());
    assert!(bed.host_links().is_empty());
    assert!(bed.vrf_routes().is_empty());
}

/// SIGKILL in the middle of an ADD storm, restart, GC with the attachments the runtime
/// believes in: nothing leaks (address, interface or route) and nothing is handed out twice.
#[test]
fn sigkill_during_adds_then_restart_and_gc_leaks_nothing() {
    let n = 30;
    let mut bed = Bed::new("kl");
    let pods = Arc::new(PodNamespaces::new(&format!("lace-ct-k{}-", bed.tag), n));
    let done = Arc::new(AtomicUsize::new(0));
    let threads = add_storm(&bed, &pods, &done);
    // Let some ADDs finish and others be in flight, then kill.
    let deadline = Instant::now() + DEADLINE;
    // A few done, most still in flight (ADDs take ~0.1–0.3 s each in the VM).
    while done.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    bed.kill_agent();
    let succeeded = join_storm(threads);
    assert!(!succeeded.is_empty(), "no ADD finished before the kill");
    eprintln!("{} of {n} ADDs succeeded before SIGKILL", succeeded.len());

    bed.start_agent();
    let valid: Vec<String> = succeeded.iter().map(|(id, _)| id.clone()).collect();
    bed.gc(&valid);

    let want: BTreeSet<String> = succeeded.iter().flat_map(|(_, a)| a.clone()).collect();
    assert_eq!(
        want.len(),
        2 * succeeded.len(),
        "duplicate among successful ADDs"
    );
    assert_eq!(
        bed.ipam_addresses(),
        want,
        "IPAM holds exactly the surviving pods"
    );
    let want_hosts: BTreeSet<String> = valid
        .iter()
        .map(|id| lace::agent::cni::host_ifname(id, "eth0"))
        .collect();
    assert_eq!(
        bed.host_links(),
        want_hosts,
        "veths are exactly the surviving pods'"
    );
    let want_routes: BTreeSet<String> = want
        .iter()
        .map(|a| a.split('/').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        bed.vrf_routes(),
        want_routes,
        "routes are exactly the surviving pods'"
    );

    // The runtime retries the failed pods after cleaning them (DEL), and they get addresses
    // that no surviving pod holds.
    let mut all = want.clone();
    for (i, pod) in pods.iter().enumerate() {
        let id = format!("ctr-{i}");
        if valid.contains(&id) {
            continue;
        }
        bed.del(&id, &pod.path());
        for a in addresses(&bed.add(&id, pod)) {
            assert!(all.insert(a.clone()), "{a} handed out twice after restart");
        }
    }
    // Pods deleted while the agent is down: the plugin queues the DELs (and succeeds); the
    // agent replays the queue at start, before serving, removing veths and addresses (the
    // namespaces are still there, so it is the replay and not the start-up check that
    // cleans).
    bed.kill_agent();
    del_all(&bed, &pods);
    assert!(
        !bed.ipam_addresses().is_empty(),
        "nothing was left for the replay to release"
    );
    assert_eq!(bed.host_links().len(), n);
    bed.start_agent();
    assert!(
        bed.ipam_addresses().is_empty(),
        "{:?}",
        bed.ipam_addresses()
    );
    assert!(bed.host_links().is_empty(), "{:?}", bed.host_links());
    assert!(bed.vrf_routes().is_empty(), "{:?}", bed.vrf_routes());
    let queue = bed.p("state/cni-del-queue");
    assert_eq!(
        std::fs::read_dir(&queue).map(|d| d.count()).unwrap_or(0),
        0,
        "queue not emptied"
    );
}

/// A node the manifests have no allocation for: the agent serves, but STATUS and `/healthz`
/// say why it is not ready, and no conflist is written (so the node would stay NotReady).
/// Once `lace-agent allocate` records the node, the watcher picks it up and the agent turns
/// ready. Needs no VRF (no pod is created).
#[test]
fn unallocated_node_is_not_ready_until_allocated() {
    let mut bed = Bed::for_node("un", "node-9");
    let nodes = bed.p("manifests/nodes.yaml");
    let mut text = std::fs::read_to_string(&nodes).unwrap();
    text.push_str(
        "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: node-9\nstatus:\n  addresses:\n    - type: InternalIP\n      address: fd00:fab::9\n",
    );
    std::fs::write(&nodes, text).unwrap();
    bed.spawn_agent();

    let status = |bed: &Bed| -> (bool, Value) {
        let conf = json!({
            "cniVersion": "1.1.0", "name": "lace", "type": "lace",
            "agentSocket": bed.p("run/cni.sock"),
            "delQueueDir": bed.p("state/cni-del-queue"),
        });
        let mut child = Command::new(cni_bed::binary("lace"))
            .env_clear()
            .env("CNI_COMMAND", "STATUS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.success(), json)
    };
    // Wait until the agent serves its socket: watching the file, not exec'ing STATUS in a loop
    // (plugin execs would compete with the agent's start under emulation). Then until STATUS
    // gives the loaded state's reason (the agent serves, not ready, while its source loads).
    let socket = bed.p("run/cni.sock");
    let deadline = Instant::now() + DEADLINE;
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the agent did not serve {} within {DEADLINE:?}:\n{}",
            socket.display(),
            bed.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, out) = loop {
        let (ok, out) = status(&bed);
        let msg = out["msg"].as_str().unwrap_or_default();
        if ok || out["code"] == 50 && msg.contains("node-9") && msg.contains("NodeAllocation") {
            break (ok, out);
        }
        assert!(
            Instant::now() < deadline,
            "STATUS does not say why node-9 is not ready: {out}\n{}",
            bed.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(!ok, "{out}");
    assert!(
        out["msg"].as_str().unwrap().contains("lace-agent allocate"),
        "{out}"
    );
    let health = bed.http_get("/healthz");
    assert!(
        health.starts_with("HTTP/1.1 503") && health.contains("node-9"),
        "{health}"
    );
    assert!(bed.metrics().contains("lace_ready 0"));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !bed.p("conf/10-lace.conflist").exists(),
        "conflist written while not ready"
    );

    let out = Command::new(cni_bed::binary("lace-agent"))
        .arg("allocate")
        .arg("--manifests")
        .arg(bed.p("manifests"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bed.wait_for_conflist(DEADLINE);
    let (ok, out) = status(&bed);
    assert!(ok, "{out}");
    assert!(bed.http_get("/healthz").starts_with("HTTP/1.1 200"));
    assert!(
        bed.p("bin/lace").exists(),
        "plugin binary installed with the conflist"
    );
}

/// Without `--netns` the agent programs its own namespace: the host end of a pod's veth must
/// land there, although the pair is created by a thread that has entered the pod's
/// namespace. A thread living in a "node" namespace stands in for the agent's main thread.
/// The pod end is configured in the same go (addresses, routes, gateway neighbours). Needs
/// no VRF.
#[test]
fn veth_host_end_lands_in_the_agents_own_namespace() {
    use lace::dataplane::{NetnsTarget, PodInterface, Reconciler};
    let tag = std::process::id() % 100_000;
    let node = Ns::new(format!("lace-ct-own-{tag}"));
    let pod = Ns::new(format!("lace-ct-ownp-{tag}"));
    let (node_path, pod_path) = (node.path(), pod.path());
    let created = std::thread::spawn(move || {
        let f = std::fs::File::open(&node_path).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let rec = Reconciler::new(NetnsTarget::Current).unwrap();
        rec.create_pod_interface(
            std::path::Path::new(&pod_path),
            &PodInterface {
                ifname: "eth0".into(),
                host_ifname: "lp-owntest".into(),
                mtu: 1400,
                host_mac: [2, 0, 0, 0, 0, 1],
                ips: vec![
                    "10.9.0.5/32".parse().unwrap(),
                    "fd00:9::5/128".parse().unwrap(),
                ],
            },
        )
    })
    .join()
    .unwrap()
    .unwrap();
    assert!(
        created.is_some(),
        "create_pod_interface reported a name clash in fresh namespaces"
    );
    let host = ip(&["-n", &node.0, "link", "show", "dev", "lp-owntest"]);
    assert!(
        host.contains("mtu 1400") && host.contains("02:00:00:00:00:01"),
        "{host}"
    );
    assert!(
        !ip_ok(&["link", "show", "dev", "lp-owntest"]),
        "landed in the test's namespace"
    );
    let pod_if = ip(&["-n", &pod.0, "addr", "show", "dev", "eth0"]);
    assert!(
        pod_if.contains("inet 10.9.0.5/32")
            && pod_if.contains("inet6 fd00:9::5/128")
            && pod_if.contains("mtu 1400")
            && pod_if.contains(",UP"),
        "{pod_if}"
    );
    let routes = ip(&["-n", &pod.0, "route", "show"]);
    assert!(
        routes.contains("default via 169.254.1.1 dev eth0")
            && routes.contains("169.254.1.1 dev eth0"),
        "{routes}"
    );
    let routes6 = ip(&["-n", &pod.0, "-6", "route", "show"]);
    assert!(
        routes6.contains("default via fe80::1 dev eth0"),
        "{routes6}"
    );
    let neigh = ip(&["-n", &pod.0, "neigh", "show", "dev", "eth0"]);
    assert!(
        neigh.contains("169.254.1.1 lladdr 02:00:00:00:00:01 PERMANENT"),
        "{neigh}"
    );
}

/// What one ADD of a storm gave: the container id and addresses, or the plugin's output.
type StormResult = Result<(String, Vec<String>), String>;

/// One thread per pod, each exec'ing ADD (`ctr-<i>`) as containerd does; `done` counts
/// the successes as they come.
fn add_storm(
    bed: &Bed,
    pods: &Arc<PodNamespaces>,
    done: &Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<StormResult>> {
    let conf = bed.netconf(json!({}));
    let plugin = bed.p("bin/lace");
    let bin_dir = bed.p("bin");
    (0..pods.len())
        .map(|i| {
            let (pods, conf, plugin, bin_dir, done) = (
                Arc::clone(pods),
                conf.clone(),
                plugin.clone(),
                bin_dir.clone(),
                Arc::clone(done),
            );
            std::thread::spawn(move || {
                let id = format!("ctr-{i}");
                let mut child = Command::new(&plugin)
                    .env_clear()
                    .env("CNI_COMMAND", "ADD")
                    .env("CNI_CONTAINERID", &id)
                    .env("CNI_NETNS", pods[i].path())
                    .env("CNI_IFNAME", "eth0")
                    .env(
                        "CNI_ARGS",
                        format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME=k{i}"),
                    )
                    .env("CNI_PATH", &bin_dir)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(conf.to_string().as_bytes())
                    .unwrap();
                let out = child.wait_with_output().unwrap();
                if out.status.success() {
                    done.fetch_add(1, Ordering::SeqCst);
                    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                    Ok((id, addresses(&v)))
                } else {
                    Err(String::from_utf8_lossy(&out.stdout).into_owned())
                }
            })
        })
        .collect()
}

/// Waits for the storm's threads; returns the successful ADDs and prints a few failures.
fn join_storm(threads: Vec<std::thread::JoinHandle<StormResult>>) -> Vec<(String, Vec<String>)> {
    let (succeeded, failed): (Vec<_>, Vec<_>) = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .partition(Result::is_ok);
    for f in failed.iter().take(3) {
        eprintln!("failed ADD: {f:?}");
    }
    succeeded.into_iter().flatten().collect()
}

/// SIGTERM in the middle of an ADD storm (an agent upgrade): requests being handled are
/// finished before the agent exits, the restarted agent keeps every pod that was set up
/// (CHECK passes, same addresses), and the rest get fresh, distinct addresses on retry.
#[test]
fn sigterm_during_adds_drains_and_restart_keeps_pods() {
    let n = 20;
    let mut bed = Bed::new("tm");
    let pods = Arc::new(PodNamespaces::new(&format!("lace-ct-t{}-", bed.tag), n));
    let done = Arc::new(AtomicUsize::new(0));
    let threads = add_storm(&bed, &pods, &done);
    let deadline = Instant::now() + DEADLINE;
    while done.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut agent = bed.agent.take().unwrap();
    let term = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let exit = agent.wait().unwrap();
    assert!(
        exit.success(),
        "agent exited with {exit} on SIGTERM:\n{}",
        bed.log()
    );
    let succeeded = join_storm(threads);
    eprintln!("{} of {n} ADDs succeeded before SIGTERM", succeeded.len());
    assert!(
        bed.log().contains("shutting down"),
        "no clean shutdown:\n{}",
        bed.log()
    );
    // Whatever the agent accepted, it finished: every IPAM record is a successful ADD.
    let want: BTreeSet<String> = succeeded.iter().flat_map(|(_, a)| a.clone()).collect();
    assert_eq!(bed.ipam_addresses(), want, "an accepted ADD was cut off");

    bed.start_agent();
    for (i, pod) in pods.iter().enumerate() {
        let id = format!("ctr-{i}");
        match succeeded.iter().find(|(s, _)| *s == id) {
            Some((_, ips)) => {
                let prev =
                    json!({"ips": ips.iter().map(|a| json!({"address": a})).collect::<Vec<_>>()});
                let (ok, out) = bed.cni(
                    "CHECK",
                    &id,
                    &pod.path(),
                    &pod.0,
                    bed.netconf(json!({"prevResult": prev})),
                );
                assert!(ok, "pod {id} broken by the restart: {out}");
            }
            None => {
                bed.del(&id, &pod.path());
                bed.add(&id, pod);
            }
        }
    }
    assert_eq!(
        bed.ipam_addresses().len(),
        2 * n,
        "duplicate or missing address"
    );
    assert_eq!(bed.host_links().len(), n);
    del_all(&bed, &pods);
    assert!(bed.ipam_addresses().is_empty() && bed.host_links().is_empty());
}

// --- A node that heals itself ---------------------------------------------------------------

/// The value of the agent's counter or gauge `name` (a line `name <value>`).
fn metric(bed: &Bed, name: &str) -> u64 {
    let text = bed.metrics();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

/// Polls `ok` every 100 ms until it holds; panics naming `what` (and with the agent's log)
/// if it still does not after `deadline`. Returns how long it took.
fn within(bed: &Bed, deadline: Duration, what: &str, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < deadline,
            "{what}: not the case within {deadline:?}\n{}",
            bed.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = start.elapsed();
    eprintln!("{what}: after {took:?}");
    took
}

/// One ping from `pod` (`-4`/`-6`) to `dst`.
fn pings(pod: &Ns, fam: &str, dst: &str) -> bool {
    Command::new("ip")
        .args([
            "netns", "exec", &pod.0, "ping", fam, "-c", "1", "-W", "3", dst,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `ip -n <node> <args>` (split on whitespace).
fn node_ip(bed: &Bed, args: &str) -> String {
    let mut all = vec!["-n", &bed.node.0];
    all.extend(args.split_whitespace());
    ip(&all)
}

/// With a real agent running (standalone mode, its periodic resync an hour away), a Lace
/// route, a Lace rule, an address on a pod veth and the whole VRF are deleted by hand: each
/// is back within 5 s with nothing else happening (no CNI request, no manifest change), and
/// traffic through it works again. Foreign routes in Lace's tables stay as they were.
#[test]
fn heal_what_lace_owns_deleted_by_hand_comes_back_within_5s() {
    const DEADLINE: Duration = Duration::from_secs(5);
    let mut bed = Bed::for_node("hl", cni_bed::NODE);
    bed.agent_args = vec!["--resync-interval".into(), "3600".into()];
    bed.start_agent();
    let a = Ns::new(format!("lace-ct-ha-{}", bed.tag));
    let b = Ns::new(format!("lace-ct-hb-{}", bed.tag));
    let host = |r: &Value| r["interfaces"][0]["name"].as_str().unwrap().to_owned();
    let (host_a, host_b) = (host(&bed.add("ctr-a", &a)), host(&bed.add("ctr-b", &b)));
    let (b4, b6) = ("10.244.64.2", "fd00:244:0:100::2");
    assert!(pings(&a, "-4", b4) && pings(&a, "-6", b6), "{}", bed.log());

    // Foreign routes: in the Network's table, the kubelet-probe table and the main table.
    let foreign = [
        "-4 route add 198.51.100.0/24 dev up0 table 1000001",
        "-6 route add 2001:db8:f00::/48 dev up0 table 1000001",
        "-4 route add 198.51.100.0/24 dev up0 table 1065536",
        "-4 route add 203.0.113.0/24 dev up0",
    ];
    for f in foreign {
        node_ip(&bed, f);
    }
    let foreign_now = || -> Vec<String> {
        foreign
            .iter()
            .map(|f| node_ip(&bed, &f.replace("route add", "route show")))
            .collect()
    };
    let foreign_before = foreign_now();
    assert!(foreign_before.iter().all(|r| !r.trim().is_empty()));
    let drift_before = metric(&bed, "lace_dataplane_drift_total");

    // 1. Lace routes: pod b's host route (what a -> b goes through) and an SRv6 encap route.
    let pod_route = || node_ip(&bed, &format!("-4 route show table 1000001 {b4}"));
    let encap = || node_ip(&bed, "-4 route show table 1000001 10.244.65.0/24");
    assert!(pod_route().contains("proto 76") && encap().contains("encap seg6"));
    node_ip(&bed, &format!("-4 route del {b4}/32 table 1000001"));
    node_ip(&bed, "-4 route del 10.244.65.0/24 table 1000001");
    within(&bed, DEADLINE, "the deleted Lace routes are back", || {
        pod_route().contains(&format!("dev {host_b}"))
            && pod_route().contains("proto 76")
            && encap().contains("encap seg6")
    });
    assert!(pings(&a, "-4", b4), "a -> b after the route came back");

    // 2. A Lace rule: the l3mdev rules, through which every lookup in a VRF goes.
    for fam in ["-4", "-6"] {
        node_ip(&bed, &format!("{fam} rule del pref 1000 l3mdev"));
    }
    within(&bed, DEADLINE, "the deleted l3mdev rules are back", || {
        ["-4", "-6"]
            .iter()
            .all(|fam| node_ip(&bed, &format!("{fam} rule show pref 1000")).contains("l3mdev"))
    });
    assert!(
        pings(&a, "-4", b4) && pings(&a, "-6", b6),
        "a -> b after the rules came back"
    );

    // 3. An address on a pod veth: fe80::1 on a's host end, the source of its IPv6
    //    kubelet-probe route (what the probe program's mark selects; `ping -m` sets it).
    node_ip(&bed, &format!("-6 addr del fe80::1/64 dev {host_a}"));
    within(&bed, DEADLINE, "fe80::1 is back on the pod veth", || {
        node_ip(&bed, &format!("-6 addr show dev {host_a}")).contains("fe80::1/64")
            && node_ip(&bed, "-6 route show table 1065536 fd00:244:0:100::1")
                .contains("src fe80::1")
    });
    let probe = |dst: &str| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &bed.node.0,
                "ping",
                "-6",
                "-c",
                "1",
                "-W",
                "3",
            ])
            .args(["-m", "4096", dst]) // the probe mark, 0x1000
            .output()
            .unwrap()
    };
    let out = probe("fd00:244:0:100::1");
    assert!(
        out.status.success(),
        "a probe from the node (fe80::1) to pod a after the address came back: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        node_ip(&bed, "-6 route get fd00:244:0:100::1 mark 0x1000")
    );

    // 4. The whole VRF: its pods' veths fall out of it, their routes with them.
    node_ip(&bed, &format!("link del {VRF}"));
    within(
        &bed,
        DEADLINE,
        "the VRF, its pods and routes are back",
        || {
            let vrf_ok = ip_ok(&["-n", &bed.node.0, "link", "show", "dev", VRF])
                && node_ip(&bed, &format!("-d link show dev {VRF}"))
                    .contains(&format!("vrf table {TABLE}"));
            vrf_ok
                && [&host_a, &host_b].iter().all(|h| {
                    node_ip(&bed, &format!("link show dev {h}")).contains(&format!("master {VRF}"))
                })
                && bed.vrf_routes().len() == 4
        },
    );
    assert!(
        pings(&a, "-4", b4) && pings(&a, "-6", b6),
        "a -> b after the VRF came back"
    );

    assert_eq!(foreign_now(), foreign_before, "a foreign route was touched");
    // It was the kernel's notifications: drift seen, no resync ran.
    assert!(metric(&bed, "lace_dataplane_drift_total") >= drift_before + 4);
    assert_eq!(metric(&bed, "lace_dataplane_resyncs_total"), 0);
}

/// An ADD followed by the reconcile it triggers writes each of the pod's kernel objects once:
/// `ip monitor` in the node's namespace sees each pod route and the pod veth's link-local
/// address notified once, and no reconcile after the ADD (the one it triggers, periodic
/// resyncs every 2 s) writes anything. The resync then puts back what no notification
/// reports: the nft table, deleted by hand.
#[test]
fn add_and_its_reconcile_write_each_object_once_and_resync_restores_nft() {
    let mut bed = Bed::for_node("wo", cni_bed::NODE);
    bed.agent_args = vec!["--resync-interval".into(), "2".into()];
    bed.start_agent();
    let pod = Ns::new(format!("lace-ct-wo-{}", bed.tag));
    let out = bed.p("monitor.txt");
    let mut monitor = Command::new("ip")
        .args(["-o", "-n", &bed.node.0, "monitor", "route", "address"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = || std::fs::read_to_string(&out).unwrap_or_default();
    // The monitor listens once it reports a marker route: a new one each time (replacing a
    // route with itself notifies nothing, and the first may come before it listens).
    let mut marker = 0;
    within(&bed, Duration::from_secs(20), "ip monitor listens", || {
        marker += 1;
        node_ip(&bed, &format!("-4 route add 198.18.7.{marker}/32 dev up0"));
        std::thread::sleep(Duration::from_millis(200));
        seen().contains("198.18.7.")
    });

    let log_from = bed.log().len();
    let r = bed.add("ctr-w", &pod);
    let host = r["interfaces"][0]["name"].as_str().unwrap().to_owned();
    let after_add = metric(&bed, "lace_reconciles_total");
    // Two more reconciles: at least one of them started after the ADD returned.
    within(
        &bed,
        Duration::from_secs(30),
        "two reconciles after the ADD",
        || metric(&bed, "lace_reconciles_total") >= after_add + 2,
    );
    monitor.kill().unwrap();
    let _ = monitor.wait();
    let lines = seen();
    let lines: Vec<&str> = lines
        .lines()
        .filter(|l| !l.starts_with("Deleted"))
        .collect();
    for ip_addr in addresses(&r) {
        let dst = ip_addr.split('/').next().unwrap();
        for table in [TABLE, "1065536"] {
            let writes = lines
                .iter()
                .filter(|l| {
                    l.starts_with(&format!("{dst} ")) && l.contains(&format!("table {table} "))
                })
                .count();
            assert_eq!(
                writes,
                1,
                "route {dst} table {table} notified {writes} times:\n{}",
                lines.join("\n")
            );
        }
    }
    let address = lines
        .iter()
        .filter(|l| l.contains(&host) && l.contains("fe80::1/64"))
        .count();
    assert_eq!(address, 1, "fe80::1 on {host}:\n{}", lines.join("\n"));
    // A periodic resync may run while the ADD is in flight, once the pod's veth exists: it
    // then sets the pod up itself and the ADD's attach finds nothing left to write (the
    // monitor above still sees each object once). What must not write is any reconcile after
    // the ADD: the agent logs the ADD once its attach is done.
    let log = bed.log()[log_from..].to_owned();
    let add_done = log
        .lines()
        .position(|l| l.contains(" ADD ") && l.contains("ctr-w"))
        .unwrap_or_else(|| panic!("no ADD of ctr-w in the agent's log:\n{log}"));
    let later: Vec<&str> = log.lines().skip(add_done + 1).collect();
    assert!(
        !later.iter().any(|l| l.contains("dataplane: applied")),
        "a reconcile after the ADD wrote:\n{}",
        later.join("\n")
    );

    // What no notification reports: the periodic resync restores it.
    let resyncs = metric(&bed, "lace_dataplane_resyncs_total");
    assert!(resyncs > 0);
    bed.node_nft_delete();
    within(
        &bed,
        Duration::from_secs(15),
        "the nft table is back",
        || bed.node_nft(&["list", "table", "inet", "lace"]).0,
    );
    assert!(metric(&bed, "lace_dataplane_resyncs_total") > resyncs);
}

/// A tool that keeps deleting a Lace route cannot make Lace spin: after a burst of quick
/// repairs they are rate-limited (and counted), yet the route is back once the tool stops. A
/// tool flapping its own route in Lace's table triggers nothing at all.
#[test]
fn a_flapping_tool_cannot_make_lace_spin() {
    let mut bed = Bed::for_node("fl", cni_bed::NODE);
    bed.agent_args = vec!["--resync-interval".into(), "3600".into()];
    bed.start_agent();
    let pod = Ns::new(format!("lace-ct-fl-{}", bed.tag));
    let before = metric(&bed, "lace_reconciles_total");
    let r = bed.add("ctr-f", &pod);
    let dst = addresses(&r)[0].clone();
    // Let the ADD's own reconcile pass, and the node fall quiet.
    within(&bed, Duration::from_secs(20), "the ADD's reconcile", || {
        metric(&bed, "lace_reconciles_total") > before
    });
    std::thread::sleep(Duration::from_secs(3));

    let flap = |args: Vec<String>, every: Duration, for_: Duration| {
        let node = bed.node.0.clone();
        std::thread::spawn(move || {
            let end = Instant::now() + for_;
            while Instant::now() < end {
                for a in &args {
                    let mut all = vec!["-n".to_string(), node.clone()];
                    all.extend(a.split_whitespace().map(str::to_owned));
                    let _ = Command::new("ip").args(&all).stderr(Stdio::null()).status();
                }
                std::thread::sleep(every);
            }
        })
    };
    // A foreign route flapping in Lace's table: no drift, no reconcile.
    let (drift0, rec0) = (
        metric(&bed, "lace_dataplane_drift_total"),
        metric(&bed, "lace_reconciles_total"),
    );
    flap(
        vec![
            "route add 198.51.100.0/24 dev up0 table 1000001".into(),
            "route del 198.51.100.0/24 dev up0 table 1000001".into(),
        ],
        Duration::from_millis(100),
        Duration::from_secs(4),
    )
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(metric(&bed, "lace_dataplane_drift_total"), drift0);
    assert_eq!(metric(&bed, "lace_reconciles_total"), rec0);

    // Lace's own route deleted every 200 ms for 15 s.
    let flap_for = Duration::from_secs(15);
    flap(
        vec![format!("route del {dst} table {TABLE}")],
        Duration::from_millis(200),
        flap_for,
    )
    .join()
    .unwrap();
    let repairs = metric(&bed, "lace_reconciles_total") - rec0;
    let burst = u64::from(lace::agent::reconcile::DRIFT_BURST);
    let refills = flap_for.as_secs() / lace::agent::reconcile::DRIFT_REFILL.as_secs();
    assert!(metric(&bed, "lace_dataplane_drift_throttled_total") > 0);
    assert!(
        repairs <= burst + refills + 1,
        "{repairs} reconciles in {flap_for:?} of flapping (burst {burst}, {refills} refills)"
    );
    assert!(
        bed.log().contains("repairs are rate-limited"),
        "{}",
        bed.log()
    );
    let route = || {
        node_ip(
            &bed,
            &format!(
                "-4 route show table {TABLE} {}",
                dst.trim_end_matches("/32")
            ),
        )
    };
    within(
        &bed,
        lace::agent::reconcile::DRIFT_REFILL + Duration::from_secs(5),
        "the route is back once the tool stopped",
        || route().contains("proto 76"),
    );
}

/// DEL of `ctr-<i>` for every pod `i`, all at once (one thread each).
fn del_all(bed: &Bed, pods: &PodNamespaces) {
    std::thread::scope(|s| {
        for (i, pod) in pods.iter().enumerate() {
            s.spawn(move || bed.del(&format!("ctr-{i}"), &pod.path()));
        }
    });
}

// --- What the runtime's libcni reads, and the loopback network ----------------------------

fn conflist(cni_version: &str) -> Value {
    json!({"cniVersion": cni_version, "cniVersions": ["0.4.0", "1.0.0", "1.1.0"],
           "name": "lace", "plugins": [{"type": "lace"}]})
}

/// The harness's libcni emulation itself: it negotiates and refuses as the real ones do, so a
/// plugin answering in a version the old libcni cannot read fails the tests that use it.
#[test]
fn libcni_emulation_negotiates_and_refuses_like_libcni_1_1_and_1_2() {
    // libcni 1.1.2 reads only cniVersion; 1.2+ the highest it implements of both keys.
    assert_eq!(Libcni::V1_1.negotiate(&conflist("1.0.0")), "1.0.0");
    assert_eq!(Libcni::V1_2.negotiate(&conflist("1.0.0")), "1.1.0");
    let newer = json!({"cniVersion": "1.0.0", "cniVersions": ["1.0.0", "1.1.0", "1.2.0"]});
    assert_eq!(
        Libcni::V1_2.negotiate(&newer),
        "1.1.0",
        "1.2.0 is newer than libcni 1.2"
    );
    let only = json!({"cniVersion": "0.4.0"});
    assert_eq!(Libcni::V1_2.negotiate(&only), "0.4.0");

    let result = |v: &str| {
        json!({"cniVersion": v,
               "interfaces": [{"name": "lp-1"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
               "ips": [{"address": "10.244.64.1/32", "interface": 1},
                       {"address": "fd00:244:0:100::1/128", "interface": 1}]})
        .to_string()
    };
    // A 1.1.0 result: containerd 1.6/1.7 refuse it, 2.x read it.
    let err = Libcni::V1_1
        .read_add("lace", "1.1.0", result("1.1.0").as_bytes())
        .unwrap_err();
    assert_eq!(
        err,
        r#"plugin type="lace" failed (add): unsupported CNI result version "1.1.0""#
    );
    let read = Libcni::V1_2
        .read_add("lace", "1.1.0", result("1.1.0").as_bytes())
        .unwrap();
    assert_eq!(read.interfaces["eth0"].ips.len(), 2);
    assert_eq!(read.interfaces["eth0"].sandbox, "/run/netns/p");
    // 1.0.0 both read.
    for libcni in [Libcni::V1_1, Libcni::V1_2] {
        let read = libcni
            .read_add("lace", "1.0.0", result("1.0.0").as_bytes())
            .unwrap();
        assert_eq!(read.version, "1.0.0");
    }
    // A result without a version is taken as the configuration's (libcni's fixup).
    let unversioned = json!({"ips": [{"address": "10.0.0.1/32"}]}).to_string();
    let read = Libcni::V1_1
        .read_add("lace", "1.0.0", unversioned.as_bytes())
        .unwrap();
    assert_eq!(read.version, "1.0.0");
    assert_eq!(read.interfaces["eth0"].ips[0].to_string(), "10.0.0.1/32");
    // An answer in another version than asked: the spec forbids it.
    let err = Libcni::V1_2
        .read_add("lace", "1.0.0", result("0.4.0").as_bytes())
        .unwrap_err();
    assert!(err.contains("not the configuration's"), "{err}");
    // An address naming an interface that is not there: go-cni fails the setup.
    let bad = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}],
                     "ips": [{"address": "10.0.0.1/32", "interface": 1}]})
    .to_string();
    let err = Libcni::V1_1
        .read_add("lace", "1.0.0", bad.as_bytes())
        .unwrap_err();
    assert!(err.contains("interface number 1"), "{err}");
    // 0.2.0: ip4/ip6 on the default interface.
    let legacy = json!({"cniVersion": "0.2.0", "ip4": {"ip": "127.0.0.1/8"}}).to_string();
    let read = Libcni::V1_1
        .read_add("loopback", "0.2.0", legacy.as_bytes())
        .unwrap();
    assert_eq!(read.interfaces["eth0"].ips[0].to_string(), "127.0.0.1/8");
}

/// The loopback ADD of go-cni's fixed configuration (0.3.1), as a runtime reads it.
fn loopback_add(bed: &Bed, id: &str, pod: &Ns) -> cni_bed::libcni::Read {
    let lo = plugin_conf(
        &serde_json::from_str(LOOPBACK_CONFLIST).unwrap(),
        bed.runtime,
    );
    let (ok, out) = bed.exec("loopback", "ADD", id, &pod.path(), &pod.0, "lo", &lo);
    assert!(ok, "loopback ADD failed: {}", String::from_utf8_lossy(&out));
    bed.runtime
        .read_add("loopback", "0.3.1", &out)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn lo_state(pod: &Ns) -> String {
    ip(&["-n", &pod.0, "addr", "show", "dev", "lo"])
}

/// One agent for the runtime compatibility (its start is the expensive part under TCG):
///
/// - The agent installs its copy of the plugin as `loopback` (none was there), with the
///   settings file naming its socket; the copy brings a new sandbox's `lo` up through the agent
///   and answers what the reference plugin answers; CHECK sees `lo` down; IPv6 off in the
///   sandbox means no ::1; DEL needs no agent. (A loopback of the host's is never replaced:
///   `agent::install`'s unit tests.)
/// - containerd 1.6's libcni (1.1.2) with the agent's conflist: the plugin answers in 1.0.0
///   and the pod gets its addresses; with the conflist the agent used to write (`"cniVersion":
///   "1.1.0"`) the same ADD fails as containerd 1.6 failed it, and containerd's DEL after the
///   failed setup leaves nothing behind; libcni 1.2+ negotiates 1.1.0 from it either way.
#[test]
fn loopback_and_both_libcni_generations_as_containerd_sets_pods_up() {
    let mut bed = Bed::new("lo");
    let bin = bed.p("bin");
    assert_eq!(
        std::fs::read(bin.join("loopback")).unwrap(),
        std::fs::read(bin.join("lace")).unwrap(),
        "bin/loopback is not a copy of the plugin"
    );
    let settings: Value =
        serde_json::from_slice(&std::fs::read(bin.join("lace-loopback.json")).unwrap()).unwrap();
    assert_eq!(
        settings["agentSocket"],
        bed.p("run/cni.sock").to_str().unwrap()
    );
    assert!(
        bed.log().contains("installed Lace's"),
        "the agent did not say it installed loopback:\n{}",
        bed.log()
    );

    let pod = Ns::bare(format!("lace-ct-l-{}", bed.tag));
    assert!(!lo_state(&pod).contains("UP"), "{}", lo_state(&pod));
    let (lo, eth0) = bed.setup("ctr-l", &pod).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lo.version, "0.3.1");
    let l = &lo.interfaces["lo"];
    assert_eq!(
        (l.mac.as_str(), l.sandbox.as_str()),
        ("00:00:00:00:00:00", pod.path().as_str())
    );
    assert_eq!(
        l.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
        ["127.0.0.1/8", "::1/128"],
        "{}",
        lo.raw
    );
    assert_eq!(eth0.version, "1.1.0", "libcni 1.2+ negotiates 1.1.0");
    assert_eq!(eth0.interfaces["eth0"].ips.len(), 2);
    let state = lo_state(&pod);
    assert!(
        state.contains(",UP")
            && state.contains("inet 127.0.0.1/8")
            && state.contains("inet6 ::1/128"),
        "{state}"
    );

    // CHECK (0.4.0 and later have it): up passes, down is named.
    let check = json!({"cniVersion": "1.0.0", "name": "cni-loopback", "type": "loopback"});
    let (ok, out) = bed.exec(
        "loopback",
        "CHECK",
        "ctr-l",
        &pod.path(),
        &pod.0,
        "lo",
        &check,
    );
    assert!(ok, "{}", String::from_utf8_lossy(&out));
    ip(&["-n", &pod.0, "link", "set", "lo", "down"]);
    let (ok, out) = bed.exec(
        "loopback",
        "CHECK",
        "ctr-l",
        &pod.path(),
        &pod.0,
        "lo",
        &check,
    );
    let out = String::from_utf8_lossy(&out).into_owned();
    assert!(!ok && out.contains("lo is down"), "{out}");
    // ADD again (a retried sandbox): up again, same answer.
    assert_eq!(loopback_add(&bed, "ctr-l", &pod).interfaces["lo"], *l);
    bed.del("ctr-l", &pod.path());

    // A sandbox with IPv6 off: only 127.0.0.1/8, as the reference plugin reports it.
    let v4 = Ns::bare(format!("lace-ct-l4-{}", bed.tag));
    for sysctl in [
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.lo.disable_ipv6=1",
    ] {
        ip(&["netns", "exec", &v4.0, "sysctl", "-qw", sysctl]);
    }
    let only4 = loopback_add(&bed, "ctr-l4", &v4);
    assert_eq!(
        only4.interfaces["lo"]
            .ips
            .iter()
            .map(|ip| ip.to_string())
            .collect::<Vec<_>>(),
        ["127.0.0.1/8"]
    );
    // DEL of loopback needs neither the namespace nor the agent.
    let lo_conf = plugin_conf(
        &serde_json::from_str(LOOPBACK_CONFLIST).unwrap(),
        bed.runtime,
    );
    for netns in [v4.path(), String::new()] {
        let (ok, out) = bed.exec("loopback", "DEL", "ctr-l4", &netns, "x", "lo", &lo_conf);
        assert!(ok && out.is_empty(), "{}", String::from_utf8_lossy(&out));
    }

    // containerd 1.6/1.7: libcni 1.1.2 uses the conflist's cniVersion, 1.0.0.
    bed.runtime = Libcni::V1_1;
    let pod = Ns::bare(format!("lace-ct-v-{}", bed.tag));
    let (_, eth0) = bed.setup("ctr-v", &pod).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(eth0.version, "1.0.0");
    assert_eq!(
        eth0.interfaces["eth0"]
            .ips
            .iter()
            .map(|ip| ip.to_string())
            .collect::<Vec<_>>(),
        ["10.244.64.1/32", "fd00:244:0:100::1/128"]
    );
    bed.del("ctr-v", &pod.path());
    // The conflist the agent used to write: the ADD that failed under containerd 1.6.
    let mut list = bed.conflist();
    list["cniVersion"] = json!("1.1.0");
    std::fs::write(bed.p("conf/10-lace.conflist"), list.to_string()).unwrap();
    let err = bed.setup("ctr-v2", &pod).unwrap_err();
    assert_eq!(
        err,
        r#"plugin type="lace" failed (add): unsupported CNI result version "1.1.0""#
    );
    bed.del("ctr-v2", &pod.path());
    assert!(
        bed.ipam_addresses().is_empty(),
        "{:?}",
        bed.ipam_addresses()
    );
    assert!(bed.host_links().is_empty(), "{:?}", bed.host_links());
}

// --- hostPorts through the real plugin and agent -------------------------------------------

/// The elements of Lace's `hostports_any_v4` map on the bed's node, one per line.
fn host_port_elements(bed: &Bed) -> String {
    bed.node_nft(&["list", "map", "inet", "lace", "hostports_any_v4"])
        .1
}

/// hostPorts as containerd passes them (`runtimeConfig.portMappings`, go-cni's PascalCase):
/// the first pod's mapping lands in the nft map naming the pod; a second pod asking for the
/// same port is refused with an error naming the holder, and nothing is recorded for it; the
/// mapping survives an agent restart (rebuilt from the agent's records); DEL removes it, and
/// then the second pod gets the port.
#[test]
fn host_port_conflicts_are_refused_and_mappings_follow_the_agents_records() {
    const DEADLINE: Duration = Duration::from_secs(10);
    let mut bed = Bed::new("hp");
    let (a, b) = (
        Ns::new(format!("lace-ct-hpa-{}", bed.tag)),
        Ns::new(format!("lace-ct-hpb-{}", bed.tag)),
    );
    fn add(bed: &Bed, id: &str, pod: &Ns, name: &str) -> (bool, Value) {
        let mapping = json!({"runtimeConfig": {"portMappings": [
            {"HostPort": 18080, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""}]}});
        bed.cni("ADD", id, &pod.path(), name, bed.netconf(mapping))
    }
    let (ok, ra) = add(&bed, "ctr-hpa", &a, "web-a");
    assert!(ok, "ADD of web-a failed: {ra}\n{}", bed.log());
    let a4 = addresses(&ra)[0].trim_end_matches("/32").to_owned();
    let element_of =
        |pod: &str, ip: &str| format!("tcp . 18080 comment \"pod default/{pod}\" : {ip} . 8080");
    within(&bed, DEADLINE, "web-a's hostPort in the nft map", || {
        host_port_elements(&bed).contains(&element_of("web-a", &a4))
    });

    let held = bed.ipam_addresses();
    let (ok, rb) = add(&bed, "ctr-hpb", &b, "web-b");
    assert!(!ok, "a second pod got hostPort 18080/TCP: {rb}");
    let msg = rb["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("hostPort 18080/TCP") && msg.contains("default/web-a"),
        "the refusal names the port and the pod holding it: {rb}"
    );
    assert_eq!(bed.ipam_addresses(), held, "nothing recorded for web-b");

    bed.kill_agent();
    bed.node_nft_delete();
    bed.start_agent();
    within(
        &bed,
        DEADLINE,
        "web-a's hostPort back after a restart",
        || host_port_elements(&bed).contains(&element_of("web-a", &a4)),
    );

    bed.del("ctr-hpa", &a.path());
    within(&bed, DEADLINE, "web-a's hostPort gone after DEL", || {
        !host_port_elements(&bed).contains("web-a")
    });
    let (ok, rb) = add(&bed, "ctr-hpb", &b, "web-b");
    assert!(
        ok,
        "ADD of web-b after web-a's DEL failed: {rb}\n{}",
        bed.log()
    );
    let b4 = addresses(&rb)[0].trim_end_matches("/32").to_owned();
    within(&bed, DEADLINE, "web-b's hostPort in the nft map", || {
        host_port_elements(&bed).contains(&element_of("web-b", &b4))
    });
    bed.del("ctr-hpb", &b.path());
}
