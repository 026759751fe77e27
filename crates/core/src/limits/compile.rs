//! Validation of one parsed file and its compilation into a domain's lookup tree.
//!
//! Invariants:
//! - Every problem is reported, not just the first: checks push to an error list and go on
//!   (a broken descriptor's children are still checked).
//! - A limit is built only from fields that passed their checks; a file with any error
//!   never becomes part of a loaded [`super::Limits`] (the caller discards it).
//! - Places name the domain, each descriptor by index with its key and value, and the
//!   field: `domain edge > descriptors[1] (key api_key, value vip) > rate_limits[0].unit`.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, MAX_WINDOW_SECONDS, Rate, Unit};
use crate::check::Capabilities;
use crate::key::{FNV64_OFFSET, fnv1a64};

use super::error::{ConfigError, join, name};
use super::glob::Glob;
use super::schema::{METADATA_DEPTH, RawDescriptor, RawFile, RawLimit, RawReplace};
use super::tree::{Domain, KeyGroup, Level, Limit, Metadata, Node};

/// The longest `max_wait` accepted.
pub const MAX_WAIT_CEILING: Duration = Duration::from_secs(10);
/// The largest `max_queue` accepted.
pub const MAX_QUEUE_CEILING: u32 = 100_000;
/// `max_queue` when a limit has `max_wait` but no `max_queue`.
pub const DEFAULT_MAX_QUEUE: u32 = 1_000;

/// A file's domain, built even when the file has errors (so duplicate domains are still
/// found), with how many limits it configures.
pub(crate) struct Compiled {
    pub domain: Domain,
    pub limit_count: usize,
    /// The `order` the next file of this domain starts at.
    pub next_order: usize,
}

/// Where a file starts when it adds to a domain that other files already defined (merged
/// domains): limit indices and node order continue the domain's, and a top-level
/// descriptor some earlier file defined is a duplicate.
#[derive(Default)]
pub(crate) struct Base<'a> {
    pub first_limit: usize,
    pub first_order: usize,
    /// The domain's top-level descriptors so far, `(key, value or "")`, with the file
    /// defining each.
    pub taken: Option<&'a HashMap<(String, String), String>>,
}

/// Validates and compiles one file. `None` when it names no domain.
pub(crate) fn compile(
    file: &str,
    raw: Option<RawFile>,
    base: &Base<'_>,
    errors: &mut Vec<ConfigError>,
    store: &Capabilities,
) -> Option<Compiled> {
    let raw = raw.unwrap_or_default();
    let domain = match raw.domain {
        None => {
            errors.push(ConfigError::whole_file(file, "missing domain"));
            None
        }
        Some(domain) if domain.is_empty() => {
            errors.push(ConfigError::whole_file(file, "empty domain"));
            None
        }
        Some(domain) => Some(domain),
    };
    let place = domain
        .as_deref()
        .map(|d| format!("domain {}", name(d)))
        .unwrap_or_default();
    let path = domain.as_deref().map(name).unwrap_or_default();
    let mut compiler = Compiler {
        file,
        errors,
        store,
        order: base.first_order,
        first_limit: base.first_limit,
        limit_count: 0,
    };
    let root = compiler.level(raw.descriptors, &place, &path, "", base.taken);
    Some(Compiled {
        domain: Domain {
            name: domain?.into(),
            root,
        },
        limit_count: compiler.limit_count,
        next_order: compiler.order,
    })
}

struct Compiler<'a> {
    file: &'a str,
    errors: &'a mut Vec<ConfigError>,
    /// What the selected store can count.
    store: &'a Capabilities,
    order: usize,
    /// Index of this file's first limit within its domain.
    first_limit: usize,
    limit_count: usize,
}

