//! Which underlay each pair takes: the agent's probes of the link-local path.
//!
//! The planner chooses per pair from the cluster state and the [`UnderlayFacts`] this loop
//! gathers (see [`crate::plan::underlay`]): every [`probe_interval`] it asks the dataplane
//! to look at the uplink and probe the peers on its L2 segment
//! ([`crate::dataplane::linklocal`]), runs the answers through a [`Tracker`] (a pair takes
//! the link-local path after one answered probe and leaves it after [`MISSES`] unanswered
//! ones in a row, or at once when the uplink's IPv6 goes off or the peer is no longer
//! on-link), and hands changed facts to the agent, which re-plans and reconciles. Each pair
//! that changes path is logged (`underlay: peer … now …`) and counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::dataplane::{UnderlayQuery, UnderlayRound};
use crate::plan::underlay::{PeerPath, UnderlayFacts};
use crate::state::ClusterState;

/// Unanswered probes in a row before a pair leaves the link-local path.
pub const MISSES: u32 = 3;
/// The shortest time between two probe rounds.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The time between two probe rounds for `peers` probed peers: [`MIN_INTERVAL`], longer on
/// large segments so that every node's kernel answers at most about 200 probes a second (the
/// kernel sends at most 1,000 ICMP messages a second, `net.ipv4.icmp_msgs_per_sec`, shared by
/// both families; a probe needs one).
pub fn probe_interval(peers: usize) -> Duration {
    MIN_INTERVAL.max(Duration::from_millis(5) * u32::try_from(peers).unwrap_or(u32::MAX))
}

/// What the agent asks the dataplane about node `node`: its IPv4 InternalIP and the peers it
/// shares no IPv6 InternalIP with that have an IPv4 one (those a link-local path could serve).
pub fn query(node: &str, state: &ClusterState) -> UnderlayQuery {
    let Some(me) = state.node_allocations.get(node) else {
        return UnderlayQuery::default();
    };
    let peers = state
        .node_allocations
        .iter()
        .filter(|(n, _)| n.as_str() != node)
        .filter(|(_, a)| !(me.underlay.ipv6.is_some() && a.underlay.ipv6.is_some()))
        .filter_map(|(n, a)| Some((n.clone(), a.underlay.ipv4?)))
        .collect();
    UnderlayQuery {
        ipv4: me.underlay.ipv4,
        peers,
    }
}

/// Turns probe rounds into facts, with hysteresis for the answers.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    /// Per on-link peer: whether it counts as answering, and unanswered probes in a row.
    peers: BTreeMap<String, (bool, u32)>,
    /// The on-link peers that answered at least once since they are on-link.
    answered: BTreeSet<String>,
}

impl Tracker {
    /// The facts after `round`.
    pub fn update(&mut self, round: &UnderlayRound) -> UnderlayFacts {
        // Peers no longer on-link (or an uplink without IPv6) start over.
        self.peers
            .retain(|p, _| round.uplink_ipv6 && round.on_link.contains(p));
        self.answered.retain(|p| round.on_link.contains(p));
        if round.uplink_ipv6 {
            for p in &round.on_link {
                let e = self.peers.entry(p.clone()).or_insert((false, 0));
                if round.answering.contains(p) {
                    *e = (true, 0);
                    self.answered.insert(p.clone());
                } else if round.holds_address {
                    // Only a probe that was sent counts as unanswered.
                    e.1 += 1;
                    if e.1 >= MISSES {
                        e.0 = false;
                    }
                }
            }
        }
        UnderlayFacts {
            uplink_ipv6: round.uplink_ipv6,
            on_link: round.on_link.clone(),
            answering: self
                .peers
                .iter()
                .filter(|(_, (a, _))| *a)
                .map(|(p, _)| p.clone())
                .collect(),
            answered: self.answered.clone(),
            uplink_mtu: round.uplink_mtu,
        }
    }
}

