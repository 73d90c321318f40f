//! Pods wired the way Lace's CNI wires them, until the CNI itself does it in these tests: a
//! veth pair, the pod end renamed `eth0` in the pod's namespace with the pod's /32 and a default
//! route via the link-local gateway `169.254.1.1`; the host end keeps its `lp-*` name in the
//! node's namespace, holds `169.254.1.1/32` (so it answers the pod's ARP inside the VRF) and is
//! left for the reconciler to enslave to the Network's VRF and route to. [`add_pod_v6`] gives
//! such a pod an IPv6 address too, behind the gateway `fe80::1` as a permanent neighbour (the
//! host end gets no IPv6 address here: the reconciler adds `fe80::1` for the probe route).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::{veth, Netns, Result};

/// The pods' default gateway (the CNI's `gateway` in its result).
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Wires pod namespace `pod` with address `addr` to `node` through host interface `host_if`.
pub fn attach_pod(node: &Netns, host_if: &str, pod: &Netns, addr: Ipv4Addr) -> Result<()> {
    veth(node, host_if, pod, "eth0")?;
    node.ip(&format!("addr add {POD_GATEWAY_V4}/32 dev {host_if}"))?;
    pod.ip(&format!("addr add {addr}/32 dev eth0"))?;
    pod.ip(&format!("route add {POD_GATEWAY_V4} dev eth0 scope link"))?;
    pod.ip(&format!("route add default via {POD_GATEWAY_V4} dev eth0"))?;
    Ok(())
}

/// The pods' IPv6 gateway: what Lace's CNI points the pod's default route at.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Gives a pod wired by [`attach_pod`] the IPv6 address `addr` (`/128`, `nodad`), the
/// gateway [`POD_GATEWAY_V6`] as a permanent neighbour at the host end's MAC, and a default
/// route via it, as Lace's CNI does.
pub fn add_pod_v6(node: &Netns, host_if: &str, pod: &Netns, addr: Ipv6Addr) -> Result<()> {
    let mac = node.exec("cat", &[&format!("/sys/class/net/{host_if}/address")])?;
    let mac = mac.trim();
    pod.ip(&format!("-6 addr add {addr}/128 dev eth0 nodad"))?;
    pod.ip(&format!(
        "-6 neigh replace {POD_GATEWAY_V6} lladdr {mac} dev eth0 nud permanent"
    ))?;
    pod.ip(&format!(
        "-6 route add default via {POD_GATEWAY_V6} dev eth0"
    ))?;
    Ok(())
}
