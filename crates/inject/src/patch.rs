//! JSONPatch (RFC 6902) from a pod to its injected self: what the webhook answers, so
//! the API server's result is exactly what `ratekeeper inject` writes for the same pod.
//!
//! Invariants: applying [`diff`]`(before, after)` to `before` gives `after` (as JSON: map
//! keys compare unordered). Keys are escaped as JSON pointers (`~` -> `~0`, `/` -> `~1`);
//! a map or list that did not exist is added whole; items appended to a list are added at
//! `-`, items inserted into it at their index; anything else that changed is replaced.

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
        (Node::Seq(old), Node::Seq(new)) => match inserted(old, new) {
            Some(at) => {
                let added = &new[at..at + new.len() - old.len()];
                for (offset, value) in added.iter().enumerate() {
                    // Appended: at `-`; inserted: at its index, in order.
                    let index = if at == old.len() {
                        "-".to_owned()
                    } else {
                        (at + offset).to_string()
                    };
                    ops.push(Op::Add {
                        path: format!("{path}/{index}"),
                        value: value.clone(),
                    });
                }
            }
            None if new.len() == old.len() => {
                for (index, (a, b)) in old.iter().zip(new).enumerate() {
                    walk(format!("{path}/{index}"), a, b, ops);
                }
            }
            None => ops.push(Op::Replace {
                path,
                value: after.clone(),
            }),
        },
        _ => ops.push(Op::Replace {
            path,
            value: after.clone(),
        }),
    }
}

/// Where `new` is `old` with items inserted in one place: that index (`old.len()`: appended).
fn inserted(old: &[Node], new: &[Node]) -> Option<usize> {
    let added = new.len().checked_sub(old.len())?;
    let at = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    (old[at..] == new[at + added..]).then_some(at)
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

    #[test]
    fn items_inserted_into_a_list_are_added_at_their_index() {
        let ops = |before: &str, after: &str| {
            serde_json::to_value(diff(&node(before), &node(after))).expect("json")
        };
        assert_eq!(
            ops(r#"{"l":["a","c"]}"#, r#"{"l":["a","b","x","c"]}"#),
            serde_json::json!([
                {"op": "add", "path": "/l/1", "value": "b"},
                {"op": "add", "path": "/l/2", "value": "x"},
            ])
        );
        assert_eq!(
            ops(r#"{"l":["c"]}"#, r#"{"l":["b","c"]}"#),
            serde_json::json!([{"op": "add", "path": "/l/0", "value": "b"}])
        );
        // Not one insertion: the list is replaced.
        assert_eq!(
            ops(r#"{"l":["a","c"]}"#, r#"{"l":["b","a","d"]}"#),
            serde_json::json!([{"op": "replace", "path": "/l", "value": ["b", "a", "d"]}])
        );
    }
}
