//! A blocking rtnetlink socket that batches requests: many messages per `send`, their answers
//! read back together.
//!
//! The kernel's rtnetlink handler walks every message of one `sendmsg` buffer in order. Only
//! the last message of a buffer asks for an ACK (`NLM_F_ACK`); the kernel answers the others
//! only when they fail, before the last one's ACK. So a batch of N routes costs about N/300
//! system calls instead of the 2N of `ip -batch` (one send, one ACK read per line), and the
//! kernel builds and queues an answer per failure, not per request. The socket lives on the
//! namespace's worker thread ([`super::netns`]), which is why it can be blocking: nothing else
//! runs there.
//!
//! Next to it, optionally, a second socket subscribed to rtnetlink's multicast groups
//! ([`Notifications`]): the kernel's change notifications, which keep the reconciler's cache
//! current ([`super::watch`]). [`Nl::batch`] drains it after every chunk, so the notifications
//! of a large batch never pile up in (and overflow) its receive buffer.
//!
//! Types come from `netlink-packet-route` 0.34 and `netlink-packet-core`, the socket from
//! `netlink-sys`: the project's one netlink stack, for the reconciler and the CNI alike.

use std::io;
use std::os::fd::AsFd;
use std::sync::mpsc;

use netlink_packet_core::{
    DecodeError, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NlaBuffer,
    ParseableParametrized, NLA_TYPE_MASK, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Bytes of requests sent per `send`: the answers of one chunk (36 bytes each with capped
/// ACKs, should every request fail) must fit the socket's receive buffer, which the kernel
/// caps at `rmem_max`.
const CHUNK_BYTES: usize = 32 * 1024;
/// Requests of a batch past which a second thread encodes its chunks ([`Nl::batch`]), and
/// how many chunks it may encode ahead.
const PIPELINE_REQUESTS: usize = 1024;
const CHUNKS_AHEAD: usize = 4;
/// How often requests the kernel refused with `ENOMEM` are sent again ([`Nl::batch`]), and
/// the pause before the first time (doubling: 630 ms in all).
const ENOMEM_RESENDS: usize = 6;
const ENOMEM_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);
/// How often a dump the kernel marked inconsistent (`NLM_F_DUMP_INTR`) is retried.
const DUMP_ATTEMPTS: usize = 5;
/// Receive buffer size asked for (the kernel caps it at `net.core.rmem_max`).
const RX_BUF: usize = 4 << 20;
/// rtnetlink multicast groups (`RTNLGRP_*`) whose notifications describe what the reconciler
/// observes: links, IPv4/IPv6 addresses, IPv4/IPv6 routes, IPv4/IPv6 rules.
const GROUPS: [(u32, &str); 7] = [
    (libc::RTNLGRP_LINK, "RTNLGRP_LINK"),
    (libc::RTNLGRP_IPV4_IFADDR, "RTNLGRP_IPV4_IFADDR"),
    (libc::RTNLGRP_IPV4_ROUTE, "RTNLGRP_IPV4_ROUTE"),
    (libc::RTNLGRP_IPV4_RULE, "RTNLGRP_IPV4_RULE"),
    (libc::RTNLGRP_IPV6_IFADDR, "RTNLGRP_IPV6_IFADDR"),
    (libc::RTNLGRP_IPV6_ROUTE, "RTNLGRP_IPV6_ROUTE"),
    (libc::RTNLGRP_IPV6_RULE, "RTNLGRP_IPV6_RULE"),
];

/// The route groups of [`GROUPS`], which a bulk apply leaves ([`Notifications::pause_routes`]).
const ROUTE_GROUPS: [u32; 2] = [libc::RTNLGRP_IPV4_ROUTE, libc::RTNLGRP_IPV6_ROUTE];

/// What went wrong talking to the kernel.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("netlink send: {0}")]
    Send(#[source] io::Error),
    #[error("netlink receive: {0}")]
    Receive(#[source] io::Error),
    #[error("cannot decode a netlink message from the kernel: {0}")]
    Decode(String),
    #[error("dump of {what} was interrupted by concurrent changes {DUMP_ATTEMPTS} times in a row")]
    DumpInterrupted { what: &'static str },
    #[error("reading {what} failed: {source}")]
    Get {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("dump of {what} failed: {source}")]
    Dump {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("notification socket: subscribing to {group}: {source}")]
    Subscribe {
        group: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The kernel's answer to one request of a batch: `Ok` or the errno.
pub type Ack = Result<(), i32>;

/// The datagram socket under [`Nl`]: the kernel's rtnetlink socket, or a scripted kernel in
/// unit tests (so the dump and batch loops are tested without one).
pub trait Transport: Send {
    /// Sends one datagram.
    fn send(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Receives one datagram into `buf`; returns its length.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

impl Transport for Socket {
    fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        Socket::send(self, buf, 0).map(|_| ())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Socket::recv(self, &mut &mut buf[..], 0)
    }
}

/// A blocking rtnetlink socket (and, once [`Nl::subscribe`]d, its notification socket).
#[derive(Debug)]
pub struct Nl<T: Transport = Socket> {
    sock: T,
    seq: u32,
    rx: Vec<u8>,
    notifications: Option<Notifications>,
}

/// The messages of one datagram, or of datagrams laid end to end, one at a time and not
/// decoded: each one's header fields and payload bytes ([`NetlinkBuffer`]), checked to lie
/// within the datagram. Stops after the first malformed one.
#[derive(Debug)]
pub struct RawMessages<'a> {
    buf: &'a [u8],
    off: usize,
}

impl<'a> RawMessages<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, off: 0 }
    }
}

impl<'a> Iterator for RawMessages<'a> {
    type Item = Result<NetlinkBuffer<&'a [u8]>, NlError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (buf, off, n) = (self.buf, self.off, self.buf.len());
        if off + 16 > n {
            return None;
        }
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        if len < 16 || off + len > n {
            self.off = n;
            return Some(Err(NlError::Decode(format!(
                "message length {len} at offset {off} of a {n}-byte datagram"
            ))));
        }
        self.off = off + ((len + 3) & !3);
        Some(Ok(NetlinkBuffer::new(&buf[off..off + len])))
    }
}

/// One attribute of a message, not decoded: its type (without the nested and byte-order
/// flags), its value, and the whole attribute for netlink-packet-route's parse ([`Self::nla`]).
#[derive(Clone, Copy, Debug)]
pub struct RawAttr<'a> {
    pub kind: u16,
    pub value: &'a [u8],
    whole: &'a [u8],
}

impl<'a> RawAttr<'a> {
    /// The attribute as netlink-packet-route parses it (its length already checked).
    pub fn nla(&self) -> NlaBuffer<&'a [u8]> {
        NlaBuffer::new(self.whole)
    }
}