impl Compiler<'_> {
    fn error(&mut self, place: impl Into<String>, problem: impl Into<String>) {
        self.errors.push(ConfigError::at(self.file, place, problem));
    }

    /// Compiles one level of descriptors (a file's top level, or an entry's children).
    /// `parent` is the level's place in errors, `path` its entries' path (`edge > user`),
    /// `keys` its keys joined by dots; `taken`, at the top of a merged domain, the
    /// descriptors earlier files defined.
    fn level(
        &mut self,
        descriptors: Vec<RawDescriptor>,
        parent: &str,
        path: &str,
        keys: &str,
        taken: Option<&HashMap<(String, String), String>>,
    ) -> Level {
        let mut level = Level::new();
        let mut seen: HashMap<(String, String), usize> = HashMap::new();
        for (index, mut raw) in descriptors.into_iter().enumerate() {
            let key = raw.key.take().unwrap_or_default();
            let value = raw.value.take().filter(|value| !value.is_empty());
            let place = join(parent, &descriptor_place(index, &key, value.as_deref()));
            let insert = self.check_entry(index, &key, value.as_deref(), &place, &mut seen, taken);
            let glob = value.as_deref().and_then(Glob::new);
            let node_path = node_path(path, &key, value.as_deref());
            let key_path = key_path(keys, &key);
            let node = self.node(
                raw,
                value.as_deref(),
                glob.is_some(),
                &place,
                node_path,
                key_path,
            );
            if insert {
                add_node(&mut level, key, value, glob, node);
            }
        }
        level
    }

    /// Reports an empty key, and a descriptor with the same key and value as one `seen`
    /// before it on its level or as one of `taken`. `false`: leave the descriptor out.
    fn check_entry(
        &mut self,
        index: usize,
        key: &str,
        value: Option<&str>,
        place: &str,
        seen: &mut HashMap<(String, String), usize>,
        taken: Option<&HashMap<(String, String), String>>,
    ) -> bool {
        let mut insert = true;
        if key.is_empty() {
            self.error(place, "empty key");
            insert = false;
        }
        let entry = (key.to_owned(), value.unwrap_or_default().to_owned());
        if let Some(other) = taken.and_then(|taken| taken.get(&entry)) {
            self.error(
                place,
                format!(
                    "duplicate descriptor (same key and value as in {other}, merged into one domain)"
                ),
            );
            insert = false;
        }
        match seen.entry(entry) {
            Entry::Occupied(first) => {
                let first = *first.get();
                self.error(
                    place,
                    format!("duplicate descriptor (same key and value as descriptors[{first}])"),
                );
                insert = false;
            }
            Entry::Vacant(slot) => {
                slot.insert(index);
            }
        }
        insert
    }

    /// The entry one descriptor compiles to, its children included. `place` names it in
    /// errors, `path` and `key_path` are its own; `wildcard`: its value is a pattern.
    fn node(
        &mut self,
        raw: RawDescriptor,
        value: Option<&str>,
        wildcard: bool,
        place: &str,
        path: String,
        key_path: String,
    ) -> Node {
        let mut limits = self.limits(raw.rate_limit, raw.rate_limits, place);
        let shared = self.shared(raw.share_threshold, wildcard, value, place);
        let metadata = raw
            .metadata
            .and_then(|metadata| self.metadata(metadata, &join(place, "metadata")));
        for limit in limits.iter_mut() {
            limit.rule = rule_tag(&path, limit.rate.as_ref());
        }
        let order = self.order;
        self.order += 1;
        let children = self.level(raw.descriptors, place, &path, &key_path, None);
        Node {
            limits,
            shadow_mode: raw.shadow_mode,
            soft: raw.quota_mode,
            detailed_metric: raw.detailed_metric,
            value_to_metric: raw.value_to_metric,
            shared,
            metadata,
            path: path.into(),
            key_path: key_path.into(),
            children,
            order,
        }
    }

    /// With `share_threshold`, the pattern whose matches share one counter: only a
    /// wildcard value has one.
    fn shared(
        &mut self,
        share_threshold: bool,
        wildcard: bool,
        value: Option<&str>,
        place: &str,
    ) -> Option<Box<str>> {
        match (share_threshold, wildcard, value) {
            (true, true, Some(value)) => Some(Box::from(value)),
            (true, _, _) => {
                self.error(
                    join(place, "share_threshold"),
                    "share_threshold needs a wildcard value (a value with *) whose matches share one counter",
                );
                None
            }
            (false, _, _) => None,
        }
    }

    /// A descriptor's `metadata`: a map, nested at most [`METADATA_DEPTH`] levels. `null`
    /// (an empty `metadata:`) means none.
    fn metadata(&mut self, value: serde_json::Value, place: &str) -> Option<Arc<Metadata>> {
        if value.is_null() {
            return None;
        }
        if !value.is_object() {
            self.error(
                place,
                "expected a map (key: value pairs) of data to return to Envoy",
            );
            return None;
        }
        if depth(&value) > METADATA_DEPTH {
            self.error(
                place,
                format!("metadata nested deeper than {METADATA_DEPTH} levels"),
            );
            return None;
        }
        match value {
            serde_json::Value::Object(map) if !map.is_empty() => Some(Arc::new(map)),
            _ => None,
        }
    }

    fn limits(
        &mut self,
        single: Option<RawLimit>,
        list: Option<Vec<RawLimit>>,
        place: &str,
    ) -> Box<[Limit]> {
        let list = match (single, list) {
            (None, None) => return Box::default(),
            (Some(_), Some(_)) => {
                self.error(
                    place,
                    "both rate_limit and rate_limits are set (use one of them)",
                );
                return Box::default();
            }
            (Some(raw), None) => {
                let limit = self.limit(raw, &join(place, "rate_limit"));
                return limit.into_iter().collect();
            }
            (None, Some(list)) => list,
        };
        if list.is_empty() {
            self.error(
                join(place, "rate_limits"),
                "empty list (remove rate_limits or add a limit)",
            );
            return Box::default();
        }
        let several = list.len() > 1;
        let mut limits = Vec::with_capacity(list.len());
        // A limit is its window's length (the rate is canonical: `day` x 7 is `week`).
        let mut counters: HashMap<(Unit, u32, Algorithm), usize> = HashMap::new();
        for (index, raw) in list.into_iter().enumerate() {
            let item = join(place, &format!("rate_limits[{index}]"));
            let unlimited_among_others = several && raw.unlimited == Some(true);
            let limit = self.limit(raw, &item);
            if unlimited_among_others {
                self.error(
                    format!("{item}.unlimited"),
                    "an unlimited limit cannot be combined with other limits in rate_limits",
                );
                continue;
            }
            let Some(limit) = limit else {
                continue;
            };
            if let Some(rate) = limit.rate
                && let Some(&first) = counters.get(&(rate.unit, rate.multiplier, rate.algorithm))
            {
                let what = if rate.multiplier == 1 {
                    "unit"
                } else {
                    "window"
                };
                self.error(
                    item,
                    format!(
                        "same {what} and algorithm as rate_limits[{first}] ({}, {}): they would share one counter",
                        rate.window_name(),
                        rate.algorithm
                    ),
                );
                continue;
            }
            if let Some(rate) = limit.rate {
                counters.insert((rate.unit, rate.multiplier, rate.algorithm), index);
            }
            limits.push(limit);
        }
        limits.into_boxed_slice()
    }

    /// One limit at `place` (`... > rate_limit` or `... > rate_limits[2]`).
    fn limit(&mut self, raw: RawLimit, place: &str) -> Option<Limit> {
        let errors_before = self.errors.len();
        let rate = if raw.unlimited == Some(true) {
            self.check_unlimited(&raw, place);
            None
        } else {
            self.rate(&raw, place)
        };
        let max_wait = raw
            .max_wait
            .as_deref()
            .and_then(|text| self.max_wait(text, place));
        let max_queue = self.max_queue(&raw, place);
        if raw.max_keys == Some(0) {
            self.error(
                format!("{place}.max_keys"),
                "max_keys must be at least 1 (a limit that may hold no key refuses every new client)",
            );
        }
        let own_name: Option<Arc<str>> = raw.name.filter(|name| !name.is_empty()).map(Arc::from);
        let replaces = self.replaces(raw.replaces.unwrap_or_default(), own_name.as_deref(), place);
        self.check_store(rate.as_ref(), max_wait, place);
        if self.errors.len() > errors_before {
            return None;
        }
        self.limit_count += 1;
        Some(Limit {
            index: self.first_limit + self.limit_count - 1,
            name: own_name,
            rate,
            max_wait,
            max_queue,
            replaces,
            // Set by `node` once the entry's path is known.
            rule: 0,
            max_keys: raw.max_keys,
        })
    }

    /// Refuses the fields that have no meaning on an unlimited limit.
    fn check_unlimited(&mut self, raw: &RawLimit, place: &str) {
        let extensions = [
            ("unit", raw.unit.is_some()),
            ("unit_multiplier", raw.unit_multiplier.is_some()),
            ("algorithm", raw.algorithm.is_some()),
            ("burst", raw.burst.is_some()),
            ("max_wait", raw.max_wait.is_some()),
            ("max_queue", raw.max_queue.is_some()),
            ("max_keys", raw.max_keys.is_some()),
        ];
        for (name, set) in extensions {
            if set {
                self.error(
                    format!("{place}.{name}"),
                    format!("{name} must not be set when unlimited is true"),
                );
            }
        }
    }

    /// The limit's `max_wait`, from its `text`: a duration more than 0 and at most
    /// [`MAX_WAIT_CEILING`].
    fn max_wait(&mut self, text: &str, place: &str) -> Option<Duration> {
        let field = format!("{place}.max_wait");
        match parse_duration(text) {
            None => {
                self.error(
                    field,
                    format!(
                        "invalid duration {text:?} (expected a number and a unit of ns, us, ms or s, e.g. \"50ms\")"
                    ),
                );
                None
            }
            Some(wait) if wait.is_zero() => {
                self.error(field, "max_wait must be more than 0");
                None
            }
            Some(wait) if wait > MAX_WAIT_CEILING => {
                self.error(
                    field,
                    format!(
                        "max_wait {} is more than the maximum of {}",
                        format_duration(wait),
                        format_duration(MAX_WAIT_CEILING)
                    ),
                );
                None
            }
            Some(wait) => Some(wait),
        }
    }

    /// The limit's `max_queue`: 0 without `max_wait` (setting it then is an error, unless
    /// the limit is unlimited), [`DEFAULT_MAX_QUEUE`] when `max_wait` comes alone.
    fn max_queue(&mut self, raw: &RawLimit, place: &str) -> u32 {
        match (raw.max_queue, raw.max_wait.is_some()) {
            (None, false) => 0,
            (None, true) => DEFAULT_MAX_QUEUE,
            (Some(_), false) => {
                if raw.unlimited != Some(true) {
                    self.error(
                        format!("{place}.max_queue"),
                        "max_queue is only valid with max_wait",
                    );
                }
                0
            }
            (Some(queue), true) => {
                if !(1..=MAX_QUEUE_CEILING).contains(&queue) {
                    self.error(
                        format!("{place}.max_queue"),
                        format!("max_queue must be from 1 to {MAX_QUEUE_CEILING}, got {queue}"),
                    );
                }
                queue
            }
        }
    }

    /// The names of the limits this one (named `own_name`) replaces: each non-empty, and
    /// not its own.
    fn replaces(
        &mut self,
        list: Vec<RawReplace>,
        own_name: Option<&str>,
        place: &str,
    ) -> Box<[Arc<str>]> {
        let mut replaces = Vec::new();
        for (index, replace) in list.into_iter().enumerate() {
            let place = format!("{place}.replaces[{index}].name");
            match replace.name.filter(|name| !name.is_empty()) {
                None => self.error(place, "empty name"),
                Some(other) if own_name == Some(other.as_str()) => {
                    self.error(place, format!("limit {} replaces itself", name(&other)));
                }
                Some(other) => replaces.push(Arc::from(other)),
            }
        }
        replaces.into_boxed_slice()
    }

    /// Refuses what the selected store cannot count exactly.
    fn check_store(&mut self, rate: Option<&Rate>, max_wait: Option<Duration>, place: &str) {
        let store = *self.store;
        if max_wait.is_some() && !store.wait {
            self.error(
                format!("{place}.max_wait"),
                format!(
                    "max_wait is not available with {} (it cannot hold requests in a queue): remove it or use --store memory",
                    store.name
                ),
            );
        }
        let Some(rate) = rate else { return };
        if let Some(most) = store.max_sliding_per_unit
            && rate.algorithm == Algorithm::SlidingWindow
            && rate.requests_per_unit > most
        {
            self.error(
                format!("{place}.requests_per_unit"),
                format!(
                    "a sliding_window limit can count at most {most} per unit with {}, got {}",
                    store.name, rate.requests_per_unit
                ),
            );
        }
        if let Some(most) = store.max_refill
            && rate.algorithm.uses_burst()
            && rate.refill_time() > most
        {
            self.error(
                format!("{place}.burst"),
                format!(
                    "a {} limit may take at most {} to refill with {}; this one takes {} (lower burst or use a shorter unit)",
                    rate.algorithm,
                    format_duration(most),
                    store.name,
                    format_duration(rate.refill_time())
                ),
            );
        }
    }

    /// The counting rule of a limit that is not unlimited.
    fn rate(&mut self, raw: &RawLimit, place: &str) -> Option<Rate> {
        let unit = self.unit(raw, place);
        let algorithm = match raw.algorithm.as_deref() {
            None => Some(Algorithm::default()),
            Some(text) => {
                let algorithm = Algorithm::parse(text);
                if algorithm.is_none() {
                    let algorithms =
                        one_of(Algorithm::ALL.iter().map(|algorithm| algorithm.as_str()));
                    self.error(
                        format!("{place}.algorithm"),
                        format!("unknown algorithm {text:?} (expected {algorithms})"),
                    );
                }
                algorithm
            }
        };
        if let (Some(algorithm), Some(burst)) = (algorithm, raw.burst) {
            if !algorithm.uses_burst() {
                self.error(
                    format!("{place}.burst"),
                    format!(
                        "burst is not used by {algorithm} (only token_bucket and gcra take a burst)"
                    ),
                );
            } else if burst == 0 {
                self.error(format!("{place}.burst"), "burst must be at least 1");
            }
        }
        let rate = Rate::new(
            algorithm?,
            raw.requests_per_unit.unwrap_or(0),
            unit?,
            raw.burst,
        );
        self.multiplied(rate, raw.unit_multiplier, place)
    }

    /// The limit's `unit`: named, and one of [`Unit::ALL`].
    fn unit(&mut self, raw: &RawLimit, place: &str) -> Option<Unit> {
        let units = one_of(Unit::ALL.iter().map(|unit| unit.as_str()));
        match raw.unit.as_deref() {
            None => {
                self.error(
                    format!("{place}.unit"),
                    format!("missing unit (expected {units}, or unlimited: true)"),
                );
                None
            }
            Some(text) => {
                let unit = Unit::parse(text);
                if unit.is_none() {
                    self.error(
                        format!("{place}.unit"),
                        format!("unknown unit {text:?} (expected {units})"),
                    );
                }
                unit
            }
        }
    }

    /// `rate` over `unit_multiplier` units (`None`: one): at least 1, and a window of a
    /// year at most ([`MAX_WINDOW_SECONDS`]: a counter lives as long as its window).
    fn multiplied(&mut self, rate: Rate, multiplier: Option<u32>, place: &str) -> Option<Rate> {
        let Some(multiplier) = multiplier else {
            return Some(rate);
        };
        let field = format!("{place}.unit_multiplier");
        if multiplier == 0 {
            self.error(field, "unit_multiplier must be at least 1");
            return None;
        }
        let multiplied = rate.every(multiplier);
        if multiplied.is_none() {
            self.error(
                field,
                format!(
                    "{multiplier} x {} is longer than a year ({MAX_WINDOW_SECONDS} seconds), the longest window a limit may have",
                    rate.unit
                ),
            );
        }
        multiplied
    }
}

