//! JSONPatch (RFC 6902) from a pod to its injected self: what the webhook answers, so
//! the API server's result is exactly what `ratekeeper inject` writes for the same pod.
//!
//! Invariants: applying [`diff`]`(before, after)` to `before` gives `after` (as JSON: map
//! keys compare unordered). Keys are escaped as JSON pointers (`~` -> `~0`, `/` -> `~1`);
//! a map or list that did not exist is added whole; items appended to a list are added at
//! `-`; anything else that changed is replaced.

use serde::Serialize;

use super::node::Node;

/// One operation.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    Add { path: String, value: Node },
    Replace { path: String, value: Node },
    Remove { path: String },
}

/// The operations that turn `before` into `after`.
pub fn diff(before: &Node, after: &Node) -> Vec<Op> {
    let mut ops = Vec::new();
    walk(String::new(), before, after, &mut ops);
    ops
}

/// `key` as one JSON pointer token.
pub fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn walk(path: String, before: &Node, after: &Node, ops: &mut Vec<Op>) {
    if before == after {
        return;
    }
    match (before, after) {
        (Node::Map(old), Node::Map(new)) => {
            for (key, value) in old.iter() {
                let at = format!("{path}/{}", escape(key));
                match new.get(key) {
                    None => ops.push(Op::Remove { path: at }),
                    Some(changed) => walk(at, value, changed, ops),
                }
            }
            for (key, value) in new.iter() {
                if !old.contains_key(key) {
                    ops.push(Op::Add {
                        path: format!("{path}/{}", escape(key)),
                        value: value.clone(),
                    });
                }
            }
        }
        (Node::Seq(old), Node::Seq(new))
            if new.len() >= old.len() && new.iter().zip(old).all(|(a, b)| a == b) =>
        {
            for value in &new[old.len()..] {
                ops.push(Op::Add {
                    path: format!("{path}/-"),
                    value: value.clone(),
                });
            }
        }
        (Node::Seq(old), Node::Seq(new)) if new.len() == old.len() => {
            for (index, (a, b)) in old.iter().zip(new).enumerate() {
                walk(format!("{path}/{index}"), a, b, ops);
            }
        }
        _ => ops.push(Op::Replace {
            path,
            value: after.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{Op, diff, escape};
    use crate::node::Node;

    fn node(text: &str) -> Node {
        serde_json::from_str(text).expect("json")
    }

    #[test]
    fn absent_maps_and_lists_are_added_whole_and_keys_escaped() {
        let before = node(r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"app"}]}}"#);
        let after = node(
            r#"{"metadata":{"name":"p","annotations":{"ratekeeper.io/status":"{}","a~b":"c"}},
                "spec":{"containers":[{"name":"app"},{"name":"ratekeeper"}],"volumes":[{"name":"v"}]}}"#,
        );
        let ops = serde_json::to_value(diff(&before, &after)).expect("json");
        assert_eq!(
            ops,
            serde_json::json!([
                {"op": "add", "path": "/metadata/annotations", "value": {"ratekeeper.io/status": "{}", "a~b": "c"}},
                {"op": "add", "path": "/spec/containers/-", "value": {"name": "ratekeeper"}},
                {"op": "add", "path": "/spec/volumes", "value": [{"name": "v"}]},
            ])
        );
        assert_eq!(escape("ratekeeper.io/status"), "ratekeeper.io~1status");
        assert_eq!(escape("a~/b"), "a~0~1b");
        let changed = diff(
            &node(r#"{"a":{"x/y":"1"}}"#),
            &node(r#"{"a":{"x/y":"1,2"}}"#),
        );
        assert_eq!(
            changed,
            [Op::Replace {
                path: "/a/x~1y".to_owned(),
                value: Node::str("1,2")
            }]
        );
    }
}
