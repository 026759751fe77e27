//! Tests of the limits module: validation messages, matching, loading from disk.

mod loading;
mod matching;
mod validation;

use super::{ConfigErrors, Limits};

// Compiled limits are shared across request tasks behind an `ArcSwap`.
const _: fn() = || {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<Limits>();
};

/// Compiles `yaml` as file `t.yaml`, failing the test with every error if it is invalid.
fn limits(yaml: &str) -> Limits {
    match Limits::parse_str("t.yaml", yaml) {
        Ok(limits) => limits,
        Err(errors) => panic!("config rejected:\n{errors}"),
    }
}

/// The error lines for `yaml` as file `t.yaml`, failing the test if it is accepted.
fn errors(yaml: &str) -> Vec<String> {
    lines(Limits::parse_str("t.yaml", yaml).map(|limits| limits.to_string()))
}

fn lines(result: Result<String, ConfigErrors>) -> Vec<String> {
    match result {
        Ok(dump) => panic!("config accepted, expected errors; loaded:\n{dump}"),
        Err(errors) => errors.errors().iter().map(ToString::to_string).collect(),
    }
}
#[test]
fn zz_print() {
    for y in ["domain: edge\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
              "domain: edge\ndescriptors:\n  - key: a\n    descriptors: {key: b}\n",
              "domain: [a\n", "domain: edge\ndescriptors: 5\n", "hello\n", "[1]\n", "domain: {a: 1}\n",
              "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, replaces: [x]}\n",
              "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, replaces: {name: x}}\n",
              "domain: edge\ndescriptors:\n  - key: [a]\n",
              "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: [second]}\n",
              "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unlimited: 1}\n",
              "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, max_wait: 5}\n",
              "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, max_wait: 5.5}\n",
              "domain: edge\ndescriptors:\n  - &x {key: a}\n  - *x\n",
              "domain: edge\ndescriptors:\n  - key: a\n\tvalue: b\n",
              ] {
        println!("{:?}", Limits::parse_str("t.yaml", y).err().map(|e| e.to_string()));
    }
    let flow = format!("domain: edge\ndescriptors: {}{}\n", "[{key: k, descriptors: ".repeat(40), "}]".repeat(40));
    println!("{:?}", Limits::parse_str("t.yaml", &flow).err().map(|e| e.to_string()));
    for n in [300, 5000] {
    let flow = format!("domain: edge\ndescriptors: {}{}\n", "[{key: k, descriptors: ".repeat(n), "}]".repeat(n));
    println!("{:?}", Limits::parse_str("t.yaml", &flow).err().map(|e| e.to_string()));
    }
}