/// The attributes of a message's payload after its fixed header, one at a time and not
/// decoded ([`RawAttr`]), each checked to lie within the payload. Stops after the first
/// malformed one. What netlink-packet-core's `NlasIterator` yields, for a fraction of its
/// instructions: a large dump's 200,000 routes have eight attributes each, and under the test
/// VM's emulation the decoding, not the kernel, was what a fresh reconciler waited on.
#[derive(Debug)]
pub struct RawAttrs<'a> {
    buf: &'a [u8],
}

impl<'a> RawAttrs<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
}

impl<'a> Iterator for RawAttrs<'a> {
    type Item = Result<RawAttr<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let buf = self.buf;
        if buf.is_empty() {
            return None;
        }
        let len = match buf {
            [l0, l1, _, _, ..] => usize::from(u16::from_ne_bytes([*l0, *l1])),
            _ => 0,
        };
        if len < 4 || len > buf.len() {
            self.buf = &[];
            return Some(Err(DecodeError::from(format!(
                "attribute length {len} in {} bytes of attributes",
                buf.len()
            ))));
        }
        self.buf = buf.get((len + 3) & !3..).unwrap_or_default();
        Some(Ok(RawAttr {
            kind: u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK,
            value: &buf[4..len],
            whole: &buf[..len],
        }))
    }
}

/// Decodes one message of [`RawMessages`].
pub fn decode_message(
    raw: NetlinkBuffer<&[u8]>,
) -> Result<NetlinkMessage<RouteNetlinkMessage>, NlError> {
    NetlinkMessage::<RouteNetlinkMessage>::deserialize(raw.into_inner())
        .map_err(|e| NlError::Decode(e.to_string()))
}

/// Decodes every message of one datagram.
fn decode(buf: &[u8]) -> Result<Vec<NetlinkMessage<RouteNetlinkMessage>>, NlError> {
    RawMessages::new(buf)
        .map(|m| m.and_then(decode_message))
        .collect()
}

/// Receives one datagram into `buf` (retrying when interrupted); returns its length.
fn recv<T: Transport>(sock: &mut T, buf: &mut [u8]) -> Result<usize, NlError> {
    loop {
        match sock.recv(buf) {
            Ok(n) => return Ok(n.min(buf.len())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(NlError::Receive(e)),
        }
    }
}

/// Who receives a dump's datagrams after its first.
#[derive(Clone, Copy)]
enum Readers {
    /// This thread, which decodes each before it receives the next.
    This,
    /// A second thread ([`read_dump`]), while this one decodes.
    Second,
    /// A second thread, which also decodes the datagrams this one is too far behind to take.
    SecondHelping,
}

/// Datagrams [`read_dump`] may read ahead of the decoding.
const DUMP_QUEUE: usize = 4;

/// What a dump hands each object to: the accumulator, the object's message type, its payload.
type Add<'a, A> = dyn Fn(&mut A, u16, &[u8]) -> Result<(), NlError> + Sync + 'a;

/// The decoding a dump's reader thread may do itself: its own accumulators and `add`.
type Helper<'a, A> = (Fold<'a, A>, &'a Add<'a, A>);

/// A received datagram: its number in the dump, the buffer and the length received into it.
type Datagram = (usize, Vec<u8>, usize);