/// The pairs whose path differs between `before` and `after` (a peer only in one of them:
/// `None` on the other side).
pub fn path_changes<'a>(
    before: &'a BTreeMap<String, PeerPath>,
    after: &'a BTreeMap<String, PeerPath>,
) -> Vec<(&'a str, Option<&'a PeerPath>, Option<&'a PeerPath>)> {
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    names
        .into_iter()
        .filter_map(|n| {
            let (b, a) = (before.get(n), after.get(n));
            let changed = match (b, a) {
                (Some(b), Some(a)) => b.kind() != a.kind() || b != a,
                _ => true,
            };
            changed.then_some((n.as_str(), b, a))
        })
        .collect()
}

/// At most this many pairs changing path at once are logged one by one; the rest in a count.
const LOGGED_CHANGES: usize = 20;

/// Logs and counts how the pairs' paths changed from `before` (`None`: the first plan) to
/// `after`, and sets the per-path gauge.
pub fn report(
    agent: &super::Agent,
    before: Option<&BTreeMap<String, PeerPath>>,
    after: &BTreeMap<String, PeerPath>,
) {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for p in after.values() {
        *counts.entry(p.kind()).or_default() += 1;
    }
    agent.metrics.set_underlay_peers(&counts);
    let Some(before) = before else {
        tracing::info!(node = %agent.node, peers = ?counts, "underlay: paths to the other nodes");
        return;
    };
    let changes = path_changes(before, after);
    for (i, (peer, b, a)) in changes.iter().enumerate() {
        let from = b.map_or("none", PeerPath::kind);
        let to = a.map_or("none", PeerPath::kind);
        agent.metrics.underlay_path_changed(from, to);
        if i < LOGGED_CHANGES {
            let now = a.map_or("gone".to_string(), ToString::to_string);
            let was = b.map_or("new".to_string(), ToString::to_string);
            tracing::info!(node = %agent.node, %peer, path = to, "underlay: peer {peer} now {now} (was {was})");
        }
    }
    if changes.len() > LOGGED_CHANGES {
        tracing::info!(
            node = %agent.node,
            more = changes.len() - LOGGED_CHANGES,
            peers = ?counts,
            "underlay: more pairs changed path"
        );
    }
}

