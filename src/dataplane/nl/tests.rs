//! The dump and batch loops against a scripted kernel: dumps across datagrams, stray and
//! interrupted ones, the reader thread (order, errors, a broken stream, two decoders), and
//! resends of what the kernel refused for lack of memory.

use std::collections::VecDeque;

use netlink_packet_core::DoneMessage;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};

use super::*;

/// One answer of the scripted kernel to a dump request: the links it lists, and whether
/// it flags them `NLM_F_DUMP_INTR`.
struct Answer {
    links: Vec<&'static str>,
    interrupted: bool,
}

/// How the scripted kernel lays an answer out: the first link in one datagram and the
/// rest with `NLMSG_DONE` in a second, or each message in its own datagram, ending with
/// `NLMSG_DONE`, an error (`NLMSG_ERROR` with this errno) or nothing (the stream breaks).
#[derive(Clone, Copy, Default, PartialEq)]
enum Layout {
    #[default]
    Two,
    Each(End),
}

#[derive(Clone, Copy, PartialEq)]
enum End {
    Done,
    Errno(i32),
    Nothing,
}

/// A kernel that answers each dump request with the next scripted answer, split over
/// two datagrams (a dump spans several `recv`s), preceded by a stray message of an
/// earlier request.
#[derive(Default)]
struct Scripted {
    answers: VecDeque<Answer>,
    layout: Layout,
    requests: usize,
    queue: VecDeque<Vec<u8>>,
}

fn emit(seq: u32, flags: u16, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.sequence_number = seq;
    header.flags = flags;
    let mut m = NetlinkMessage::new(header, payload);
    m.finalize();
    let mut buf = vec![0; m.buffer_len()];
    m.serialize(&mut buf);
    buf
}

fn link(name: &str) -> RouteNetlinkMessage {
    let mut l = LinkMessage::default();
    l.attributes.push(LinkAttribute::IfName(name.into()));
    RouteNetlinkMessage::NewLink(l)
}

impl Transport for Scripted {
    fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        self.requests += 1;
        let seq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
        let answer = self
            .answers
            .pop_front()
            .expect("a request the script has no answer for");
        let flags = NLM_F_MULTI_FLAG
            | if answer.interrupted {
                NLM_F_DUMP_INTR
            } else {
                0
            };
        // Something an earlier request left behind: must not be taken as this dump's.
        self.queue.push_back(emit(
            seq.wrapping_sub(1),
            NLM_F_MULTI_FLAG,
            NetlinkPayload::InnerMessage(link("stale0")),
        ));
        let done = emit(seq, flags, NetlinkPayload::Done(DoneMessage::default()));
        let links = answer
            .links
            .iter()
            .map(|name| emit(seq, flags, NetlinkPayload::InnerMessage(link(name))));
        match self.layout {
            Layout::Two => {
                let mut links = links;
                self.queue.push_back(links.next().unwrap_or_default());
                self.queue.push_back(links.flatten().chain(done).collect());
            }
            Layout::Each(end) => {
                self.queue.extend(links);
                match end {
                    End::Done => self.queue.push_back(done),
                    End::Errno(errno) => {
                        let mut e = netlink_packet_core::ErrorMessage::default();
                        e.code = std::num::NonZeroI32::new(-errno);
                        self.queue.push_back(emit(seq, 0, NetlinkPayload::Error(e)));
                    }
                    End::Nothing => {}
                }
            }
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Self::pop(&mut self.queue, buf)
    }
}

impl Scripted {
    /// The next queued datagram into `buf`.
    fn pop(queue: &mut VecDeque<Vec<u8>>, buf: &mut [u8]) -> io::Result<usize> {
        let d = queue
            .pop_front()
            .ok_or_else(|| io::Error::from(io::ErrorKind::WouldBlock))?;
        buf[..d.len()].copy_from_slice(&d);
        Ok(d.len())
    }
}

/// `NLM_F_MULTI`: set on every message of a dump.
const NLM_F_MULTI_FLAG: u16 = 2;