/// A dump's reader thread: receives the rest of the dump `seq` into buffers of `size` bytes
/// (taken back from `empty` once decoded: a few per dump, never cleared again) and hands
/// each with its number (the dump's first datagram, read before, is 0) and length to `full`,
/// until the datagram that ends the dump (`NLMSG_DONE` or `NLMSG_ERROR` of `seq`: only the
/// headers are read here), a receive error (handed on), or until `full`'s receiver is gone.
/// With a `helper`, a datagram that finds `full` full is decoded here instead (never the one
/// that ends the dump: the receiver sees that end); the helper's fold is returned, or its
/// error.
fn read_dump<'a, T: Transport, A>(
    sock: &mut T,
    seq: u32,
    size: usize,
    full: mpsc::SyncSender<Result<Datagram, NlError>>,
    empty: mpsc::Receiver<Vec<u8>>,
    mut helper: Option<Helper<'a, A>>,
) -> Result<Option<Fold<'a, A>>, NlError> {
    let mut spare = None;
    for number in 1.. {
        let mut buf = spare
            .take()
            .or_else(|| empty.try_recv().ok())
            .unwrap_or_else(|| vec![0; size]);
        let received = recv(sock, &mut buf).map(|n| (number, buf, n));
        let last = match &received {
            Ok((_, buf, n)) => ends_dump(&buf[..*n], seq),
            Err(_) => true,
        };
        let sent = match (&mut helper, received) {
            (Some((fold, add)), Ok(datagram)) if !last => match full.try_send(Ok(datagram)) {
                Ok(()) => Ok(()),
                Err(mpsc::TrySendError::Full(Ok((number, buf, n)))) => {
                    fold.datagram(number, &buf[..n], *add)?;
                    spare = Some(buf);
                    Ok(())
                }
                Err(_) => Err(()), // gone (an error there)
            },
            (_, received) => full.send(received).map_err(|_| ()),
        };
        if sent.is_err() || last {
            break;
        }
    }
    Ok(helper.map(|(fold, _)| fold))
}

/// How long the decoding thread waits for the next datagram before it sleeps: about a
/// datagram's filling by the kernel under TCG (32 KiB of routes, half a millisecond), ten
/// times that on hardware.
const DUMP_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// Datagrams of a dump after which the decoding thread waits for the next without sleeping:
/// a long dump (routes), not the few datagrams of links or addresses, whose waits are short
/// and whose CPU other threads of the agent can use.
const DUMP_SPIN_AFTER: usize = 8;

/// The next datagram [`read_dump`] sends on `full`, `None` once it is gone. Once `decoded`
/// datagrams reach [`DUMP_SPIN_AFTER`], waits yielding the CPU for up to [`DUMP_SPIN`]
/// before sleeping: a sleeping receiver has to be woken by the reader (a futex wake per
/// datagram), which delays the next `recv` that has the kernel fill the datagram after, and
/// the kernel's filling is what a long dump waits on.
fn next_datagram<T>(full: &mpsc::Receiver<T>, decoded: usize) -> Option<T> {
    let waiting = std::time::Instant::now();
    loop {
        match full.try_recv() {
            Ok(datagram) => return Some(datagram),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty)
                if decoded >= DUMP_SPIN_AFTER && waiting.elapsed() < DUMP_SPIN =>
            {
                std::thread::yield_now()
            }
            Err(mpsc::TryRecvError::Empty) => return full.recv().ok(),
        }
    }
}

/// Whether `datagram` holds the message that ends dump `seq` (or is malformed: the decoding
/// reports that). Reads only the messages' headers.
fn ends_dump(datagram: &[u8], seq: u32) -> bool {
    RawMessages::new(datagram).any(|m| {
        m.map_or(true, |m| {
            m.sequence_number() == seq && matches!(m.message_type(), NLMSG_DONE | NLMSG_ERROR)
        })
    })
}

/// Netlink's own message types: nothing, an error or ACK, a dump's end, data lost.
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;

/// One dump attempt's state: what its messages add up to so far, as the accumulators of
/// runs of consecutive datagrams (one run unless another thread took some datagrams).
struct Fold<'a, A> {
    what: &'static str,
    seq: u32,
    init: &'a (dyn Fn() -> A + Sync),
    /// Each run's first datagram's number and accumulator, in the order received.
    runs: Vec<(usize, A)>,
    /// The number of the datagram after the last one read here.
    next: usize,
    /// Whether the kernel flagged the dump inconsistent (`NLM_F_DUMP_INTR`): it is read to
    /// its end and thrown away.
    interrupted: bool,
}

impl<'a, A> Fold<'a, A> {
    fn new(what: &'static str, seq: u32, init: &'a (dyn Fn() -> A + Sync)) -> Self {
        Self {
            what,
            seq,
            init,
            runs: Vec::new(),
            next: 0,
            interrupted: false,
        }
    }

    /// The accumulators of the runs of `self` and of `helped` (the reader thread's fold of the
    /// same dump, if it read any datagram), in the kernel's order.
    fn runs(self, helped: Option<Self>) -> Vec<A> {
        let mut runs = self.runs;
        runs.extend(helped.into_iter().flat_map(|h| h.runs));
        runs.sort_unstable_by_key(|(first, _)| *first);
        runs.into_iter().map(|(_, acc)| acc).collect()
    }

