//! `ip sr tunsrc` over generic netlink (family `SEG6`): two small messages instead of
//! starting `ip` on every observation.

use std::net::Ipv6Addr;

use netlink_sys::Socket;

use super::rawnl::{attrs, genl_family, request, talk, RawNlError, NLM_F_ACK, NLM_F_REQUEST};

const SEG6_CMD_SET_TUNSRC: u8 = 3;
const SEG6_CMD_GET_TUNSRC: u8 = 4;
const SEG6_ATTR_DST: u16 = 1;
const SEG6_GENL_VERSION: u8 = 1;

/// A generic-netlink socket and the id of family `SEG6`.
fn seg6() -> Result<(Socket, u16), RawNlError> {
    genl_family("SEG6")
}

/// The namespace's seg6 tunnel source, `None` when unset (`::`).
pub fn tunsrc_get() -> Result<Option<Ipv6Addr>, RawNlError> {
    let (sock, family) = seg6()?;
    let req = request(
        family,
        NLM_F_REQUEST,
        [SEG6_CMD_GET_TUNSRC, SEG6_GENL_VERSION, 0, 0],
        &[(SEG6_ATTR_DST, &[0; 16])],
    );
    let what = "SEG6_CMD_GET_TUNSRC";
    let a = attrs(talk(&sock, &req, what)?, what)?;
    let raw = a
        .iter()
        .find(|(t, v)| *t == SEG6_ATTR_DST && v.len() == 16)
        .map(|(_, v)| v.as_slice())
        .ok_or_else(|| RawNlError::malformed(what, "no address in the answer"))?;
    let mut octets = [0u8; 16];
    octets.copy_from_slice(raw);
    let addr = Ipv6Addr::from(octets);
    Ok((!addr.is_unspecified()).then_some(addr))
}

/// Sets the namespace's seg6 tunnel source (`ip sr tunsrc set <addr>`).
pub fn tunsrc_set(addr: Ipv6Addr) -> Result<(), RawNlError> {
    let (sock, family) = seg6()?;
    let req = request(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        [SEG6_CMD_SET_TUNSRC, SEG6_GENL_VERSION, 0, 0],
        &[(SEG6_ATTR_DST, &addr.octets())],
    );
    let what = "SEG6_CMD_SET_TUNSRC";
    attrs(talk(&sock, &req, what)?, what).map(|_| ())
}
