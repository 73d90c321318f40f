//! The two-node SRv6 test bed: the datapath Lace programs, built by hand with stock tools.
//!
//! ```text
//!  pod-a ── node-a ══ fabric ══ node-b ── pod-b
//!  10.1.1.2  vrf-blue  (IPv6    vrf-blue  10.2.1.2
//!  fd00:a::2 table 100  only)   table 100 fd00:b::2
//! ```
//!
//! Each node has one VRF (`vrf-blue`, table 100) holding its pod's veth, a `seg6` encap route
//! per remote pod subnet towards the remote node's SID, and a `seg6local End.DT46 vrftable 100`
//! route (with `count`) decapsulating its own SID into the VRF. The fabric only routes the node
//! locators (`fc00:a::/48`, `fc00:b::/48`) and counts the SRv6 packets it forwards in nftables,
//! matching the segment routing header (`rt type 4`). It proves the kernel and the bed work; it
//! contains no Lace code.

use crate::{Netns, NetnsError, Topology};

/// The VRF on each node.
pub const VRF: &str = "vrf-blue";
/// The VRF's routing table on each node.
pub const VRF_TABLE: u32 = 100;

/// One side of the bed: a node and the pod behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// node-a / pod-a.
    A,
    /// node-b / pod-b.
    B,
}

impl Side {
    /// The other side.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    /// Lower-case letter used in names and addresses.
    fn letter(self) -> char {
        match self {
            Side::A => 'a',
            Side::B => 'b',
        }
    }

    /// The node's namespace label.
    pub fn node(self) -> String {
        format!("node-{}", self.letter())
    }

    /// The pod's namespace label.
    pub fn pod(self) -> String {
        format!("pod-{}", self.letter())
    }

    /// The pod's IPv4 address.
    pub fn pod_v4(self) -> &'static str {
        match self {
            Side::A => "10.1.1.2",
            Side::B => "10.2.1.2",
        }
    }

    /// The pod's IPv6 address.
    pub fn pod_v6(self) -> String {
        format!("fd00:{}::2", self.letter())
    }

    /// The node's SRv6 locator.
    pub fn locator(self) -> String {
        format!("fc00:{}::/48", self.letter())
    }

    /// The node's End.DT46 SID for `vrf-blue`.
    pub fn sid(self) -> String {
        format!("fc00:{}::46", self.letter())
    }

    /// The node's underlay (fabric-facing) IPv6 address.
    fn underlay(self) -> String {
        format!("2001:db8:{}::2", self.letter())
    }

    /// The fabric's address on the link to this node.
    fn fabric_side(self) -> String {
        format!("2001:db8:{}::1", self.letter())
    }
}

/// What went wrong building or reading the bed.
#[derive(Debug, thiserror::Error)]
pub enum BedError {
    /// A harness command failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A counter could not be read from a tool's output.
    #[error("no {what} in the output of {command}: {output:?}")]
    Counter {
        /// Which counter.
        what: String,
        /// The command whose output was parsed.
        command: String,
        /// The output.
        output: String,
    },
}

/// The built bed; dropping it deletes every namespace.
#[derive(Debug)]
pub struct TwoNodeBed {
    topo: Topology,
}

/// The fabric's nftables observer: SRv6 packets (outer IPv6 with a segment routing header)
/// forwarded towards each node's locator.
const FABRIC_NFT: &str = r#"
table inet bed {
  counter srv6_to_a { }
  counter srv6_to_b { }
  chain forward {
    type filter hook forward priority 0; policy accept;
    ip6 daddr fc00:a::/48 rt type 4 counter name "srv6_to_a"
    ip6 daddr fc00:b::/48 rt type 4 counter name "srv6_to_b"
  }
}
"#;

/// The number after `word` in `text` (`packets 12`).
pub fn number_after(text: &str, word: &str) -> Option<u64> {
    let mut tokens = text.split_whitespace();
    while let Some(t) = tokens.next() {
        if t == word {
            return tokens.next()?.parse().ok();
        }
    }
    None
}

