//! Lace's routes as the kernel holds them, by key ([`KernelRoutes`]): the lists a dump read,
//! sorted, one after the other, and a small map of what changed since. A dump's 200,000
//! routes arrive as runs of one table each, a table's nearly in key order: the thread that
//! decodes a run sorts it once the next starts (while the kernel fills the next datagram), by
//! a sort that finds a handful of runs, and the runs become the lists as they are. A tree
//! built from them took longer than the rest of a restart's reading after the kernel's dump
//! (measured in the test VM at 5,000 nodes x 50 Networks: 45-67 ms of 0.43 s), and one list
//! of them all cost a copy as long as the sort. The kernel's notifications then replace, add
//! and remove single routes: a replace is written into the lists in place, an addition or
//! removal goes to the map, and the two are merged into lists again once the map holds half
//! as many routes as the lists.

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
    /// What a dump read, with replaces written in place: lists of one table's routes each,
    /// none empty, each sorted by key with one route per key and each after the one before
    /// (its first key above that one's last). A table's routes are one list, or a few (one
    /// per family, or where a dump split them). A key that `changed` holds is decided there.
    dumped: Vec<TableRoutes>,
    /// Routes added since the dump (`Some`) and routes of the dump removed since (`None`).
    changed: BTreeMap<RouteKey, Option<KernelNexthop>>,
    len: usize,
}

/// One table's routes.
pub type TableRoutes = Vec<(RouteKey, KernelNexthop)>;

/// A run of one table's routes, as a dump sent them.
#[derive(Debug)]
pub struct TableRun {
    table: u32,
    routes: TableRoutes,
    /// Whether `routes` is sorted by key with one route per key (by [`TableRun::sort`]).
    sorted: bool,
}

impl TableRun {
    fn new(route: (RouteKey, KernelNexthop)) -> Self {
        Self {
            table: route.0.table,
            routes: vec![route],
            sorted: false,
        }
    }

    /// Sorts the run, once.
    fn sort(&mut self) {
        if !self.sorted && !self.routes.is_sorted_by(|a, b| a.0 < b.0) {
            sort_table(&mut self.routes);
        }
        self.sorted = true;
    }
}

/// Adds `route` to the last of `runs` if it is of that run's table, else sorts that run and
/// starts one: a dump's routes as [`KernelRoutes::from_table_runs`] takes them, each run but
/// the last sorted by the thread that decoded it.
pub fn push_to_runs(runs: &mut Vec<TableRun>, route: (RouteKey, KernelNexthop)) {
    match runs.last_mut() {
        Some(run) if run.table == route.0.table => run.routes.push(route),
        last => {
            if let Some(run) = last {
                run.sort();
            }
            runs.push(TableRun::new(route));
        }
    }
}

impl KernelRoutes {
    /// The routes of a dump, in any order; of two with one key, the later is kept.
    pub fn from_dump(routes: Vec<(RouteKey, KernelNexthop)>) -> Self {
        let mut runs = Vec::new();
        for route in routes {
            push_to_runs(&mut runs, route);
        }
        Self::from_table_runs(runs)
    }

    /// The routes of a dump as the kernel sends them: runs of one table each, the tables in
    /// any order (the kernel's is that of its hash of their ids, one family after the other),
    /// a table's routes nearly in key order. Of two routes with one key, the later is kept.
    /// The runs become the lists as they are, sorted, where a table's follow each other in
    /// key order (a dump's do, but where a datagram cuts a table between prefixes of one
    /// address): a dump's 200,000 routes are neither copied into one list nor sorted as one
    /// (in the test VM that copy alone, into memory faulted in page by page, took 23-27 ms).
    pub fn from_table_runs(mut runs: Vec<TableRun>) -> Self {
        // Stable: a table's runs stay in the order they came, for the later route to win.
        runs.sort_by_key(|run| run.table);
        let mut dumped: Vec<TableRoutes> = Vec::with_capacity(runs.len());
        let mut runs = runs
            .into_iter()
            .filter(|run| !run.routes.is_empty())
            .peekable();
        while let Some(first) = runs.next() {
            let mut table = vec![first];
            while let Some(run) = runs.next_if(|run| run.table == table[0].table) {
                table.push(run);
            }
            table.iter_mut().for_each(TableRun::sort);
            if in_key_order(table.iter().map(|run| &run.routes)) {
                dumped.extend(table.into_iter().map(|run| run.routes));
            } else {
                let mut routes: TableRoutes =
                    table.into_iter().flat_map(|run| run.routes).collect();
                sort_table(&mut routes);
                dumped.push(routes);
            }
        }
        Self::from_lists(dumped)
    }

