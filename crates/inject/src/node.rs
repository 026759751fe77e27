//! An ordered YAML/JSON value: what `inject` reads and writes, so every map keeps the order
//! its keys were written in (`serde_json::Value` sorts them, and turning on its
//! `preserve_order` feature would change the order of every JSON answer the crate builds).
//!
//! Invariants: a map's keys are strings, unique, in input order; reading and writing back
//! a value changes neither its content nor its key order (comments and the YAML styles of
//! the input are not kept: the writer picks block style and quotes what YAML 1.1 readers
//! would otherwise take for another type).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// One YAML/JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    String(String),
    Seq(Vec<Node>),
    Map(Map),
}

/// A map that keeps its keys in order (linear lookups: Kubernetes objects are small).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Map {
    entries: Vec<(String, Node)>,
}

impl Map {
    pub fn new() -> Map {
        Map::default()
    }

    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entries
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        self.entries
            .iter_mut()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key`: in place when present, else appended.
    pub fn insert(&mut self, key: &str, value: Node) {
        match self.get_mut(key) {
            Some(slot) => *slot = value,
            None => self.entries.push((key.to_owned(), value)),
        }
    }

    /// Puts `key` first (or sets it in place when present).
    pub fn insert_first(&mut self, key: &str, value: Node) {
        match self.get_mut(key) {
            Some(slot) => *slot = value,
            None => self.entries.insert(0, (key.to_owned(), value)),
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Node> {
        let at = self.entries.iter().position(|(name, _)| name == key)?;
        Some(self.entries.remove(at).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.entries
            .iter()
            .map(|(name, value)| (name.as_str(), value))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl FromIterator<(String, Node)> for Map {
    fn from_iter<I: IntoIterator<Item = (String, Node)>>(iter: I) -> Map {
        let mut map = Map::new();
        for (key, value) in iter {
            map.insert(&key, value);
        }
        map
    }
}

impl Node {
    pub fn str(text: &str) -> Node {
        Node::String(text.to_owned())
    }

    /// A map from `(key, value)` pairs, in that order.
    pub fn map<const N: usize>(entries: [(&str, Node); N]) -> Node {
        Node::Map(
            entries
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value))
                .collect(),
        )
    }

    pub fn as_map(&self) -> Option<&Map> {
        match self {
            Node::Map(map) => Some(map),
            _ => None,
        }
    }

    pub fn as_map_mut(&mut self) -> Option<&mut Map> {
        match self {
            Node::Map(map) => Some(map),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&Vec<Node>> {
        match self {
            Node::Seq(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_seq_mut(&mut self) -> Option<&mut Vec<Node>> {
        match self {
            Node::Seq(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::String(text) => Some(text),
            _ => None,
        }
    }

    /// The value at `key` of a map (`None` for anything else).
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?.get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        self.as_map_mut()?.get_mut(key)
    }

    /// The value at a path of map keys.
    pub fn at(&self, path: &[&str]) -> Option<&Node> {
        path.iter().try_fold(self, |node, key| node.get(key))
    }

    pub fn at_mut(&mut self, path: &[&str]) -> Option<&mut Node> {
        path.iter().try_fold(self, |node, key| node.get_mut(key))
    }

    /// The string at a path of map keys.
    pub fn str_at(&self, path: &[&str]) -> Option<&str> {
        self.at(path)?.as_str()
    }

    /// What this value is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) | Node::UInt(_) | Node::Float(_) => "a number",
            Node::String(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a map",
        }
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => serializer.serialize_unit(),
            Node::Bool(value) => serializer.serialize_bool(*value),
            Node::Int(value) => serializer.serialize_i64(*value),
            Node::UInt(value) => serializer.serialize_u64(*value),
            Node::Float(value) => serializer.serialize_f64(*value),
            Node::String(text) => serializer.serialize_str(text),
            Node::Seq(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Map(map) => {
                let mut out = serializer.serialize_map(Some(map.len()))?;
                for (key, value) in map.iter() {
                    out.serialize_entry(key, value)?;
                }
                out.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML or JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Node, E> {
        Ok(Node::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Node, E> {
        Ok(Node::Int(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Node, E> {
        // Non-negative integers are Int when they fit, so equal numbers compare equal
        // whichever reader produced them.
        Ok(i64::try_from(value).map_or(Node::UInt(value), Node::Int))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Node, E> {
        Ok(Node::Float(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Node, E> {
        Ok(Node::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Node, E> {
        Ok(Node::String(value))
    }

    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        Node::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<Key>()? {
            if map.contains_key(&key.0) {
                return Err(de::Error::custom(format_args!("duplicate key {:?}", key.0)));
            }
            let value = access.next_value()?;
            map.entries.push((key.0, value));
        }
        Ok(Node::Map(map))
    }
}

/// A map key: a string, or a scalar taken as its text (YAML allows `80: http`).
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        match Node::deserialize(deserializer)? {
            Node::String(text) => Ok(Key(text)),
            Node::Bool(value) => Ok(Key(value.to_string())),
            Node::Int(value) => Ok(Key(value.to_string())),
            Node::UInt(value) => Ok(Key(value.to_string())),
            Node::Float(value) => Ok(Key(value.to_string())),
            other => Err(de::Error::custom(format_args!(
                "a map key must be a string, found {}",
                other.kind()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Node;

    #[test]
    fn yaml_keeps_key_order_and_types_through_a_round_trip() {
        let text = "kind: Deployment\napiVersion: apps/v1\nspec:\n  z: 1\n  a: '8080'\n  b: 'true'\n  c: true\n  d: 1.5\n  e: null\n  f:\n  - x\n  - y: 2\n";
        let node: Node = serde_saphyr::from_str(text).expect("yaml");
        let keys: Vec<&str> = node.as_map().expect("map").iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["kind", "apiVersion", "spec"]);
        let written = serde_saphyr::to_string(&node).expect("written");
        let again: Node = serde_saphyr::from_str(&written).expect("yaml again");
        assert_eq!(again, node);
        // Strings that look like other types stay strings.
        assert_eq!(again.str_at(&["spec", "a"]), Some("8080"));
        assert_eq!(again.str_at(&["spec", "b"]), Some("true"));
        assert_eq!(again.at(&["spec", "c"]), Some(&Node::Bool(true)));
    }

    #[test]
    fn json_keeps_key_order_and_duplicate_keys_are_refused() {
        let node: Node =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,"2"],"x":null}}"#).expect("json");
        assert_eq!(
            serde_json::to_string(&node).expect("json"),
            r#"{"b":1,"a":{"y":[1,"2"],"x":null}}"#
        );
        let error = serde_json::from_str::<Node>(r#"{"a":1,"a":2}"#).expect_err("duplicate");
        assert!(error.to_string().contains("duplicate key"), "{error}");
    }
}
