//! Pods wired the way Lace's CNI wires them, until the CNI itself does it in these tests: a
//! veth pair, the pod end renamed `eth0` in the pod's namespace with the pod's /32 and a default
//! route via the link-local gateway `169.254.1.1`; the host end keeps its `lp-*` name in the
//! node's namespace, holds `169.254.1.1/32` (so it answers the pod's ARP inside the VRF) and is
//! left for the reconciler to enslave to the Network's VRF and route to.

use std::net::Ipv4Addr;

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