    /// The routes of two dumps together; of two routes with one key, `other`'s is kept. Two
    /// dumps of different keys (the two families' routes) are joined list by list, with
    /// nothing copied or sorted again.
    pub fn join(self, other: Self) -> Self {
        if !(self.changed.is_empty() && other.changed.is_empty()) {
            let mut routes = self.into_vec();
            routes.extend(other.into_vec());
            return Self::from_dump(routes);
        }
        // Both dumps' lists by first key, each with whether it is `other`'s.
        let mut lists = Vec::with_capacity(self.dumped.len() + other.dumped.len());
        let mut others = other.dumped.into_iter().peekable();
        for routes in self.dumped {
            while let Some(theirs) = others.next_if(|t| t[0].0 < routes[0].0) {
                lists.push((true, theirs));
            }
            lists.push((false, routes));
        }
        lists.extend(others.map(|theirs| (true, theirs)));
        if in_key_order(lists.iter().map(|(_, routes)| routes)) {
            return Self::from_lists(lists.into_iter().map(|(_, routes)| routes).collect());
        }
        // A key in both: `other`'s routes last, for theirs to be kept.
        lists.sort_by_key(|(theirs, _)| *theirs);
        Self::from_dump(lists.into_iter().flat_map(|(_, routes)| routes).collect())
    }

    /// Of lists as `dumped` holds them.
    fn from_lists(dumped: Vec<TableRoutes>) -> Self {
        Self {
            len: dumped.iter().map(Vec::len).sum(),
            dumped,
            changed: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `key` is in the lists (the list's, the route's), if there.
    fn position(&self, key: &RouteKey) -> Option<(usize, usize)> {
        position(&self.dumped, key)
    }

    pub fn get(&self, key: &RouteKey) -> Option<&KernelNexthop> {
        match self.changed.get(key) {
            Some(changed) => changed.as_ref(),
            None => self.position(key).map(|(t, i)| &self.dumped[t][i].1),
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
            Some((t, i)) => self.dumped[t][i].1 = nh,
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
        for routes in &mut self.dumped {
            routes.retain_mut(|(k, nh)| changed.contains_key(k) || keep(k, nh));
        }
        self.dumped.retain(|routes| !routes.is_empty());
        let dumped = &self.dumped;
        changed.retain(|k, nh| {
            if let Some(route) = nh {
                if keep(k, route) {
                    return true;
                }
                *nh = None;
            }
            // A removal is kept while the list holds the route it removes.
            position(dumped, k).is_some()
        });
        self.len = self.iter().count();
    }

    /// Every route's next hop, to change in place (routes removed since the dump included:
    /// changing them changes nothing).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut KernelNexthop> {
        let dumped = self.dumped.iter_mut().flatten().map(|(_, nh)| nh);
        dumped.chain(self.changed.values_mut().flatten())
    }

    /// The routes in key order.
    pub fn iter(&self) -> Iter<'_> {
        self.of_tables(Tables::ALL)
    }

    /// The routes from `first` on, in key order.
    pub fn range_from(&self, first: &RouteKey) -> Iter<'_> {
        // The first list that ends at or after `first`.
        let t = self
            .dumped
            .partition_point(|routes| routes[routes.len() - 1].0 < *first);
        let (head, tail): (&[(RouteKey, KernelNexthop)], _) = match self.dumped.get(t) {
            Some(routes) => (
                &routes[routes.partition_point(|(k, _)| k < first)..],
                &self.dumped[t + 1..],
            ),
            None => (&[], &[]),
        };
        Iter::new(head, tail, self.changed.range(first..))
    }

