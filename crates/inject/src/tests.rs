//! Property tests of injection on generated pods: whatever the pod, `inject` either refuses
//! it unchanged or injects it so that a second `inject` changes nothing, `uninject` gives
//! the pod back exactly (field order included), and the webhook's JSONPatch, applied to
//! the pod, gives the injected pod. And no input bytes make `inject` or the webhook panic.

use proptest::prelude::*;

use super::node::{Map, Node};
use super::patch::{Op, diff};
use super::review::{Scope, answer};
use super::settings::SettingsArgs;
use super::sidecar::{Outcome, inject, uninject};
use super::workload::{Mode, Options, rewrite};

/// Leaves and small trees of them, as found anywhere in a pod.
fn value() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![
        Just(Node::Null),
        any::<bool>().prop_map(Node::Bool),
        any::<i64>().prop_map(Node::Int),
        "[a-z0-9/~.-]{0,8}".prop_map(Node::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Node::Seq),
            prop::collection::vec(("[a-z~/]{1,6}", inner), 0..4)
                .prop_map(|entries| Node::Map(entries.into_iter().collect())),
        ]
    })
}

/// A pod (template): some metadata (annotations ratekeeper reads among others), a spec with
/// containers and maybe volumes, and extra fields; any of them may be missing or odd.
fn pod() -> impl Strategy<Value = Node> {
    let annotation = prop_oneof![
        Just(("ratekeeper.io/cluster".to_owned(), Node::str("true"))),
        Just(("ratekeeper.io/istio".to_owned(), Node::str("true"))),
        Just(("ratekeeper.io/inject".to_owned(), Node::str("enabled"))),
        Just((
            "ratekeeper.io/admin-token-secret".to_owned(),
            Node::str("tok")
        )),
        Just((
            "traffic.sidecar.istio.io/excludeInboundPorts".to_owned(),
            Node::str("9000")
        )),
        Just((
            "traffic.sidecar.istio.io/excludeOutboundPorts".to_owned(),
            Node::str("8091")
        )),
        Just((
            "ratekeeper.io/native-sidecar".to_owned(),
            Node::str("false")
        )),
        ("[a-z]{1,5}/[a-z]{1,5}", "[a-z0-9]{0,5}").prop_map(|(k, v)| (k, Node::String(v))),
    ];
    let annotations = prop_oneof![
        Just(None),
        Just(Some(Node::Null)),
        prop::collection::vec(annotation, 0..4)
            .prop_map(|entries| Some(Node::Map(entries.into_iter().collect()))),
    ];
    let container = ("[a-z]{1,6}", prop::option::of(1..70_000i64)).prop_map(|(name, port)| {
        let mut container = Map::new();
        container.insert("name", Node::String(name));
        if let Some(port) = port {
            container.insert(
                "ports",
                Node::Seq(vec![Node::map([("containerPort", Node::Int(port))])]),
            );
        }
        Node::Map(container)
    });
    // Init containers: run to completion, or native sidecars (Istio's among them).
    let init_container = prop_oneof![
        container.clone(),
        Just(Node::map([
            ("name", Node::str("istio-proxy")),
            ("restartPolicy", Node::str("Always")),
        ])),
    ];
    let init_containers = prop_oneof![
        Just(None),
        Just(Some(Node::Null)),
        prop::collection::vec(init_container, 0..3).prop_map(|items| Some(Node::Seq(items))),
    ];
    let volumes = prop_oneof![
        Just(None),
        Just(Some(Node::Null)),
        prop::collection::vec("[a-z-]{1,8}", 0..3).prop_map(|names| {
            Some(Node::Seq(
                names
                    .into_iter()
                    .map(|name| Node::map([("name", Node::String(name))]))
                    .collect(),
            ))
        }),
    ];
    (
        any::<bool>(),
        annotations,
        (prop::collection::vec(container, 0..3), init_containers),
        volumes,
        prop::collection::vec(("[a-z]{1,6}", value()), 0..3),
    )
        .prop_map(
            |(with_metadata, annotations, (containers, init), volumes, extra)| {
                let mut pod = Map::new();
                for (key, value) in extra {
                    pod.insert(&key, value);
                }
                if with_metadata || annotations.is_some() {
                    let mut metadata = Map::new();
                    metadata.insert("name", Node::str("p"));
                    if let Some(annotations) = annotations {
                        metadata.insert("annotations", annotations);
                    }
                    pod.insert("metadata", Node::Map(metadata));
                }
                let mut spec = Map::new();
                if let Some(init) = init {
                    spec.insert("initContainers", init);
                }
                spec.insert("containers", Node::Seq(containers));
                if let Some(volumes) = volumes {
                    spec.insert("volumes", volumes);
                }
                pod.insert("spec", Node::Map(spec));
                Node::Map(pod)
            },
        )
}

