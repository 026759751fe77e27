//! Rate-limit configuration: envoyproxy/ratelimit's YAML format (plus our extensions:
//! `algorithm`, `burst`, `max_wait`, `max_queue` and `rate_limits` lists), validated and
//! compiled into an immutable per-domain lookup tree.
//!
//! Pipeline: [`load`](Limits::load) reads files (`load`), `schema` parses each into raw
//! structs within input bounds, `compile` validates them and builds the `tree`, and
//! [`Limits`] checks domains across files.
//!
//! Invariants:
//! - Pure apart from reading files in [`Limits::load`]: no clock, no global state.
//! - All or nothing: a configuration with any error yields [`ConfigErrors`] listing every
//!   problem found, never a partial [`Limits`].
//! - A [`Limits`] is immutable, `Send + Sync`, and looking a descriptor up allocates nothing.
//! - Bounded input: files over 4 MiB, nesting over [`MAX_DEPTH`] levels or more than
//!   [`MAX_DESCRIPTORS`] descriptors in all are errors, never a panic or unbounded memory.

mod compile;
mod error;
mod glob;
mod load;
mod schema;
mod tree;

pub use self::compile::parse_duration;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::path::Path;

use crate::store::Capabilities;

pub use self::compile::{DEFAULT_MAX_QUEUE, MAX_QUEUE_CEILING, MAX_WAIT_CEILING};
pub use self::error::{ConfigError, ConfigErrors, Position};
pub use self::schema::{MAX_DEPTH, MAX_DESCRIPTORS, MAX_FILE_BYTES};
pub use self::tree::{Domain, Limit, Node};

/// One limits file's text, and the name errors call it by (its path, for loaded files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// Every loaded domain's limits.
#[derive(Debug, Default)]
pub struct Limits {
    domains: BTreeMap<Box<str>, Domain>,
    limit_count: usize,
}

impl Limits {
    /// Loads a YAML file, or every `*.yaml` / `*.yml` file directly in a directory (in name
    /// order, skipping names starting with `.`, following symlinks). A directory without
    /// YAML files gives empty limits.
    pub fn load(path: &Path) -> Result<Limits, ConfigErrors> {
        Limits::load_with_sources(path, &Capabilities::MEMORY).map(|(limits, _)| limits)
    }

    /// [`Limits::load`] for a store that can do what `store` says (a limit it cannot count
    /// is an error), also returning the files exactly as read: the text that was compiled,
    /// for hashing it into a version (see `reload`).
    pub fn load_with_sources(
        path: &Path,
        store: &Capabilities,
    ) -> Result<(Limits, Vec<Source>), ConfigErrors> {
        let (sources, errors) = load::read(path);
        let limits = Limits::build(&sources, errors, store)?;
        Ok((limits, sources))
    }

    /// Parses, validates and compiles already-read files (for the in-memory store).
    pub fn from_sources(sources: &[Source]) -> Result<Limits, ConfigErrors> {
        Limits::from_sources_for(sources, &Capabilities::MEMORY)
    }

    /// [`Limits::from_sources`] for a store that can do what `store` says.
    pub fn from_sources_for(
        sources: &[Source],
        store: &Capabilities,
    ) -> Result<Limits, ConfigErrors> {
        Limits::build(sources, Vec::new(), store)
    }

    /// One file's worth of YAML, named `name` in errors.
    pub fn parse_str(name: &str, yaml: &str) -> Result<Limits, ConfigErrors> {
        Limits::from_sources(&[Source {
            name: name.to_owned(),
            text: yaml.to_owned(),
        }])
    }

    fn build(
        sources: &[Source],
        mut errors: Vec<ConfigError>,
        store: &Capabilities,
    ) -> Result<Limits, ConfigErrors> {
        let bounds = schema::Bounds::new();
        let mut limits = Limits::default();
        let mut files: BTreeMap<Box<str>, &str> = BTreeMap::new();
        for source in sources {
            let raw = match schema::parse(&source.name, &source.text, &bounds) {
                Ok(raw) => raw,
                Err(error) => {
                    errors.push(error);
                    if bounds.exhausted() {
                        break;
                    }
                    continue;
                }
            };
            let Some(compiled) = compile::compile(&source.name, raw, &mut errors, store) else {
                continue;
            };
            let domain = compiled.domain;
            match limits.domains.entry(domain.name.clone()) {
                Entry::Occupied(_) => {
                    let first = files.get(&domain.name).copied().unwrap_or_default();
                    errors.push(ConfigError::at(
                        &source.name,
                        format!("domain {}", error::name(&domain.name)),
                        format!("duplicate domain (already defined in {first})"),
                    ));
                }
                Entry::Vacant(slot) => {
                    files.insert(domain.name.clone(), &source.name);
                    slot.insert(domain);
                    limits.limit_count += compiled.limit_count;
                }
            }
        }
        if errors.is_empty() {
            Ok(limits)
        } else {
            Err(ConfigErrors::new(errors))
        }
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// All domains, in name order.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// How many limits are configured: each `rate_limit` and each `rate_limits` item,
    /// unlimited ones included.
    pub fn limit_count(&self) -> usize {
        self.limit_count
    }
}

/// A dump of every limit, one line each, like the reference service's `/rlconfig`:
/// `edge.api_key_vip: unit=SECOND requests_per_unit=10, algorithm=fixed_window, shadow_mode=false`.
/// Domains in name order, nodes in config order.
impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for domain in self.domains.values() {
            let mut nodes = Vec::new();
            tree::visit(&domain.root, &domain.name, &mut nodes);
            nodes.sort_by_key(|(_, node)| node.order);
            for (key, node) in nodes {
                for limit in &node.limits {
                    write!(f, "{}: ", key.escape_debug())?;
                    dump_limit(f, limit)?;
                    writeln!(f, ", shadow_mode={}", node.shadow_mode)?;
                }
            }
        }
        Ok(())
    }
}

fn dump_limit(f: &mut fmt::Formatter<'_>, limit: &Limit) -> fmt::Result {
    match &limit.rate {
        None => f.write_str("unlimited")?,
        Some(rate) => {
            write!(
                f,
                "unit={} requests_per_unit={}, algorithm={}",
                rate.unit.as_str().to_ascii_uppercase(),
                rate.requests_per_unit,
                rate.algorithm
            )?;
            if rate.algorithm.uses_burst() {
                write!(f, ", burst={}", rate.burst)?;
            }
        }
    }
    if let Some(wait) = limit.max_wait {
        write!(
            f,
            ", max_wait={}, max_queue={}",
            compile::format_duration(wait),
            limit.max_queue
        )?;
    }
    if let Some(name) = &limit.name {
        write!(f, ", name={}", name.escape_debug())?;
    }
    if !limit.replaces.is_empty() {
        f.write_str(", replaces=")?;
        for (i, name) in limit.replaces.iter().enumerate() {
            let separator = if i == 0 { "" } else { "|" };
            write!(f, "{separator}{}", name.escape_debug())?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
