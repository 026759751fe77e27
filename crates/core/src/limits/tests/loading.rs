//! Loading limits from a file or a directory on disk.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use crate::limits::tests::TempDir;
use crate::limits::{Limits, LoadOptions};
use crate::testing::mkfifo;

fn domain_file(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    )
}

fn load(path: &Path) -> Limits {
    match Limits::load(path) {
        Ok(limits) => limits,
        Err(errors) => panic!("load of {} failed:\n{errors}", path.display()),
    }
}

fn load_errors(path: &Path) -> Vec<String> {
    match Limits::load(path) {
        Ok(limits) => panic!("load of {} succeeded:\n{limits}", path.display()),
        Err(errors) => errors.errors().iter().map(ToString::to_string).collect(),
    }
}

fn names(limits: &Limits) -> Vec<&str> {
    limits.domains().map(|d| d.name()).collect()
}

#[test]
fn a_single_file() {
    let dir = TempDir::new("single");
    let file = dir.write("edge.yaml", &domain_file("edge"));
    let limits = load(&file);
    assert_eq!(names(&limits), ["edge"]);
    assert_eq!(limits.limit_count(), 1);
}

#[test]
fn a_directory_loads_every_visible_file_recursively_like_the_reference() {
    let dir = TempDir::new("multi");
    dir.write("b.yml", &domain_file("bravo"));
    dir.write("a.yaml", &domain_file("alpha"));
    dir.write("ratelimit.conf", &domain_file("charlie"));
    dir.write("nested/deeper/d", &domain_file("delta"));
    fs::create_dir_all(dir.path().join("empty.yaml")).expect("create empty.yaml/");
    // Hidden names are never read: these would fail the load if they were.
    dir.write(".hidden.yaml", "not: [valid");
    dir.write(".git/config", "not: [valid");
    let (limits, sources) =
        Limits::load_with_sources(dir.path(), LoadOptions::default()).expect("loads");
    assert_eq!(names(&limits), ["alpha", "bravo", "charlie", "delta"]);
    let read: Vec<String> = sources
        .iter()
        .map(|source| {
            let path = Path::new(&source.name);
            let relative = path.strip_prefix(dir.path()).expect("under the directory");
            relative.display().to_string()
        })
        .collect();
    assert_eq!(
        read,
        ["a.yaml", "b.yml", "nested/deeper/d", "ratelimit.conf"],
        "every file read, in path order"
    );
}

#[test]
fn a_file_that_is_not_limits_fails_the_load_naming_it() {
    let dir = TempDir::new("stray");
    dir.write("a.yaml", &domain_file("alpha"));
    let notes = dir.write("docs/notes.txt", "these are notes, not limits");
    let errors = load_errors(dir.path());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(&notes.display().to_string()),
        "names the file: {errors:?}"
    );
}

#[test]
fn a_symlink_loop_is_read_once() {
    let dir = TempDir::new("loop");
    dir.write("sub/a.yaml", &domain_file("alpha"));
    symlink("..", dir.path().join("sub/up")).expect("link sub/up -> ..");
    let limits = load(dir.path());
    assert_eq!(names(&limits), ["alpha"]);
}

#[test]
fn a_kubernetes_configmap_mount() {
    // The layout kubelet writes: files in a timestamped dir, `..data` pointing at it, and
    // each visible name a symlink through `..data`.
    let dir = TempDir::new("configmap");
    dir.write("..2024_05_01_12_00_00.123/edge.yaml", &domain_file("edge"));
    dir.write(
        "..2024_05_01_12_00_00.123/internal.yml",
        &domain_file("internal"),
    );
    symlink("..2024_05_01_12_00_00.123", dir.path().join("..data")).expect("link ..data");
    symlink("..data/edge.yaml", dir.path().join("edge.yaml")).expect("link edge.yaml");
    symlink("..data/internal.yml", dir.path().join("internal.yml")).expect("link internal.yml");
    let limits = load(dir.path());
    assert_eq!(names(&limits), ["edge", "internal"]);
    assert_eq!(limits.limit_count(), 2);
}

