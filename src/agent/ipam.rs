//! Pod IPAM persisted on the node: which attachment (container id, ifname) holds which
//! addresses of which Network.
//!
//! Why it is safe across restarts, crashes and reboots:
//! - every change is written before the kernel is touched (allocate → persist → create the
//!   veth), so a crash can leave a record without an interface, never an interface without a
//!   record; the agent's start-up check ([`IpamStore::retain`]) then releases records whose
//!   host veth is gone and removes Lace veths without a record;
//! - writes are atomic: the whole store goes to a temporary file in the same directory, is
//!   fsynced, renamed over `ipam.json` and the directory is fsynced. A torn temporary file is
//!   never read (only `ipam.json` is);
//! - one process at a time: the store holds an exclusive `flock` on `ipam.lock` for its whole
//!   life (a second agent on the same state directory fails to start), and an in-process mutex
//!   serialises concurrent ADDs, so no address is handed out twice.
//!
//! Addresses handed out (decided here, documented in the agent's README section):
//! - IPv4 blocks shorter than /31: never the block's network address nor its broadcast
//!   address (pods get /32s and a link-local gateway, so neither has a role, but tools and
//!   people treat `.0` and `.255` specially); /31 and /32 blocks use every address (RFC 3021);
//! - IPv6 blocks: never the block's first address, the subnet-router anycast address
//!   (RFC 4291 §2.6.1);
//! - nothing else is reserved: the pods' gateway is link-local, not in the block.
//!
//! The lowest free address is taken, so addresses are reused after release.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::{self, File, OpenOptions};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::bandwidth::Bandwidth;
use crate::hostport::HostPort;
use crate::state::{ObjectKey, PodAttachment};

/// The store's file in the state directory.
pub const STORE_FILE: &str = "ipam.json";
/// The lock file held by the agent that owns the state directory.
pub const LOCK_FILE: &str = "ipam.lock";
/// Version of the on-disk format.
const FORMAT_VERSION: u32 = 1;
/// How long [`IpamStore::open`] waits for another process to release the lock (an agent
/// being replaced by its successor).
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// What went wrong in the IPAM store. Every variant names the file, Network or block.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("IPAM state {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("IPAM state {path} is corrupt: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "IPAM state {path} has format version {found}, this agent reads version {FORMAT_VERSION}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("IPAM lock {path} is held by another process (is another lace-agent using this state directory?): {errno}")]
    Locked {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("Network {network:?} has no free address left in block {block} on this node")]
    Exhausted { network: String, block: IpNet },
    #[error("Network {network:?} has no block on this node")]
    NoBlocks { network: String },
    #[error(
        "hostPort {port} is taken on this node by pod {holder} (container {container}): a node \
         exposes one host address, port and protocol once; delete that pod or give this one \
         another hostPort"
    )]
    HostPortTaken {
        port: String,
        holder: ObjectKey,
        container: String,
    },
    #[error("IPAM state lock poisoned by a panic in another request")]
    Poisoned,
}

/// What one ADD asks of the store for its attachment.
#[derive(Clone, Debug)]
pub struct Claim<'a> {
    pub pod: &'a ObjectKey,
    /// The Network, and this node's blocks of it (one address is taken from each).
    pub network: &'a str,
    pub blocks: &'a [IpNet],
    pub host_ifname: &'a str,
    pub netns: Option<PathBuf>,
    /// The pod's hostPorts: none may conflict with another attachment's.
    pub host_ports: Vec<HostPort>,
    /// What the pod's traffic is shaped to.
    pub bandwidth: Option<Bandwidth>,
}

/// Identity of one pod interface: what the runtime passes as `CNI_CONTAINERID` and
/// `CNI_IFNAME` (and lists in `cni.dev/valid-attachments`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttachmentKey {
    pub container_id: String,
    pub ifname: String,
}

impl std::fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.container_id, self.ifname)
    }
}

/// What the store knows about one attachment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub pod: ObjectKey,
    pub network: String,
    /// Host side of the pod's veth.
    pub host_ifname: String,
    /// One host address (`/32`, `/128`) per block of the Network on this node.
    pub ips: Vec<IpNet>,
    /// `CNI_NETNS` at ADD (for CHECK and for cleaning a half-created pod at DEL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<PathBuf>,
    /// The pod's hostPorts (`runtimeConfig.portMappings` at ADD).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
    /// What the pod's traffic is shaped to (`runtimeConfig.bandwidth` at ADD); records
    /// written before Lace shaped pods have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
}

