//! Lace's nft table in the kernel: its plan tag read back with one nfnetlink request
//! (`NFT_MSG_GETSETELEM` on set [`TAG_SET`]), so observing costs the same for any table size,
//! and the transactions the diff chose run with `nft -f` (one atomic run each). What the tag
//! is and which transaction to run is the pure half's ([`crate::dataplane::diff::nft`]).

use super::diff::nft::{TAG_PREFIX, TAG_SET};
use super::host;
use super::observed::NftState;
use super::rawnl;
use crate::plan::nft::TABLE;

/// `NFT_MSG_GETTABLE` and `NFT_MSG_GETSETELEM` (nfnetlink subsystem 10, messages 1 and 13).
const NFT_MSG_GETTABLE: u16 = (10 << 8) | 1;
const NFT_MSG_GETSETELEM: u16 = (10 << 8) | 13;
const NFPROTO_INET: u8 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
/// libnftnl's user-data TLV type of an element's comment.
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;

/// The comment in nftables user data (TLVs of type u8, length u8, value).
fn udata_comment(udata: &[u8]) -> Option<String> {
    let mut i = 0;
    while i + 2 <= udata.len() {
        let (t, l) = (udata[i], usize::from(udata[i + 1]));
        let v = udata.get(i + 2..i + 2 + l)?;
        if t == NFTNL_UDATA_SET_ELEM_COMMENT {
            let v = v.strip_suffix(&[0]).unwrap_or(v);
            return Some(String::from_utf8_lossy(v).into_owned());
        }
        i += 2 + l;
    }
    None
}

/// The tag in the attributes of an `NFT_MSG_NEWSETELEM` message of set [`TAG_SET`]: the
/// comment of its element, when it has exactly one and the comment is a plan tag.
fn tag_of(attrs: &[(u16, Vec<u8>)]) -> Option<String> {
    let list = attrs
        .iter()
        .find(|(t, _)| *t == NFTA_SET_ELEM_LIST_ELEMENTS)?;
    let elements = rawnl::parse_attrs(&list.1);
    let [(NFTA_LIST_ELEM, element)] = elements.as_slice() else {
        return None;
    };
    rawnl::parse_attrs(element)
        .into_iter()
        .find(|(t, _)| *t == NFTA_SET_ELEM_USERDATA)
        .and_then(|(_, u)| udata_comment(u))
        .filter(|c| c.starts_with(TAG_PREFIX))
}

/// Whether table `inet lace` exists, and its tag: one `NFT_MSG_GETSETELEM` dump of set
/// [`TAG_SET`] (plus an `NFT_MSG_GETTABLE` when there is no such set), not a run of `nft`.
pub fn observe() -> Result<NftState, rawnl::RawNlError> {
    let sock = rawnl::open(netlink_sys::protocols::NETLINK_NETFILTER, "nfnetlink")?;
    let table = format!("{TABLE}\0");
    let set = format!("{TAG_SET}\0");
    let req = rawnl::request(
        NFT_MSG_GETSETELEM,
        rawnl::NLM_F_REQUEST | rawnl::NLM_F_DUMP,
        [NFPROTO_INET, 0, 0, 0],
        &[
            (NFTA_SET_ELEM_LIST_TABLE, table.as_bytes()),
            (NFTA_SET_ELEM_LIST_SET, set.as_bytes()),
        ],
    );
    let what = "NFT_MSG_GETSETELEM inet lace plan";
    match rawnl::talk(&sock, &req, what)? {
        rawnl::Answer::Errno(e) if e == libc::ENOENT => {}
        // An empty set answers with the end of the dump: no attributes, no tag.
        a => {
            let attrs = rawnl::attrs(a, what)?;
            return Ok(NftState::Present {
                tag: tag_of(&attrs),
            });
        }
    }
    // No tag set: is there a table at all?
    let req = rawnl::request(
        NFT_MSG_GETTABLE,
        rawnl::NLM_F_REQUEST,
        [NFPROTO_INET, 0, 0, 0],
        &[(NFTA_TABLE_NAME, table.as_bytes())],
    );
    let what = "NFT_MSG_GETTABLE inet lace";
    match rawnl::talk(&sock, &req, what)? {
        rawnl::Answer::Errno(e) if e == libc::ENOENT => Ok(NftState::Absent),
        a => rawnl::attrs(a, what).map(|_| NftState::Present { tag: None }),
    }
}

/// Runs one `nft -f` transaction.
pub fn apply(script: &str) -> Result<(), host::HostError> {
    host::run("nft", &["-f", "-"], Some(script)).map(|_| ())
}

/// The `delete table` transaction, create-if-missing first so it never fails.
pub fn delete_script() -> String {
    format!("table inet {TABLE}\ndelete table inet {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nlattr bytes: length, type, value, padding.
    fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize((a.len() + 3) & !3, 0);
        a
    }

    /// The attributes of a `NFT_MSG_NEWSETELEM` dump message with elements of `comments`.
    fn setelem_message(comments: &[&str]) -> Vec<(u16, Vec<u8>)> {
        let mut list = Vec::new();
        for c in comments {
            let mut udata = vec![NFTNL_UDATA_SET_ELEM_COMMENT, (c.len() + 1) as u8];
            udata.extend_from_slice(c.as_bytes());
            udata.push(0);
            let mut element = attr(1, &attr(1, b"digest\0")); // NFTA_SET_ELEM_KEY
            element.extend(attr(NFTA_SET_ELEM_USERDATA, &udata));
            list.extend(attr(NFTA_LIST_ELEM, &element));
        }
        vec![
            (NFTA_SET_ELEM_LIST_TABLE, b"lace\0".to_vec()),
            (NFTA_SET_ELEM_LIST_SET, b"plan\0".to_vec()),
            (NFTA_SET_ELEM_LIST_ELEMENTS, list),
        ]
    }

    #[test]
    fn the_tag_is_the_comment_of_the_one_element_of_the_tag_set() {
        let t = "lace-plan 0123456789abcdef";
        assert_eq!(tag_of(&setelem_message(&[t])).as_deref(), Some(t));
        assert_eq!(tag_of(&setelem_message(&["hand-written"])), None);
        assert_eq!(tag_of(&setelem_message(&[t, t])), None, "two elements");
        assert_eq!(tag_of(&setelem_message(&[])), None);
        assert_eq!(tag_of(&[]), None, "end of an empty dump");
    }

    #[test]
    fn comments_are_read_from_nftables_user_data() {
        let mut u = vec![1, 2, 9, 9, NFTNL_UDATA_SET_ELEM_COMMENT, 6];
        u.extend_from_slice(b"lace-\0");
        assert_eq!(udata_comment(&u).as_deref(), Some("lace-"));
        assert_eq!(udata_comment(&[1, 1, 0]), None);
        assert_eq!(udata_comment(&[0, 9, 1]), None, "truncated");
    }
}
