//! What the load generator sends: `N` descriptors per request (`api_key = key-<n>`, domain
//! `bench`), the keys drawn from a key space of `keys` values by a seeded PRNG.
//!
//! Invariants: the descriptors of one request carry different keys (so a workload needs
//! `keys >= descriptors`); a body is a complete gRPC frame (see [`super::grpc_frame`]) ready
//! to hand to the HTTP/2 stream as it is; the same seed draws the same keys.
//!
//! Two ways to make a body, measured against the no-op server (load generator CPU per
//! request, 4 descriptors, 100k keys, median of 4 runs on the 2-core machine): writing the
//! protobuf bytes by hand per request 5.8 us ([`BodyMode::Build`], the default); encoding a
//! reused `RateLimitRequest` with prost per request 6.6 us; picking from 128k pre-encoded
//! frames 7.0 us ([`BodyMode::Pool`]: each pick is a cache miss, plus a reference count on a
//! cold line). h2load sending one fixed body costs 4.4 us on the same runs.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::grpc_frame;

pub const DOMAIN: &str = "bench";
pub const KEY: &str = "api_key";

/// The largest request this module builds: 4 descriptors fit many times over.
const MAX_DESCRIPTORS: usize = 16;
/// Bytes the per-request builder asks the allocator for at a time; frames are carved out of
/// it and the block is reused or freed once every frame cut from it has been sent. Small, so
/// the blocks of 256 workers stay in cache (64 KiB blocks measured no faster).
const BUILD_BLOCK: usize = 4 * 1024;
/// Pool size when one pool entry per key would not cover the combinations (several
/// descriptors per request).
const COMBINATION_POOL: usize = 1 << 17;

/// How a request body comes to be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BodyMode {
    /// Pre-encoded frames, one picked at random per request.
    Pool,
    /// Written per request into the worker's buffer.
    Build,
}

