//! Reading table `inet lace` back from the kernel: what the reconciler wrote, as `nft` prints it.

use crate::bed::number_after;
use crate::Netns;

/// The handles of table `inet lace` and of everything in it (`nft -a` prints them as
/// `# handle N`), with the line naming each: a replaced table gets new ones, an element update
/// keeps them all. Stateless (`-s`): a drop counter's values change whenever a stray packet (an
/// IPv6 router solicitation from a pod's new link) meets it, which says nothing about the
/// handles.
pub fn handles(node: &Netns) -> Vec<String> {
    node.exec("nft", &["-a", "-s", "list", "table", "inet", "lace"])
        .unwrap()
        .lines()
        .filter(|l| l.contains("# handle "))
        .map(|l| l.trim().to_string())
        .collect()
}

/// The packets counted by the first rule of chain `chain` of `inet lace` that counts and
/// drops (`to_pods`' drop of what no policy allows, `np_ingress`' final drop, ...).
pub fn counted_drops(node: &Netns, chain: &str) -> u64 {
    let out = node
        .exec("nft", &["list", "chain", "inet", "lace", chain])
        .unwrap();
    let line = out
        .lines()
        .find(|l| l.contains("counter") && l.contains("drop"))
        .unwrap_or_else(|| panic!("no counted drop in chain {chain}:\n{out}"));
    number_after(line, "packets").unwrap()
}
