//! The limits file as written: YAML text to raw, unvalidated structs.
//!
//! Owns the serde schema (envoyproxy/ratelimit's format plus our extensions) and the
//! input bounds. Invariants:
//! - Every map rejects unknown fields and duplicate keys, so a typo (`ratelimit:`) fails
//!   loudly instead of silently dropping a limit. The one free-form map is a descriptor's
//!   `metadata` (user data handed back to Envoy), which still rejects duplicate keys.
//! - Whole numbers are read as YAML integers only: a float, a negative number or a quoted
//!   string is a type error, as in the reference service.
//! - Descriptors are counted and their depth checked while they are read, so an oversized
//!   input stops early: at most [`MAX_DESCRIPTORS`] descriptors across all files, nested at
//!   most [`MAX_DEPTH`] levels. Other YAML resources are capped by the parser budget.
//!
//! Semantic checks (units, algorithms, duplicates) belong to `compile`.

use std::cell::Cell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Budget, DuplicateKeyPolicy, MessageFormatter, UserMessageFormatter};

use super::error::{ConfigError, Position};

/// The most descriptors accepted across all files of one load.
pub const MAX_DESCRIPTORS: usize = 100_000;
/// The deepest descriptor nesting accepted (a top-level descriptor is level 1).
pub const MAX_DEPTH: usize = 32;
/// The largest file accepted, in bytes.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// YAML nesting the parser allows: the root map, then a list and a map per descriptor
/// level, then `rate_limits`, its items, `replaces` and its items (or a `metadata` value
/// [`METADATA_DEPTH`] deep), plus slack so that our own depth check (with its clearer
/// message) fires first.
const YAML_MAX_DEPTH: usize = 1 + 2 * (MAX_DEPTH + 1) + METADATA_DEPTH + 2;

/// How deep a descriptor's `metadata` map may nest (maps and lists inside it), counting the
/// map itself; `compile` reports deeper ones, the parser's budget stops far deeper ones.
pub const METADATA_DEPTH: usize = 8;

/// A whole limits file.
#[derive(Debug, Default)]
pub(crate) struct RawFile {
    pub domain: Option<String>,
    pub descriptors: Vec<RawDescriptor>,
}

/// One `descriptors` entry.
#[derive(Debug, Default)]
pub(crate) struct RawDescriptor {
    pub key: Option<String>,
    pub value: Option<String>,
    pub rate_limit: Option<RawLimit>,
    pub rate_limits: Option<Vec<RawLimit>>,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    pub quota_mode: bool,
    pub share_threshold: bool,
    pub value_to_metric: bool,
    /// `metadata`: any YAML value here (compile insists on a map).
    pub metadata: Option<serde_json::Value>,
    pub descriptors: Vec<RawDescriptor>,
}

/// One `rate_limit` (or one item of `rate_limits`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    pub unit: Option<String>,
    /// `unit_multiplier`: the window is this many units (ours; the reference's PR #552).
    #[serde(default, deserialize_with = "whole_number")]
    pub unit_multiplier: Option<u32>,
    #[serde(default, deserialize_with = "whole_number")]
    pub requests_per_unit: Option<u32>,
    pub name: Option<String>,
    pub replaces: Option<Vec<RawReplace>>,
    pub unlimited: Option<bool>,
    pub algorithm: Option<String>,
    #[serde(default, deserialize_with = "whole_number")]
    pub burst: Option<u32>,
    pub max_wait: Option<String>,
    #[serde(default, deserialize_with = "whole_number")]
    pub max_queue: Option<u32>,
    #[serde(default, deserialize_with = "whole_number")]
    pub max_keys: Option<u32>,
}

/// One `replaces` item.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplace {
    pub name: Option<String>,
}