/// The probe loop: runs until the agent stops. A round every [`probe_interval`]; a new state
/// starts one at once only when it changes what there is to probe (the node's IPv4
/// InternalIP, its peers), so a busy cluster's state changes never add probes; drift starts one
/// at once too (IPv6 switched off on the uplink shows as Lace's routes and address flushed).
pub async fn run(agent: Arc<super::Agent>) {
    let mut tracker = Tracker::default();
    // Rounds that found on-link peers before the node held its own address (no probe sent).
    let mut unsent = 0;
    loop {
        let mut asked = UnderlayQuery::default();
        let mut soon = false;
        if let Ok(loaded) = agent.loaded() {
            asked = query(&agent.node, &loaded.state);
            let q = asked.clone();
            let dataplane = Arc::clone(&agent.dataplane);
            let round = if q.ipv4.is_none() || q.peers.is_empty() {
                Ok(Ok(UnderlayRound::default()))
            } else {
                tokio::task::spawn_blocking(move || dataplane.probe_underlay(q)).await
            };
            match round {
                Ok(Ok(round)) => {
                    let probed =
                        round.holds_address || !round.uplink_ipv6 || round.on_link.is_empty();
                    let facts = tracker.update(&round);
                    agent.set_underlay_facts(facts);
                    if probed {
                        unsent = 0;
                    } else {
                        // The plan just got the node's own address: probe once it is in.
                        unsent += 1;
                        soon = true;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "underlay: cannot look at the uplink; keeping the last facts")
                }
                Err(e) => tracing::error!(error = %e, "underlay: the probe task failed"),
            }
            // Ready once probes went out (the pods' MTU then counts the peers that answered),
            // or when there is nothing to probe, looking failed, or the own address does not
            // come: the pairs then take fou, which always works.
            if !soon || unsent > MISSES {
                agent.underlay_looked();
            }
        }
        let wait = if soon {
            Duration::from_millis(300)
        } else {
            probe_interval(asked.peers.len())
        };
        let next = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => break,
                _ = agent.underlay_look_now.notified() => break,
                _ = agent.underlay_wanted.notified() => {
                    let now = agent.loaded().ok().map(|l| query(&agent.node, &l.state));
                    if now.is_some_and(|q| q != asked) {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ipv6: bool, on: &[&str], ans: &[&str]) -> UnderlayRound {
        UnderlayRound {
            uplink: Some("eth0".into()),
            uplink_mtu: Some(1500),
            uplink_ipv6: ipv6,
            holds_address: true,
            on_link: on.iter().map(|s| s.to_string()).collect(),
            answering: ans.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn set(s: &[&str]) -> BTreeSet<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_answer_promotes_three_misses_demote() {
        let mut t = Tracker::default();
        let f = t.update(&round(true, &["a", "b"], &[]));
        assert!(f.answering.is_empty());
        assert_eq!(f.on_link, set(&["a", "b"]));
        let f = t.update(&round(true, &["a", "b"], &["a"]));
        assert_eq!(f.answering, set(&["a"]));
        for i in 1..MISSES {
            let f = t.update(&round(true, &["a", "b"], &[]));
            assert_eq!(f.answering, set(&["a"]), "demoted after {i} misses");
        }
        let f = t.update(&round(true, &["a", "b"], &[]));
        assert!(f.answering.is_empty());
        // A miss in between answers does not count up.
        t.update(&round(true, &["a"], &["a"]));
        t.update(&round(true, &["a"], &[]));
        let f = t.update(&round(true, &["a"], &["a"]));
        assert_eq!(f.answering, set(&["a"]));
    }

    #[test]
    fn ipv6_off_or_a_router_in_between_demote_at_once() {
        let mut t = Tracker::default();
        t.update(&round(true, &["a", "b"], &["a", "b"]));
        let f = t.update(&round(true, &["a"], &["a", "b"]));
        assert_eq!(f.answering, set(&["a"]), "b moved behind a router");
        let f = t.update(&round(false, &["a"], &[]));
        assert!(!f.uplink_ipv6);
        assert!(f.answering.is_empty());
        assert_eq!(
            f.on_link,
            set(&["a"]),
            "still on-link: its TCP is clamped on fou"
        );
        assert!(!f.link_local_works("a"));
    }

    #[test]
    fn without_its_own_address_the_node_sent_no_probe_and_counts_no_miss() {
        let mut t = Tracker::default();
        t.update(&round(true, &["a"], &["a"]));
        let mut r = round(true, &["a"], &[]);
        r.holds_address = false;
        for _ in 0..MISSES + 2 {
            assert_eq!(t.update(&r).answering, set(&["a"]));
        }
    }

    #[test]
    fn the_interval_grows_with_the_segment() {
        assert_eq!(probe_interval(0), MIN_INTERVAL);
        assert_eq!(probe_interval(100), MIN_INTERVAL);
        assert_eq!(probe_interval(1000), Duration::from_secs(5));
    }

    #[test]
    fn path_changes_name_each_pair_once() {
        let v4 = |s: &str| PeerPath::Ipv4(s.parse().unwrap());
        let ll = |s: &str| PeerPath::LinkLocal(s.parse().unwrap());
        let before: BTreeMap<String, PeerPath> = [
            ("a".to_string(), v4("192.0.2.1")),
            ("b".to_string(), v4("192.0.2.2")),
            ("gone".to_string(), v4("192.0.2.9")),
        ]
        .into();
        let after: BTreeMap<String, PeerPath> = [
            ("a".to_string(), v4("192.0.2.1")),
            ("b".to_string(), ll("fe80::4c61:6365:c000:202")),
            ("new".to_string(), v4("192.0.2.7")),
        ]
        .into();
        let c = path_changes(&before, &after);
        let names: Vec<&str> = c.iter().map(|(n, ..)| *n).collect();
        assert_eq!(names, ["b", "gone", "new"]);
        assert_eq!(c[0].2.unwrap().kind(), "link-local");
    }
}