impl TwoNodeBed {
    /// Builds namespaces, links, addresses, VRFs, sysctls and the fabric's routes. Pods reach
    /// their own node but not each other: [`TwoNodeBed::install_srv6`] adds the SRv6 routes.
    pub fn build() -> Result<Self, BedError> {
        let mut topo = Topology::new();
        topo.add("fabric")?;
        for side in [Side::A, Side::B] {
            topo.add(&side.node())?;
            topo.add(&side.pod())?;
        }
        let bed = TwoNodeBed { topo };
        let fabric = bed.fabric()?;
        fabric.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        fabric.exec_stdin("nft", &["-f", "-"], FABRIC_NFT)?;
        for side in [Side::A, Side::B] {
            bed.build_side(side)?;
        }
        Ok(bed)
    }

    fn build_side(&self, side: Side) -> Result<(), BedError> {
        let l = side.letter();
        let fabric = self.fabric()?;
        let node = self.node(side)?;
        let pod = self.pod(side)?;

        // Underlay: node eth0 <-> fabric fab-<l>, IPv6 only.
        self.topo
            .link((&side.node(), "eth0"), ("fabric", &format!("fab-{l}")))?;
        fabric.ip(&format!(
            "-6 addr add {}/64 dev fab-{l} nodad",
            side.fabric_side()
        ))?;
        fabric.ip(&format!(
            "-6 route add {} via {} dev fab-{l}",
            side.locator(),
            side.underlay()
        ))?;
        node.ip(&format!(
            "-6 addr add {}/64 dev eth0 nodad",
            side.underlay()
        ))?;

        // Node: forwarding, VRF, strict mode (End.DT46 vrftable needs it), rp_filter off
        // (decapsulated packets arrive through the VRF device).
        for (key, value) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ] {
            node.sysctl(key, value)?;
        }
        node.ip(&format!("link add {VRF} type vrf table {VRF_TABLE}"))?;
        node.ip(&format!("link set {VRF} up"))?;
        node.sysctl("net.vrf.strict_mode", "1")?;
        node.sysctl(&format!("net.ipv4.conf.{VRF}.rp_filter"), "0")?;
        // Encapsulated packets leave from the node's underlay address.
        node.ip(&format!("sr tunsrc set {}", side.underlay()))?;
        // The remote locator via the fabric, in the main table (underlay) and in the VRF's
        // table: after encap the outer lookup happens in the VRF.
        for table in ["main".to_owned(), VRF_TABLE.to_string()] {
            node.ip(&format!(
                "-6 route add {} via {} dev eth0 table {table}",
                side.peer().locator(),
                side.fabric_side()
            ))?;
        }