/// RFC 6902, as the API server applies the webhook's patch.
fn apply(document: &mut Node, ops: &[Op]) {
    for op in ops {
        let (path, value) = match op {
            Op::Add { path, value } | Op::Replace { path, value } => (path, Some(value.clone())),
            Op::Remove { path } => (path, None),
        };
        let mut tokens: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|token| token.replace("~1", "/").replace("~0", "~"))
            .collect();
        let last = tokens.pop().expect("a non-root path");
        let mut target = &mut *document;
        for token in &tokens {
            target = match target {
                Node::Map(map) => map.get_mut(token).expect("the path exists"),
                Node::Seq(items) => &mut items[token.parse::<usize>().expect("an index")],
                _ => panic!("{path}: not a container"),
            };
        }
        match (target, value) {
            (Node::Map(map), Some(value)) => map.insert(&last, value),
            (Node::Map(map), None) => {
                map.remove(&last).expect("removed");
            }
            (Node::Seq(items), Some(value)) if last == "-" => items.push(value),
            (Node::Seq(items), Some(value)) if matches!(op, Op::Add { .. }) => {
                items.insert(last.parse().expect("an index"), value);
            }
            (Node::Seq(items), Some(value)) => items[last.parse::<usize>().expect("index")] = value,
            (Node::Seq(items), None) => {
                items.remove(last.parse().expect("an index"));
            }
            _ => panic!("{path}: not a container"),
        }
    }
}

/// Map equality ignoring key order (JSON's, after a patch adds keys at the end).
fn same_json(a: &Node, b: &Node) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn injection_is_refused_unchanged_or_idempotent_exactly_reversible_and_patchable(original in pod()) {
        let settings = SettingsArgs::default();
        let mut injected = original.clone();
        match inject(&mut injected, &settings) {
            Err(_) => prop_assert_eq!(&injected, &original),
            Ok((Outcome::Injected, _)) => {
                let mut twice = injected.clone();
                let (outcome, _) = inject(&mut twice, &settings).expect("a second inject");
                prop_assert_eq!(outcome, Outcome::AlreadyInjected);
                prop_assert_eq!(&twice, &injected);
                let mut back = injected.clone();
                prop_assert!(uninject(&mut back).expect("uninjected"));
                prop_assert_eq!(&back, &original);
                let mut patched = original.clone();
                apply(&mut patched, &diff(&original, &injected));
                prop_assert!(same_json(&patched, &injected));
            }
            Ok(_) => prop_assert_eq!(&injected, &original),
        }
    }

    #[test]
    fn no_input_makes_inject_or_the_webhook_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), text in "[-a-z:{}\\[\\] \n,'\"]{0,200}") {
        let options = Options { mode: Mode::Inject, strict: false, settings: SettingsArgs::default() };
        let _ = rewrite(&text, &options);
        let _ = rewrite(&String::from_utf8_lossy(&bytes), &options);
        for scope in [Scope::Annotated, Scope::Namespace] {
            if let Ok(answer) = answer(&bytes, scope, &options.settings) {
                prop_assert_eq!(&answer.review["response"]["allowed"], &serde_json::Value::Bool(true));
            }
            if let Ok(answer) = answer(text.as_bytes(), scope, &options.settings) {
                prop_assert_eq!(&answer.review["response"]["allowed"], &serde_json::Value::Bool(true));
            }
        }
    }
}
