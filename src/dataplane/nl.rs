//! A blocking rtnetlink socket that batches requests: many messages per `send`, their ACKs read
//! back together.
//!
//! The kernel's rtnetlink handler walks every message of one `sendmsg` buffer and ACKs each, so
//! a batch of N routes costs about N/300 system calls instead of the 2N of `ip -batch` (one send,
//! one ACK read per line). The socket lives on the namespace's worker thread
//! ([`super::netns`]), which is why it can be blocking: nothing else runs there.
//!
//! Types come from the `rtnetlink` crate's re-exports (`netlink-packet-route` 0.34,
//! `netlink-packet-core`, `netlink-sys`), so the project depends on one netlink stack.

use std::io;

use rtnetlink::packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Bytes of requests sent per `send`: the ACKs of one chunk (36 bytes each with capped ACKs)
/// must fit the socket's receive buffer, which the kernel caps at `rmem_max`.
const CHUNK_BYTES: usize = 32 * 1024;
/// How often a dump the kernel marked inconsistent (`NLM_F_DUMP_INTR`) is retried.
const DUMP_ATTEMPTS: usize = 5;
/// Receive buffer size asked for (the kernel caps it at `net.core.rmem_max`).
const RX_BUF: usize = 4 << 20;

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
    #[error("dump of {what} failed: {source}")]
    Dump {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The kernel's answer to one request of a batch: `Ok` or the errno.
pub type Ack = Result<(), i32>;

/// A blocking rtnetlink socket.
#[derive(Debug)]
pub struct Nl {
    sock: Socket,
    seq: u32,
    rx: Vec<u8>,
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
        Ok(Self {
            sock,
            seq: 0,
            rx: vec![0; 1 << 20],
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn encode(&mut self, msg: RouteNetlinkMessage, flags: u16, out: &mut Vec<u8>) -> u32 {
        let seq = self.next_seq();
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        m.finalize();
        let start = out.len();
        out.resize(start + m.buffer_len(), 0);
        m.serialize(&mut out[start..]);
        seq
    }

    /// Receives one datagram and decodes every message in it.
    fn recv_messages(&mut self) -> Result<Vec<NetlinkMessage<RouteNetlinkMessage>>, NlError> {
        let n = loop {
            match self.sock.recv(&mut &mut self.rx[..], 0) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NlError::Receive(e)),
            }
        };
        let mut out = Vec::new();
        let mut off = 0;
        while off + 16 <= n {
            let len = u32::from_ne_bytes([
                self.rx[off],
                self.rx[off + 1],
                self.rx[off + 2],
                self.rx[off + 3],
            ]) as usize;
            if len < 16 || off + len > n {
                return Err(NlError::Decode(format!(
                    "message length {len} at offset {off} of a {n}-byte datagram"
                )));
            }
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.rx[off..off + len])
                .map_err(|e| NlError::Decode(e.to_string()))?;
            out.push(msg);
            off += (len + 3) & !3;
        }
        Ok(out)
    }

    /// Dumps `request` (a `Get*` message), retrying while the kernel reports the dump as
    /// interrupted by concurrent changes.
    pub fn dump(
        &mut self,
        what: &'static str,
        request: RouteNetlinkMessage,
    ) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        for _ in 0..DUMP_ATTEMPTS {
            let mut buf = Vec::new();
            let seq = self.encode(request.clone(), NLM_F_REQUEST | NLM_F_DUMP, &mut buf);
            self.sock.send(&buf, 0).map_err(NlError::Send)?;
            let mut items = Vec::new();
            let mut interrupted = false;
            'recv: loop {
                for msg in self.recv_messages()? {
                    if msg.header.sequence_number != seq {
                        continue; // a late ACK of an earlier request: not ours to read
                    }
                    interrupted |= msg.header.flags & NLM_F_DUMP_INTR != 0;
                    match msg.payload {
                        NetlinkPayload::Done(_) => break 'recv,
                        NetlinkPayload::Error(e) if e.code.is_some() => {
                            return Err(NlError::Dump {
                                what,
                                source: e.to_io(),
                            })
                        }
                        NetlinkPayload::InnerMessage(m) => items.push(m),
                        _ => {}
                    }
                }
            }
            if !interrupted {
                return Ok(items);
            }
        }
        Err(NlError::DumpInterrupted { what })
    }

    /// Sends `requests` (message and `NLM_F_*` flags besides REQUEST|ACK) in chunks and returns
    /// the kernel's answer to each, in order. The kernel handles every message even when an
    /// earlier one failed; the caller decides what a failure means.
    pub fn batch(
        &mut self,
        requests: Vec<(RouteNetlinkMessage, u16)>,
    ) -> Result<Vec<Ack>, NlError> {
        let total = requests.len();
        let mut acks: Vec<Option<Ack>> = vec![None; total];
        let mut iter = requests.into_iter().enumerate().peekable();
        let mut buf = Vec::with_capacity(CHUNK_BYTES + 4096);
        while iter.peek().is_some() {
            buf.clear();
            // seq of the first message of the chunk; seqs within a chunk are consecutive.
            let mut first: Option<(u32, usize)> = None;
            let mut count = 0usize;
            while buf.len() < CHUNK_BYTES {
                let Some((i, (msg, flags))) = iter.next() else {
                    break;
                };
                let seq = self.encode(msg, NLM_F_REQUEST | NLM_F_ACK | flags, &mut buf);
                first.get_or_insert((seq, i));
                count += 1;
            }
            let Some((seq0, i0)) = first else { break };
            self.sock.send(&buf, 0).map_err(NlError::Send)?;
            let mut pending = count;
            while pending > 0 {
                for msg in self.recv_messages()? {
                    let NetlinkPayload::Error(e) = msg.payload else {
                        continue;
                    };
                    let off = msg.header.sequence_number.wrapping_sub(seq0) as usize;
                    if off >= count {
                        continue;
                    }
                    let slot = &mut acks[i0 + off];
                    if slot.is_none() {
                        pending -= 1;
                    }
                    *slot = Some(match e.code {
                        None => Ok(()),
                        Some(code) => Err(-code.get()),
                    });
                }
            }
        }
        Ok(acks.into_iter().map(|a| a.unwrap_or(Ok(()))).collect())
    }
}