        // Pod behind the node, its veth enslaved to the VRF.
        let host_if = format!("veth-pod-{l}");
        self.topo
            .link((&side.node(), &host_if), (&side.pod(), "eth0"))?;
        node.ip(&format!("link set {host_if} master {VRF}"))?;
        node.ip(&format!("addr add 10.{}.1.1/24 dev {host_if}", net(side)))?;
        node.ip(&format!("-6 addr add fd00:{l}::1/64 dev {host_if} nodad"))?;
        pod.ip(&format!("addr add {}/24 dev eth0", side.pod_v4()))?;
        pod.ip(&format!("-6 addr add {}/64 dev eth0 nodad", side.pod_v6()))?;
        pod.ip(&format!("route add default via 10.{}.1.1", net(side)))?;
        pod.ip(&format!("-6 route add default via fd00:{l}::1"))?;
        Ok(())
    }

    /// Adds, on each node, the decap route for its own SID and the encap routes towards the
    /// other node's pod subnets.
    pub fn install_srv6(&self) -> Result<(), BedError> {
        for side in [Side::A, Side::B] {
            let node = self.node(side)?;
            let peer = side.peer();
            node.ip(&format!(
                "-6 route add {}/128 encap seg6local action End.DT46 vrftable {VRF_TABLE} count dev {VRF}",
                side.sid()
            ))?;
            node.ip(&format!(
                "route add 10.{}.1.0/24 vrf {VRF} encap seg6 mode encap segs {} dev eth0",
                net(peer),
                peer.sid()
            ))?;
            node.ip(&format!(
                "-6 route add fd00:{}::/64 vrf {VRF} encap seg6 mode encap segs {} dev eth0",
                peer.letter(),
                peer.sid()
            ))?;
        }
        Ok(())
    }

    /// The fabric namespace.
    pub fn fabric(&self) -> Result<&Netns, NetnsError> {
        self.topo.ns("fabric")
    }

    /// A node's namespace.
    pub fn node(&self, side: Side) -> Result<&Netns, NetnsError> {
        self.topo.ns(&side.node())
    }

    /// A pod's namespace.
    pub fn pod(&self, side: Side) -> Result<&Netns, NetnsError> {
        self.topo.ns(&side.pod())
    }

    /// Packets decapsulated by `side`'s End.DT46 route (its `count` statistics).
    pub fn decap_packets(&self, side: Side) -> Result<u64, BedError> {
        let args = format!("-s -6 route show {}/128", side.sid());
        let out = self.node(side)?.ip(&args)?;
        number_after(&out, "packets").ok_or_else(|| BedError::Counter {
            what: format!("seg6local packet count of {}", side.sid()),
            command: format!("ip -n {} {args}", side.node()),
            output: out,
        })
    }

    /// SRv6 packets (with a segment routing header) the fabric forwarded towards `side`.
    pub fn fabric_srv6_packets_to(&self, side: Side) -> Result<u64, BedError> {
        let counter = format!("srv6_to_{}", side.letter());
        let out = self
            .fabric()?
            .exec("nft", &["list", "counter", "inet", "bed", &counter])?;
        number_after(&out, "packets").ok_or_else(|| BedError::Counter {
            what: format!("nft counter {counter}"),
            command: format!("nft list counter inet bed {counter}"),
            output: out,
        })
    }

    /// What an operator would look at on a node: `ip vrf`, the VRF's routes and the IPv6 main
    /// table with the seg6/seg6local routes.
    pub fn describe_node(&self, side: Side) -> Result<String, BedError> {
        let node = self.node(side)?;
        Ok(format!(
            "$ ip vrf\n{}$ ip route show vrf {VRF}\n{}$ ip -6 route show vrf {VRF}\n{}$ ip -s -6 route\n{}",
            node.ip("vrf show")?,
            node.ip(&format!("route show vrf {VRF}"))?,
            node.ip(&format!("-6 route show vrf {VRF}"))?,
            node.ip("-s -6 route")?,
        ))
    }

    /// Pings `to`'s pod from `from`'s pod (`ping -c count`), IPv4 or IPv6; returns ping's output.
    pub fn ping(&self, from: Side, to: Side, v6: bool, count: u32) -> Result<String, BedError> {
        let target = if v6 {
            to.pod_v6()
        } else {
            to.pod_v4().to_owned()
        };
        let count = count.to_string();
        Ok(self.pod(from)?.exec(
            "ping",
            &["-n", "-c", &count, "-i", "0.2", "-W", "3", &target],
        )?)
    }
}

/// The second octet of a side's pod subnet (10.1.1.0/24, 10.2.1.0/24).
fn net(side: Side) -> u8 {
    match side {
        Side::A => 1,
        Side::B => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_after_finds_counts_in_tool_output() {
        let ip = "fc00:a::46  encap seg6local action End.DT46 vrftable 100 packets 7 bytes 588 \
                  errors 0 dev vrf-blue metric 1024 pref medium";
        assert_eq!(number_after(ip, "packets"), Some(7));
        assert_eq!(number_after(ip, "bytes"), Some(588));
        let nft = "table inet bed {\n\tcounter srv6_to_b {\n\t\tpackets 12 bytes 1400\n\t}\n}";
        assert_eq!(number_after(nft, "packets"), Some(12));
        assert_eq!(number_after("packets", "packets"), None);
        assert_eq!(number_after("packets x", "packets"), None);
        assert_eq!(number_after("no counters here", "packets"), None);
    }

    #[test]
    fn sides_have_distinct_addresses_and_sids() {
        assert_eq!(Side::A.peer(), Side::B);
        assert_eq!(Side::B.peer(), Side::A);
        assert_ne!(Side::A.sid(), Side::B.sid());
        assert_ne!(Side::A.pod_v4(), Side::B.pod_v4());
        // Each SID lies in its own node's locator.
        for side in [Side::A, Side::B] {
            let prefix = side.locator().trim_end_matches(":/48").to_owned();
            assert!(side.sid().starts_with(&prefix), "{side:?}");
        }
    }
}
