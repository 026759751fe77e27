//! Rate-limit keys and the hashes that route them.
//!
//! A key stands for one counter: the domain, the request descriptor's entries (with the
//! request's own values, so each value under a default entry counts on its own) and the
//! limit's slot (its window and algorithm: [`slot`]). Keys are never stored as strings: a [`KeyId`] is
//! - `route`: FNV-1a 64 over the domain and entries only. It picks the shard (and, in cluster
//!   mode, the owning pod), so all limits of one descriptor land on the same shard and are
//!   decided together, and a key keeps its owner across windows (the window is state, not
//!   part of the key);
//! - `id`: FNV-1a 128 over the same bytes plus the slot: the counter's identity, except
//!   that its low 32 bits are the tag of the rule (the configured limit) the key counts
//!   for ([`KeyId::rule`]), so a shard can keep each rule's keys within its budget without
//!   storing anything more per key, and bit 32 says whether the limit's unit is a minute or
//!   longer ([`KeyId::long_lived`]), so a shard keeps such keys apart from those of
//!   per-second limits and does not look at them twice a second only to keep them
//!   (see `store::memory::shard::table`). 95 bits of hash remain for the identity.
//!
//! Every field is length-prefixed, so `("ab", "c")` and `("a", "bc")` never collide.
//! FNV's low bits are weak for `% n`, so routing mixes the hash with murmur3's `fmix64`
//! before reducing it.

use std::hash::{BuildHasher, Hash, Hasher};

use crate::algorithm::Rate;

pub const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// FNV-1a, 64 bits, over `bytes`, continuing from `hash`.
pub fn fnv1a64(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV64_PRIME);
    }
    hash
}

/// FNV-1a, 128 bits, over `bytes`, continuing from `hash`.
pub fn fnv1a128(mut hash: u128, bytes: &[u8]) -> u128 {
    for &byte in bytes {
        hash ^= u128::from(byte);
        hash = hash.wrapping_mul(FNV128_PRIME);
    }
    hash
}

/// murmur3's 64-bit finalizer: spreads every input bit over every output bit.
pub const fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// The identity of one counter. 24 bytes; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyId {
    pub route: u64,
    pub id: [u64; 2],
}

impl KeyId {
    /// The tag of the rule this key counts for (see [`KeyBuilder::rule_key`]); 0 for a
    /// key of no configured rule (a request's own limit).
    pub fn rule(&self) -> u32 {
        self.id[1] as u32
    }

    /// Whether this key counts for a limit whose unit is a minute or longer (see
    /// [`KeyBuilder::rule_key`]): its state usually matters for a minute or more. A hint
    /// for where a shard keeps the key, never for what it decides.
    pub fn long_lived(&self) -> bool {
        self.id[1] & LONG_LIVED != 0
    }

    /// The shard (of `shards`) that owns this key.
    pub fn shard(&self, shards: usize) -> usize {
        shard_of(self.route, shards)
    }
}

/// The shard (of `shards`, at least 1) for a route hash.
pub fn shard_of(route: u64, shards: usize) -> usize {
    // `usize` -> `u64` is lossless on every supported target, and the result is < shards.
    (fmix64(route) % shards.max(1) as u64) as usize
}

impl Hash for KeyId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The id is already a hash: hand the map one well-mixed word (see `KeyHasher`).
        state.write_u64(self.id[0] ^ self.id[1]);
    }
}

/// The bit of [`KeyId::id`]`[1]` that marks a key of a limit whose unit is a minute or
/// longer ([`KeyId::long_lived`]).
const LONG_LIVED: u64 = 1 << 32;
/// Units from which a key is [`KeyId::long_lived`].
const LONG_LIVED_FROM: u64 = 60 * crate::algorithm::NANOS_PER_SEC;

/// The top bit of a length prefix: marks a shared wildcard pattern (see
/// [`KeyBuilder::shared_entry`]).
const SHARED_FRAME: u32 = 1 << 31;

