//! fou receive ports over generic netlink (family `fou`): `ip fou show`, `ip fou add port P
//! ipproto 41`, `ip fou del port P`; and loading the `fou` module, which also registers the
//! encapsulation a `sit` device with `encap fou` needs.

use netlink_sys::Socket;

use super::host::HostError;
use super::observed::{FouListener, AF_INET};
use super::rawnl::{
    attrs, dump, genl_family, request, talk, Answer, RawNlError, NLM_F_ACK, NLM_F_DUMP,
    NLM_F_REQUEST,
};

/// Why a fou request failed.
#[derive(Debug, thiserror::Error)]
pub enum FouError {
    #[error("the kernel's fou module is not loaded and loading it failed ({0}); load it on the node: `modprobe fou`, and list it in /etc/modules-load.d/")]
    Module(#[source] HostError),
    #[error(transparent)]
    Netlink(#[from] RawNlError),
    #[error("fou port {0} is a GUE listener, which Lace neither makes nor takes over")]
    Gue(u16),
}

const FOU_GENL_VERSION: u8 = 1;
const FOU_CMD_ADD: u8 = 1;
const FOU_CMD_DEL: u8 = 2;
const FOU_CMD_GET: u8 = 3;
const FOU_ATTR_PORT: u16 = 1;
const FOU_ATTR_AF: u16 = 2;
const FOU_ATTR_IPPROTO: u16 = 3;
const FOU_ATTR_TYPE: u16 = 4;
/// `FOU_ENCAP_DIRECT`: the UDP payload is the packet of [`FouListener::ipproto`].
const FOU_ENCAP_DIRECT: u8 = 1;

fn u8_of(a: &[(u16, Vec<u8>)], ty: u16) -> Option<u8> {
    a.iter()
        .find(|(t, _)| *t == ty)
        .and_then(|(_, v)| v.first().copied())
}

/// Makes sure the kernel's fou support is loaded (for a `sit` device with `encap fou`, and the
/// receive port). The `fou` module declares no alias the kernel could load it by on demand
/// (checked on Debian's 6.1 and 6.12), so when its generic netlink family is missing this runs
/// `modprobe fou` (kmod, with the host's `/lib/modules`, which the agent's DaemonSet mounts).
pub fn load() -> Result<(), FouError> {
    fou_family().map(|_| ())
}

/// The `fou` generic-netlink family (socket and id), loading the module when it is missing.
fn fou_family() -> Result<(Socket, u16), FouError> {
    if let Ok(found) = genl_family("fou") {
        return Ok(found);
    }
    super::host::run("modprobe", &["fou"], None).map_err(FouError::Module)?;
    Ok(genl_family("fou")?)
}

/// The namespace's fou receive ports.
pub fn list() -> Result<Vec<FouListener>, RawNlError> {
    let (sock, family) = genl_family("fou")?;
    let req = request(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        [FOU_CMD_GET, FOU_GENL_VERSION, 0, 0],
        &[],
    );
    let mut out = Vec::new();
    for a in dump(&sock, &req, "FOU_CMD_GET")? {
        let Some(port) = a
            .iter()
            .find(|(t, v)| *t == FOU_ATTR_PORT && v.len() == 2)
            .map(|(_, v)| u16::from_be_bytes([v[0], v[1]]))
        else {
            continue;
        };
        let direct = u8_of(&a, FOU_ATTR_TYPE) == Some(FOU_ENCAP_DIRECT);
        out.push(FouListener {
            port,
            family: u8_of(&a, FOU_ATTR_AF).unwrap_or(AF_INET),
            ipproto: u8_of(&a, FOU_ATTR_IPPROTO).filter(|_| direct),
        });
    }
    out.sort();
    Ok(out)
}

/// `ip fou add port <port> ipproto <ipproto>` (IPv4, direct); one that exists is fine.
pub fn add(l: FouListener) -> Result<(), FouError> {
    let ipproto = l.ipproto.ok_or(FouError::Gue(l.port))?;
    let port = l.port.to_be_bytes();
    let attributes: [(u16, &[u8]); 4] = [
        (FOU_ATTR_PORT, &port),
        (FOU_ATTR_AF, &[l.family]),
        (FOU_ATTR_IPPROTO, &[ipproto]),
        (FOU_ATTR_TYPE, &[FOU_ENCAP_DIRECT]),
    ];
    send(FOU_CMD_ADD, "FOU_CMD_ADD", &attributes, libc::EEXIST)
}

/// `ip fou del port <port>` (of `family`); one that is gone is fine.
pub fn del(port: u16, family: u8) -> Result<(), FouError> {
    let port = port.to_be_bytes();
    send(
        FOU_CMD_DEL,
        "FOU_CMD_DEL",
        &[(FOU_ATTR_PORT, &port), (FOU_ATTR_AF, &[family])],
        libc::ENOENT,
    )
}

/// One acknowledged request `cmd` (named `what` in errors); `fine` is the errno that means
/// "already so".
fn send(cmd: u8, what: &str, attributes: &[(u16, &[u8])], fine: i32) -> Result<(), FouError> {
    let (sock, family) = fou_family()?;
    let req = request(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        [cmd, FOU_GENL_VERSION, 0, 0],
        attributes,
    );
    match talk(&sock, &req, what)? {
        Answer::Errno(e) if e == fine => Ok(()),
        a => Ok(attrs(a, what).map(|_| ())?),
    }
}
