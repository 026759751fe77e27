//! A shard's key table, cut into [`PARTS`] parts by key hash, so that no single step has
//! to go through (or rehash) the whole table while it holds the shard's lock.
//!
//! A table of a million keys is one allocation of tens of megabytes: growing it rehashes
//! every key at once, and sweeping it looks at every key at once, both under the shard's
//! lock (every request of the shard waits). Cut into parts, a part grows alone (1/1024 of
//! the pause), the sweep goes through a part at a time ([`Table::retain_part`]: 2,000 keys
//! of a shard of 2 million, some tens of microseconds), and a part whose keys went is shrunk
//! alone, giving its memory back.
//!
//! A hash map's room doubles when it fills, so one map's memory is anywhere from 1.1 to 2.3
//! times what its keys need, and jumps. The parts therefore come in [`GROUPS`] groups of
//! unequal size on purpose: group `g` takes a share of the keys proportional to `64 + g`,
//! split evenly over its [`PER_GROUP`] parts, so the groups fill (and double) at different
//! table sizes, and the table's room follows its keys smoothly (about 1.5 times them)
//! instead of doubling all at once: memory then goes up and down with the live keys, not
//! with the most the table ever held.
//!
//! Keys of limits of a minute or longer ([`KeyId::long_lived`]) have parts of their own
//! (the second half), and each part knows a tick before which none of its keys expires
//! ([`Table::part_due`]): the sweep passes over a part with nothing due without looking at
//! its keys. Kept with the keys of per-second limits, which expire all the time, a million
//! keys of an hourly limit would be looked at twice a second for an hour only to be kept;
//! in parts of their own they are looked at when they are due.
//!
//! Invariants: `len` is the sum of the parts' lengths; no value of part `i` expires before
//! `due[i]` ([`Expires`]; a caller that moves a held value's expiry earlier through
//! [`Table::get_mut`] or [`Table::get_or_insert_with`] says so with [`Table::lower_due`]).

use std::collections::HashMap;
use std::hash::BuildHasher;

use crate::check::Slot;
use crate::key::{KeyHasher, KeyId};

/// Groups of parts of each class of keys, each its share of the class's keys (see the
/// module docs).
pub const GROUPS: usize = 64;
/// Parts per group: equal shares of the group's keys.
pub const PER_GROUP: usize = 16;
/// Classes of keys with parts of their own: keys of per-second limits, and
/// [`KeyId::long_lived`] keys.
pub const CLASSES: usize = 2;
/// Parts per table: a power of two.
pub const PARTS: usize = CLASSES * GROUPS * PER_GROUP;

/// A value that may be forgotten from an [`expiry`](crate::check::expiry) tick on.
pub trait Expires {
    fn expires(&self) -> u32;
}

impl Expires for Slot {
    fn expires(&self) -> u32 {
        self.expires
    }
}

/// Handed-over states of one key: due when the first of them is.
impl Expires for Vec<Slot> {
    fn expires(&self) -> u32 {
        self.iter().map(|slot| slot.expires).min().unwrap_or(0)
    }
}

/// When a part is swept it is shrunk to fit its keys plus this share of them, if that
/// frees at least half of its room (a map's room only halves or doubles): 1/8 more keys
/// fit before it grows again, and its next sweep (a second later) is the earliest it can
/// shrink again, so a part does not rehash back and forth at the key rate.
const SHRINK_HEADROOM: usize = 8;
/// Parts with room for no more than this are left as they are.
const SHRINK_ABOVE: usize = 64;

/// Which group each of 1024 equal hash ranges goes to: group `g` gets a number of ranges
/// proportional to `64 + g` (see the module docs).
static GROUP_OF: [u8; 1024] = group_ranges();

const fn group_ranges() -> [u8; 1024] {
    let total_weight = (64 + 127) * 64 / 2;
    let mut ranges = [0u8; 1024];
    let (mut group, mut filled, mut weight_so_far) = (0, 0, 0);
    while group < GROUPS {
        weight_so_far += 64 + group;
        // The ranges up to this group's end, rounded: every group gets 10 or more.
        let end = (weight_so_far * 1024 + total_weight / 2) / total_weight;
        while filled < end {
            ranges[filled] = group as u8;
            filled += 1;
        }
        group += 1;
    }
    ranges
}