fn names(items: &[RouteNetlinkMessage]) -> Vec<String> {
    items
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => l.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some(n.clone()),
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

fn dump_links(answers: Vec<Answer>) -> (Result<Vec<RouteNetlinkMessage>, NlError>, usize) {
    dump_links_laid_out(answers, Layout::Two)
}

fn dump_links_laid_out(
    answers: Vec<Answer>,
    layout: Layout,
) -> (Result<Vec<RouteNetlinkMessage>, NlError>, usize) {
    let mut nl = Nl::with_transport(Scripted {
        answers: answers.into(),
        layout,
        ..Default::default()
    });
    let got = nl.dump(
        "links",
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    );
    (got, nl.sock.requests)
}

#[test]
fn a_complete_dump_is_read_across_datagrams_and_only_its_own_messages_count() {
    let (got, requests) = dump_links(vec![Answer {
        links: vec!["lo", "eth0", "lv-a"],
        interrupted: false,
    }]);
    assert_eq!(names(&got.unwrap()), ["lo", "eth0", "lv-a"]);
    assert_eq!(requests, 1);
}

/// 200 names, each its own datagram: far more than the reader thread may read ahead.
fn many_links() -> Vec<&'static str> {
    (0..200)
        .map(|i| &*Box::leak(format!("l{i}").into_boxed_str()))
        .collect()
}

#[test]
fn a_long_dump_read_ahead_by_the_reader_thread_keeps_every_message_in_order() {
    let links = many_links();
    let (got, requests) = dump_links_laid_out(
        vec![Answer {
            links: links.clone(),
            interrupted: false,
        }],
        Layout::Each(End::Done),
    );
    assert_eq!(names(&got.unwrap()), links);
    assert_eq!(requests, 1);
}

