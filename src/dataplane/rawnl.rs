//! Tiny netlink requests encoded by hand, for the things no crate here carries: the seg6
//! tunnel source and the fou listeners (generic netlink) and the nft table's plan tag
//! (nfnetlink). All use the same layout: `nlmsghdr`, a 4-byte family header (`genlmsghdr` /
//! `nfgenmsg`), attributes.

use netlink_sys::{Socket, SocketAddr};

pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_ACK: u16 = 4;
/// `NLM_F_ROOT | NLM_F_MATCH`: list every object the request selects.
pub const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// Why a hand-encoded request failed; each names the request (`what`).
#[derive(Debug, thiserror::Error)]
pub enum RawNlError {
    #[error("{what}: netlink {step}: {source}")]
    Io {
        what: String,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: the kernel answered: {source}")]
    Refused {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {detail}")]
    Malformed { what: String, detail: String },
}

impl RawNlError {
    fn io<'a>(what: &'a str, step: &'static str) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| Self::Io {
            what: what.to_owned(),
            step,
            source,
        }
    }

    /// The answer to `what` lacked or mangled what it should carry (`detail`).
    pub fn malformed(what: &str, detail: impl Into<String>) -> Self {
        Self::Malformed {
            what: what.to_owned(),
            detail: detail.into(),
        }
    }
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// A connected netlink socket of `protocol` in the calling thread's namespace, for `what`.
pub fn open(protocol: isize, what: &str) -> Result<Socket, RawNlError> {
    let mut sock = Socket::new(protocol).map_err(RawNlError::io(what, "socket"))?;
    sock.bind_auto().map_err(RawNlError::io(what, "bind"))?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(RawNlError::io(what, "connect"))?;
    Ok(sock)
}

/// One request of message type `ty` whose 4-byte family header is `head`, with `attrs`.
pub fn request(ty: u16, flags: u16, head: [u8; 4], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let len = 16 + 4 + attrs.iter().map(|a| align(4 + a.1.len())).sum::<usize>();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    m.extend_from_slice(&head);
    for (ty, value) in attrs {
        m.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(value);
        m.resize(align(m.len()), 0);
    }
    m
}

/// The attributes in `buf` (type, value), nested ones left encoded. Parsing stops at the
/// first malformed one.
pub fn parse_attrs(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut attrs = Vec::new();
    let mut off = 0;
    while off + 4 <= buf.len() {
        let alen = u16::from_ne_bytes([buf[off], buf[off + 1]]) as usize;
        // The top two bits are the nested / byte-order flags.
        let aty = u16::from_ne_bytes([buf[off + 2], buf[off + 3]]) & 0x3fff;
        if alen < 4 || off + alen > buf.len() {
            break;
        }
        attrs.push((aty, &buf[off + 4..off + alen]));
        off += align(alen);
    }
    attrs
}

/// What the kernel answered to a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// The attributes of its message (empty for a bare ACK).
    Attrs(Vec<(u16, Vec<u8>)>),
    /// An error, as errno.
    Errno(i32),
}

/// Sends `req` (request `what`) and reads the answer.
pub fn talk(sock: &Socket, req: &[u8], what: &str) -> Result<Answer, RawNlError> {
    sock.send(req, 0).map_err(RawNlError::io(what, "send"))?;
    let mut buf = vec![0u8; 16384];
    let n = sock
        .recv(&mut &mut buf[..], 0)
        .map_err(RawNlError::io(what, "receive"))?;
    let buf = &buf[..n];
    if n < 20 {
        return Err(RawNlError::malformed(
            what,
            format!("short answer ({n} bytes)"),
        ));
    }
    if u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
        let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        return Ok(if code == 0 {
            Answer::Attrs(Vec::new())
        } else {
            Answer::Errno(-code)
        });
    }
    let len = (u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize).min(n);
    Ok(Answer::Attrs(
        parse_attrs(&buf[20..len])
            .into_iter()
            .map(|(t, v)| (t, v.to_vec()))
            .collect(),
    ))
}

/// The attributes of one message: (type, value), nested ones left encoded.
pub type Attrs = Vec<(u16, Vec<u8>)>;

