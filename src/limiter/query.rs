//! What a front end asks the limiter: a [`Query`] of descriptors, each with its entries, its
//! cost and an optional request-supplied limit, borrowing the front end's strings; and the
//! [`bounds`] every query is checked against before anything else happens.

use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Unit;
use crate::error::Error;

/// Bounds on one query; larger input is rejected with [`Error::Invalid`].
pub mod bounds {
    pub const MAX_DOMAIN_LEN: usize = 256;
    pub const MAX_DESCRIPTORS: usize = 64;
    pub const MAX_ENTRIES: usize = 32;
    pub const MAX_KEY_LEN: usize = 256;
    pub const MAX_VALUE_LEN: usize = 4096;
    /// The most hits one descriptor may ask for: a limit counts at most `u32::MAX`, so a
    /// larger cost could never be admitted, and every store (Redis's Lua counts in
    /// doubles) holds it exactly. A cost up to this bound but above what its limit can
    /// ever admit is answered OVER_LIMIT and consumes nothing.
    pub const MAX_HITS: u64 = crate::check::MAX_COST;
}

/// A limit the request brings itself instead of the configured ones (Envoy's descriptor
/// `limit` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// One descriptor's entries, in order: `(key, value)`.
pub type Entries<'a> = SmallVec<[(&'a str, &'a str); 2]>;

/// One descriptor of a query.
#[derive(Clone, Debug)]
pub struct Descriptor<'a> {
    pub entries: Entries<'a>,
    /// Hits to count (0 reports without consuming).
    pub cost: u64,
    pub limit: Option<LimitOverride>,
    /// The descriptor's own `hits_addend` as the request gave it (`cost` is what counts),
    /// for the dynamic metadata.
    pub hits_addend: Option<u64>,
    /// The cost is given back instead of taken (Envoy's `is_negative_hits`): answered OK,
    /// it consumes nothing and leaves each counter no lower than zero used.
    pub refund: bool,
}

/// What a front end asks: may these descriptors pass in `domain`?
#[derive(Clone, Debug)]
pub struct Query<'a> {
    pub domain: &'a str,
    pub descriptors: SmallVec<[Descriptor<'a>; 4]>,
    /// The caller's bound on waiting for capacity: never longer than a limit's `max_wait`
    /// allows; `None` keeps the configured bound, `Some(ZERO)` never waits.
    pub max_wait: Option<Duration>,
    /// The request's own `hits_addend` as given (0: not set), for the dynamic metadata.
    pub hits_addend: u32,
}

impl<'a> Query<'a> {
    pub fn new(domain: &'a str) -> Query<'a> {
        Query {
            domain,
            descriptors: SmallVec::new(),
            max_wait: None,
            hits_addend: 0,
        }
    }

    /// Adds a descriptor counting `cost` hits.
    pub fn descriptor(
        &mut self,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
        cost: u64,
    ) -> &mut Descriptor<'a> {
        self.descriptors.push(Descriptor {
            entries: entries.into_iter().collect(),
            cost,
            limit: None,
            hits_addend: None,
            refund: false,
        });
        let last = self.descriptors.len() - 1;
        &mut self.descriptors[last]
    }
}

/// Checks the query against [`bounds`]; the error names the field as the query's own
/// structure does (`descriptors[1].entries[0].key`).
pub(super) fn validate(query: &Query<'_>) -> Result<(), Error> {
    use bounds::*;
    let too_long = |len: usize, max: usize| format!("{len} bytes, at most {max} allowed");
    let too_many = |len: usize, max: usize| format!("{len} given, at most {max} allowed");
    if query.domain.is_empty() {
        return Err(Error::invalid("domain", "must not be empty"));
    }
    if query.domain.len() > MAX_DOMAIN_LEN {
        let problem = too_long(query.domain.len(), MAX_DOMAIN_LEN);
        return Err(Error::invalid("domain", problem));
    }
    if query.descriptors.is_empty() {
        return Err(Error::invalid("descriptors", "must not be empty"));
    }
    if query.descriptors.len() > MAX_DESCRIPTORS {
        let problem = too_many(query.descriptors.len(), MAX_DESCRIPTORS);
        return Err(Error::invalid("descriptors", problem));
    }
    for (index, descriptor) in query.descriptors.iter().enumerate() {
        let field = |name: &str| format!("descriptors[{index}].{name}");
        if descriptor.entries.is_empty() {
            return Err(Error::invalid(field("entries"), "must not be empty"));
        }
        if descriptor.cost > MAX_HITS {
            let problem = format!("{} given, at most {MAX_HITS} allowed", descriptor.cost);
            return Err(Error::invalid(field("hits_addend"), problem));
        }
        if descriptor.entries.len() > MAX_ENTRIES {
            let problem = too_many(descriptor.entries.len(), MAX_ENTRIES);
            return Err(Error::invalid(field("entries"), problem));
        }
        for (position, (key, value)) in descriptor.entries.iter().enumerate() {
            let entry_field = |name: &str| field(&format!("entries[{position}].{name}"));
            if key.is_empty() {
                return Err(Error::invalid(entry_field("key"), "must not be empty"));
            }
            if key.len() > MAX_KEY_LEN {
                let problem = too_long(key.len(), MAX_KEY_LEN);
                return Err(Error::invalid(entry_field("key"), problem));
            }
            if value.len() > MAX_VALUE_LEN {
                let problem = too_long(value.len(), MAX_VALUE_LEN);
                return Err(Error::invalid(entry_field("value"), problem));
            }
        }
    }
    Ok(())
}
