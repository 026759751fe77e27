//! Rate-limit configuration: envoyproxy/ratelimit's YAML format (plus our extensions:
//! `algorithm`, `burst`, `max_wait`, `max_queue` and `rate_limits` lists), validated and
//! compiled into an immutable per-domain lookup tree.
//!
//! Pipeline: [`load`](Limits::load) reads files (`load`), `schema` parses each into raw
//! structs within input bounds, `compile` validates them and builds the `tree`, and
//! [`Limits`] checks domains across files: a domain in two files is an error, or, with
//! [`LoadOptions::merge_domains`], one domain holding both files' descriptors.
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

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::check::{Capabilities, Rules};

pub use self::compile::{DEFAULT_MAX_QUEUE, MAX_QUEUE_CEILING, MAX_WAIT_CEILING};
pub use self::error::{ConfigError, ConfigErrors, Position};
pub use self::schema::{MAX_DEPTH, MAX_DESCRIPTORS, MAX_FILE_BYTES, METADATA_DEPTH};
pub use self::tree::{Applies, Domain, Limit, Metadata, Node, Step, Steps, Walk, replaced_names};

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
    /// Every limit with a rate, by its rule tag ([`Limit::rule`]).
    rules: HashMap<u32, Rule>,
}

/// One configured limit as the stores see it: by its tag, with its key budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The entry's place (`edge > remote_address`), with the limit's name, or its unit and
    /// algorithm, when the entry has several limits.
    pub name: Arc<str>,
    pub max_keys: Option<u32>,
}

/// How files become one configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Files naming the same domain add their descriptors to it (the reference service's
    /// `MERGE_DOMAIN_CONFIG`), in load order; a top-level descriptor (key and value) that
    /// an earlier file of the domain defined is an error naming both files. Without it a
    /// domain in a second file is a "duplicate domain" error.
    pub merge_domains: bool,
    /// What the counter store can count: a limit it cannot is an error, naming the file
    /// and the place (the in-memory store, the default, counts everything).
    pub store: Capabilities,
}

/// What the files loaded so far contributed to one domain.
struct DomainFiles<'s> {
    /// The file that defined the domain first.
    first: &'s str,
    limit_count: usize,
    next_order: usize,
    /// Top-level `(key, value or "")` -> the file defining it (kept only when merging).
    top: HashMap<(String, String), String>,
}

impl DomainFiles<'_> {
    /// Where the next file of the domain starts (see [`compile::Base`]).
    fn base(&self) -> compile::Base<'_> {
        compile::Base {
            first_limit: self.limit_count,
            first_order: self.next_order,
            taken: Some(&self.top),
        }
    }
}

impl Limits {
    /// Loads a YAML file, or every file under a directory (see `load`), with the default
    /// [`LoadOptions`].
    pub fn load(path: &Path) -> Result<Limits, ConfigErrors> {
        Limits::load_with_sources(path, LoadOptions::default()).map(|(limits, _)| limits)
    }

    /// [`Limits::load`] with `options`, also returning the files exactly as read: the text
    /// that was compiled, for hashing it into a version (see `reload`).
    pub fn load_with_sources(
        path: &Path,
        options: LoadOptions,
    ) -> Result<(Limits, Vec<Source>), ConfigErrors> {
        let (sources, errors) = load::read(path);
        let limits = Limits::build(&sources, errors, options)?;
        Ok((limits, sources))
    }

    /// Parses, validates and compiles already-read files.
    pub fn from_sources(sources: &[Source]) -> Result<Limits, ConfigErrors> {
        Limits::from_sources_with(sources, LoadOptions::default())
    }

    /// [`Limits::from_sources`] with `options`.
    pub fn from_sources_with(
        sources: &[Source],
        options: LoadOptions,
    ) -> Result<Limits, ConfigErrors> {
        Limits::build(sources, Vec::new(), options)
    }

    /// One file's worth of YAML, named `name` in errors.
    pub fn parse_str(name: &str, yaml: &str) -> Result<Limits, ConfigErrors> {
        Limits::from_sources(&[Source {
            name: name.to_owned(),
            text: yaml.to_owned(),
        }])
    }

