//! The documents link where they say: every relative link and every `#anchor` in the
//! README, the manual (`docs/`), ARCHITECTURE.md, CONTRIBUTING.md, BENCHMARKS.md and the
//! fuzzing notes resolves to a file of the repository and a heading of it, with GitHub's
//! anchor rules. Links to other sites are not fetched (CI has no internet).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents checked: the front pages and every Markdown file of the manual.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut documents: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "BENCHMARKS.md",
        "fuzz/README.md",
    ]
    .iter()
    .map(|name| root.join(name))
    .collect();
    let mut manual: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    manual.sort();
    documents.extend(manual);
    documents
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// `line` without its code spans (a link inside backticks is code, not a link).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The targets of the inline links (`[text](target)`) and reference definitions
/// (`[name]: target`) of `text`; footnotes (`[^name]`) are not links.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let line = without_code(line);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && !trimmed.starts_with("[^")
            && let Some((label, target)) = trimmed.split_once("]: ")
            && !label.contains('(')
        {
            targets.push(target.split_whitespace().next().unwrap_or("").to_owned());
            continue;
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// GitHub's anchor of a heading: lowercased, punctuation dropped (but `-` and `_`),
/// spaces made `-`.
fn slug(heading: &str) -> String {
    heading
        .replace('`', "")
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown file: its headings' slugs, a repeated one numbered `-1`,
/// `-2`..., and any `<a name="...">`/`id="..."` it sets.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose(text) {
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                let base = slug(heading);
                let count = seen.entry(base.clone()).or_insert(0);
                anchors.insert(match *count {
                    0 => base.clone(),
                    n => format!("{base}-{n}"),
                });
                *count += 1;
            }
        }
        for marker in ["name=\"", "id=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(marker) {
                let after = &rest[at + marker.len()..];
                let end = after.find('"').unwrap_or(after.len());
                anchors.insert(after[..end].to_owned());
                rest = &after[end..];
            }
        }
    }
    anchors
}

/// Why `target`, linked from `document`, does not resolve; `None` when it does.
fn broken(document: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        document.to_path_buf()
    } else {
        document.parent().expect("a document's folder").join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|ext| ext != "md") {
        return None;
    }
    let text = std::fs::read_to_string(&file).expect("a Markdown file");
    (!anchors(&text).contains(anchor))
        .then(|| format!("{} has no heading #{anchor}", file.display()))
}

#[test]
fn every_relative_link_and_anchor_of_the_docs_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(&document)
            .unwrap_or_else(|e| panic!("{}: {e}", document.display()));
        for target in links(&text) {
            checked += 1;
            if let Some(problem) = broken(&document, &target) {
                let name = document.strip_prefix(root()).unwrap_or(&document);
                problems.push(format!("{}: ({target}): {problem}", name.display()));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: the scan is broken"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scan_finds_links_anchors_and_breaks() {
    let text = "# Quick start\n## The `serve` flags\n## Quick start\n```\n# not a heading [x](nowhere.md)\n```\n\
                See [a](docs/README.md#top), `[b](code.md)`, [^note] and\n[ref]: other.md#x\n";
    assert_eq!(links(text), ["docs/README.md#top", "other.md#x"]);
    let anchors = anchors(text);
    assert!(anchors.contains("quick-start") && anchors.contains("quick-start-1"));
    assert!(anchors.contains("the-serve-flags"), "{anchors:?}");
    assert_eq!(
        slug(" Cluster mode: one limit across all replicas"),
        "cluster-mode-one-limit-across-all-replicas"
    );
    assert_eq!(
        slug(" Refunds (`is_negative_hits`)"),
        "refunds-is_negative_hits"
    );
    let readme = root().join("README.md");
    assert!(broken(&readme, "docs/README.md").is_none());
    assert!(broken(&readme, "docs/nothing.md").is_some());
    assert!(broken(&readme, "#the-two-commands").is_none());
    assert!(broken(&readme, "#no-such-heading").is_some());
}