pub struct Table<V> {
    parts: Box<[HashMap<KeyId, V, KeyHasher>]>,
    /// Per part: no value in it expires before this tick (`u32::MAX`: none held since the
    /// part was last swept).
    due: Box<[u32]>,
    len: usize,
}

impl<V: Expires> Table<V> {
    pub fn new() -> Table<V> {
        Table {
            parts: (0..PARTS)
                .map(|_| HashMap::with_hasher(KeyHasher::default()))
                .collect(),
            due: vec![u32::MAX; PARTS].into_boxed_slice(),
            len: 0,
        }
    }

    /// The part of `key`: its class's half of the table, then bits of the map's own hash
    /// that neither the bucket index (the low bits) nor the control byte (the top 7) use,
    /// so a part's keys still spread over its buckets: 10 bits pick the group, 4 more the
    /// part within it.
    fn part(key: &KeyId) -> usize {
        let hash = KeyHasher::default().hash_one(key);
        let range = (hash >> 40) as usize & (GROUP_OF.len() - 1);
        let within = (hash >> 50) as usize & (PER_GROUP - 1);
        let class = usize::from(key.long_lived()) * (GROUPS * PER_GROUP);
        class + usize::from(GROUP_OF[range]) * PER_GROUP + within
    }

    /// The keys in part `index` (mod [`PARTS`]).
    pub fn part_len(&self, index: usize) -> usize {
        self.parts[index & (PARTS - 1)].len()
    }

    /// A tick before which no value of part `index` (mod [`PARTS`]) expires.
    pub fn part_due(&self, index: usize) -> u32 {
        self.due[index & (PARTS - 1)]
    }

    /// The keys a sweep of part `index` at `tick` looks at: none if none can be due.
    pub fn due_len(&self, index: usize, tick: u32) -> usize {
        if self.part_due(index) <= tick {
            self.part_len(index)
        } else {
            0
        }
    }

