//! Deterministic, stable allocation of SID functions and node locators, and the per-node
//! address blocks derived from them.
//!
//! Given a [`ClusterState`] (with whatever allocations already exist in it), [`allocate`]
//! returns the complete new set of [`NetworkAllocationSpec`]s and [`NodeAllocationSpec`]s:
//!
//! - every Network (external ones included, so every Network has a stable number the planner
//!   can derive table ids from) gets a SID function, the lowest free one from 1;
//! - every node gets an index, the lowest free one from 1 (index 0 would make the locator the
//!   prefix's own address), its /96 locator derived from the index (see [`crate::sid`]), and as
//!   underlay its first InternalIP of each family.
//!
//! Blocks are not allocated but derived: node `index` holds block `index - 1` of each subnet of
//! every non-external Network ([`node_blocks`]). Because indices are the lowest free ones, they
//! stay dense, so a subnet with `n` blocks serves the first `n` node indices, and a node whose
//! index lies beyond a Network's blocks has no block of it (the controller reports that on
//! the Network). This keeps the internal objects O(1) per Network and per node: a new Network
//! or node is one write, and no other object changes.
//!
//! Stability: an existing allocation that is still valid (its Network or node still exists,
//! the value is in range and not claimed twice) is kept as it is, before anything new is
//! handed out; new things are handled in name order. So re-running gives the same result,
//! adding a node or Network never moves an existing allocation, and removing one frees its
//! values for reuse (lowest free first).
//!
//! [`allocate`] is all or nothing (the standalone `lace-agent allocate`); [`allocate_partial`]
//! is the same allocation with the failures set aside, one per Network or node, so the
//! controller can allocate the rest and report those.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::api::{NetworkAllocationSpec, NetworkSpec, NodeAllocationSpec, Subnet, Underlay};
use crate::sid::{self, SidError};
use crate::state::ClusterState;
use crate::validate::{self, ValidationError};

/// The complete allocation of a cluster: what the controller writes as internal objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Per Network name.
    pub network_allocations: BTreeMap<String, NetworkAllocationSpec>,
    /// Per node name.
    pub node_allocations: BTreeMap<String, NodeAllocationSpec>,
}

impl Allocation {
    /// Replaces the allocations recorded in `state` with these.
    pub fn store_in(self, state: &mut ClusterState) {
        state.network_allocations = self.network_allocations;
        state.node_allocations = self.node_allocations;
    }
}

/// Why an allocation could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A Network's subnets are invalid (the allocator relies on the validation rules).
    #[error("cannot allocate for invalid Networks: {}", join(.0))]
    InvalidNetworks(Vec<ValidationError>),
    /// The locator prefix is unusable.
    #[error(transparent)]
    Locator(#[from] SidError),
    /// There are nodes but no locator prefix to carve their locators from.
    #[error("no srv6LocatorPrefix is configured: cannot allocate locators for {nodes} nodes")]
    NoLocatorPrefix { nodes: usize },
    /// The node has no address usable as SRv6 underlay.
    #[error("Node {node} has no usable InternalIP in status.addresses: the other nodes need one (IPv4 or IPv6; not loopback, link-local, multicast or unspecified) to reach its SRv6 locator")]
    NoUnderlay { node: String },
    /// Every node index of the locator prefix is taken.
    #[error("srv6LocatorPrefix {prefix} is exhausted: all {max} node locators are taken, none left for Node {node}")]
    LocatorsExhausted {
        prefix: Ipv6Net,
        max: u32,
        node: String,
    },
    /// Every SID function is taken.
    #[error(
        "SID functions are exhausted: all {} are taken, none left for Network {network}",
        u16::MAX
    )]
    FunctionsExhausted { network: String },
}