#[test]
fn an_empty_directory_has_no_limits() {
    let dir = TempDir::new("empty");
    dir.write(".notes.txt", "nothing");
    let limits = load(dir.path());
    assert_eq!(names(&limits), Vec::<&str>::new());
    assert_eq!(limits.limit_count(), 0);
}

#[test]
fn a_domain_in_two_files_names_both() {
    let dir = TempDir::new("duplicate");
    let first = dir.write("a.yaml", &domain_file("edge"));
    let second = dir.write("b.yaml", &domain_file("edge"));
    assert_eq!(
        load_errors(dir.path()),
        [format!(
            "{}: domain edge: duplicate domain (already defined in {})",
            second.display(),
            first.display()
        )]
    );
}

#[test]
fn errors_in_several_files_are_all_reported_in_name_order() {
    let dir = TempDir::new("several");
    let b = dir.write(
        "b.yaml",
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n",
    );
    let a = dir.write("a.yaml", "descriptors: []\n");
    dir.write("c.yaml", &domain_file("c"));
    let errors = load_errors(dir.path());
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0], format!("{}: missing domain", a.display()));
    assert!(
        errors[1].starts_with(&format!(
            "{}: domain b > descriptors[0] (key k) > rate_limit.unit: unknown unit",
            b.display()
        )),
        "{errors:?}"
    );
}

#[test]
fn a_missing_path_is_named() {
    let dir = TempDir::new("missing");
    let missing = dir.path().join("nope.yaml");
    assert_eq!(
        load_errors(&missing),
        [format!(
            "{}: cannot read: no such file or directory (os error 2)",
            missing.display()
        )]
    );
}

#[test]
fn a_dangling_symlink_in_a_directory_is_named() {
    let dir = TempDir::new("dangling");
    dir.write("a.yaml", &domain_file("alpha"));
    let link = dir.path().join("gone.yaml");
    symlink("..data/gone.yaml", &link).expect("link gone.yaml");
    assert_eq!(
        load_errors(dir.path()),
        [format!(
            "{}: cannot read: no such file or directory (os error 2)",
            link.display()
        )]
    );
}

#[test]
fn oversized_and_non_utf8_files_are_rejected() {
    let dir = TempDir::new("oversized");
    let big = dir.write(
        "big.yaml",
        &format!("domain: big\n#{}\n", "x".repeat(4 * 1024 * 1024)),
    );
    let binary = dir.join("binary.yaml");
    fs::write(&binary, b"domain: \xff\xfe\n").expect("write binary.yaml");
    let errors = load_errors(dir.path());
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(
        errors[0],
        format!(
            "{}: file is larger than 4194304 bytes (4 MiB)",
            big.display()
        )
    );
    assert!(
        errors[1].starts_with(&format!(
            "{}: file is not utf-8 text: invalid utf-8 sequence",
            binary.display()
        )),
        "{errors:?}"
    );
}

fn load_merged(path: &Path) -> Result<Limits, Vec<String>> {
    let options = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    Limits::load_with_sources(path, options)
        .map(|(limits, _)| limits)
        .map_err(|errors| errors.errors().iter().map(ToString::to_string).collect())
}

/// The limit `entries` match in `domain`, as `requests_per_unit`.
fn rate(limits: &Limits, domain: &str, entries: &[(&str, &str)]) -> Option<u32> {
    let node = limits.domain(domain)?.lookup(entries.iter().copied())?;
    Some(node.limits.first()?.rate.as_ref()?.requests_per_unit)
}

