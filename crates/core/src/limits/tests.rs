//! Tests of the limits module: validation messages, matching, loading from disk.

mod bounds;
mod key_budgets;
pub(crate) mod loading;
mod matching;
mod newer_keys;
mod validation;

use super::{ConfigErrors, Limits};
pub(crate) use crate::testing::TempDir;

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
