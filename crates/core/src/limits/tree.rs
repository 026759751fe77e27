//! The compiled, immutable lookup tree of one domain, and the descriptor walk over it.
//!
//! Each level maps a descriptor key to a [`KeyGroup`] holding that key's entries: exact
//! values in a hash map, wildcard values in config order, and the no-value (default) entry.
//!
//! Invariants:
//! - Lookup follows the reference service: per request entry, exact value first, then the
//!   first matching wildcard in config order, then the default; no backtracking; the walk
//!   must consume every request entry.
//! - Lookup allocates nothing: maps are keyed by `Box<str>` and probed with `&str`.
//! - A tree is never mutated after `compile` builds it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Rate;

use super::glob::Glob;

/// A descriptor's `metadata`: a map of JSON-like values (strings, numbers, booleans,
/// null, lists, maps).
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// The descriptor keys of one level.
pub(crate) type Level = HashMap<Box<str>, KeyGroup>;

/// The limits of one domain.
#[derive(Debug)]
pub struct Domain {
    pub(crate) name: Box<str>,
    pub(crate) root: Level,
}

impl Domain {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Walks the request descriptor's entries in order; returns the node the walk ends on,
    /// if it got through every entry (`None` for an empty descriptor). Whether that node
    /// has limits is for the caller to see.
    pub fn lookup<'e>(
        &self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&Node> {
        self.walk(entries).map(|walk| walk.node())
    }

    /// [`Domain::lookup`], keeping the node matched for each entry (`share_threshold` and
    /// `value_to_metric` apply per entry). Allocates nothing for up to four entries.
    pub fn walk<'e>(
        &self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<Walk<'_>> {
        let mut level = &self.root;
        let mut steps = SmallVec::new();
        for (key, value) in entries {
            let found = level.get(key)?.find(value)?;
            level = &found.children;
            steps.push(found);
        }
        (!steps.is_empty()).then_some(Walk { steps })
    }
}

/// The nodes a request descriptor's entries matched, one per entry, in order.
#[derive(Clone, Debug)]
pub struct Walk<'t> {
    steps: SmallVec<[&'t Node; 4]>,
}

impl<'t> Walk<'t> {
    /// The node the walk ended on (the one whose limits apply).
    pub fn node(&self) -> &'t Node {
        // A walk has at least one step (see `Domain::walk`).
        self.steps[self.steps.len() - 1]
    }

    /// The node matched by each entry.
    pub fn steps(&self) -> &[&'t Node] {
        &self.steps
    }

    /// Whether any entry's node asks for its request value in the metrics.
    pub fn values_in_metrics(&self) -> bool {
        self.steps.iter().any(|node| node.value_to_metric)
    }
}

impl Domain {
    /// Every node of the domain, depth first.
    pub fn nodes(&self) -> Vec<&Node> {
        let mut out = Vec::new();
        let mut stack: Vec<&Level> = vec![&self.root];
        while let Some(level) = stack.pop() {
            for group in level.values() {
                let wildcards = group.wildcards.iter().map(|(_, _, node)| node);
                for node in group
                    .exact
                    .values()
                    .chain(wildcards)
                    .chain(group.default.as_deref())
                {
                    out.push(node);
                    stack.push(&node.children);
                }
            }
        }
        out
    }
}

/// The configured entries for one key at one level.
#[derive(Debug, Default)]
pub(crate) struct KeyGroup {
    pub(crate) exact: HashMap<Box<str>, Node>,
    pub(crate) wildcards: Vec<(Glob, Box<str>, Node)>,
    pub(crate) default: Option<Box<Node>>,
}

impl KeyGroup {
    fn find(&self, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(value) {
            return Some(node);
        }
        if let Some((_, _, node)) = self
            .wildcards
            .iter()
            .find(|(glob, _, _)| glob.matches(value))
        {
            return Some(node);
        }
        self.default.as_deref()
    }
}

/// One configured descriptor entry.
#[derive(Debug)]
pub struct Node {
    /// Empty for allow-list and intermediate nodes.
    pub limits: Box<[Limit]>,
    pub shadow_mode: bool,
    /// `quota_mode: true` in the file (the reference service's name; inside the code
    /// "quota" means RLQS only): a soft limit. Over it, the request still passes (reported
    /// as a violation) unless every soft descriptor of the request is over.
    pub soft: bool,
    pub detailed_metric: bool,
    /// The request value of this entry appears in the metrics label (`key=value`).
    pub value_to_metric: bool,
    /// `share_threshold` on a wildcard value: the wildcard pattern, which stands for every
    /// value it matches in the counter key, so they all share one counter.
    pub shared: Option<Box<str>>,
    /// User data returned in the response's dynamic metadata while this entry's limits
    /// are not exceeded.
    pub metadata: Option<Arc<Metadata>>,
    /// Where the entry is in the config, for logs and metrics: the domain, then each key,
    /// with `=value` where a value is configured (`edge > api_key=vip > path`).
    pub path: Box<str>,
    /// The descriptor keys leading here, without values (`api_key.path`): the metrics label,
    /// which must never carry request values.
    pub key_path: Box<str>,
    pub(crate) children: Level,
    /// Position in the domain's config (depth-first, file order), for stable dumps.
    pub(crate) order: usize,
}