/// How many descriptors the rest of a load may still read.
#[derive(Debug)]
pub(crate) struct Bounds {
    remaining: Cell<usize>,
    breach: Cell<Option<Breach>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Breach {
    TooMany,
    TooDeep,
}

impl Breach {
    fn problem(self) -> String {
        match self {
            Breach::TooMany => format!("more than {MAX_DESCRIPTORS} descriptors in all files"),
            Breach::TooDeep => format!("descriptors nested deeper than {MAX_DEPTH} levels"),
        }
    }
}

impl Bounds {
    pub(crate) fn new() -> Bounds {
        Bounds {
            remaining: Cell::new(MAX_DESCRIPTORS),
            breach: Cell::new(None),
        }
    }

    /// Whether the descriptor budget ran out (later files need not be read).
    pub(crate) fn exhausted(&self) -> bool {
        self.breach.get() == Some(Breach::TooMany)
    }
}

/// Parses one file. `Ok(None)` for a document with no content (empty or only comments).
pub(crate) fn parse(
    file: &str,
    text: &str,
    bounds: &Bounds,
) -> Result<Option<RawFile>, ConfigError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(ConfigError::whole_file(
            file,
            format!("file is larger than {MAX_FILE_BYTES} bytes (4 MiB)"),
        ));
    }
    bounds.breach.set(None);
    let options = serde_saphyr::options! {
        with_snippet: false,
        duplicate_keys: DuplicateKeyPolicy::Error,
        budget: Some(budget()),
    };
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |deserializer| {
        FileSeed(bounds).deserialize(deserializer)
    })
    .map_err(|error| {
        let position = error
            .location()
            .filter(|location| location.line() > 0)
            .map(|location| Position {
                line: location.line(),
                column: location.column(),
            });
        let breach = bounds.breach.get().or_else(|| {
            matches!(
                error.without_snippet(),
                serde_saphyr::Error::Budget {
                    breach: serde_saphyr::budget::BudgetBreach::Depth { .. },
                    ..
                }
            )
            .then_some(Breach::TooDeep)
        });
        let problem = match breach {
            Some(breach) => breach.problem(),
            None => {
                let message = UserMessageFormatter.format_message(error.without_snippet());
                reword(&message).map_or_else(|| message.into_owned(), str::to_owned)
            }
        };
        ConfigError::parse(file, position, problem)
    })
}

/// Plainer words for the parser's terse type errors (the position says where).
fn reword(message: &str) -> Option<&'static str> {
    match message {
        "expected mapping start" => Some("expected a map (key: value pairs)"),
        "expected sequence start" => Some("expected a list"),
        "expected string scalar" => Some("expected a string"),
        "invalid boolean" => Some("expected true or false"),
        _ => None,
    }
}

/// Parser limits: generous for any file under [`MAX_FILE_BYTES`], while alias expansion
/// stays capped.
fn budget() -> Budget {
    let mut budget = Budget::default();
    budget.max_depth = YAML_MAX_DEPTH;
    budget.max_nodes = MAX_FILE_BYTES;
    budget.max_events = 2 * MAX_FILE_BYTES;
    // One `&limit` anchor aliased by every descriptor is a normal way to share a limit;
    // alias replay stays capped by `AliasLimits::max_total_replayed_events` and our
    // descriptor count.
    budget.enforce_alias_anchor_ratio = false;
    budget
}

/// Reads a YAML integer into a `u32`; null reads as absent.
fn whole_number<'de, D: de::Deserializer<'de>>(deserializer: D) -> Result<Option<u32>, D::Error> {
    deserializer.deserialize_any(WholeNumber)
}

struct WholeNumber;

impl<'de> Visitor<'de> for WholeNumber {
    type Value = Option<u32>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number from 0 to {}", u32::MAX)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        u32::try_from(value)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(value), &self))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        u32::try_from(value)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(value), &self))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum FileField {
    Domain,
    Descriptors,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum DescriptorField {
    Key,
    Value,
    RateLimit,
    RateLimits,
    ShadowMode,
    DetailedMetric,
    QuotaMode,
    ShareThreshold,
    ValueToMetric,
    Metadata,
    Descriptors,
}

/// The whole document: absent (empty file) or a map.
struct FileSeed<'b>(&'b Bounds);