    /// Everything read, when one thread read the whole dump: one run.
    fn into_acc(self) -> A {
        let mut runs = self.runs.into_iter().map(|(_, acc)| acc);
        runs.next().unwrap_or_else(self.init)
    }

    /// The accumulator datagram `number` goes to in `runs` (`next`: the number after the last
    /// run's last datagram): the last run's if it follows that run, else a new run's.
    fn run_of<'r>(
        runs: &'r mut Vec<(usize, A)>,
        next: &mut usize,
        init: &dyn Fn() -> A,
        number: usize,
    ) -> &'r mut A {
        if runs.is_empty() || number != *next {
            runs.push((number, init()));
        }
        *next = number + 1;
        let last = runs.len() - 1;
        &mut runs[last].1
    }

    /// Reads datagram `number` of the dump into its run's accumulator, handing `add` each of
    /// its objects' message type and payload; `Ok(true)` once the dump ended.
    fn datagram(&mut self, number: usize, datagram: &[u8], add: &Add<A>) -> Result<bool, NlError> {
        let acc = Self::run_of(&mut self.runs, &mut self.next, self.init, number);
        for msg in RawMessages::new(datagram) {
            let msg = msg?;
            if msg.sequence_number() != self.seq {
                continue; // a late ACK of an earlier request: not ours to read
            }
            self.interrupted |= msg.flags() & NLM_F_DUMP_INTR != 0;
            match msg.message_type() {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => {
                    return match decode_message(msg)?.payload {
                        NetlinkPayload::Error(e) if e.code.is_some() => Err(NlError::Dump {
                            what: self.what,
                            source: e.to_io(),
                        }),
                        // An ACK (code 0) ends the request as `NLMSG_DONE` would.
                        _ => Ok(true),
                    };
                }
                NLMSG_NOOP | NLMSG_OVERRUN => {}
                // An interrupted dump is read to its end and thrown away.
                kind if !self.interrupted => add(acc, kind, msg.payload())?,
                _ => {}
            }
        }
        Ok(false)
    }
}

impl Nl {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, NlError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NlError::Socket)?;
        sock.bind_auto().map_err(NlError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(NlError::Socket)?;
        // ACKs carry only the request's header, not its payload: smaller batches of ACKs.
        sock.set_cap_ack(true).map_err(NlError::Socket)?;
        // Best effort: a smaller buffer only means smaller chunks would be safer; the chunk
        // size is chosen to fit the default (212 KiB).
        let _ = sock.set_rx_buf_sz(RX_BUF);
        Ok(Self::with_transport(sock))
    }

    /// [`Nl::open`] with the kernel's strict checking of dump requests
    /// (`NETLINK_GET_STRICT_CHK`, Linux 4.20), under which a dump can be filtered: an IPv4
    /// route dump that names a table (`RTA_TABLE`) walks that table alone.
    pub fn open_strict() -> Result<Self, NlError> {
        let nl = Self::open()?;
        nl.sock
            .set_netlink_get_strict_chk(true)
            .map_err(NlError::Socket)?;
        Ok(nl)
    }

    /// Opens the notification socket (in the calling thread's namespace) unless it is open:
    /// from then on the kernel queues every change of links, addresses, routes and rules for
    /// [`Nl::notifications`]. `rx_buf` is its receive buffer, set past `net.core.rmem_max`
    /// when the process may (`SO_RCVBUFFORCE`, `CAP_NET_ADMIN`).
    pub fn subscribe(&mut self, rx_buf: usize) -> Result<(), NlError> {
        if self.notifications.is_none() {
            self.notifications = Some(Notifications::open(rx_buf)?);
        }
        Ok(())
    }

    /// The notification socket, if [`Nl::subscribe`]d.
    pub fn notifications(&mut self) -> Option<&mut Notifications> {
        self.notifications.as_mut()
    }

    /// [`Notifications::pause_routes`], if subscribed.
    pub fn pause_route_notifications(&mut self) -> bool {
        self.notifications
            .as_mut()
            .is_some_and(|n| n.pause_routes())
    }
}