impl Record {
    /// The attachment as the planner sees it.
    pub fn to_pod_attachment(&self, key: &AttachmentKey) -> PodAttachment {
        PodAttachment {
            pod: self.pod.clone(),
            container_id: key.container_id.clone(),
            host_ifname: self.host_ifname.clone(),
            network: self.network.clone(),
            ips: self.ips.clone(),
            host_ports: self.host_ports.clone(),
            bandwidth: self.bandwidth,
        }
    }
}

/// The file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StoreFile {
    version: u32,
    attachments: Vec<(AttachmentKey, Record)>,
}

/// The persisted IPAM store of one node. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct IpamStore {
    dir: PathBuf,
    records: Mutex<BTreeMap<AttachmentKey, Record>>,
    /// Held for the store's life; released by the kernel when the process dies.
    _lock: Flock<File>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IpamError + '_ {
    move |source| IpamError::Io {
        path: path.to_owned(),
        source,
    }
}

impl IpamStore {
    /// Opens (creating if needed) the store in `dir`, taking its lock and loading
    /// `ipam.json`. Leftover temporary files of a crashed write are removed.
    pub fn open(dir: &Path) -> Result<Self, IpamError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        let lock = take_lock(lock_file, &lock_path)?;
        let records = load(dir)?;
        // Temporary files are only ever half-written leftovers of a crash: we hold the lock.
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            if crate::durable::is_leftover(&entry.file_name().to_string_lossy()) {
                let p = entry.path();
                fs::remove_file(&p).map_err(io_err(&p))?;
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
            records: Mutex::new(records),
            _lock: lock,
        })
    }

    /// The attachments recorded in `dir`, read without taking the lock (`lace-agent plan
    /// --state-dir` beside a running agent: writes replace the file atomically, so a read sees
    /// one whole state).
    pub fn read_attachments(dir: &Path) -> Result<Vec<PodAttachment>, IpamError> {
        Ok(load(dir)?
            .iter()
            .map(|(k, r)| r.to_pod_attachment(k))
            .collect())
    }

    fn lock(&self) -> Result<MutexGuard<'_, BTreeMap<AttachmentKey, Record>>, IpamError> {
        self.records.lock().map_err(|_| IpamError::Poisoned)
    }

    /// Every record, sorted by key.
    pub fn records(&self) -> Result<Vec<(AttachmentKey, Record)>, IpamError> {
        Ok(self
            .lock()?
            .iter()
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect())
    }

    /// The record of `key`, if any.
    pub fn get(&self, key: &AttachmentKey) -> Result<Option<Record>, IpamError> {
        Ok(self.lock()?.get(key).cloned())
    }

    /// The attachments as the planner takes them.
    pub fn pod_attachments(&self) -> Result<Vec<PodAttachment>, IpamError> {
        Ok(self
            .lock()?
            .iter()
            .map(|(k, r)| r.to_pod_attachment(k))
            .collect())
    }

    /// Addresses in use per Network.
    pub fn in_use(&self) -> Result<BTreeMap<String, usize>, IpamError> {
        let mut out = BTreeMap::new();
        for r in self.lock()?.values() {
            *out.entry(r.network.clone()).or_default() += r.ips.len();
        }
        Ok(out)
    }

    /// Allocates one address from each of the claim's blocks (this node's blocks of its
    /// Network) for `key`, with its hostPorts, and persists it before returning. If `key`
    /// already holds addresses of the same Network (a retried ADD), they are returned
    /// unchanged; if it holds another Network's, those are released first. A hostPort another
    /// attachment holds fails the claim.
    pub fn allocate(&self, key: &AttachmentKey, claim: Claim<'_>) -> Result<Record, IpamError> {
        let Claim {
            pod,
            network,
            blocks,
            host_ifname,
            netns,
            host_ports,
            bandwidth,
        } = claim;
        if blocks.is_empty() {
            return Err(IpamError::NoBlocks {
                network: network.to_owned(),
            });
        }
        let mut records = self.lock()?;
        for (k, r) in records.iter().filter(|(k, _)| *k != key) {
            if let Some(hp) = host_ports
                .iter()
                .find(|hp| r.host_ports.iter().any(|o| o.conflicts_with(hp)))
            {
                return Err(IpamError::HostPortTaken {
                    port: hp.to_string(),
                    holder: r.pod.clone(),
                    container: k.container_id.clone(),
                });
            }
        }
        if let Some(existing) = records.get(key) {
            if existing.network == network
                && existing.ips.len() == blocks.len()
                && existing
                    .ips
                    .iter()
                    .zip(blocks)
                    .all(|(ip, b)| b.contains(&ip.addr()))
            {
                let mut rec = existing.clone();
                if rec.netns != netns || rec.host_ports != host_ports || rec.bandwidth != bandwidth
                {
                    rec.netns = netns;
                    rec.host_ports = host_ports;
                    rec.bandwidth = bandwidth;
                    records.insert(key.clone(), rec.clone());
                    self.persist(&records)?;
                }
                return Ok(rec);
            }
        }
        let used: HashSet<IpAddr> = records
            .iter()
            .filter(|(k, _)| *k != key)
            .flat_map(|(_, r)| r.ips.iter().map(|ip| ip.addr()))
            .collect();
        let mut ips = Vec::with_capacity(blocks.len());
        for block in blocks {
            let ip = first_free(*block, &used).ok_or_else(|| IpamError::Exhausted {
                network: network.to_owned(),
                block: *block,
            })?;
            ips.push(host_net(ip));
        }
        let rec = Record {
            pod: pod.clone(),
            network: network.to_owned(),
            host_ifname: host_ifname.to_owned(),
            ips,
            netns,
            host_ports,
            bandwidth,
        };
        let previous = records.insert(key.clone(), rec.clone());
        if let Err(e) = self.persist(&records) {
            // Keep memory equal to disk: the caller reports the error and creates nothing.
            match previous {
                Some(p) => records.insert(key.clone(), p),
                None => records.remove(key),
            };
            return Err(e);
        }
        Ok(rec)
    }

    /// Releases `key`'s addresses; returns the record if there was one.
    pub fn release(&self, key: &AttachmentKey) -> Result<Option<Record>, IpamError> {
        let mut records = self.lock()?;
        let Some(rec) = records.remove(key) else {
            return Ok(None);
        };
        if let Err(e) = self.persist(&records) {
            records.insert(key.clone(), rec);
            return Err(e);
        }
        Ok(Some(rec))
    }

    /// Keeps the records for which `keep` is true and releases the others (GC, start-up
    /// verification); returns the released ones.
    pub fn retain(
        &self,
        mut keep: impl FnMut(&AttachmentKey, &Record) -> bool,
    ) -> Result<Vec<(AttachmentKey, Record)>, IpamError> {
        let mut records = self.lock()?;
        let drop: BTreeSet<AttachmentKey> = records
            .iter()
            .filter(|(k, r)| !keep(k, r))
            .map(|(k, _)| k.clone())
            .collect();
        if drop.is_empty() {
            return Ok(Vec::new());
        }
        let before = records.clone();
        let released: Vec<_> = drop
            .into_iter()
            .filter_map(|k| records.remove_entry(&k))
            .collect();
        if let Err(e) = self.persist(&records) {
            *records = before;
            return Err(e);
        }
        Ok(released)
    }

    /// Writes `records` durably ([`crate::durable::write`]).
    fn persist(&self, records: &BTreeMap<AttachmentKey, Record>) -> Result<(), IpamError> {
        let file = StoreFile {
            version: FORMAT_VERSION,
            attachments: records
                .iter()
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect(),
        };
        let bytes = serde_json::to_vec(&file).map_err(|e| IpamError::Io {
            path: self.dir.join(STORE_FILE),
            source: std::io::Error::other(e),
        })?;
        crate::durable::write(&self.dir, STORE_FILE, &mut bytes.as_slice(), 0o600)
            .map(drop)
            .map_err(|e| IpamError::Io {
                path: e.path,
                source: e.source,
            })
    }
}