    /// Notes that `key`'s held value may now expire from `tick` on (its expiry was moved
    /// earlier in place).
    pub fn lower_due(&mut self, key: &KeyId, tick: u32) {
        let due = &mut self.due[Self::part(key)];
        *due = (*due).min(tick);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keys the parts have room for before one of them grows.
    pub fn capacity(&self) -> usize {
        self.parts.iter().map(HashMap::capacity).sum()
    }

    pub fn get(&self, key: &KeyId) -> Option<&V> {
        self.parts[Self::part(key)].get(key)
    }

    pub fn get_mut(&mut self, key: &KeyId) -> Option<&mut V> {
        self.parts[Self::part(key)].get_mut(key)
    }

    pub fn contains_key(&self, key: &KeyId) -> bool {
        self.parts[Self::part(key)].contains_key(key)
    }

    pub fn insert(&mut self, key: KeyId, value: V) -> Option<V> {
        let index = Self::part(&key);
        self.due[index] = self.due[index].min(value.expires());
        let old = self.parts[index].insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &KeyId) -> Option<V> {
        let old = self.parts[Self::part(key)].remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// The value of `key`, inserted with `make` if there is none.
    pub fn get_or_insert_with(&mut self, key: KeyId, make: impl FnOnce() -> V) -> &mut V {
        let index = Self::part(&key);
        let part = &mut self.parts[index];
        if !part.contains_key(&key) {
            self.len += 1;
        }
        let value = part.entry(key).or_insert_with(make);
        self.due[index] = self.due[index].min(value.expires());
        value
    }

    /// Keeps the entries of part `index` (mod [`PARTS`]) that `keep` accepts, then shrinks
    /// the part if half of its room is not needed; returns how many were removed. The
    /// part's due tick becomes the earliest expiry of what is kept.
    pub fn retain_part(
        &mut self,
        index: usize,
        mut keep: impl FnMut(&KeyId, &mut V) -> bool,
    ) -> usize {
        let index = index & (PARTS - 1);
        let part = &mut self.parts[index];
        let before = part.len();
        let mut due = u32::MAX;
        part.retain(|key, value| {
            let kept = keep(key, value);
            if kept {
                due = due.min(value.expires());
            }
            kept
        });
        self.due[index] = due;
        let removed = before - part.len();
        self.len -= removed;
        if part.capacity() > SHRINK_ABOVE {
            // A no-op unless a map half the size holds the keys and the headroom.
            part.shrink_to(part.len() + part.len() / SHRINK_HEADROOM);
        }
        removed
    }

    /// Removes the entries of part `index` (mod [`PARTS`]) that `take` accepts, adding them
    /// to `out`.
    pub fn extract_part(
        &mut self,
        index: usize,
        out: &mut Vec<(KeyId, V)>,
        mut take: impl FnMut(&KeyId, &mut V) -> bool,
    ) {
        let before = out.len();
        out.extend(self.parts[index & (PARTS - 1)].extract_if(|key, value| take(key, value)));
        self.len -= out.len() - before;
    }

    /// Removes and returns every entry `take` accepts.
    #[cfg(test)]
    pub fn extract(&mut self, mut take: impl FnMut(&KeyId, &mut V) -> bool) -> Vec<(KeyId, V)> {
        let mut out = Vec::new();
        for part in 0..PARTS {
            self.extract_part(part, &mut out, &mut take);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{CLASSES, Expires, GROUPS, PARTS, PER_GROUP, Table};
    use crate::key::KeyId;

    /// A test value is its own expiry tick.
    impl Expires for u64 {
        fn expires(&self) -> u32 {
            u32::try_from(*self).unwrap_or(u32::MAX)
        }
    }

    impl Expires for () {
        fn expires(&self) -> u32 {
            u32::MAX
        }
    }

    /// A key of a per-second limit (`n` below 2^32).
    fn key(n: u64) -> KeyId {
        KeyId {
            route: n,
            id: [n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n],
        }
    }

    /// A [`KeyId::long_lived`] key (`n` below 2^32).
    fn long_key(n: u64) -> KeyId {
        KeyId {
            route: n,
            id: [n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n | 1 << 32],
        }
    }

    #[test]
    fn keys_spread_over_every_part_of_their_class_and_len_follows_every_change() {
        let mut table = Table::new();
        for n in 0..6400 {
            assert_eq!(table.insert(key(n), n), None);
            assert_eq!(table.insert(long_key(n), n), None);
        }
        assert_eq!(table.insert(key(7), 70), Some(7), "a known key is replaced");
        assert_eq!(table.len(), 12_800);
        let half = PARTS / CLASSES;
        for (class, parts) in table.parts.chunks(half).enumerate() {
            let used = parts.iter().filter(|part| !part.is_empty()).count();
            assert!(
                used > half * 97 / 100,
                "class {class}: keys in {used} of {half} parts"
            );
            assert_eq!(parts.iter().map(|part| part.len()).sum::<usize>(), 6400);
            let sizes: Vec<usize> = parts
                .chunks(PER_GROUP)
                .map(|group| group.iter().map(|part| part.len()).sum())
                .collect();
            assert_eq!(sizes.len(), GROUPS);
            assert!(
                sizes.iter().all(|&size| (35..=170).contains(&size)),
                "67 to 133 keys in each of the {GROUPS} groups: {sizes:?}"
            );
            assert!(
                sizes[..8].iter().sum::<usize>() * 3 < sizes[56..].iter().sum::<usize>() * 2,
                "the last groups take about twice the first's share: {sizes:?}"
            );
        }
        assert!(
            table.parts[half..]
                .iter()
                .flat_map(|part| part.keys())
                .all(KeyId::long_lived),
            "the second half holds the long-lived keys only"
        );
        assert_eq!(table.remove(&key(1)), Some(1));
        assert_eq!(table.remove(&key(1)), None);
        *table.get_or_insert_with(key(1), || 0) += 5;
        *table.get_or_insert_with(key(1), || 0) += 5;
        assert_eq!(table.get(&key(1)), Some(&10));
        let odd = table.extract(|key, _| key.route % 2 == 1);
        assert_eq!(odd.len(), 6400);
        assert_eq!(table.len(), 6400);
        assert!(!table.contains_key(&key(1)) && table.contains_key(&key(2)));
    }

    #[test]
    fn a_part_is_due_at_the_earliest_expiry_it_holds() {
        let mut table: Table<u64> = Table::new();
        let part = |key: &KeyId| Table::<u64>::part(key);
        let a = long_key(1);
        let index = part(&a);
        assert_eq!(
            table.part_due(index),
            u32::MAX,
            "an empty part is never due"
        );
        table.insert(a, 500);
        assert_eq!((table.part_due(index), table.due_len(index, 499)), (500, 0));
        assert_eq!(table.due_len(index, 500), table.part_len(index));
        // A later expiry leaves the part due at the earliest; an earlier one moves it.
        table.insert(a, 900);
        assert_eq!(
            table.part_due(index),
            500,
            "a lower bound, made exact by a sweep"
        );
        *table.get_mut(&a).expect("held") = 300;
        table.lower_due(&a, 300);
        assert_eq!(table.part_due(index), 300);
        // A sweep makes it exact: the earliest expiry of what it keeps.
        let neighbours = (2..).map(long_key).filter(|key| part(key) == index);
        for (key, expires) in neighbours.zip([700, 800, 600]) {
            table.insert(key, expires);
        }
        assert_eq!(table.part_len(index), 4);
        table.retain_part(index, |_, &mut expires| expires > 650);
        assert_eq!(table.part_due(index), 700, "300 and 600 went; 700 is next");
        table.retain_part(index, |_, _| false);
        assert_eq!(table.part_due(index), u32::MAX);
    }

    #[test]
    fn the_room_follows_the_keys_smoothly_where_one_map_doubles() {
        let mut table = Table::new();
        let mut one_map = std::collections::HashMap::new();
        let (mut table_ratios, mut map_ratios) = (Vec::new(), Vec::new());
        for n in 0..400_000u64 {
            table.insert(key(n), ());
            one_map.insert(key(n), ());
            if n >= 50_000 && n % 5_000 == 0 {
                table_ratios.push(table.capacity() as f64 / table.len() as f64);
                map_ratios.push(one_map.capacity() as f64 / one_map.len() as f64);
            }
        }
        let spread = |ratios: &[f64]| {
            let most = ratios.iter().copied().fold(f64::MIN, f64::max);
            let least = ratios.iter().copied().fold(f64::MAX, f64::min);
            most / least
        };
        assert!(
            spread(&map_ratios) > 1.7,
            "one map's room jumps: {map_ratios:?}"
        );
        assert!(
            spread(&table_ratios) < 1.2,
            "the table's room follows its keys: {table_ratios:?}"
        );
    }

    #[test]
    fn a_sweep_step_looks_at_one_part_and_an_emptied_part_gives_its_room_back() {
        let mut table = Table::new();
        for n in 0..64_000 {
            table.insert(key(n), n);
        }
        let room = table.capacity();
        let removed = table.retain_part(3, |_, _| false);
        assert_eq!(table.len(), 64_000 - removed);
        assert!(
            (15..=100).contains(&removed),
            "one part of {PARTS}: {removed}"
        );
        // Everything but 1 key in 10 goes: each part shrinks as it is swept.
        let mut removed = removed;
        for part in 0..PARTS {
            removed += table.retain_part(part, |key, _| key.route % 10 == 0);
        }
        assert_eq!(table.len(), 64_000 - removed);
        assert!(
            table.capacity() * 4 < room,
            "the room shrank with the keys: {} of {room}",
            table.capacity()
        );
        // Sweeping again finds nothing more and does not shrink what is left further.
        let kept = table.capacity();
        for part in 0..PARTS {
            assert_eq!(table.retain_part(part, |key, _| key.route % 10 == 0), 0);
        }
        assert_eq!(table.capacity(), kept);
    }
}