impl<'de> DeserializeSeed<'de> for FileSeed<'_> {
    type Value = Option<RawFile>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for FileSeed<'_> {
    type Value = Option<RawFile>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map with domain and descriptors")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(FileMap(self.0)).map(Some)
    }
}

struct FileMap<'b>(&'b Bounds);

impl<'de> Visitor<'de> for FileMap<'_> {
    type Value = RawFile;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map with domain and descriptors")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFile, A::Error> {
        let mut file = RawFile::default();
        while let Some(field) = map.next_key()? {
            match field {
                FileField::Domain => file.domain = map.next_value()?,
                FileField::Descriptors => {
                    file.descriptors = map.next_value_seed(ListSeed {
                        bounds: self.0,
                        depth: 1,
                    })?;
                }
            }
        }
        Ok(file)
    }
}

/// A `descriptors` list whose items are at nesting level `depth`; null reads as empty.
struct ListSeed<'b> {
    bounds: &'b Bounds,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_> {
    type Value = Vec<RawDescriptor>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_> {
    type Value = Vec<RawDescriptor>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of descriptors")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_some<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // No `size_hint` preallocation: the input decides the hint, the bounds decide the size.
        let mut descriptors = Vec::new();
        let seed = DescriptorSeed {
            bounds: self.bounds,
            depth: self.depth,
        };
        while let Some(descriptor) = seq.next_element_seed(seed.clone())? {
            descriptors.push(descriptor);
        }
        Ok(descriptors)
    }
}

/// One descriptor map at nesting level `depth`.
#[derive(Clone)]
struct DescriptorSeed<'b> {
    bounds: &'b Bounds,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for DescriptorSeed<'_> {
    type Value = RawDescriptor;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DescriptorSeed<'_> {
    type Value = RawDescriptor;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a descriptor map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawDescriptor, A::Error> {
        // The error kind is one the parser attaches a position to; `parse` swaps the
        // wording for the breach's own message.
        if self.depth > MAX_DEPTH {
            self.bounds.breach.set(Some(Breach::TooDeep));
            return Err(de::Error::invalid_length(
                self.depth,
                &"a shallower nesting",
            ));
        }
        let Some(remaining) = self.bounds.remaining.get().checked_sub(1) else {
            self.bounds.breach.set(Some(Breach::TooMany));
            return Err(de::Error::invalid_length(
                MAX_DESCRIPTORS + 1,
                &"fewer descriptors",
            ));
        };
        self.bounds.remaining.set(remaining);

        let mut descriptor = RawDescriptor::default();
        let mut has_key = false;
        while let Some(field) = map.next_key()? {
            match field {
                DescriptorField::Key => {
                    descriptor.key = map.next_value()?;
                    has_key = true;
                }
                DescriptorField::Value => descriptor.value = map.next_value()?,
                DescriptorField::RateLimit => descriptor.rate_limit = map.next_value()?,
                DescriptorField::RateLimits => descriptor.rate_limits = map.next_value()?,
                DescriptorField::ShadowMode => {
                    descriptor.shadow_mode = map.next_value::<Option<bool>>()?.unwrap_or(false);
                }
                DescriptorField::DetailedMetric => {
                    descriptor.detailed_metric = map.next_value::<Option<bool>>()?.unwrap_or(false);
                }
                DescriptorField::QuotaMode => {
                    descriptor.quota_mode = map.next_value::<Option<bool>>()?.unwrap_or(false);
                }
                DescriptorField::ShareThreshold => {
                    descriptor.share_threshold = map.next_value::<Option<bool>>()?.unwrap_or(false);
                }
                DescriptorField::ValueToMetric => {
                    descriptor.value_to_metric = map.next_value::<Option<bool>>()?.unwrap_or(false);
                }
                DescriptorField::Metadata => descriptor.metadata = map.next_value()?,
                DescriptorField::Descriptors => {
                    descriptor.descriptors = map.next_value_seed(ListSeed {
                        bounds: self.bounds,
                        depth: self.depth + 1,
                    })?;
                }
            }
        }
        if !has_key {
            return Err(de::Error::missing_field("key"));
        }
        Ok(descriptor)
    }
}