#[test]
fn merged_files_of_one_domain_hold_every_descriptor_of_each() {
    let dir = TempDir::new("merge");
    dir.write(
        "a.yaml",
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: tenant\n    value: acme\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    );
    dir.write(
        "teams/b.yaml",
        "domain: edge\ndescriptors:\n  - key: tenant\n    value: globex\n    rate_limit: {unit: hour, requests_per_unit: 3}\n  - key: path\n    descriptors:\n      - key: method\n        rate_limit: {unit: day, requests_per_unit: 4}\n",
    );
    dir.write("c.yaml", &domain_file("other"));
    let limits = load_merged(dir.path()).unwrap_or_else(|errors| panic!("{errors:#?}"));
    assert_eq!(names(&limits), ["edge", "other"]);
    assert_eq!(limits.limit_count(), 5);
    assert_eq!(rate(&limits, "edge", &[("api_key", "k")]), Some(1));
    assert_eq!(rate(&limits, "edge", &[("tenant", "acme")]), Some(2));
    assert_eq!(rate(&limits, "edge", &[("tenant", "globex")]), Some(3));
    assert_eq!(
        rate(&limits, "edge", &[("path", "/"), ("method", "GET")]),
        Some(4)
    );
    assert_eq!(rate(&limits, "other", &[("k", "v")]), Some(1));
    // Every limit of the merged domain has its own index (per-limit metrics use them).
    let domain = limits.domain("edge").expect("edge");
    let mut indices: Vec<usize> = domain
        .nodes()
        .iter()
        .flat_map(|node| node.limits.iter().map(|limit| limit.index))
        .collect();
    indices.sort_unstable();
    assert_eq!(indices, [0, 1, 2, 3]);
    // The dump lists the first file's limits first.
    let dump = limits.to_string();
    let acme = dump.find("edge.tenant_acme").expect("acme in the dump");
    let globex = dump.find("edge.tenant_globex").expect("globex in the dump");
    assert!(acme < globex, "{dump}");
}

#[test]
fn merged_wildcards_keep_load_order() {
    let dir = TempDir::new("merge-wildcards");
    dir.write(
        "a.yaml",
        "domain: edge\ndescriptors:\n  - key: api_key\n    value: vip-*\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    dir.write(
        "b.yaml",
        "domain: edge\ndescriptors:\n  - key: api_key\n    value: vip-gold-*\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: api_key\n    value: partner-*\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
    );
    let limits = load_merged(dir.path()).unwrap_or_else(|errors| panic!("{errors:#?}"));
    // The first matching wildcard in load order wins, as within one file.
    assert_eq!(rate(&limits, "edge", &[("api_key", "vip-gold-1")]), Some(1));
    assert_eq!(rate(&limits, "edge", &[("api_key", "partner-x")]), Some(3));
}

#[test]
fn a_descriptor_defined_in_two_merged_files_names_both() {
    let dir = TempDir::new("merge-duplicate");
    let first = dir.write(
        "a.yaml",
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: tenant\n    value: acme\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    let second = dir.write(
        "b.yaml",
        "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: tenant\n    value: acme\n    descriptors:\n      - key: path\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    assert_eq!(
        load_merged(dir.path()).map(|limits| limits.to_string()),
        Err(vec![
            format!(
                "{}: domain edge > descriptors[1] (key tenant, value acme): duplicate descriptor (same key and value as in {}, merged into one domain)",
                second.display(),
                first.display()
            ),
            format!(
                "{}: domain edge > descriptors[2] (key api_key): duplicate descriptor (same key and value as in {}, merged into one domain)",
                second.display(),
                first.display()
            ),
        ])
    );
    // Without merging the same files are a duplicate domain, as before.
    assert_eq!(
        load_errors(dir.path()),
        [format!(
            "{}: domain edge: duplicate domain (already defined in {})",
            second.display(),
            first.display()
        )]
    );
}

/// The finding: a FIFO in the limits directory froze the load (opening it waits for a
/// writer). Now it is an error naming it, at once, whether it sits in the directory, is
/// reached through a symlink, or is the `--config` path itself.
#[test]
fn a_fifo_is_an_error_naming_it_never_a_blocked_read() {
    let dir = TempDir::new("fifo");
    fs::write(dir.join("a.yaml"), domain_file("a")).expect("written");
    let fifo = dir.join("b.yaml");
    mkfifo(&fifo);
    let errors = load_errors(dir.path());
    assert!(
        errors
            .iter()
            .any(|error| error.contains("b.yaml") && error.contains("not a regular file")),
        "{errors:?}"
    );
    assert!(
        load_errors(&fifo)
            .iter()
            .any(|error| error.contains("not a regular file")),
        "the config path itself"
    );
    let linked = TempDir::new("fifo-link");
    symlink(&fifo, linked.join("c.yaml")).expect("a symlink");
    assert!(
        load_errors(linked.path())
            .iter()
            .any(|error| error.contains("c.yaml") && error.contains("not a regular file"))
    );
}
