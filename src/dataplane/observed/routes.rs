//! Lace's routes as the kernel holds them, by key ([`KernelRoutes`]): the list a dump read,
//! sorted, and a small map of what changed since. A dump's 200,000 routes arrive in the
//! kernel's order, which is nearly the key order: made a list by one sort that finds a
//! handful of runs, where a tree built from them took longer than the rest of a restart's
//! reading after the kernel's dump (measured in the test VM at 5,000 nodes x 50 Networks:
//! 45-67 ms of 0.43 s). The kernel's notifications then replace, add and remove single
//! routes: a replace is written into the list in place, an addition or removal goes to the
//! map, and the two are merged into one list again once the map holds half as many routes as
//! the list.

use std::collections::BTreeMap;
use std::fmt;
use std::iter::Peekable;
use std::ops::Bound;

use super::KernelNexthop;
use crate::plan::{RouteKey, Tables};

/// Changes the map holds before it is merged into the list whatever the list's size: below
/// it, a merge costs more than the lookups it saves.
const MERGE_MIN: usize = 1024;

/// Lace's routes by key, as a map: one next hop per key, walked in key order.
#[derive(Clone, Default)]
pub struct KernelRoutes {
    /// Sorted by key, one route per key: what a dump read, with replaces written in place.
    /// A key that `changed` holds is decided there.
    dumped: Vec<(RouteKey, KernelNexthop)>,
    /// Routes added since the dump (`Some`) and routes of the dump removed since (`None`).
    changed: BTreeMap<RouteKey, Option<KernelNexthop>>,
    len: usize,
}

impl KernelRoutes {
    /// The routes of a dump, in any order; of two with one key, the later is kept.
    pub fn from_dump(mut routes: Vec<(RouteKey, KernelNexthop)>) -> Self {
        // Stable, so that of equal keys the later stays later: nearly sorted input is a few
        // runs merged.
        routes.sort_by_key(|a| a.0);
        // Of equal keys, the later's route takes the kept one's place.
        routes.dedup_by(|later, kept| {
            let equal = later.0 == kept.0;
            if equal {
                std::mem::swap(later, kept);
            }
            equal
        });
        Self {
            len: routes.len(),
            dumped: routes,
            changed: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `key` is in the list, if there.
    fn position(&self, key: &RouteKey) -> Option<usize> {
        self.dumped.binary_search_by(|(k, _)| k.cmp(key)).ok()
    }

    pub fn get(&self, key: &RouteKey) -> Option<&KernelNexthop> {
        match self.changed.get(key) {
            Some(changed) => changed.as_ref(),
            None => self.position(key).map(|i| &self.dumped[i].1),
        }
    }

    pub fn contains_key(&self, key: &RouteKey) -> bool {
        self.get(key).is_some()
    }

    /// Sets the route at `key` (added or replaced).
    pub fn insert(&mut self, key: RouteKey, nh: KernelNexthop) {
        if let Some(changed) = self.changed.get_mut(&key) {
            self.len += usize::from(changed.is_none());
            *changed = Some(nh);
            return;
        }
        match self.position(&key) {
            Some(i) => self.dumped[i].1 = nh,
            None => {
                self.changed.insert(key, Some(nh));
                self.len += 1;
                self.merge_if_large();
            }
        }
    }

    /// Removes the route at `key`; returns whether there was one.
    pub fn remove(&mut self, key: &RouteKey) -> bool {
        let dumped = self.position(key).is_some();
        let had = match self.changed.get_mut(key) {
            Some(changed) => {
                let had = changed.take().is_some();
                if !dumped {
                    self.changed.remove(key);
                }
                had
            }
            None if dumped => {
                self.changed.insert(*key, None);
                self.merge_if_large();
                true
            }
            None => false,
        };
        self.len -= usize::from(had);
        had
    }

    /// Keeps the routes for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&RouteKey, &mut KernelNexthop) -> bool) {
        let changed = &mut self.changed;
        self.dumped
            .retain_mut(|(k, nh)| changed.contains_key(k) || keep(k, nh));
        let dumped = &self.dumped;
        let position = |key: &RouteKey| dumped.binary_search_by(|(k, _)| k.cmp(key)).is_ok();
        changed.retain(|k, nh| {
            if let Some(route) = nh {
                if keep(k, route) {
                    return true;
                }
                *nh = None;
            }
            // A removal is kept while the list holds the route it removes.
            position(k)
        });
        self.len = self.iter().count();
    }

    /// Every route's next hop, to change in place (routes removed since the dump included:
    /// changing them changes nothing).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut KernelNexthop> {
        let dumped = self.dumped.iter_mut().map(|(_, nh)| nh);
        dumped.chain(self.changed.values_mut().flatten())
    }