impl BodyMode {
    pub fn parse(text: &str) -> Result<BodyMode, String> {
        match text {
            "pool" => Ok(BodyMode::Pool),
            "build" => Ok(BodyMode::Build),
            other => Err(format!("body must be pool or build, not {other:?}")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BodyMode::Pool => "pool",
            BodyMode::Build => "build",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Workload {
    /// Descriptors per request, each `api_key = key-<n>` with its own `n`.
    pub descriptors: usize,
    /// Size of the key space: `n` is in `first..first + keys`.
    pub keys: u64,
    /// The first key's number (so runs can use fresh keys).
    pub first: u64,
}

impl Workload {
    pub fn validate(&self) -> Result<(), String> {
        if self.descriptors == 0 || self.descriptors > MAX_DESCRIPTORS {
            return Err(format!(
                "descriptors must be 1..={MAX_DESCRIPTORS}, not {}",
                self.descriptors
            ));
        }
        if self.keys < self.descriptors as u64 {
            return Err(format!(
                "{} descriptors need at least as many keys, not {}",
                self.descriptors, self.keys
            ));
        }
        Ok(())
    }

    /// The request whose descriptors carry `keys`, one each.
    pub fn request(&self, keys: &[u64]) -> RateLimitRequest {
        RateLimitRequest {
            domain: DOMAIN.to_owned(),
            descriptors: keys
                .iter()
                .map(|key| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: KEY.to_owned(),
                        value: format!("key-{key}"),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    /// Draws `self.descriptors` different keys into `out`.
    pub fn draw(&self, rng: &mut Rng, out: &mut [u64]) {
        let out = &mut out[..self.descriptors];
        for index in 0..out.len() {
            out[index] = loop {
                let key = self.first + rng.below(self.keys);
                if !out[..index].contains(&key) {
                    break key;
                }
            };
        }
    }

    /// The pre-encoded frames of [`BodyMode::Pool`]: one per key when each request has one
    /// descriptor (so the whole key space is reachable), else random combinations.
    pub fn pool(&self, seed: u64) -> Arc<[Bytes]> {
        let mut rng = Rng::new(seed);
        let mut keys = [0; MAX_DESCRIPTORS];
        if self.descriptors == 1 {
            (self.first..self.first + self.keys)
                .map(|key| Bytes::from(grpc_frame(&self.request(&[key]))))
                .collect()
        } else {
            (0..COMBINATION_POOL)
                .map(|_| {
                    self.draw(&mut rng, &mut keys);
                    Bytes::from(grpc_frame(&self.request(&keys[..self.descriptors])))
                })
                .collect()
        }
    }
}

/// Produces one worker's request bodies.
pub enum Bodies {
    Pool {
        pool: Arc<[Bytes]>,
        rng: Rng,
    },
    Build {
        workload: Workload,
        rng: Rng,
        keys: Vec<u64>,
        buffer: BytesMut,
    },
}

impl Bodies {
    pub fn pool(pool: Arc<[Bytes]>, seed: u64) -> Bodies {
        Bodies::Pool {
            pool,
            rng: Rng::new(seed),
        }
    }

    pub fn build(workload: Workload, seed: u64) -> Bodies {
        Bodies::Build {
            workload,
            rng: Rng::new(seed),
            keys: vec![0; workload.descriptors],
            buffer: BytesMut::new(),
        }
    }

    pub fn next_body(&mut self) -> Bytes {
        match self {
            Bodies::Pool { pool, rng } => pool[rng.below(pool.len() as u64) as usize].clone(),
            Bodies::Build {
                workload,
                rng,
                keys,
                buffer,
            } => {
                workload.draw(rng, keys);
                encode_frame(keys, buffer)
            }
        }
    }
}

/// Appends the gRPC frame of the request whose descriptors carry `keys` to `buffer` and
/// splits it off. Writes the bytes prost would (see [`check_build_matches_pool`]) without
/// building a message: every nested length here is below 128, so each is a one-byte varint.
fn encode_frame(keys: &[u64], buffer: &mut BytesMut) -> Bytes {
    const LONGEST_VALUE: usize = "key-".len() + 20;
    const LONGEST_DESCRIPTOR: usize = 6 + KEY.len() + 2 + LONGEST_VALUE;
    let mut frame = [0; 5 + 2 + DOMAIN.len() + MAX_DESCRIPTORS * LONGEST_DESCRIPTOR];
    let mut len = 5;
    let mut put = |bytes: &[u8]| {
        frame[len..len + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    };
    // Field 1, length-delimited: the domain.
    put(&[0x0a, DOMAIN.len() as u8]);
    put(DOMAIN.as_bytes());
    for &key in keys {
        let mut digits = [0; 20];
        let mut start = digits.len();
        let mut rest = key;
        loop {
            start -= 1;
            digits[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let value_len = "key-".len() + digits.len() - start;
        let entry_len = 2 + KEY.len() + 2 + value_len;
        // Field 2: a descriptor, holding field 1: one entry {1: key, 2: value}.
        put(&[0x12, (2 + entry_len) as u8, 0x0a, entry_len as u8]);
        put(&[0x0a, KEY.len() as u8]);
        put(KEY.as_bytes());
        put(&[0x12, value_len as u8]);
        put(b"key-");
        put(&digits[start..]);
    }
    // Uncompressed, then the message's length.
    let message_len = (len - 5) as u32;
    frame[0] = 0;
    frame[1..5].copy_from_slice(&message_len.to_be_bytes());
    if buffer.capacity() < len {
        buffer.reserve(BUILD_BLOCK.max(len));
    }
    buffer.extend_from_slice(&frame[..len]);
    buffer.split().freeze()
}

/// splitmix64: tiny, fast, and good enough to spread keys.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift, bias below 2^-40 for these sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// The per-request builder encodes exactly what the pool pre-encodes.
pub fn check_build_matches_pool() {
    let workload = Workload {
        descriptors: 4,
        keys: 100_000,
        first: 0,
    };
    let mut bodies = Bodies::build(workload, 7);
    let mut rng = Rng::new(7);
    let mut keys = [0; MAX_DESCRIPTORS];
    for _ in 0..1000 {
        workload.draw(&mut rng, &mut keys);
        let expected = grpc_frame(&workload.request(&keys[..workload.descriptors]));
        assert_eq!(bodies.next_body()[..], expected[..], "keys {keys:?}");
    }
    // The widest values, and as many descriptors as fit.
    let keys = [u64::MAX; MAX_DESCRIPTORS];
    let expected = grpc_frame(&workload.request(&keys));
    assert_eq!(encode_frame(&keys, &mut BytesMut::new())[..], expected[..]);
    let expected = grpc_frame(&workload.request(&[0, 9, 10, 99_999]));
    assert_eq!(
        encode_frame(&[0, 9, 10, 99_999], &mut BytesMut::new())[..],
        expected[..]
    );
}