/// One configured limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Position among its domain's limits (0..): lets callers keep per-limit side tables.
    pub index: usize,
    pub name: Option<Arc<str>>,
    /// `None` for `unlimited: true`.
    pub rate: Option<Rate>,
    /// How long a hit may wait for quota instead of being denied at once.
    pub max_wait: Option<Duration>,
    /// Most waiters per key; 0 when `max_wait` is `None` (nobody waits).
    pub max_queue: u32,
    /// Names of limits this one drops from the same request.
    pub replaces: Box<[Arc<str>]>,
    /// The rule's tag, stamped into each of its keys ([`KeyBuilder::rule_key`]): a hash of
    /// the entry's place in the config (its `path`) and the limit's unit and algorithm, so
    /// it stays the same across reloads and on every node loading the same files. Never 0.
    ///
    /// [`KeyBuilder::rule_key`]: crate::key::KeyBuilder::rule_key
    pub rule: u32,
    /// `max_keys`: the most live keys this limit may hold on one node (its key budget);
    /// `None`: the store's default share of its key cap.
    pub max_keys: Option<u32>,
}

impl Limit {
    pub fn is_unlimited(&self) -> bool {
        self.rate.is_none()
    }
}

/// How one configured entry on a descriptor's path matches request values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Exact(Box<str>),
    Wildcard(Box<str>),
    /// The key's entry without a value.
    Default,
}

/// The configured entries from a domain's root to one node, in order.
pub type Steps = Vec<(Box<str>, Step)>;

impl Domain {
    /// Every configured entry of the domain with the steps leading to it (in no particular
    /// order; [`Node::order`] is the config's).
    pub fn entries(&self) -> Vec<(Steps, &Node)> {
        let mut out = Vec::new();
        let mut stack = vec![(&self.root, Steps::new())];
        while let Some((level, steps)) = stack.pop() {
            for (key, group) in level {
                let exact = group
                    .exact
                    .iter()
                    .map(|(value, node)| (Step::Exact(value.clone()), node));
                let wildcards = group
                    .wildcards
                    .iter()
                    .map(|(_, pattern, node)| (Step::Wildcard(pattern.clone()), node));
                let default = group.default.iter().map(|node| (Step::Default, &**node));
                for (step, node) in exact.chain(wildcards).chain(default) {
                    let mut here = steps.clone();
                    here.push((key.clone(), step));
                    if !node.children.is_empty() {
                        stack.push((&node.children, here.clone()));
                    }
                    out.push((here, node));
                }
            }
        }
        out
    }
}

impl Node {
    /// The entry's position in its domain's config (depth-first, file order).
    pub fn order(&self) -> usize {
        self.order
    }
}

/// What the limits of one matched entry come to once `replaces` has dropped those that
/// other matched entries name: the one rule the limiter (`ShouldRateLimit` and the HTTP
/// front ends) and RLQS share, so the two can never disagree on which limits apply.
#[derive(Debug, PartialEq, Eq)]
pub enum Applies<'t> {
    /// No limit: the entry has none (allow-list and intermediate entries), or every one
    /// was replaced.
    Nothing,
    /// One of them is `unlimited: true`: the descriptor is not counted at all.
    Unlimited,
    /// These limits count (at least one, each with a rate).
    Limits(SmallVec<[&'t Limit; 2]>),
}

impl<'t> Applies<'t> {
    /// What `limits` (already free of replaced ones) come to.
    pub fn of(limits: impl IntoIterator<Item = &'t Limit>) -> Applies<'t> {
        let limits: SmallVec<[&'t Limit; 2]> = limits.into_iter().collect();
        if limits.is_empty() {
            Applies::Nothing
        } else if limits.iter().any(|limit| limit.is_unlimited()) {
            Applies::Unlimited
        } else {
            Applies::Limits(limits)
        }
    }
}

impl Node {
    /// The limits of this entry that apply, `replaced` being the names that the request's
    /// matched entries ask to replace ([`replaced_names`]).
    pub fn applies(&self, replaced: &[&str]) -> Applies<'_> {
        Applies::of(
            self.limits
                .iter()
                .filter(|limit| !limit.is_replaced(replaced)),
        )
    }
}

impl Limit {
    /// Whether one of the `replaced` names is this limit's.
    pub fn is_replaced(&self, replaced: &[&str]) -> bool {
        !replaced.is_empty()
            && self
                .name
                .as_deref()
                .is_some_and(|name| replaced.contains(&name))
    }
}

/// The names that the limits of `nodes` (the entries one request matched) ask to replace.
pub fn replaced_names<'t>(nodes: impl IntoIterator<Item = &'t Node>) -> SmallVec<[&'t str; 4]> {
    nodes
        .into_iter()
        .flat_map(|node| node.limits.iter())
        .flat_map(|limit| limit.replaces.iter())
        .map(|name| &**name)
        .collect()
}

/// Visits every node of `level` with its `FullKey`-style name (`edge.key_value.key2`, as
/// the reference service's `/rlconfig` names them).
pub(crate) fn visit<'t>(level: &'t Level, prefix: &str, out: &mut Vec<(String, &'t Node)>) {
    for (key, group) in level {
        let base = format!("{prefix}.{key}");
        let exact = group.exact.iter().map(|(value, node)| (&**value, node));
        let wildcards = group
            .wildcards
            .iter()
            .map(|(_, value, node)| (&**value, node));
        for (value, node) in exact.chain(wildcards) {
            let name = format!("{base}_{value}");
            visit(&node.children, &name, out);
            out.push((name, node));
        }
        if let Some(node) = &group.default {
            visit(&node.children, &base, out);
            out.push((base.clone(), node));
        }
    }
}