/// How deeply `value` nests maps and lists (a scalar is 0, `{a: 1}` is 1).
fn depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The tag of the rule at `path` with `rate` ([`Limit::rule`]): FNV-1a over the path and the
/// counter's slot, folded to 32 bits, never 0 (the tag of keys of no configured rule).
fn rule_tag(path: &str, rate: Option<&Rate>) -> u32 {
    let (slot, len) = rate.map_or(([0; 6], 2), crate::key::slot);
    let hash = fnv1a64(fnv1a64(FNV64_OFFSET, path.as_bytes()), &slot[..len]);
    match (hash ^ (hash >> 32)) as u32 {
        0 => 1,
        tag => tag,
    }
}

/// `descriptors[3] (key api_key, value vip)`.
fn descriptor_place(index: usize, key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!(
            "descriptors[{index}] (key {}, value {})",
            name(key),
            name(value)
        ),
        None => format!("descriptors[{index}] (key {})", name(key)),
    }
}

/// The path of the entry `key` (with `value`) under `parent`: `edge > api_key=vip`.
fn node_path(parent: &str, key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("{parent} > {}={}", name(key), name(value)),
        None => format!("{parent} > {}", name(key)),
    }
}

/// `keys` and `key` joined by a dot (`api_key.path`).
fn key_path(keys: &str, key: &str) -> String {
    if keys.is_empty() {
        key.to_owned()
    } else {
        format!("{keys}.{key}")
    }
}