/// The records of `ipam.json` in `dir`; none when there is no such file.
fn load(dir: &Path) -> Result<BTreeMap<AttachmentKey, Record>, IpamError> {
    let path = dir.join(STORE_FILE);
    match fs::read(&path) {
        Ok(bytes) => {
            let file: StoreFile =
                serde_json::from_slice(&bytes).map_err(|source| IpamError::Corrupt {
                    path: path.clone(),
                    source,
                })?;
            if file.version != FORMAT_VERSION {
                return Err(IpamError::Version {
                    path,
                    found: file.version,
                });
            }
            Ok(file.attachments.into_iter().collect())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(io_err(&path)(e)),
    }
}

fn take_lock(mut file: File, path: &Path) -> Result<Flock<File>, IpamError> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, errno)) => {
                if errno != nix::errno::Errno::EWOULDBLOCK || Instant::now() >= deadline {
                    return Err(IpamError::Locked {
                        path: path.to_owned(),
                        errno,
                    });
                }
                file = f;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn host_net(ip: IpAddr) -> IpNet {
    match ip {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::from(a)),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::from(a)),
    }
}

/// The lowest address of `block` that is neither reserved (see the module docs) nor in
/// `used`. Looks at most `used.len() + 1` usable candidates, so it is fast even for a /64.
fn first_free(block: IpNet, used: &HashSet<IpAddr>) -> Option<IpAddr> {
    match block.trunc() {
        IpNet::V4(b) => {
            let first = u32::from(b.network());
            let last = u32::from(b.broadcast());
            let (lo, hi) = if b.prefix_len() >= 31 {
                (first, last)
            } else {
                (first + 1, last - 1)
            };
            (lo..=hi)
                .map(|n| IpAddr::V4(Ipv4Addr::from(n)))
                .take(used.len() + 1)
                .find(|a| !used.contains(a))
        }
        IpNet::V6(b) => {
            let first = u128::from(b.network());
            let last = u128::from(b.broadcast());
            let lo = if b.prefix_len() == 128 {
                first
            } else {
                first + 1
            };
            (lo..=last)
                .map(|n| IpAddr::V6(Ipv6Addr::from(n)))
                .take(used.len() + 1)
                .find(|a| !used.contains(a))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(i: usize) -> AttachmentKey {
        AttachmentKey {
            container_id: format!("c{i:04}"),
            ifname: "eth0".into(),
        }
    }

    fn pod(i: usize) -> ObjectKey {
        ObjectKey::new("default", format!("p{i}"))
    }

    fn blocks() -> Vec<IpNet> {
        vec![
            "10.244.64.0/24".parse().unwrap(),
            "fd00:244:0:100::/64".parse().unwrap(),
        ]
    }

    fn claim<'a>(
        pod: &'a ObjectKey,
        network: &'a str,
        blocks: &'a [IpNet],
        host_ifname: &'a str,
    ) -> Claim<'a> {
        Claim {
            pod,
            network,
            blocks,
            host_ifname,
            netns: None,
            host_ports: Vec::new(),
            bandwidth: None,
        }
    }

    fn alloc(s: &IpamStore, i: usize, blocks: &[IpNet]) -> Result<Record, IpamError> {
        s.allocate(
            &key(i),
            claim(&pod(i), "default", blocks, &format!("lp-{i}")),
        )
    }

    #[test]
    fn concurrent_allocations_never_share_an_address() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(IpamStore::open(dir.path()).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    (0..25)
                        .map(|j| alloc(&store, t * 25 + j, &blocks()).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            for rec in t.join().unwrap() {
                assert_eq!(rec.ips.len(), 2);
                for ip in rec.ips {
                    assert!(seen.insert(ip.addr()), "{ip} handed out twice");
                }
            }
        }
        assert_eq!(seen.len(), 200);
        // Disk agrees with memory.
        let records = store.records().unwrap();
        drop(store);
        assert_eq!(
            IpamStore::open(dir.path()).unwrap().records().unwrap(),
            records
        );
    }

    #[test]
    fn reserved_addresses_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        let rec = alloc(&s, 0, &blocks()).unwrap();
        assert_eq!(rec.ips[0].to_string(), "10.244.64.1/32");
        assert_eq!(rec.ips[1].to_string(), "fd00:244:0:100::1/128");
        // A /30 has exactly two usable addresses, .1 and .2.
        let small: Vec<IpNet> = vec!["192.0.2.0/30".parse().unwrap()];
        let got: Vec<_> = (1..3)
            .map(|i| alloc(&s, i, &small).unwrap().ips[0].addr().to_string())
            .collect();
        assert_eq!(got, ["192.0.2.1", "192.0.2.2"]);
        // /31 uses both.
        let p2p: Vec<IpNet> = vec!["192.0.2.4/31".parse().unwrap()];
        assert_eq!(
            alloc(&s, 3, &p2p).unwrap().ips[0].addr().to_string(),
            "192.0.2.4"
        );
    }

    #[test]
    fn exhaustion_names_network_and_block() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        let small: Vec<IpNet> = vec!["192.0.2.0/30".parse().unwrap()];
        alloc(&s, 0, &small).unwrap();
        alloc(&s, 1, &small).unwrap();
        let err = alloc(&s, 2, &small).unwrap_err();
        assert!(matches!(err, IpamError::Exhausted { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("\"default\"") && msg.contains("192.0.2.0/30"),
            "{msg}"
        );
        // The failed ADD left nothing behind.
        assert_eq!(s.records().unwrap().len(), 2);
        let none = s
            .allocate(&key(9), claim(&pod(9), "tenant", &[], "lp-9"))
            .unwrap_err()
            .to_string();
        assert!(none.contains("\"tenant\""), "{none}");
    }

    #[test]
    fn release_then_reuse_and_idempotent_retry() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        let a = alloc(&s, 0, &blocks()).unwrap();
        let b = alloc(&s, 1, &blocks()).unwrap();
        assert_ne!(a.ips, b.ips);
        // A retried ADD of the same attachment keeps its addresses.
        assert_eq!(alloc(&s, 1, &blocks()).unwrap().ips, b.ips);
        assert_eq!(s.release(&key(0)).unwrap(), Some(a.clone()));
        assert_eq!(
            s.release(&key(0)).unwrap(),
            None,
            "second release is a no-op"
        );
        let c = alloc(&s, 2, &blocks()).unwrap();
        assert_eq!(c.ips, a.ips, "lowest free address is reused");
        assert_eq!(s.in_use().unwrap()["default"], 4);
    }

    #[test]
    fn host_ports_are_kept_and_a_conflict_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        let web = |container_port, host_ip: Option<&str>| HostPort {
            protocol: crate::hostport::Protocol::Tcp,
            host_port: 8080,
            container_port,
            host_ip: host_ip.map(|ip| ip.parse().unwrap()),
        };
        let (pods, blocks): (Vec<ObjectKey>, _) = ((0..3).map(pod).collect(), blocks());
        let with = |i: usize, hp: HostPort| Claim {
            host_ports: vec![hp],
            ..claim(&pods[i], "default", &blocks, "lp")
        };
        let a = s
            .allocate(&key(0), with(0, web(80, Some("192.0.2.1"))))
            .unwrap();
        assert_eq!(a.host_ports, vec![web(80, Some("192.0.2.1"))]);
        // Another address of the node: no conflict.
        s.allocate(&key(1), with(1, web(81, Some("192.0.2.2"))))
            .unwrap();
        // Every address: conflicts with both; nothing is recorded.
        let err = s.allocate(&key(2), with(2, web(82, None))).unwrap_err();
        assert!(matches!(err, IpamError::HostPortTaken { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("8080/TCP -> 82")
                && msg.contains("pod default/p0")
                && msg.contains("container c0"),
            "{msg}"
        );
        assert_eq!(s.records().unwrap().len(), 2);
        // A retried ADD of the holder keeps its port, and it survives a restart.
        s.allocate(&key(0), with(0, web(80, Some("192.0.2.1"))))
            .unwrap();
        drop(s);
        let s = IpamStore::open(dir.path()).unwrap();
        assert_eq!(s.get(&key(0)).unwrap().unwrap().host_ports, a.host_ports);
        assert_eq!(
            s.pod_attachments().unwrap()[0].host_ports,
            a.host_ports,
            "the planner sees the pod's hostPorts"
        );
        assert_eq!(
            IpamStore::read_attachments(dir.path()).unwrap(),
            s.pod_attachments().unwrap(),
            "read beside the running store, without its lock"
        );
        // Released, the port is free again.
        s.release(&key(0)).unwrap();
        s.release(&key(1)).unwrap();
        s.allocate(&key(2), with(2, web(82, None))).unwrap();
    }

    #[test]
    fn bandwidth_is_kept_across_a_restart_and_a_retried_add() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        let (p, blocks) = (pod(0), blocks());
        let shaped = |rate| {
            Some(Bandwidth {
                ingress: Some(crate::bandwidth::Limit {
                    rate,
                    burst: Some(u64::from(u32::MAX)),
                }),
                egress: None,
            })
        };
        let with = |bandwidth| Claim {
            bandwidth,
            ..claim(&p, "default", &blocks, "lp-0")
        };
        let a = s.allocate(&key(0), with(shaped(10_000_000))).unwrap();
        assert_eq!(a.bandwidth, shaped(10_000_000));
        drop(s);
        let s = IpamStore::open(dir.path()).unwrap();
        assert_eq!(
            s.pod_attachments().unwrap()[0].bandwidth,
            shaped(10_000_000),
            "the planner sees the pod's bandwidth after a restart"
        );
        // A retried ADD keeps the addresses and takes the bandwidth it carries.
        let b = s.allocate(&key(0), with(shaped(20_000_000))).unwrap();
        assert_eq!((b.ips, b.bandwidth), (a.ips, shaped(20_000_000)));
        assert_eq!(
            s.get(&key(0)).unwrap().unwrap().bandwidth,
            shaped(20_000_000)
        );
    }

    #[test]
    fn records_written_before_bandwidth_still_load() {
        let dir = tempfile::tempdir().unwrap();
        // What an agent without bandwidth wrote (no `bandwidth` key).
        let old = r#"{"version":1,"attachments":[[{"container_id":"c0000","ifname":"eth0"},
            {"pod":{"namespace":"default","name":"p0"},"network":"default",
             "host_ifname":"lp-0","ips":["192.0.2.1/32"]}]]}"#;
        fs::write(dir.path().join(STORE_FILE), old).unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        let rec = s.get(&key(0)).unwrap().unwrap();
        assert_eq!((rec.host_ifname.as_str(), rec.bandwidth), ("lp-0", None));
        // And an unshaped record is written without the key.
        alloc(&s, 1, &blocks()).unwrap();
        let text = fs::read_to_string(dir.path().join(STORE_FILE)).unwrap();
        assert!(!text.contains("bandwidth"), "{text}");
    }

    #[test]
    fn reload_gives_the_same_state_and_torn_temp_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let records = {
            let s = IpamStore::open(dir.path()).unwrap();
            for i in 0..5 {
                alloc(&s, i, &blocks()).unwrap();
            }
            s.release(&key(2)).unwrap();
            s.records().unwrap()
        };
        // A crash in the middle of a write leaves half a temporary file.
        let torn = crate::durable::temp_path(dir.path(), STORE_FILE, 4242);
        fs::write(&torn, b"{\"version\":1,\"attachments\":[[{\"contai").unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        assert_eq!(s.records().unwrap(), records);
        assert!(!torn.exists(), "leftover removed");
        // And the next allocation fills the hole left by the release.
        assert_eq!(alloc(&s, 7, &blocks()).unwrap().ips, {
            let d = tempfile::tempdir().unwrap();
            let fresh = IpamStore::open(d.path()).unwrap();
            (0..3)
                .map(|i| alloc(&fresh, i, &blocks()).unwrap())
                .last()
                .unwrap()
                .ips
        });
    }

    #[test]
    fn corrupt_store_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STORE_FILE), b"not json").unwrap();
        let err = IpamStore::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(STORE_FILE) && err.contains("corrupt"), "{err}");
    }

    #[test]
    fn retain_releases_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let s = IpamStore::open(dir.path()).unwrap();
        for i in 0..4 {
            alloc(&s, i, &blocks()).unwrap();
        }
        let released = s.retain(|k, _| k.container_id.ends_with('1')).unwrap();
        assert_eq!(released.len(), 3);
        let left: Vec<_> = s.records().unwrap().into_iter().map(|(k, _)| k).collect();
        assert_eq!(left, vec![key(1)]);
        drop(s);
        assert_eq!(
            IpamStore::open(dir.path())
                .unwrap()
                .records()
                .unwrap()
                .len(),
            1
        );
    }
}
