//! Connection probes for the policy tests: TCP connections, SCTP associations and UDP datagrams
//! between namespaces, all run at once and each checked against what it must meet: answered
//! with the server seeing an expected source, or refused with the drop of the chain that
//! enforces it counting the packet.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::echo::{self, PeerEcho, UdpEcho};
use crate::nft::counted_drops;
use crate::Netns;

/// How long a probe that must be refused waits for an answer.
pub const REFUSED_WAIT: Duration = Duration::from_secs(2);
/// How long a probe that must be answered waits (and a server waits for a client's request).
pub const PATIENT: Duration = Duration::from_secs(10);

/// The transport a probe speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Tcp, Proto::Udp, Proto::Sctp];

    /// One exchange from `ns` with an echo server of this protocol at `server`: the source
    /// address the server saw, or what failed.
    pub fn ask(self, ns: &Netns, server: SocketAddr, timeout: Duration) -> Result<IpAddr, String> {
        match self {
            Proto::Tcp => echo::ask(ns, server, timeout),
            Proto::Udp => echo::ask_udp(ns, server, timeout),
            Proto::Sctp => echo::ask_sctp(ns, server, timeout),
        }
    }
}

/// Echo servers of any protocol, answering while this is held.
#[derive(Debug, Default)]
pub struct Servers {
    streams: Vec<PeerEcho>,
    datagrams: Vec<UdpEcho>,
}

impl Servers {
    /// Starts a `proto` echo server on `bind` in `ns`.
    pub fn start(&mut self, ns: &Netns, proto: Proto, bind: SocketAddr) {
        match proto {
            Proto::Tcp => self.streams.push(PeerEcho::start(ns, bind, PATIENT)),
            Proto::Sctp => self.streams.push(PeerEcho::start_sctp(ns, bind, PATIENT)),
            Proto::Udp => self.datagrams.push(UdpEcho::start(ns, bind)),
        }
    }
}

/// What an [`Attempt`] must meet.
#[derive(Debug)]
pub enum Expect<'a> {
    /// Answered, the server seeing one of these sources.
    Answered(Vec<IpAddr>),
    /// Not answered, and the counted drop of chain `chain` of `inet lace` on `node` counting it;
    /// `by` says which policy refuses it, for the failure message.
    Refused {
        node: &'a Netns,
        chain: &'static str,
        by: &'static str,
    },
}

/// One probe in one address family: from namespace `from` to `server` over `proto`.
#[derive(Debug)]
pub struct Attempt<'a> {
    /// How failure messages name it.
    pub what: String,
    pub from: &'a Netns,
    pub proto: Proto,
    pub server: SocketAddr,
    pub expect: Expect<'a>,
}

impl Attempt<'_> {
    /// Runs it; how its outcome differs from what it must meet, if it does.
    fn run(&self) -> Option<String> {
        let wait = match self.expect {
            Expect::Answered(_) => PATIENT,
            Expect::Refused { .. } => REFUSED_WAIT,
        };
        let start = Instant::now();
        let got = self.proto.ask(self.from, self.server, wait);
        let took = start.elapsed().as_secs_f64();
        let what = &self.what;
        match (&self.expect, got) {
            (Expect::Answered(sources), Ok(seen)) if sources.contains(&seen) => None,
            (Expect::Answered(sources), Ok(seen)) => Some(format!(
                "{what}: expected answered with the server seeing one of {sources:?}, it saw {seen}"
            )),
            (Expect::Answered(_), Err(e)) => Some(format!(
                "{what}: expected answered, saw {e} after {took:.1}s"
            )),
            (Expect::Refused { by, .. }, Ok(seen)) => Some(format!(
                "{what}: expected refused by {by}, saw an answer (the server saw {seen})"
            )),
            (Expect::Refused { .. }, Err(_)) => None,
        }
    }
}

/// Runs every attempt at once (a refused one waits [`REFUSED_WAIT`]); what differs from what
/// they must meet, including a chain whose counted drop counted fewer packets than the
/// attempts it must refuse (sorted).
pub fn run_all(attempts: &[Attempt]) -> Vec<String> {
    let mut expected: BTreeMap<(&str, &str), (&Netns, u64)> = BTreeMap::new();
    for a in attempts {
        if let Expect::Refused { node, chain, .. } = a.expect {
            expected.entry((node.name(), chain)).or_insert((node, 0)).1 += 1;
        }
    }
    let before: BTreeMap<(&str, &str), u64> = expected
        .iter()
        .map(|(&k, &(node, _))| (k, counted_drops(node, k.1)))
        .collect();
    let mut wrong: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = attempts.iter().map(|a| s.spawn(move || a.run())).collect();
        runs.into_iter().filter_map(|r| r.join().unwrap()).collect()
    });
    for (&(name, chain), &(node, want)) in &expected {
        let got = counted_drops(node, chain) - before[&(name, chain)];
        if got < want {
            wrong.push(format!(
                "{name} chain {chain}: expected its drop to count at least {want} packets (the \
                 probes it must refuse), it counted {got}"
            ));
        }
    }
    wrong.sort();
    wrong
}