fn join(errors: &[ValidationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Computes the complete allocation for `state`, keeping every still-valid allocation that
/// `state` already records. See the module docs for the rules. All or nothing: the first
/// failure [`allocate_partial`] reports is the error.
pub fn allocate(state: &ClusterState) -> Result<Allocation, AllocError> {
    let mut invalid = Vec::new();
    for (name, spec) in &state.networks {
        if let Err(errors) = validate::validate_network(name, spec) {
            invalid.extend(errors);
        }
    }
    if !invalid.is_empty() {
        return Err(AllocError::InvalidNetworks(invalid));
    }
    let Partial {
        allocation,
        failures,
    } = allocate_partial(state);
    match failures.into_iter().next() {
        Some(first) => Err(first),
        None => Ok(allocation),
    }
}

/// What [`allocate_partial`] allocated, and why the rest could not be.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partial {
    pub allocation: Allocation,
    /// One error per Network or node left out or kept as recorded, each naming it: Networks
    /// first, then nodes, each in name order.
    pub failures: Vec<AllocError>,
}

/// Allocates everything in `state` that can be allocated, with the rules of [`allocate`]:
/// the controller's pass, where one node without an address must not hold up the rest.
/// Whatever [`allocate`] accepts gets exactly the same result here.
///
/// - An invalid Network is treated as absent (one `InvalidNetworks` failure each).
/// - Without a usable locator prefix no node is allocated (one failure).
/// - A node without an InternalIP gets nothing new; if it already holds a valid allocation
///   it keeps it with the underlay last recorded (so its index is never handed to another
///   node while its address is missing). Either way it is reported (`NoUnderlay`).
/// - Once SID functions or node locators run out, each Network or node still without one
///   is reported.
pub fn allocate_partial(state: &ClusterState) -> Partial {
    let mut failures = Vec::new();
    let valid: Vec<&String> = state
        .networks
        .iter()
        .filter_map(
            |(name, spec)| match validate::validate_network(name, spec) {
                Ok(()) => Some(name),
                Err(errors) => {
                    failures.push(AllocError::InvalidNetworks(errors));
                    None
                }
            },
        )
        .collect();
    let network_allocations = allocate_functions(state, &valid, &mut failures);
    let node_allocations = allocate_nodes(state, &mut failures);
    Partial {
        allocation: Allocation {
            network_allocations,
            node_allocations,
        },
        failures,
    }
}

/// Hands out the lowest free values of `first..=last` once the existing claims are settled.
///
/// A sorted vector and a forward cursor instead of a set: the claims are known up front and
/// new values only go out in ascending order, so this stays linear after one sort.
#[derive(Debug)]
struct LowestFree {
    /// Claimed values, sorted and distinct.
    used: Vec<u128>,
    /// Position in `used` of the first value not below `next`.
    pos: usize,
    /// The next candidate; `None` once the range is used up.
    next: Option<u128>,
    last: u128,
}

impl LowestFree {
    /// Settles the existing claims: `claims[i]` is the value owner `i` holds, if any, with the
    /// owners in name order. A value out of range, or already held by an earlier owner, is
    /// rejected. Returns the pool and the accepted value of each owner.
    fn settle(first: u128, last: u128, claims: &[Option<u128>]) -> (Self, Vec<Option<u128>>) {
        let mut by_value: Vec<(u128, usize)> = claims
            .iter()
            .enumerate()
            .filter_map(|(owner, claim)| {
                claim
                    .filter(|v| (first..=last).contains(v))
                    .map(|v| (v, owner))
            })
            .collect();
        // Sorting by (value, owner) puts the earliest owner of a value first.
        by_value.sort_unstable();
        let mut accepted = vec![None; claims.len()];
        let mut used = Vec::with_capacity(by_value.len());
        for (value, owner) in by_value {
            if used.last() != Some(&value) {
                used.push(value);
                accepted[owner] = Some(value);
            }
        }
        (
            Self {
                used,
                pos: 0,
                next: Some(first),
                last,
            },
            accepted,
        )
    }

    /// The lowest value neither claimed nor taken yet.
    fn take(&mut self) -> Option<u128> {
        loop {
            let candidate = self.next.filter(|c| *c <= self.last)?;
            self.next = candidate.checked_add(1);
            while self.used.get(self.pos).is_some_and(|u| *u < candidate) {
                self.pos += 1;
            }
            if self.used.get(self.pos) != Some(&candidate) {
                return Some(candidate);
            }
        }
    }
}

fn allocate_functions(
    state: &ClusterState,
    networks: &[&String],
    failures: &mut Vec<AllocError>,
) -> BTreeMap<String, NetworkAllocationSpec> {
    let claims: Vec<Option<u128>> = networks
        .iter()
        .map(|name| {
            state
                .network_allocations
                .get(*name)
                .map(|a| u128::from(a.function))
        })
        .collect();
    let (mut free, accepted) = LowestFree::settle(1, u128::from(u16::MAX), &claims);
    let mut out = BTreeMap::new();
    for (name, kept) in networks.iter().zip(accepted) {
        match kept
            .or_else(|| free.take())
            .and_then(|f| u16::try_from(f).ok())
        {
            Some(function) => {
                out.insert((*name).clone(), NetworkAllocationSpec { function });
            }
            None => failures.push(AllocError::FunctionsExhausted {
                network: (*name).clone(),
            }),
        }
    }
    out
}

/// The blocks of one subnet, numbered from 0 at the subnet's first address.
#[derive(Debug)]
struct BlockPool {
    cidr: IpNet,
    block_prefix: u8,
    /// Host bits of one block (`max_prefix_len - block_prefix`).
    shift: u32,
    /// Number of blocks (saturated at `u128::MAX`).
    count: u128,
}

fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

impl BlockPool {
    /// `subnet` must be valid (see [`validate::validate_network`]).
    fn new(subnet: &Subnet) -> Self {
        let cidr = subnet.cidr.trunc();
        let shift = u32::from(cidr.max_prefix_len().saturating_sub(subnet.block_prefix));
        let count = 1u128
            .checked_shl(u32::from(
                subnet.block_prefix.saturating_sub(cidr.prefix_len()),
            ))
            .unwrap_or(u128::MAX);
        Self {
            cidr,
            block_prefix: subnet.block_prefix,
            shift,
            count,
        }
    }

    /// The number of the block holding `addr`, if `addr` lies in this pool.
    fn offset_of(&self, addr: IpAddr) -> Option<u128> {
        if !self.cidr.contains(&addr) {
            return None;
        }
        let delta = addr_bits(addr) - addr_bits(self.cidr.network());
        Some(delta.checked_shr(self.shift).unwrap_or(0))
    }

    /// Block number `offset`; `None` if the pool has no such block.
    fn block(&self, offset: u128) -> Option<IpNet> {
        if offset >= self.count {
            return None;
        }
        let start = addr_bits(self.cidr.network()) + offset.checked_shl(self.shift).unwrap_or(0);
        let block = match self.cidr {
            IpNet::V4(_) => IpNet::V4(
                Ipv4Net::new(
                    Ipv4Addr::from(u32::try_from(start).ok()?),
                    self.block_prefix,
                )
                .ok()?,
            ),
            IpNet::V6(_) => IpNet::V6(Ipv6Net::new(Ipv6Addr::from(start), self.block_prefix).ok()?),
        };
        Some(block)
    }
}

/// The address blocks node `index` holds in a Network with these `subnets`: block
/// `index - 1` of each, in the subnets' order. Empty for an external Network (no subnets),
/// and empty when any subnet has fewer than `index` blocks (all or nothing, so a dual-stack
/// Network's pods always get both families).
///
/// `subnets` must be valid (see [`validate::validate_network`]).
pub fn node_blocks(index: u32, subnets: &[Subnet]) -> Vec<IpNet> {
    let Some(offset) = index.checked_sub(1).map(u128::from) else {
        return Vec::new();
    };
    subnets
        .iter()
        .map(|s| BlockPool::new(s).block(offset))
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default()
}

/// How many nodes can hold blocks of a Network with these `subnets`: the fewest blocks of any
/// subnet (saturated at `u32::MAX`); node indices above it get none. 0 for no subnets.
pub fn block_capacity(subnets: &[Subnet]) -> u32 {
    subnets
        .iter()
        .map(|s| u32::try_from(BlockPool::new(s).count).unwrap_or(u32::MAX))
        .min()
        .unwrap_or(0)
}

/// The index of the node whose block of `subnet` holds `addr`, if `addr` is in `subnet` and
/// that block belongs to a node index (`1..=u32::MAX`).
pub fn block_owner(subnet: &Subnet, addr: IpAddr) -> Option<u32> {
    let offset = BlockPool::new(subnet).offset_of(addr)?;
    u32::try_from(offset.checked_add(1)?).ok()
}

/// The nodes (by name) that hold no block of `network`: their index lies beyond the
/// Network's [`block_capacity`]. Empty for external Networks.
pub fn nodes_without_blocks<'a>(
    network: &NetworkSpec,
    node_allocations: &'a BTreeMap<String, NodeAllocationSpec>,
) -> Vec<&'a str> {
    if network.external {
        return Vec::new();
    }
    let capacity = block_capacity(&network.subnets);
    node_allocations
        .iter()
        .filter(|(_, a)| a.index > capacity)
        .map(|(name, _)| name.as_str())
        .collect()
}

