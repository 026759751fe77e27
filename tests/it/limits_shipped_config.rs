//! The example limits shipped in `config/` load, and mean what their comments say.

use std::path::Path;

use ratekeeper::algorithm::Algorithm;
use ratekeeper::limits::Limits;

#[test]
fn the_shipped_limits_directory_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let limits = match Limits::load(&dir) {
        Ok(limits) => limits,
        Err(errors) => panic!("config/ does not load:\n{errors}"),
    };
    let edge = limits.domain("edge");
    assert!(edge.is_some(), "config/ defines domain edge:\n{limits}");

    let lookup = |value: &str| edge.and_then(|d| d.lookup([("api_key", value)]));
    let vip = lookup("vip-acme")
        .and_then(|n| n.limits.first())
        .and_then(|l| l.rate);
    assert_eq!(vip.map(|rate| rate.algorithm), Some(Algorithm::TokenBucket));
    let allowed = lookup("healthchecker").map(|n| n.limits.len());
    assert_eq!(allowed, Some(0), "healthchecker is allow-listed");
    let other = lookup("someone")
        .and_then(|n| n.limits.first())
        .and_then(|l| l.rate);
    assert!(other.is_some(), "any other api_key is limited");
}