#[test]
fn a_split_dump_is_decoded_by_both_threads_and_its_runs_come_back_in_the_kernels_order() {
    let links = many_links();
    let mut nl = Nl::with_transport(Scripted {
        answers: vec![Answer {
            links: links.clone(),
            interrupted: false,
        }]
        .into(),
        layout: Layout::Each(End::Done),
        ..Default::default()
    });
    let main = std::thread::current().id();
    let runs = nl
        .dump_fold_split(
            "links",
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            Vec::new,
            |seen, kind, payload| {
                // This thread decodes slowly: the reader finds the queue full and helps.
                if std::thread::current().id() == main {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                let m = RouteNetlinkMessage::parse_with_param(payload, kind).unwrap();
                seen.push((names(&[m])[0].clone(), std::thread::current().id()));
                Ok(())
            },
        )
        .unwrap();
    let got: Vec<_> = runs.into_iter().flatten().collect();
    let got_names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(got_names, links, "every message once, in the dump's order");
    let by_main = got.iter().filter(|(_, t)| *t == main).count();
    assert!(
        by_main > 0 && by_main < links.len(),
        "both threads decoded: {by_main} of {} here",
        links.len()
    );
}

#[test]
fn an_error_ending_a_long_dump_names_the_dump_and_the_errno() {
    let (got, _) = dump_links_laid_out(
        vec![Answer {
            links: many_links(),
            interrupted: false,
        }],
        Layout::Each(End::Errno(libc::EBUSY)),
    );
    let err = got.unwrap_err();
    assert!(
        matches!(&err, NlError::Dump { what: "links", source } if source.raw_os_error() == Some(libc::EBUSY)),
        "{err:?}"
    );
}

#[test]
fn a_dump_whose_stream_breaks_fails_with_the_receive_error_instead_of_hanging() {
    let (got, _) = dump_links_laid_out(
        vec![Answer {
            links: many_links(),
            interrupted: false,
        }],
        Layout::Each(End::Nothing),
    );
    let err = got.unwrap_err();
    assert!(
        matches!(&err, NlError::Receive(e) if e.kind() == io::ErrorKind::WouldBlock),
        "{err:?}"
    );
}

#[test]
fn only_the_end_of_the_dump_asked_for_stops_the_reader() {
    let end = |seq, kind| {
        let payload = match kind {
            NLMSG_DONE => NetlinkPayload::Done(DoneMessage::default()),
            _ => NetlinkPayload::Error(netlink_packet_core::ErrorMessage::default()),
        };
        emit(seq, NLM_F_MULTI_FLAG, payload)
    };
    let other = emit(7, NLM_F_MULTI_FLAG, NetlinkPayload::InnerMessage(link("a")));
    assert!(!ends_dump(&other, 7));
    assert!(!ends_dump(&end(6, NLMSG_DONE), 7), "another request's end");
    for kind in [NLMSG_DONE, NLMSG_ERROR] {
        let datagram: Vec<u8> = other.iter().copied().chain(end(7, kind)).collect();
        assert!(ends_dump(&datagram, 7), "type {kind} after a message");
    }
    let mut malformed = other.clone();
    malformed[0] = 8; // a length shorter than a header
    assert!(
        ends_dump(&malformed, 7),
        "a malformed datagram ends the reading"
    );
}

#[test]
fn an_interrupted_dump_is_retried_and_the_retry_is_what_counts() {
    let (got, requests) = dump_links(vec![
        Answer {
            links: vec!["lo", "old0"],
            interrupted: true,
        },
        Answer {
            links: vec!["lo", "new0", "lv-a"],
            interrupted: false,
        },
    ]);
    assert_eq!(names(&got.unwrap()), ["lo", "new0", "lv-a"]);
    assert_eq!(requests, 2);
}

#[test]
fn a_dump_that_stays_interrupted_gives_up_after_the_last_attempt() {
    let answers = (0..DUMP_ATTEMPTS)
        .map(|_| Answer {
            links: vec!["lo"],
            interrupted: true,
        })
        .collect();
    let (got, requests) = dump_links(answers);
    let err = got.unwrap_err();
    assert!(
        matches!(err, NlError::DumpInterrupted { what: "links" }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "dump of links was interrupted by concurrent changes {DUMP_ATTEMPTS} times in a row"
        )
    );
    assert_eq!(requests, DUMP_ATTEMPTS, "no request past the last attempt");
}

/// A kernel that handles the requests of a datagram in order, as rtnetlink does: each one's
/// answer in a datagram of its own, sent when it fails or asks for an ACK. It refuses the
/// link named `n` with `ENOMEM` the first `refuse[n]` times it sees it, and `EEXIST` the
/// links named in `exist` every time. Records the names of each send, which of them asked
/// for an ACK, and every request's sequence number.
#[derive(Default)]
struct Acking {
    refuse: std::collections::HashMap<String, usize>,
    exist: Vec<&'static str>,
    sends: Vec<Vec<String>>,
    acked: Vec<Vec<String>>,
    seqs: Vec<u32>,
    queue: VecDeque<Vec<u8>>,
}

impl Transport for Acking {
    fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut names_sent = Vec::new();
        let mut acked = Vec::new();
        for m in decode(buf).unwrap() {
            let NetlinkPayload::InnerMessage(inner) = m.payload else {
                panic!("not a request: {m:?}");
            };
            let name = names(&[inner])[0].clone();
            self.seqs.push(m.header.sequence_number);
            let mut e = netlink_packet_core::ErrorMessage::default();
            if let Some(n) = self.refuse.get_mut(name.as_str()).filter(|n| **n > 0) {
                *n -= 1;
                e.code = std::num::NonZeroI32::new(-libc::ENOMEM);
            } else if self.exist.contains(&name.as_str()) {
                e.code = std::num::NonZeroI32::new(-libc::EEXIST);
            }
            let ack = m.header.flags & NLM_F_ACK != 0;
            if ack {
                acked.push(name.clone());
            }
            if ack || e.code.is_some() {
                let answer = emit(m.header.sequence_number, 0, NetlinkPayload::Error(e));
                self.queue.push_back(answer);
            }
            names_sent.push(name);
        }
        self.sends.push(names_sent);
        self.acked.push(acked);
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Scripted::pop(&mut self.queue, buf)
    }
}