/// Builds keys for one request descriptor, hashing as it goes (no allocation).
#[derive(Clone, Copy, Debug)]
pub struct KeyBuilder {
    route: u64,
    id: u128,
}

impl KeyBuilder {
    pub fn new(domain: &str) -> KeyBuilder {
        let mut builder = KeyBuilder {
            route: FNV64_OFFSET,
            id: FNV128_OFFSET,
        };
        builder.field(domain.as_bytes());
        builder
    }

    /// Adds one descriptor entry.
    pub fn entry(&mut self, key: &str, value: &str) -> &mut KeyBuilder {
        self.field(key.as_bytes());
        self.field(value.as_bytes());
        self
    }

    /// Adds one descriptor entry whose values share a counter (`share_threshold`): the
    /// wildcard `pattern` stands for the request's value. Framed apart from [`entry`]
    /// (the length prefix has its top bit set), so a request value spelled like the
    /// pattern never lands on the shared counter by that route.
    ///
    /// [`entry`]: KeyBuilder::entry
    pub fn shared_entry(&mut self, key: &str, pattern: &str) -> &mut KeyBuilder {
        self.field(key.as_bytes());
        self.framed(pattern.as_bytes(), SHARED_FRAME);
        self
    }

    fn field(&mut self, bytes: &[u8]) {
        self.framed(bytes, 0);
    }

    fn framed(&mut self, bytes: &[u8], frame: u32) {
        // Lengths are bounded by request validation (and patterns by the config's), far
        // below the frame bit; truncation here would only weaken the prefix, never break
        // correctness of the hash function itself.
        let len = (bytes.len() as u32 | frame).to_le_bytes();
        self.route = fnv1a64(fnv1a64(self.route, &len), bytes);
        self.id = fnv1a128(fnv1a128(self.id, &len), bytes);
    }

    /// The descriptor's route hash (shard and owner choice).
    pub fn route(&self) -> u64 {
        self.route
    }

    /// The key of one limit of this descriptor, of no configured rule (tag 0).
    pub fn key(&self, rate: &Rate) -> KeyId {
        self.rule_key(rate, 0)
    }

    /// The key of one limit of this descriptor, counting for the rule tagged `rule`
    /// ([`Limit::rule`](crate::limits::Limit::rule)): the tag replaces the low 32 bits of
    /// the id, and bit 32 is set for a unit of a minute or longer ([`KeyId::long_lived`]).
    pub fn rule_key(&self, rate: &Rate, rule: u32) -> KeyId {
        let (slot, len) = slot(rate);
        let id = fnv1a128(self.id, &slot[..len]);
        let long_lived = if rate.window_nanos() >= LONG_LIVED_FROM {
            LONG_LIVED
        } else {
            0
        };
        KeyId {
            route: self.route,
            id: [
                (id >> 64) as u64,
                (id as u64 & !(LONG_LIVED | 0xffff_ffff)) | long_lived | u64::from(rule),
            ],
        }
    }
}

/// A limit's slot, hashed into its keys' ids: its unit (Envoy's enum value) and algorithm
/// code, then its multiplier (little-endian) when it is not 1, so keys of a limit without
/// `unit_multiplier` are what they always were. The rate is canonical ([`Rate::every`]),
/// so `day` x 7 and `week` have one slot. The bytes are the first `len` of the array.
#[inline]
pub fn slot(rate: &Rate) -> ([u8; 6], usize) {
    let mut slot = [0; 6];
    slot[0] = rate.unit.to_proto() as u8;
    slot[1] = rate.algorithm.code();
    if rate.multiplier == 1 {
        return (slot, 2);
    }
    slot[2..].copy_from_slice(&rate.multiplier.to_le_bytes());
    (slot, 6)
}

/// Hasher for maps keyed by [`KeyId`]: one `fmix64` of the word `KeyId::hash` writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `KeyId`; kept correct for any other key type.
        self.0 = fmix64(fnv1a64(self.0 ^ FNV64_OFFSET, bytes));
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = fmix64(self.0 ^ word);
    }
}

impl BuildHasher for KeyHasher {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

#[cfg(test)]
mod tests;
