//! `ip sr tunsrc` over generic netlink (family `SEG6`): two small messages instead of
//! starting `ip` on every observation.

use std::net::Ipv6Addr;

use netlink_sys::{protocols::NETLINK_GENERIC, Socket};

use super::rawnl::{attrs, open, request, talk, NLM_F_ACK, NLM_F_REQUEST};

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const SEG6_CMD_SET_TUNSRC: u8 = 3;
const SEG6_CMD_GET_TUNSRC: u8 = 4;
const SEG6_ATTR_DST: u16 = 1;
const SEG6_GENL_VERSION: u8 = 1;

/// A generic-netlink socket and the id of family `SEG6`.
fn seg6() -> Result<(Socket, u16), String> {
    let sock = open(NETLINK_GENERIC)?;
    let req = request(
        GENL_ID_CTRL,
        NLM_F_REQUEST,
        [CTRL_CMD_GETFAMILY, 1, 0, 0],
        &[(CTRL_ATTR_FAMILY_NAME, b"SEG6\0")],
    );
    let id = attrs(talk(&sock, &req)?, "resolving generic netlink family SEG6")?
        .iter()
        .find(|(t, v)| *t == CTRL_ATTR_FAMILY_ID && v.len() >= 2)
        .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]))
        .ok_or("generic netlink family SEG6 has no id")?;
    Ok((sock, id))
}

/// The namespace's seg6 tunnel source, `None` when unset (`::`).
pub fn tunsrc_get() -> Result<Option<Ipv6Addr>, String> {
    let (sock, family) = seg6()?;
    let req = request(
        family,
        NLM_F_REQUEST,
        [SEG6_CMD_GET_TUNSRC, SEG6_GENL_VERSION, 0, 0],
        &[(SEG6_ATTR_DST, &[0; 16])],
    );
    let a = attrs(talk(&sock, &req)?, "SEG6_CMD_GET_TUNSRC")?;
    let raw = a
        .iter()
        .find(|(t, v)| *t == SEG6_ATTR_DST && v.len() == 16)
        .map(|(_, v)| v.as_slice())
        .ok_or("SEG6_CMD_GET_TUNSRC answer without an address")?;
    let mut octets = [0u8; 16];
    octets.copy_from_slice(raw);
    let addr = Ipv6Addr::from(octets);
    Ok((!addr.is_unspecified()).then_some(addr))
}

/// Sets the namespace's seg6 tunnel source (`ip sr tunsrc set <addr>`).
pub fn tunsrc_set(addr: Ipv6Addr) -> Result<(), String> {
    let (sock, family) = seg6()?;
    let req = request(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        [SEG6_CMD_SET_TUNSRC, SEG6_GENL_VERSION, 0, 0],
        &[(SEG6_ATTR_DST, &addr.octets())],
    );
    attrs(talk(&sock, &req)?, "SEG6_CMD_SET_TUNSRC").map(|_| ())
}
