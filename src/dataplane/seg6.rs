//! `ip sr tunsrc` over generic netlink (family `SEG6`), so observing it costs two small
//! messages instead of starting `ip`. The messages are three fixed layouts, encoded by hand:
//! `nlmsghdr`, `genlmsghdr`, one attribute.

use std::net::Ipv6Addr;

use rtnetlink::sys::{protocols::NETLINK_GENERIC, Socket, SocketAddr};

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const SEG6_CMD_SET_TUNSRC: u8 = 3;
const SEG6_CMD_GET_TUNSRC: u8 = 4;
const SEG6_ATTR_DST: u16 = 1;
const SEG6_GENL_VERSION: u8 = 1;

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One generic-netlink request with one attribute.
fn request(family: u16, flags: u16, cmd: u8, version: u8, attr: (u16, &[u8])) -> Vec<u8> {
    let attr_len = 4 + attr.1.len();
    let len = 16 + 4 + align(attr_len);
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    m.extend_from_slice(&[cmd, version, 0, 0]);
    m.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    m.extend_from_slice(&attr.0.to_ne_bytes());
    m.extend_from_slice(attr.1);
    m.resize(len, 0);
    m
}

/// Sends `req` and returns the attributes of the answer (empty for a bare ACK).
fn talk(sock: &Socket, req: &[u8]) -> Result<Vec<(u16, Vec<u8>)>, String> {
    sock.send(req, 0).map_err(|e| format!("send: {e}"))?;
    let mut buf = vec![0u8; 8192];
    let n = sock
        .recv(&mut &mut buf[..], 0)
        .map_err(|e| format!("receive: {e}"))?;
    let buf = &buf[..n];
    if n < 20 {
        return Err(format!("short answer ({n} bytes)"));
    }
    let ty = u16::from_ne_bytes([buf[4], buf[5]]);
    if ty == NLMSG_ERROR {
        let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        return if code == 0 {
            Ok(Vec::new())
        } else {
            Err(std::io::Error::from_raw_os_error(-code).to_string())
        };
    }
    let len = (u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize).min(n);
    let mut attrs = Vec::new();
    let mut off = 20;
    while off + 4 <= len {
        let alen = u16::from_ne_bytes([buf[off], buf[off + 1]]) as usize;
        let aty = u16::from_ne_bytes([buf[off + 2], buf[off + 3]]) & 0x3fff;
        if alen < 4 || off + alen > len {
            break;
        }
        attrs.push((aty, buf[off + 4..off + alen].to_vec()));
        off += align(alen);
    }
    Ok(attrs)
}

/// A generic-netlink socket and the id of family `SEG6`.
fn open() -> Result<(Socket, u16), String> {
    let mut sock = Socket::new(NETLINK_GENERIC).map_err(|e| format!("socket: {e}"))?;
    sock.bind_auto().map_err(|e| format!("bind: {e}"))?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(|e| format!("connect: {e}"))?;
    let attrs = talk(
        &sock,
        &request(
            GENL_ID_CTRL,
            NLM_F_REQUEST,
            CTRL_CMD_GETFAMILY,
            1,
            (CTRL_ATTR_FAMILY_NAME, b"SEG6\0"),
        ),
    )
    .map_err(|e| format!("resolving generic netlink family SEG6: {e}"))?;
    let id = attrs
        .iter()
        .find(|(t, v)| *t == CTRL_ATTR_FAMILY_ID && v.len() >= 2)
        .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]))
        .ok_or("generic netlink family SEG6 has no id")?;
    Ok((sock, id))
}

/// The namespace's seg6 tunnel source, `None` when unset (`::`).
pub fn tunsrc_get() -> Result<Option<Ipv6Addr>, String> {
    let (sock, family) = open()?;
    let attrs = talk(
        &sock,
        &request(
            family,
            NLM_F_REQUEST,
            SEG6_CMD_GET_TUNSRC,
            SEG6_GENL_VERSION,
            (SEG6_ATTR_DST, &[0; 16]),
        ),
    )?;
    let raw = attrs
        .iter()
        .find(|(t, v)| *t == SEG6_ATTR_DST && v.len() == 16)
        .map(|(_, v)| v.as_slice())
        .ok_or("SEG6_CMD_GET_TUNSRC answer without an address")?;
    let mut a = [0u8; 16];
    a.copy_from_slice(raw);
    let addr = Ipv6Addr::from(a);
    Ok((!addr.is_unspecified()).then_some(addr))
}

/// Sets the namespace's seg6 tunnel source (`ip sr tunsrc set <addr>`).
pub fn tunsrc_set(addr: Ipv6Addr) -> Result<(), String> {
    let (sock, family) = open()?;
    talk(
        &sock,
        &request(
            family,
            NLM_F_REQUEST | NLM_F_ACK,
            SEG6_CMD_SET_TUNSRC,
            SEG6_GENL_VERSION,
            (SEG6_ATTR_DST, &addr.octets()),
        ),
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_kernel_layout() {
        let m = request(
            0x1b,
            NLM_F_REQUEST,
            SEG6_CMD_GET_TUNSRC,
            1,
            (SEG6_ATTR_DST, &[7; 16]),
        );
        assert_eq!(m.len(), 16 + 4 + 20);
        assert_eq!(
            u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x1b);
        assert_eq!(&m[16..20], &[SEG6_CMD_GET_TUNSRC, 1, 0, 0]);
        assert_eq!(u16::from_ne_bytes([m[20], m[21]]), 20);
        assert_eq!(u16::from_ne_bytes([m[22], m[23]]), SEG6_ATTR_DST);
        assert_eq!(&m[24..40], &[7; 16]);
        // Padding of an odd-sized attribute.
        let m = request(
            GENL_ID_CTRL,
            1,
            CTRL_CMD_GETFAMILY,
            1,
            (CTRL_ATTR_FAMILY_NAME, b"SEG6\0"),
        );
        assert_eq!(m.len(), 16 + 4 + 12);
    }
}