    /// Parses, validates and compiles `sources` in order, after the `errors` of reading
    /// them: all of them or, if anything is wrong, every error found.
    fn build(
        sources: &[Source],
        mut errors: Vec<ConfigError>,
        options: LoadOptions,
    ) -> Result<Limits, ConfigErrors> {
        let bounds = schema::Bounds::new();
        let mut limits = Limits::default();
        let mut files: BTreeMap<Box<str>, DomainFiles<'_>> = BTreeMap::new();
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
            // A file adding to a domain continues its numbering and may not redefine its
            // top-level descriptors.
            let earlier = raw
                .as_ref()
                .and_then(|raw| raw.domain.as_deref())
                .and_then(|domain| files.get(domain))
                .filter(|_| options.merge_domains);
            let base = earlier.map_or_else(compile::Base::default, DomainFiles::base);
            let Some(compiled) =
                compile::compile(&source.name, raw, &base, &mut errors, &options.store)
            else {
                continue;
            };
            limits.add_domain(
                compiled,
                &source.name,
                &mut files,
                &mut errors,
                options.merge_domains,
            );
        }
        if errors.is_empty() {
            limits.rules = limits.collect_rules();
            Ok(limits)
        } else {
            Err(ConfigErrors::new(errors))
        }
    }

    /// Adds the domain `file` compiled: a new domain, more of one an earlier file defined
    /// (with `merge_domains`), or else a duplicate domain error.
    fn add_domain<'s>(
        &mut self,
        compiled: compile::Compiled,
        file: &'s str,
        files: &mut BTreeMap<Box<str>, DomainFiles<'s>>,
        errors: &mut Vec<ConfigError>,
        merge_domains: bool,
    ) {
        let domain = compiled.domain;
        let top = match merge_domains {
            true => top_level(&domain.root, file),
            false => HashMap::new(),
        };
        match self.domains.entry(domain.name.clone()) {
            Entry::Occupied(mut slot) if merge_domains => {
                merge(&mut slot.get_mut().root, domain.root);
                self.limit_count += compiled.limit_count;
                if let Some(files) = files.get_mut(&domain.name) {
                    files.limit_count += compiled.limit_count;
                    files.next_order = compiled.next_order;
                    files.top.extend(top);
                }
            }
            Entry::Occupied(_) => {
                let first = files.get(&domain.name).map(|files| files.first);
                errors.push(ConfigError::at(
                    file,
                    format!("domain {}", error::name(&domain.name)),
                    format!(
                        "duplicate domain (already defined in {})",
                        first.unwrap_or_default()
                    ),
                ));
            }
            Entry::Vacant(slot) => {
                files.insert(
                    domain.name.clone(),
                    DomainFiles {
                        first: file,
                        limit_count: compiled.limit_count,
                        next_order: compiled.next_order,
                        top,
                    },
                );
                slot.insert(domain);
                self.limit_count += compiled.limit_count;
            }
        }
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// All domains, in name order.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// The limit tagged `rule` ([`Limit::rule`]), if one is configured.
    pub fn rule(&self, rule: u32) -> Option<&Rule> {
        self.rules.get(&rule)
    }

    fn collect_rules(&self) -> HashMap<u32, Rule> {
        let mut rules = HashMap::new();
        for domain in self.domains.values() {
            let mut nodes = Vec::new();
            tree::visit(&domain.root, &domain.name, &mut nodes);
            for (_, node) in nodes {
                let several = node.limits.len() > 1;
                for limit in &node.limits {
                    let Some(rate) = limit.rate else { continue };
                    let name = match (&limit.name, several) {
                        (Some(name), true) => format!("{} [{name}]", node.path),
                        (None, true) => {
                            format!("{} [{} {}]", node.path, rate.window_name(), rate.algorithm)
                        }
                        (_, false) => node.path.to_string(),
                    };
                    rules.insert(
                        limit.rule,
                        Rule {
                            name: name.into(),
                            max_keys: limit.max_keys,
                        },
                    );
                }
            }
        }
        rules
    }

    /// How many limits are configured: each `rate_limit` and each `rate_limits` item,
    /// unlimited ones included.
    pub fn limit_count(&self) -> usize {
        self.limit_count
    }
}

/// The limits in force answer the stores' questions about rules.
impl Rules for ArcSwap<Limits> {
    fn max_keys(&self, rule: u32) -> Option<u32> {
        self.load().rule(rule).and_then(|rule| rule.max_keys)
    }

    fn name(&self, rule: u32) -> Option<Arc<str>> {
        self.load().rule(rule).map(|rule| Arc::clone(&rule.name))
    }
}

/// The top-level descriptors of a file's tree, `(key, value or "")`, each naming `file`.
fn top_level(root: &tree::Level, file: &str) -> HashMap<(String, String), String> {
    let mut top = HashMap::new();
    for (key, group) in root {
        let exact = group.exact.keys();
        let wildcards = group.wildcards.iter().map(|(_, value, _)| value);
        for value in exact.chain(wildcards) {
            top.insert((key.to_string(), value.to_string()), file.to_owned());
        }
        if group.default.is_some() {
            top.insert((key.to_string(), String::new()), file.to_owned());
        }
    }
    top
}

/// Adds a later file's top-level entries to its domain's tree. Wildcards keep file order,
/// so the first matching one is still the first in load order. A duplicate never reaches
/// here in a load that succeeds (compile reported it and left it out).
fn merge(root: &mut tree::Level, other: tree::Level) {
    for (key, group) in other {
        let into = root.entry(key).or_default();
        for (value, node) in group.exact {
            into.exact.entry(value).or_insert(node);
        }
        into.wildcards.extend(group.wildcards);
        if into.default.is_none() {
            into.default = group.default;
        }
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
                    write!(f, ", shadow_mode={}", node.shadow_mode)?;
                    if node.soft {
                        f.write_str(", quota_mode=true")?;
                    }
                    if node.shared.is_some() {
                        f.write_str(", share_threshold=true")?;
                    }
                    writeln!(f)?;
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
            write!(f, "unit={}", rate.unit.as_str().to_ascii_uppercase())?;
            if rate.multiplier != 1 {
                write!(f, " unit_multiplier={}", rate.multiplier)?;
            }
            write!(
                f,
                " requests_per_unit={}, algorithm={}",
                rate.requests_per_unit, rate.algorithm
            )?;
            if rate.multiplier != 1 {
                write!(
                    f,
                    " ({} per {})",
                    rate.requests_per_unit,
                    rate.window_name()
                )?;
            }
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