    /// The routes of the tables in `tables`, in key order.
    pub fn of_tables(&self, tables: Tables) -> Iter<'_> {
        let (start, end) = tables.ids();
        let at = |table: Bound<u32>| match table {
            Bound::Included(t) | Bound::Excluded(t) => {
                self.dumped.partition_point(|routes| routes[0].0.table < t)
            }
            Bound::Unbounded => self.dumped.len(),
        };
        Iter::new(
            &[],
            &self.dumped[at(start)..at(end)],
            self.changed.range(tables.keys()),
        )
    }

    /// The table of the route in the middle of the dump, if any: where to cut the routes in
    /// two halves about as large.
    pub fn middle_table(&self) -> Option<u32> {
        let mut before = 0;
        let half = self.dumped.iter().map(Vec::len).sum::<usize>() / 2;
        self.dumped.iter().find_map(|routes| {
            before += routes.len();
            (before > half).then_some(routes[0].0.table)
        })
    }

    pub fn keys(&self) -> impl Iterator<Item = &RouteKey> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &KernelNexthop> {
        self.iter().map(|(_, nh)| nh)
    }

    /// Lists again once the map is half the lists' size (and at least
    /// [`MERGE_MIN`]): the merge, a walk of both, is then paid for by the changes that filled
    /// the map.
    fn merge_if_large(&mut self) {
        let dumped = self.dumped.iter().map(Vec::len).sum::<usize>();
        if self.changed.len() >= MERGE_MIN.max(dumped / 2) {
            *self = Self::from_dump(std::mem::take(self).into_vec());
        }
    }

    /// The routes in key order, as one list.
    fn into_vec(self) -> Vec<(RouteKey, KernelNexthop)> {
        let mut merged = Vec::with_capacity(self.len);
        let mut changed = self.changed.into_iter().peekable();
        for (k, nh) in self.dumped.into_iter().flatten() {
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

/// Where `key` is in `lists` (as [`KernelRoutes`]' `dumped`): the list's index and the
/// route's, if there.
fn position(lists: &[TableRoutes], key: &RouteKey) -> Option<(usize, usize)> {
    // The last list that starts at or before `key`.
    let t = lists
        .partition_point(|routes| routes[0].0 <= *key)
        .checked_sub(1)?;
    let i = lists[t].binary_search_by(|(k, _)| k.cmp(key)).ok()?;
    Some((t, i))
}

/// Whether each of `lists` (each sorted, none empty) starts above where the one before ends.
fn in_key_order<'a>(lists: impl Iterator<Item = &'a TableRoutes>) -> bool {
    let mut last: Option<&RouteKey> = None;
    for routes in lists {
        if last.is_some_and(|last| *last >= routes[0].0) {
            return false;
        }
        last = Some(&routes[routes.len() - 1].0);
    }
    true
}

/// Sorts a table's routes by key, one route per key: of two with one key, the later is
/// kept. A dump's runs come nearly sorted (the kernel's order within a table is the key order
/// but for prefixes of one address, longer first), which the stable sort finds as a handful
/// of runs to merge.
fn sort_table(routes: &mut TableRoutes) {
    // Stable, so that of equal keys the later stays later.
    routes.sort_by_key(|a| a.0);
    // Of equal keys, the later's route takes the kept one's place.
    routes.dedup_by(|later, kept| {
        let equal = later.0 == kept.0;
        if equal {
            std::mem::swap(later, kept);
        }
        equal
    });
}

/// [`KernelRoutes`]' routes in key order: the lists and the map walked side by side, the
/// map's entry deciding a key both hold.
#[derive(Debug)]
pub struct Iter<'a> {
    /// The rest of the list being walked, then the lists of `tables`.
    head: &'a [(RouteKey, KernelNexthop)],
    tables: std::slice::Iter<'a, TableRoutes>,
    changed: Peekable<std::collections::btree_map::Range<'a, RouteKey, Option<KernelNexthop>>>,
}

impl<'a> Iter<'a> {
    /// The routes of `head` (part of one list), then of `tables`' lists, with `changed`.
    fn new(
        head: &'a [(RouteKey, KernelNexthop)],
        tables: &'a [TableRoutes],
        changed: std::collections::btree_map::Range<'a, RouteKey, Option<KernelNexthop>>,
    ) -> Self {
        Self {
            head,
            tables: tables.iter(),
            changed: changed.peekable(),
        }
    }

    /// The next route of the lists, not taken.
    fn dumped(&mut self) -> Option<&'a (RouteKey, KernelNexthop)> {
        while self.head.is_empty() {
            self.head = self.tables.next()?;
        }
        self.head.first()
    }

    /// The next route, not taken (routes of the lists the map decides are passed over).
    pub fn peek(&mut self) -> Option<(&'a RouteKey, &'a KernelNexthop)> {
        loop {
            let Some(&(changed, route)) = self.changed.peek() else {
                return self.dumped().map(|(k, nh)| (k, nh));
            };
            match self.dumped() {
                Some(dumped) if dumped.0 < *changed => return Some((&dumped.0, &dumped.1)),
                // Decided by the map.
                Some(dumped) if dumped.0 == *changed => self.head = &self.head[1..],
                _ => {}
            }
            match route {
                Some(nh) => return Some((changed, nh)),
                None => {
                    self.changed.next();
                }
            }
        }
    }

    /// Passes over the longest run of `planned`'s first routes that comes next under the
    /// same keys, each with a route that `same` accepts for the planned one: returns how many.
    /// A diff's unchanged routes, compared as two lists.
    pub fn skip_same<P>(
        &mut self,
        planned: &[(RouteKey, P)],
        same: impl Fn(&P, &KernelNexthop) -> bool,
    ) -> usize {
        let mut skipped = 0;
        while let Some((want, nh)) = planned.get(skipped) {
            match self.peek() {
                Some((have, old)) if have == want && same(nh, old) => self.next(),
                _ => break,
            };
            skipped += 1;
            // The rest of the list the next route is in, as far as the map decides no key.
            let before = self.changed.peek().map(|&(k, _)| *k);
            let run = planned[skipped..]
                .iter()
                .zip(self.head)
                .take_while(|((want, nh), (have, old))| {
                    want == have && before.is_none_or(|b| *have < b) && same(nh, old)
                })
                .count();
            self.head = &self.head[run..];
            skipped += run;
        }
        skipped
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a RouteKey, &'a KernelNexthop);

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.peek()?;
        // The map's when its next key is this one (`peek` passed over the list's), else the
        // list's.
        match self.changed.peek() {
            Some(&(changed, _)) if changed == next.0 => {
                self.changed.next();
            }
            _ => self.head = &self.head[1..],
        }
        Some(next)
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