    /// The routes in key order.
    pub fn iter(&self) -> Iter<'_> {
        self.of_tables(Tables::ALL)
    }

    /// The routes from `first` on, in key order.
    pub fn range_from(&self, first: &RouteKey) -> Iter<'_> {
        let start = self.dumped.partition_point(|(k, _)| k < first);
        Iter::new(&self.dumped[start..], self.changed.range(first..))
    }

    /// The routes of the tables in `tables`, in key order.
    pub fn of_tables(&self, tables: Tables) -> Iter<'_> {
        let (start, end) = tables.ids();
        let at = |table: Bound<u32>| match table {
            Bound::Included(t) | Bound::Excluded(t) => {
                self.dumped.partition_point(|(k, _)| k.table < t)
            }
            Bound::Unbounded => self.dumped.len(),
        };
        Iter::new(
            &self.dumped[at(start)..at(end)],
            self.changed.range(tables.keys()),
        )
    }

    /// The table of the route in the middle of the dump, if any: where to cut the routes in
    /// two halves about as large.
    pub fn middle_table(&self) -> Option<u32> {
        self.dumped.get(self.dumped.len() / 2).map(|(k, _)| k.table)
    }

    pub fn keys(&self) -> impl Iterator<Item = &RouteKey> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &KernelNexthop> {
        self.iter().map(|(_, nh)| nh)
    }

    /// One list again once the map is half the list's size (and at least [`MERGE_MIN`]):
    /// the merge, a walk of both, is then paid for by the changes that filled the map.
    fn merge_if_large(&mut self) {
        if self.changed.len() >= MERGE_MIN.max(self.dumped.len() / 2) {
            self.dumped = std::mem::take(self).into_vec();
            self.len = self.dumped.len();
        }
    }

    /// The routes in key order, as a list.
    fn into_vec(self) -> Vec<(RouteKey, KernelNexthop)> {
        if self.changed.is_empty() {
            return self.dumped;
        }
        let mut merged = Vec::with_capacity(self.len);
        let mut changed = self.changed.into_iter().peekable();
        for (k, nh) in self.dumped {
            while let Some((c, route)) = changed.next_if(|(c, _)| *c < k) {
                merged.extend(route.map(|r| (c, r)));
            }
            match changed.next_if(|(c, _)| *c == k) {
                Some((c, route)) => merged.extend(route.map(|r| (c, r))),
                None => merged.push((k, nh)),
            }
        }
        merged.extend(changed.filter_map(|(c, route)| route.map(|r| (c, r))));
        merged
    }
}

/// [`KernelRoutes`]' routes in key order: the list and the map walked side by side, the
/// map's entry deciding a key both hold.
#[derive(Debug)]
pub struct Iter<'a> {
    dumped: Peekable<std::slice::Iter<'a, (RouteKey, KernelNexthop)>>,
    changed: Peekable<std::collections::btree_map::Range<'a, RouteKey, Option<KernelNexthop>>>,
}

impl<'a> Iter<'a> {
    fn new(
        dumped: &'a [(RouteKey, KernelNexthop)],
        changed: std::collections::btree_map::Range<'a, RouteKey, Option<KernelNexthop>>,
    ) -> Self {
        Self {
            dumped: dumped.iter().peekable(),
            changed: changed.peekable(),
        }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a RouteKey, &'a KernelNexthop);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let Some(&(changed, route)) = self.changed.peek() else {
                // Nothing changed from here on: the list as it is.
                return self.dumped.next().map(|(k, nh)| (k, nh));
            };
            match self.dumped.peek() {
                Some(&dumped) if dumped.0 < *changed => {
                    self.dumped.next();
                    return Some((&dumped.0, &dumped.1));
                }
                // Decided by the map.
                Some(&dumped) if dumped.0 == *changed => {
                    self.dumped.next();
                }
                _ => {}
            }
            self.changed.next();
            if let Some(nh) = route {
                return Some((changed, nh));
            }
        }
    }
}

impl<'a> IntoIterator for &'a KernelRoutes {
    type Item = (&'a RouteKey, &'a KernelNexthop);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl IntoIterator for KernelRoutes {
    type Item = (RouteKey, KernelNexthop);
    type IntoIter = std::vec::IntoIter<(RouteKey, KernelNexthop)>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl FromIterator<(RouteKey, KernelNexthop)> for KernelRoutes {
    fn from_iter<I: IntoIterator<Item = (RouteKey, KernelNexthop)>>(routes: I) -> Self {
        Self::from_dump(routes.into_iter().collect())
    }
}

impl Extend<(RouteKey, KernelNexthop)> for KernelRoutes {
    fn extend<I: IntoIterator<Item = (RouteKey, KernelNexthop)>>(&mut self, routes: I) {
        for (key, nh) in routes {
            self.insert(key, nh);
        }
    }
}

impl std::ops::Index<&RouteKey> for KernelRoutes {
    type Output = KernelNexthop;

    fn index(&self, key: &RouteKey) -> &KernelNexthop {
        self.get(key).expect("no route at that key")
    }
}

/// Equal when they hold the same routes, however each came to hold them.
impl PartialEq for KernelRoutes {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for KernelRoutes {}

impl fmt::Debug for KernelRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests;
