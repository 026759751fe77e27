//! The consistent hash ring: which cluster member owns a key.
//!
//! In cluster mode every rate-limit key has exactly one owner, named by its peer address
//! (e.g. `10.0.0.7:8091`). Each member gets [`DEFAULT_VNODES`] (or the given number of)
//! points at `fmix64(fnv1a64("{member}#{i}"))`; a key sits at
//! `fmix64(route ^ 0x9e37_79b9_7f4a_7c15)`, and its owner is the member of the first point
//! clockwise from there (the first point `>=` the position, wrapping to the start). The key's
//! position is salted so it is independent of the shard choice `fmix64(route) % n`: the keys
//! one node owns still spread evenly over that node's shards.
//!
//! Invariants: a [`Ring`] is a pure, immutable value (no IO, no clock, no interior
//! mutability), cheap to share behind `Arc`/`ArcSwap`, and deterministic given the member
//! set: members are deduplicated and sorted, and points with equal hashes are ordered by
//! member index, so every node that knows the same members builds the same ring regardless
//! of the order it learned them in. Lookups are a binary search and never allocate. The
//! placement is part of the cluster protocol: changing it (hashes, salt, point names)
//! changes owners, so all versions in one cluster must agree on it.

use std::sync::Arc;

use crate::key::{fmix64, fnv1a64};

/// Virtual nodes per member (default 256).
pub const DEFAULT_VNODES: usize = 256;

/// FNV-1a 64 offset basis. The same value as `key::FNV64_OFFSET`, which that module keeps
/// private; restated here so ring placement does not depend on key.rs internals.
const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Salt for a key's ring position (the 64-bit golden ratio), so ownership is independent of
/// the shard choice `fmix64(route) % shards`.
const POSITION_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// A consistent hash ring over the cluster members. See the module docs.
#[derive(Debug, Clone)]
pub struct Ring {
    /// Sorted, deduplicated peer addresses.
    members: Vec<Arc<str>>,
    /// `(point hash, index into members)`, sorted by hash, then by member index.
    points: Vec<(u64, u32)>,
    /// Points per member (at least 1).
    vnodes: usize,
}

impl Ring {
    /// Members are deduplicated and sorted, so every node that knows the same set builds the
    /// same ring. `vnodes` below 1 is taken as 1, so a non-empty ring always has an owner.
    pub fn new<S: AsRef<str>>(members: impl IntoIterator<Item = S>, vnodes: usize) -> Ring {
        let mut members: Vec<Arc<str>> = members
            .into_iter()
            .map(|member| Arc::from(member.as_ref()))
            .collect();
        members.sort_unstable();
        members.dedup();
        Ring::from_sorted(members, vnodes)
    }

    /// Builds the points for an already sorted, deduplicated member list.
    fn from_sorted(members: Vec<Arc<str>>, vnodes: usize) -> Ring {
        let vnodes = vnodes.max(1);
        let mut points = Vec::with_capacity(members.len().saturating_mul(vnodes));
        // `0u32..` bounds the index without a cast; a ring never has 2^32 members.
        for (index, member) in (0u32..).zip(&members) {
            points.extend((0..vnodes).map(|vnode| (point(member, vnode), index)));
        }
        // Sorting the (hash, index) pairs breaks ties on equal hashes by member order.
        points.sort_unstable();
        Ring {
            members,
            points,
            vnodes,
        }
    }

    /// The members, sorted.
    pub fn members(&self) -> &[Arc<str>] {
        &self.members
    }

    /// Whether the ring has no members (then no key has an owner).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Virtual nodes per member.
    pub fn vnodes(&self) -> usize {
        self.vnodes
    }

    /// Whether `member` is on the ring.
    pub fn contains(&self, member: &str) -> bool {
        self.index_of(member).is_some()
    }

    /// The owner of a route hash; None only for an empty ring. O(log(members*vnodes)), no
    /// allocation.
    pub fn owner(&self, route: u64) -> Option<&Arc<str>> {
        self.owner_index(route)
            .and_then(|index| self.members.get(index))
    }

    /// Index into [`members()`](Ring::members) of the owner (same rule), for callers that keep
    /// per-member tables.
    pub fn owner_index(&self, route: u64) -> Option<usize> {
        self.index_at(position(route))
    }

    /// A new ring with `member` added (same vnodes). Adding a present member changes nothing.
    pub fn with(&self, member: &str) -> Ring {
        match self.members.binary_search_by(|probe| (**probe).cmp(member)) {
            Ok(_) => self.clone(),
            Err(at) => {
                let mut members = self.members.clone();
                members.insert(at, Arc::from(member));
                Ring::from_sorted(members, self.vnodes)
            }
        }
    }

    /// A new ring with `member` removed (same vnodes). Removing an absent member changes
    /// nothing.
    pub fn without(&self, member: &str) -> Ring {
        match self.index_of(member) {
            None => self.clone(),
            Some(at) => {
                let mut members = self.members.clone();
                members.remove(at);
                Ring::from_sorted(members, self.vnodes)
            }
        }
    }

    fn index_of(&self, member: &str) -> Option<usize> {
        self.members
            .binary_search_by(|probe| (**probe).cmp(member))
            .ok()
    }

    /// The member owning ring position `position`: the first point at or after it, wrapping.
    fn index_at(&self, position: u64) -> Option<usize> {
        let next = self.points.partition_point(|&(hash, _)| hash < position);
        // Past the last point, wrap to the first; `first()` is None only for an empty ring.
        let (_, index) = self.points.get(next).or_else(|| self.points.first())?;
        // `u32` -> `usize` is lossless on every supported target.
        Some(*index as usize)
    }
}

/// The hash of `member`'s point number `vnode`: `fmix64(fnv1a64("{member}#{vnode}"))`.
fn point(member: &str, vnode: usize) -> u64 {
    fmix64(fnv1a64(
        FNV64_OFFSET,
        format!("{member}#{vnode}").as_bytes(),
    ))
}

/// A route hash's position on the ring.
fn position(route: u64) -> u64 {
    fmix64(route ^ POSITION_SALT)
}

#[cfg(test)]
mod tests;