fn batch_links(refuse: &[(&'static str, usize)]) -> (Vec<Ack>, Vec<Vec<String>>) {
    let mut nl = Nl::with_transport(Acking {
        refuse: refuse.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
        ..Default::default()
    });
    let requests = ["a", "b", "c", "d"].map(|n| (link(n), 0)).to_vec();
    let acks = nl.batch(requests).unwrap();
    (acks, nl.sock.sends)
}

#[test]
fn a_batch_resends_what_the_kernel_refused_for_lack_of_memory_and_only_that() {
    let (acks, sends) = batch_links(&[("b", 2), ("d", 1)]);
    assert_eq!(acks, [Ok(()), Ok(()), Ok(()), Ok(())]);
    assert_eq!(sends, [vec!["a", "b", "c", "d"], vec!["b", "d"], vec!["b"]]);
}

/// The kernel answers a request that succeeded only if it asks for an ACK: only the last one
/// of each send does, and the failures before it are still each reported, in place.
#[test]
fn only_the_last_request_of_a_send_asks_for_an_ack_and_every_failure_is_still_answered() {
    let n = 3 * PIPELINE_REQUESTS;
    let mut nl = Nl::with_transport(Acking {
        exist: vec!["l0", "l5", "l2999"],
        refuse: [("l6".to_string(), 1)].into(),
        ..Default::default()
    });
    let requests = (0..n).map(|i| (link(&format!("l{i}")), 0)).collect();
    let acks = nl.batch(requests).unwrap();
    let failed: Vec<(usize, Ack)> = (acks.iter().enumerate())
        .filter(|(_, a)| a.is_err())
        .map(|(i, a)| (i, *a))
        .collect();
    let eexist = Err(libc::EEXIST);
    assert_eq!(failed, [(0, eexist), (5, eexist), (2999, eexist)]);
    let sends = &nl.sock.sends;
    assert!(sends.len() > 3, "more than one chunk: {}", sends.len());
    for (sent, acked) in sends.iter().zip(&nl.sock.acked) {
        assert_eq!(acked, &[sent.last().unwrap().clone()], "of {sent:?}");
    }
    assert_eq!(sends[1], ["l6"], "resent alone, with its own ACK");
    // The next batch reads its own answers, none left over from this one.
    let again = nl.batch(vec![(link("l5"), 0), (link("x"), 0)]).unwrap();
    assert_eq!(again, [eexist, Ok(())]);
}

#[test]
fn a_request_refused_past_the_last_resend_reports_enomem_and_other_errors_are_not_resent() {
    let (acks, sends) = batch_links(&[("c", ENOMEM_RESENDS + 1)]);
    assert_eq!(acks, [Ok(()), Ok(()), Err(libc::ENOMEM), Ok(())]);
    assert_eq!(sends.len(), 1 + ENOMEM_RESENDS);
    assert!(sends[1..].iter().all(|s| s == &["c"]), "{sends:?}");
}

#[test]
fn a_batch_encoded_by_a_second_thread_answers_every_request_in_order_and_numbers_each_send_once() {
    let n = 3 * PIPELINE_REQUESTS;
    let names_sent: Vec<String> = (0..n).map(|i| format!("l{i}")).collect();
    let refuse = [("l7", 1), ("l2000", 2), ("l3000", ENOMEM_RESENDS + 1)];
    let mut nl = Nl::with_transport(Acking {
        refuse: refuse.iter().map(|(n, k)| (n.to_string(), *k)).collect(),
        ..Default::default()
    });
    let requests = names_sent.iter().map(|n| (link(n), 0)).collect();
    let acks = nl.batch(requests).unwrap();
    let refused: Vec<usize> = (0..n).filter(|i| acks[*i].is_err()).collect();
    assert_eq!(refused, [3000]);
    assert_eq!(acks[3000], Err(libc::ENOMEM));
    let sends = &nl.sock.sends;
    assert!(sends.len() > 2, "more than one chunk: {}", sends.len());
    // Every request is sent in order, a refused one again after its chunk: as often as it
    // was refused, up to the last resend.
    let mut seen = std::collections::BTreeSet::new();
    let mut first_sends = Vec::new();
    let mut times: std::collections::BTreeMap<&str, usize> = Default::default();
    for name in sends.iter().flatten() {
        if seen.insert(name) {
            first_sends.push(name);
        }
        *times.entry(name.as_str()).or_default() += 1;
    }
    assert!(
        first_sends.into_iter().eq(names_sent.iter()),
        "sent in order"
    );
    let resent: Vec<(&str, usize)> = times.into_iter().filter(|(_, k)| *k > 1).collect();
    assert_eq!(
        resent,
        [("l2000", 3), ("l3000", 1 + ENOMEM_RESENDS), ("l7", 2)]
    );
    let unique: std::collections::BTreeSet<u32> = nl.sock.seqs.iter().copied().collect();
    assert_eq!(unique.len(), nl.sock.seqs.len(), "no sequence number twice");
    // The next request is numbered after all of them.
    assert!(nl.seq.wrapping_add(1) > *unique.last().unwrap());
}

#[test]
fn a_request_that_cannot_be_built_is_answered_with_its_error_and_not_sent() {
    for n in [4, 3 * PIPELINE_REQUESTS] {
        let mut nl = Nl::with_transport(Acking::default());
        let requests: Vec<usize> = (0..n).collect();
        let answers = nl
            .batch_with(requests.into_iter(), |i| match i % 3 {
                2 => Err(format!("no message for {i}")),
                _ => Ok((link(&format!("l{i}")), 0)),
            })
            .unwrap();
        for (i, answer) in answers.iter().enumerate() {
            match i % 3 {
                2 => assert_eq!(answer, &Err(format!("no message for {i}"))),
                _ => assert_eq!(answer, &Ok(Ok(())), "request {i}"),
            }
        }
        let sent: Vec<String> = nl.sock.sends.into_iter().flatten().collect();
        let want: Vec<String> = (0..n)
            .filter(|i| i % 3 != 2)
            .map(|i| format!("l{i}"))
            .collect();
        assert_eq!(sent, want, "the built ones, in order, of {n}");
    }
}

#[test]
fn datagrams_laid_end_to_end_decode_in_order_and_truncation_is_an_error() {
    let mut buf = emit(7, 0, NetlinkPayload::InnerMessage(link("a")));
    buf.extend(emit(8, 0, NetlinkPayload::InnerMessage(link("b"))));
    let got: Vec<RouteNetlinkMessage> = decode(&buf)
        .unwrap()
        .into_iter()
        .filter_map(|m| match m.payload {
            NetlinkPayload::InnerMessage(i) => Some(i),
            _ => None,
        })
        .collect();
    assert_eq!(names(&got), ["a", "b"]);
    assert!(matches!(
        decode(&buf[..buf.len() - 4]),
        Err(NlError::Decode(_))
    ));
}

/// Attributes as (type, value) pairs up to the first error, and whether there was one.
type Walk = (Vec<(u16, Vec<u8>)>, bool);

/// The [`Walk`] of `RawAttrs`, and that of netlink-packet-core's `NlasIterator`.
fn walked(raw: &[u8]) -> [Walk; 2] {
    let mut ours = (Vec::new(), false);
    for a in RawAttrs::new(raw) {
        match a {
            Ok(a) => {
                assert_eq!(a.nla().kind(), a.kind);
                assert_eq!(a.nla().value(), a.value);
                ours.0.push((a.kind, a.value.to_vec()));
            }
            Err(_) => ours.1 = true,
        }
    }
    let mut theirs = (Vec::new(), false);
    for a in netlink_packet_core::NlasIterator::new(raw) {
        match a {
            Ok(a) => theirs.0.push((a.kind(), a.value().to_vec())),
            Err(_) => theirs.1 = true,
        }
    }
    [ours, theirs]
}

proptest::proptest! {
    /// Any attributes (any type, flags included, any value, padded or not at the end), cut
    /// anywhere or with a length field overwritten: `RawAttrs` yields what `NlasIterator`
    /// does, and stops with an error where it does.
    #[test]
    fn raw_attributes_are_what_the_library_walks(
        attrs in proptest::collection::vec((proptest::prelude::any::<u16>(), proptest::collection::vec(proptest::prelude::any::<u8>(), 0..24)), 0..6),
        pad_last in proptest::prelude::any::<bool>(),
        cut in proptest::prelude::any::<proptest::sample::Index>(),
        overwrite in proptest::option::of((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u16>())),
    ) {
        let mut raw = Vec::new();
        let mut starts = Vec::new();
        for (i, (kind, value)) in attrs.iter().enumerate() {
            starts.push(raw.len());
            raw.extend(u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
            raw.extend(kind.to_ne_bytes());
            raw.extend(value);
            if i + 1 < attrs.len() || pad_last {
                raw.resize(raw.len().div_ceil(4) * 4, 0);
            }
        }
        let [ours, theirs] = walked(&raw);
        proptest::prop_assert_eq!(&ours, &theirs);
        proptest::prop_assert!(!ours.1);
        proptest::prop_assert_eq!(ours.0.len(), attrs.len());
        if let Some((at, len)) = overwrite.filter(|_| !starts.is_empty()) {
            let at = starts[at.index(starts.len())];
            raw[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        }
        let cut = cut.index(raw.len() + 1);
        let [ours, theirs] = walked(&raw[..cut]);
        proptest::prop_assert_eq!(ours, theirs);
    }
}