fn allocate_nodes(
    state: &ClusterState,
    failures: &mut Vec<AllocError>,
) -> BTreeMap<String, NodeAllocationSpec> {
    let mut out = BTreeMap::new();
    if state.nodes.is_empty() {
        return out;
    }
    let Some(prefix) = state.config.srv6_locator_prefix else {
        failures.push(AllocError::NoLocatorPrefix {
            nodes: state.nodes.len(),
        });
        return out;
    };
    let max = match sid::max_node_index(prefix) {
        Ok(max) => max,
        Err(e) => {
            failures.push(e.into());
            return out;
        }
    };
    let claims: Vec<Option<u128>> = state
        .nodes
        .keys()
        .map(|name| {
            state
                .node_allocations
                .get(name)
                .map(|a| u128::from(a.index))
        })
        .collect();
    let (mut free, accepted) = LowestFree::settle(1, u128::from(max), &claims);
    for ((name, node), kept) in state.nodes.iter().zip(accepted) {
        let mut underlay = node.underlay();
        if underlay == Underlay::default() {
            failures.push(AllocError::NoUnderlay { node: name.clone() });
            match (kept, state.node_allocations.get(name)) {
                (Some(_), Some(recorded)) => underlay = recorded.underlay,
                _ => continue,
            }
        }
        let Some(index) = kept
            .or_else(|| free.take())
            .and_then(|i| u32::try_from(i).ok())
        else {
            failures.push(AllocError::LocatorsExhausted {
                prefix,
                max,
                node: name.clone(),
            });
            continue;
        };
        match sid::node_locator(prefix, index) {
            Ok(locator) => {
                out.insert(
                    name.clone(),
                    NodeAllocationSpec {
                        index,
                        locator,
                        underlay,
                    },
                );
            }
            // In range by construction; reported rather than unwrapped.
            Err(e) => failures.push(e.into()),
        }
    }
    out
}

#[cfg(test)]
mod tests;