/// The attributes of every message of a dump (`req` has [`NLM_F_DUMP`]), read until the
/// kernel's `NLMSG_DONE`; an error names `what`.
pub fn dump(sock: &Socket, req: &[u8], what: &str) -> Result<Vec<Attrs>, RawNlError> {
    sock.send(req, 0).map_err(RawNlError::io(what, "send"))?;
    let mut buf = vec![0u8; 32768];
    let mut out = Vec::new();
    loop {
        let n = sock
            .recv(&mut &mut buf[..], 0)
            .map_err(RawNlError::io(what, "receive"))?;
        let mut off = 0;
        while off + 16 <= n {
            let len =
                u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            if len < 16 || off + len > n {
                return Err(RawNlError::malformed(what, "malformed answer"));
            }
            match ty {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR if len >= 20 => {
                    let code = i32::from_ne_bytes([
                        buf[off + 16],
                        buf[off + 17],
                        buf[off + 18],
                        buf[off + 19],
                    ]);
                    if code != 0 {
                        return Err(RawNlError::Refused {
                            what: what.to_owned(),
                            source: std::io::Error::from_raw_os_error(-code),
                        });
                    }
                }
                _ if len >= 20 => out.push(
                    parse_attrs(&buf[off + 20..off + len])
                        .into_iter()
                        .map(|(t, v)| (t, v.to_vec()))
                        .collect(),
                ),
                _ => {}
            }
            off += align(len);
        }
    }
}

/// A generic-netlink socket and the id of family `name` (resolving it makes the kernel load
/// the family's module when it is one).
pub fn genl_family(name: &str) -> Result<(Socket, u16), RawNlError> {
    let what = format!("resolving generic netlink family {name}");
    let sock = open(netlink_sys::protocols::NETLINK_GENERIC, &what)?;
    let mut zname = name.as_bytes().to_vec();
    zname.push(0);
    let req = request(
        GENL_ID_CTRL,
        NLM_F_REQUEST,
        [CTRL_CMD_GETFAMILY, 1, 0, 0],
        &[(CTRL_ATTR_FAMILY_NAME, &zname)],
    );
    let id = attrs(talk(&sock, &req, &what)?, &what)?
        .iter()
        .find(|(t, v)| *t == CTRL_ATTR_FAMILY_ID && v.len() >= 2)
        .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]))
        .ok_or_else(|| RawNlError::malformed(&what, "no family id in the answer"))?;
    Ok((sock, id))
}

/// The attributes of an answer, an error naming `what` otherwise.
pub fn attrs(answer: Answer, what: &str) -> Result<Vec<(u16, Vec<u8>)>, RawNlError> {
    match answer {
        Answer::Attrs(a) => Ok(a),
        Answer::Errno(e) => Err(RawNlError::Refused {
            what: what.to_owned(),
            source: std::io::Error::from_raw_os_error(e),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_kernel_layout() {
        let m = request(0x1b, NLM_F_REQUEST, [4, 1, 0, 0], &[(1, &[7; 16])]);
        assert_eq!(m.len(), 16 + 4 + 20);
        assert_eq!(
            u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x1b);
        assert_eq!(&m[16..20], &[4, 1, 0, 0]);
        assert_eq!(u16::from_ne_bytes([m[20], m[21]]), 20);
        assert_eq!(u16::from_ne_bytes([m[22], m[23]]), 1);
        assert_eq!(&m[24..40], &[7; 16]);
        // An odd-sized attribute is padded to 4 bytes.
        let m = request(0x10, NLM_F_REQUEST, [3, 1, 0, 0], &[(2, b"SEG6\0")]);
        assert_eq!(m.len(), 16 + 4 + 12);
        // Several attributes, each padded, read back by the parser.
        let m = request(
            0xa0d,
            NLM_F_REQUEST,
            [1, 0, 0, 0],
            &[(1, b"lace\0"), (2, b"ab")],
        );
        assert_eq!(m.len(), 16 + 4 + 12 + 8);
        assert_eq!(
            parse_attrs(&m[20..]),
            vec![(1, b"lace\0".as_slice()), (2, b"ab".as_slice())]
        );
        // A length running past the end stops the parse.
        assert_eq!(parse_attrs(&[8, 0, 1, 0, 0]), vec![]);
    }
}
