//! Replays every kept fuzz input (`fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`)
//! through its harness on stable, so a fixed crash stays fixed and `cargo test` runs what
//! the fuzzer found interesting.

use std::path::Path;

/// Runs `harness` on every file of `target`'s corpus and regressions; fails when there are
/// none (an empty or moved folder must not pass quietly).
fn replay(target: &str, harness: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for folder in ["corpus", "regressions"] {
        let dir = root.join(folder).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = entries
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.is_file())
            .collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).expect("a readable input");
            let outcome = std::panic::catch_unwind(|| harness(&data));
            assert!(outcome.is_ok(), "{} failed", file.display());
            replayed += 1;
        }
    }
    assert!(
        replayed > 0,
        "no inputs for fuzz target {target} under {}",
        root.display()
    );
}

#[test]
fn fixture_limits_compile() {
    crate::limits::Limits::parse_str("fuzz.yaml", super::LIMITS).expect("the fixture's limits");
}

#[test]
fn rls_inputs_replay() {
    replay("rls", super::rls);
}

#[test]
fn limits_inputs_replay() {
    replay("limits", super::limits);
}

#[test]
fn stats_mapping_inputs_replay() {
    replay("stats_mapping", super::stats_mapping);
}

#[test]
fn grpc_inputs_replay() {
    replay("grpc", super::grpc);
}

#[test]
fn peer_inputs_replay() {
    replay("peer", super::peer);
}

#[test]
fn redis_reply_inputs_replay() {
    replay("redis_reply", super::redis_reply);
}

#[test]
fn admin_body_inputs_replay() {
    replay("admin_body", super::admin_body);
}

#[test]
fn admin_request_inputs_replay() {
    replay("admin_request", super::admin_request);
}

#[test]
fn admission_review_inputs_replay() {
    replay("admission_review", super::admission_review);
}

#[test]
fn inject_yaml_inputs_replay() {
    replay("inject_yaml", super::inject_yaml);
}

#[test]
fn rlqs_inputs_replay() {
    replay("rlqs", super::rlqs);
}