/// Files `node` under `key` in `level`: as the key's default (no value), a wildcard
/// (`glob`) or an exact value.
fn add_node(level: &mut Level, key: String, value: Option<String>, glob: Option<Glob>, node: Node) {
    let group: &mut KeyGroup = level.entry(key.into()).or_default();
    match value {
        None => group.default = Some(Box::new(node)),
        Some(value) => match glob {
            Some(glob) => group.wildcards.push((glob, value.into(), node)),
            None => {
                group.exact.insert(value.into(), node);
            }
        },
    }
}

/// `a, b or c`.
fn one_of<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => (*last).to_owned(),
        None => String::new(),
    }
}

/// Parses `50ms`, `1.5s`, `250us` (also `µs`), `100ns`. `None` when malformed or too large.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let unit_nanos: u128 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        u128::from(whole.parse::<u64>().ok()?)
    };
    // Digits past the ninth cannot add a whole nanosecond in any unit.
    let fraction = fraction.get(..fraction.len().min(9)).unwrap_or_default();
    let fraction_nanos = if fraction.is_empty() {
        0
    } else {
        let scale = 10u128.pow(u32::try_from(fraction.len()).ok()?);
        u128::from(fraction.parse::<u64>().ok()?) * unit_nanos / scale
    };
    let nanos = whole.checked_mul(unit_nanos)?.checked_add(fraction_nanos)?;
    Some(Duration::from_nanos(u64::try_from(nanos).ok()?))
}

/// Writes a duration in the largest of s, ms, us, ns that shows it exactly.
pub(crate) fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    for (unit, size) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if nanos > 0 && nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    format!("{nanos}ns")
}