impl<T: Transport> Nl<T> {
    /// Requests over `sock`, no notification socket.
    pub fn with_transport(sock: T) -> Self {
        Self {
            sock,
            seq: 0,
            rx: vec![0; 1 << 20],
            notifications: None,
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn encode(&mut self, msg: RouteNetlinkMessage, flags: u16, out: &mut Vec<u8>) -> u32 {
        let seq = self.next_seq();
        encode(msg, flags, seq, out);
        seq
    }

    /// Receives one datagram and decodes every message in it.
    fn recv_messages(&mut self) -> Result<Vec<NetlinkMessage<RouteNetlinkMessage>>, NlError> {
        let n = recv(&mut self.sock, &mut self.rx)?;
        decode(&self.rx[..n])
    }

    /// Dumps `request` (a `Get*` message), retrying while the kernel reports the dump as
    /// interrupted by concurrent changes.
    pub fn dump(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
    ) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        self.dump_fold(what, request, Vec::new, |items, kind, payload| {
            let m = RouteNetlinkMessage::parse_with_param(payload, kind)
                .map_err(|e| NlError::Decode(format!("{what}: {e}")))?;
            items.push(m);
            Ok(())
        })
    }

    /// Dumps `request` like [`Nl::dump`], handing each object's message type and payload to
    /// `add` as it is received instead of keeping them all decoded: a node's 300,000 routes
    /// are never all in memory at once, and `add` decodes only what it reads (see
    /// [`super::observe::route_from_bytes`]). A retried dump starts again from `init()`; an error of
    /// `add` ends the dump with it.
    ///
    /// A dump longer than one datagram is read on by a second thread ([`read_dump`]) while
    /// this one decodes: the kernel fills the next datagram inside the `recv` that took the
    /// last one, so its filling and Lace's decoding overlap instead of taking turns.
    pub fn dump_fold<A: Send>(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
        init: impl Fn() -> A + Sync,
        add: impl Fn(&mut A, u16, &[u8]) -> Result<(), NlError> + Sync,
    ) -> Result<A, NlError> {
        let (fold, _) = self.dump_folds(what, request, &init, &add, Readers::Second)?;
        Ok(fold.into_acc())
    }

    /// [`Nl::dump_fold`] read by this thread alone, which decodes each datagram before it
    /// receives the next: for dumps read two at a time on two sockets
    /// ([`super::observe::dump`]), where a reader thread beside each would leave two CPUs to
    /// four busy threads.
    pub fn dump_fold_here<A: Send>(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
        init: impl Fn() -> A + Sync,
        add: impl Fn(&mut A, u16, &[u8]) -> Result<(), NlError> + Sync,
    ) -> Result<A, NlError> {
        let (fold, _) = self.dump_folds(what, request, &init, &add, Readers::This)?;
        Ok(fold.into_acc())
    }

    /// [`Nl::dump_fold`] for a fold that can be split: the reader thread also decodes, into
    /// accumulators of its own, the datagrams this one is too far behind to take (a full
    /// queue). Returns the accumulators of the runs of consecutive datagrams each thread
    /// read, in the kernel's order: their objects laid end to end are the dump's (for routes,
    /// nearly sorted already). At 300,000 routes decoding takes about as long as the kernel's
    /// filling, so both threads decode.
    pub fn dump_fold_split<A: Send>(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
        init: impl Fn() -> A + Sync,
        add: impl Fn(&mut A, u16, &[u8]) -> Result<(), NlError> + Sync,
    ) -> Result<Vec<A>, NlError> {
        let (fold, helped) = self.dump_folds(what, request, &init, &add, Readers::SecondHelping)?;
        Ok(fold.runs(helped))
    }

    /// One dump read by `readers`: this thread's fold and the reader thread's, if it helped.
    fn dump_folds<'a, A: Send>(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
        init: &'a (dyn Fn() -> A + Sync),
        add: &'a Add<'a, A>,
        readers: Readers,
    ) -> Result<(Fold<'a, A>, Option<Fold<'a, A>>), NlError> {
        for _ in 0..DUMP_ATTEMPTS {
            let mut buf = Vec::new();
            let seq = self.encode(request.clone(), NLM_F_REQUEST | NLM_F_DUMP, &mut buf);
            self.sock.send(&buf).map_err(NlError::Send)?;
            let mut fold = Fold::new(what, seq, init);
            let n = recv(&mut self.sock, &mut self.rx)?;
            let mut helped = None;
            let mut ended = fold.datagram(0, &self.rx[..n], add)?;
            if let Readers::This = readers {
                for number in 1.. {
                    if ended {
                        break;
                    }
                    let n = recv(&mut self.sock, &mut self.rx)?;
                    ended = fold.datagram(number, &self.rx[..n], add)?;
                }
            }
            if !ended {
                let (sock, size) = (&mut self.sock, self.rx.len());
                let helper =
                    matches!(readers, Readers::SecondHelping).then(|| Fold::new(what, seq, init));
                helped = std::thread::scope(|s| {
                    let (full_tx, full) = mpsc::sync_channel(DUMP_QUEUE);
                    let (empty, empty_rx) = mpsc::channel();
                    let reader = s.spawn(move || {
                        read_dump(sock, seq, size, full_tx, empty_rx, helper.map(|h| (h, add)))
                    });
                    // The reader stops at the dump's end or when `full` is dropped (an error
                    // here), whichever comes first.
                    let mut ended = false;
                    let mut decoded = 1;
                    while let Some(received) = next_datagram(&full, decoded) {
                        decoded += 1;
                        let (number, buf, n) = received?;
                        if fold.datagram(number, &buf[..n], add)? {
                            ended = true;
                            break;
                        }
                        let _ = empty.send(buf);
                    }
                    let helped = reader
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                    match ended {
                        true => Ok(helped),
                        false => Err(NlError::Decode(format!(
                            "the dump of {what} stopped before its end (a malformed message?)"
                        ))),
                    }
                })?;
            }
            fold.interrupted |= helped.as_ref().is_some_and(|h| h.interrupted);
            if !fold.interrupted {
                return Ok((fold, helped));
            }
        }
        Err(NlError::DumpInterrupted { what })
    }

    /// Asks for one object (a `Get*` message that names it) and returns the kernel's answer,
    /// `None` if the kernel reports it missing (`ENODEV`, `ENOENT`, `ESRCH`).
    pub fn get(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
    ) -> Result<Option<RouteNetlinkMessage>, NlError> {
        let mut buf = Vec::new();
        let seq = self.encode(request, NLM_F_REQUEST, &mut buf);
        self.sock.send(&buf).map_err(NlError::Send)?;
        loop {
            for msg in self.recv_messages()? {
                if msg.header.sequence_number != seq {
                    continue; // a late ACK of an earlier request
                }
                match msg.payload {
                    NetlinkPayload::InnerMessage(m) => return Ok(Some(m)),
                    NetlinkPayload::Error(e) => {
                        return match e.code.map(|c| -c.get()) {
                            None | Some(libc::ENODEV | libc::ENOENT | libc::ESRCH) => Ok(None),
                            Some(_) => Err(NlError::Get {
                                what,
                                source: e.to_io(),
                            }),
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Sends `requests` (message and `NLM_F_*` flags besides REQUEST and ACK) in chunks and
    /// returns the kernel's answer to each, in order. The kernel handles every message even when an
    /// earlier one failed; the caller decides what a failure means. Requests refused with
    /// `ENOMEM` are sent again after a pause, up to [`ENOMEM_RESENDS`] times: seg6 routes take
    /// their per-CPU cache from the kernel's atomic per-CPU pool, which a fast writer empties
    /// faster than the kernel's worker refills it (measured: 184 adds in a row refused, the next
    /// ones taken).
    ///
    /// [`Nl::batch_with`] of messages built already.
    pub fn batch(
        &mut self,
        requests: Vec<(RouteNetlinkMessage, u16)>,
    ) -> Result<Vec<Ack>, NlError> {
        let answers = self.batch_with(requests.into_iter(), Ok::<_, std::convert::Infallible>)?;
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|never| match never {}))
            .collect())
    }

    /// [`Nl::batch`] of `requests` that `build` makes messages of as they are sent: each
    /// one's answer is the kernel's, or `build`'s error (then it is not sent).
    ///
    /// A batch of more than [`PIPELINE_REQUESTS`] is built and encoded by a second thread
    /// while this one waits for the kernel: the kernel does a chunk's work inside the `send`
    /// that hands it over, so building the next chunk meanwhile takes Lace's part off the
    /// batch's time.
    pub fn batch_with<R: Send, E: Send>(
        &mut self,
        requests: impl ExactSizeIterator<Item = R> + Send,
        build: impl Fn(R) -> Result<(RouteNetlinkMessage, u16), E> + Sync,
    ) -> Result<Vec<Result<Ack, E>>, NlError> {
        let total = requests.len();
        let mut acks: Vec<Option<Ack>> = vec![None; total];
        let mut unbuilt = Vec::new();
        // The chunks take the next `total` sequence numbers; resends come after them.
        let first = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(total as u32);
        let mut requests = requests.enumerate();
        let mut seq = first;
        let build = &build;
        let mut send = |chunk: Chunk<E>| {
            self.send_chunk(&chunk, &mut acks)?;
            unbuilt.extend(chunk.unbuilt);
            Ok(())
        };
        match total > PIPELINE_REQUESTS {
            false => {
                while let Some(chunk) = Chunk::next(&mut requests, build, &mut seq) {
                    send(chunk)?;
                }
            }
            true => std::thread::scope(|s| {
                let (tx, rx) = mpsc::sync_channel(CHUNKS_AHEAD);
                s.spawn(move || {
                    while let Some(chunk) = Chunk::next(&mut requests, build, &mut seq) {
                        if tx.send(chunk).is_err() {
                            return; // this thread stopped at an error
                        }
                    }
                });
                rx.into_iter().try_for_each(&mut send)
            })?,
        }
        let mut answers: Vec<Result<Ack, E>> =
            acks.into_iter().map(|a| Ok(a.unwrap_or(Ok(())))).collect();
        for (i, e) in unbuilt {
            answers[i] = Err(e);
        }
        Ok(answers)
    }

    /// Sends `chunk`, records the answers in `acks` and resends what the kernel refused with
    /// `ENOMEM` (see [`Nl::batch`]).
    fn send_chunk<E>(&mut self, chunk: &Chunk<E>, acks: &mut [Option<Ack>]) -> Result<(), NlError> {
        let Chunk {
            buf, spans, seq0, ..
        } = chunk;
        if spans.is_empty() {
            return Ok(()); // none of it built
        }
        let slots: Vec<usize> = spans.iter().map(|(i, _)| *i).collect();
        self.exchange(buf, *seq0, &slots, acks)?;
        let mut pause = ENOMEM_PAUSE;
        for _ in 0..ENOMEM_RESENDS {
            let refused = |i: &usize| acks[*i] == Some(Err(libc::ENOMEM));
            if !slots.iter().any(refused) {
                break;
            }
            std::thread::sleep(pause);
            pause *= 2;
            let mut again = Vec::new();
            let mut again_slots = Vec::new();
            let seq0 = self.seq.wrapping_add(1);
            let mut last = 0;
            for (i, bytes) in spans.iter().filter(|(i, _)| refused(i)) {
                last = again.len();
                again.extend_from_slice(&buf[bytes.clone()]);
                // A fresh sequence number: the kernel's answer to the first send is read.
                let seq = self.next_seq();
                again[last + 8..last + 12].copy_from_slice(&seq.to_ne_bytes());
                ask_ack(&mut again[last..], false);
                again_slots.push(*i);
            }
            ask_ack(&mut again[last..], true);
            tracing::debug!(
                requests = again_slots.len(),
                pause_ms = pause.as_millis() / 2,
                "netlink: the kernel was out of memory (ENOMEM), resending"
            );
            self.exchange(&again, seq0, &again_slots, acks)?;
        }
        // The chunk's notifications are queued by now (the kernel sends them before the
        // ACK): take them off the socket before the next chunk adds as many again.
        if let Some(n) = &mut self.notifications {
            n.drain();
        }
        Ok(())
    }

    /// Sends `buf`, requests with consecutive sequence numbers from `seq0`, and records the
    /// kernel's answer to the `k`th in `acks[slots[k]]`.
    fn exchange(
        &mut self,
        buf: &[u8],
        seq0: u32,
        slots: &[usize],
        acks: &mut [Option<Ack>],
    ) -> Result<(), NlError> {
        self.sock.send(buf).map_err(NlError::Send)?;
        for s in slots {
            acks[*s] = None;
        }
        // Only the last request asks for an ACK; the kernel handles the requests in order and
        // answers a failed one at once, so every failure's answer comes before the last one's.
        let last = slots.len() - 1;
        let mut done = false;
        while !done {
            for msg in self.recv_messages()? {
                let NetlinkPayload::Error(e) = msg.payload else {
                    continue;
                };
                let off = msg.header.sequence_number.wrapping_sub(seq0) as usize;
                let Some(slot) = slots.get(off).filter(|s| acks[**s].is_none()) else {
                    continue; // another exchange's, or a second answer
                };
                done |= off == last;
                acks[*slot] = Some(match e.code {
                    None => Ok(()),
                    Some(code) => Err(-code.get()),
                });
            }
        }
        for s in slots {
            acks[*s].get_or_insert(Ok(()));
        }
        Ok(())
    }
}

/// Encodes `msg` with `NLM_F_*` `flags` and sequence number `seq` onto the end of `out`.
fn encode(msg: RouteNetlinkMessage, flags: u16, seq: u32, out: &mut Vec<u8>) {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut m = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    m.finalize();
    let start = out.len();
    out.resize(start + m.buffer_len(), 0);
    m.serialize(&mut out[start..]);
}

/// Sets (or clears) `NLM_F_ACK` in the flags of the request at the start of `msg`.
fn ask_ack(msg: &mut [u8], ack: bool) {
    let flags = u16::from_ne_bytes([msg[6], msg[7]]);
    let flags = match ack {
        true => flags | NLM_F_ACK,
        false => flags & !NLM_F_ACK,
    };
    msg[6..8].copy_from_slice(&flags.to_ne_bytes());
}

/// One `send` of a batch: its requests end to end, each one's index in the batch and where
/// its bytes are, and the first one's sequence number (the others' follow); and the requests
/// that could not be built, each with its index and why.
struct Chunk<E> {
    buf: Vec<u8>,
    spans: Vec<(usize, std::ops::Range<usize>)>,
    seq0: u32,
    unbuilt: Vec<(usize, E)>,
}

impl<E> Chunk<E> {
    /// The next chunk of `requests` (about [`CHUNK_BYTES`]), built with `build` and numbered
    /// from `seq` on.
    fn next<R>(
        requests: &mut impl Iterator<Item = (usize, R)>,
        build: &impl Fn(R) -> Result<(RouteNetlinkMessage, u16), E>,
        seq: &mut u32,
    ) -> Option<Self> {
        let mut chunk = Chunk {
            buf: Vec::with_capacity(CHUNK_BYTES + 4096),
            spans: Vec::new(),
            seq0: *seq,
            unbuilt: Vec::new(),
        };
        while chunk.buf.len() < CHUNK_BYTES {
            let Some((i, request)) = requests.next() else {
                break;
            };
            let (msg, flags) = match build(request) {
                Ok(built) => built,
                Err(e) => {
                    chunk.unbuilt.push((i, e));
                    continue;
                }
            };
            let start = chunk.buf.len();
            encode(msg, NLM_F_REQUEST | flags, *seq, &mut chunk.buf);
            *seq = seq.wrapping_add(1);
            chunk.spans.push((i, start..chunk.buf.len()));
        }
        if let Some((_, last)) = chunk.spans.last() {
            ask_ack(&mut chunk.buf[last.start..], true);
        }
        (!chunk.spans.is_empty() || !chunk.unbuilt.is_empty()).then_some(chunk)
    }
}

/// The rtnetlink notification socket: subscribed to the groups of links, addresses, routes
/// and rules, non-blocking, read only by draining what the kernel queued. Notifications are
/// kept as received (bytes) until [`Notifications::take`] hands them out, in the order the
/// kernel sent them.
#[derive(Debug)]
pub struct Notifications {
    sock: Socket,
    rx: Vec<u8>,
    /// Datagrams received and not taken yet, end to end.
    pending: Vec<u8>,
    /// Why the stream since the last take has a gap (an overrun, a receive error).
    broken: Option<String>,
    /// The route groups were left ([`Notifications::pause_routes`]) and not joined again.
    routes_paused: bool,
}

impl Notifications {
    fn open(rx_buf: usize) -> Result<Self, NlError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NlError::Socket)?;
        sock.bind_auto().map_err(NlError::Socket)?;
        for (group, name) in GROUPS {
            sock.add_membership(group)
                .map_err(|source| NlError::Subscribe {
                    group: name,
                    source,
                })?;
        }
        sock.set_non_blocking(true).map_err(NlError::Socket)?;
        // Past rmem_max when allowed: a burst of changes between two drains must fit, or the
        // next reconcile re-dumps everything. Otherwise whatever the kernel grants.
        if nix::sys::socket::setsockopt(
            &sock.as_fd(),
            nix::sys::socket::sockopt::RcvBufForce,
            &rx_buf,
        )
        .is_err()
        {
            let _ = sock.set_rx_buf_sz(rx_buf);
        }
        Ok(Self {
            sock,
            // Notifications are one message per datagram; links carry the largest (a few KiB).
            rx: vec![0; 64 << 10],
            pending: Vec::new(),
            broken: None,
            routes_paused: false,
        })
    }

    /// Leaves the route groups, so that the kernel queues no notification of the routes a bulk
    /// apply writes; returns whether it did. The next [`Notifications::take`] or
    /// [`Notifications::discard`] joins them again, and `take` then reports the stream as
    /// broken: the routes must be dumped.
    pub fn pause_routes(&mut self) -> bool {
        for group in ROUTE_GROUPS {
            match self.sock.drop_membership(group) {
                Ok(()) => self.routes_paused = true,
                Err(_) => break,
            }
        }
        self.routes_paused
    }

    /// Whether the route groups are left ([`Notifications::pause_routes`]).
    pub fn routes_paused(&self) -> bool {
        self.routes_paused
    }

    /// Joins the route groups again after [`Notifications::pause_routes`] and records the gap
    /// (if joining fails, the next take or discard tries again, and the gap stays).
    fn resume_routes(&mut self) {
        if !self.routes_paused {
            return;
        }
        let joined = ROUTE_GROUPS
            .iter()
            .try_for_each(|g| self.sock.add_membership(*g));
        let why = match joined {
            Ok(()) => {
                self.routes_paused = false;
                "route notifications were paused for a bulk apply".to_string()
            }
            Err(e) => format!("following route notifications again after a bulk apply: {e}"),
        };
        self.broken.get_or_insert(why);
    }

    /// Moves everything the kernel queued into `pending`. Never fails: a gap in the stream is
    /// recorded and reported by [`Notifications::take`].
    pub fn drain(&mut self) {
        loop {
            match self.sock.recv(&mut &mut self.rx[..], 0) {
                Ok(n) => {
                    self.pending
                        .extend_from_slice(&self.rx[..n.min(self.rx.len())]);
                    // Keep messages 4-byte aligned, as in a datagram.
                    self.pending.resize((self.pending.len() + 3) & !3, 0);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The kernel dropped notifications: the socket's buffer overflowed. Reading
                // on returns the ones queued after the gap.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.broken.get_or_insert_with(|| {
                        "the kernel dropped notifications (ENOBUFS: receive buffer overrun)".into()
                    });
                }
                Err(e) => {
                    self.broken
                        .get_or_insert_with(|| format!("receiving notifications: {e}"));
                    return;
                }
            }
        }
    }

    /// Every notification since the last take or discard, in order; or why they cannot be
    /// trusted to be complete (then they are dropped).
    pub fn take(&mut self) -> Result<Taken, NotificationsLost> {
        self.resume_routes();
        self.drain();
        let bytes = std::mem::take(&mut self.pending);
        match self.broken.take() {
            Some(why) => Err(NotificationsLost(why)),
            None => Ok(Taken(bytes)),
        }
    }

    /// Drops everything queued so far, gaps included: the caller is about to dump the kernel's
    /// state, which includes those changes.
    pub fn discard(&mut self) {
        self.resume_routes();
        self.drain();
        self.pending.clear();
        self.broken = None;
    }
}

/// Why the notifications queued since the last take cannot be trusted to be complete (an
/// overrun of the socket's buffer, a failed receive).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotificationsLost(String);

/// Notifications taken off the socket, as received.
#[derive(Debug)]
pub struct Taken(Vec<u8>);

impl Taken {
    /// Whether nothing was notified.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The notifications in order, not decoded: the cache reads routes, most of them, from
    /// their bytes ([`route_from_bytes`](super::observe::route_from_bytes)) and decodes
    /// the rest ([`decode_message`]).
    pub fn messages(&self) -> RawMessages<'_> {
        RawMessages::new(&self.0)
    }
}

#[cfg(test)]
mod tests;
