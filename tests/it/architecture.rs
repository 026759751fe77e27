//! What ARCHITECTURE.md promises about the crates and the module graph, checked on the
//! source. Cargo keeps the crates apart (an import against the crate graph does not
//! compile); what it cannot see is checked here: the core crate's dependency list is its
//! contract (no runtime, network or protocol crate), and inside every crate there is no
//! import cycle: between the top-level modules of its `src/`, and between the submodules of
//! every module (the children of `store`, of `cluster`, ..). A module counts with its
//! descendants (`src/cluster/lease/tests.rs` is `cluster::lease`, and at the top level
//! `cluster`); a child may use its parent's own items (the parent declares and
//! wires its children), so an edge is drawn only between siblings. Unit tests and comments
//! do not count, code does: every path starting `crate::`, `super::` or `self::` (in `use`
//! trees with their groups, and in expressions), resolved against the file's module.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path, `["store", "cluster", "remote"]`; the crate root is `[]`.
type Module = Vec<String>;

/// Per parent module: child -> sibling it imports -> the files (relative to `src/`) that
/// make the edge. The top-level modules are the children of the crate root, `[]`.
type Graphs = BTreeMap<Module, Graph>;

/// From module -> to module -> the files that make the edge.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|error| panic!("read {}: {error}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// `text` without its unit tests (an inline `mod tests { .. }` is the file's last item) and
/// without comment lines.
fn code_of(text: &str) -> String {
    let text = text
        .split("#[cfg(test)]\nmod tests {")
        .next()
        .unwrap_or(text);
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn leading_ident(text: &str) -> &str {
    let end = text
        .find(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The items of a group, `a, b::{c, d}, e}..` -> `["a", "b::{c, d}", "e"]`: up to the
/// brace that closes it.
fn group_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 1;
    let mut start = 0;
    for (index, ch) in group.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                items.push(&group[start..index]);
                start = index + 1;
                if ch == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    items
}

/// The paths a use tree or an expression path names, from `text` on:
/// `a::b::{c, d::{self, e}}` -> `a::b::c`, `a::b::d`, `a::b::d::e`.
fn tree_paths(text: &str) -> Vec<Vec<String>> {
    let mut prefix: Vec<String> = Vec::new();
    let mut rest = text;
    loop {
        let trimmed = rest.trim_start();
        if let Some(group) = trimmed.strip_prefix('{') {
            return group_items(group)
                .into_iter()
                .flat_map(tree_paths)
                .map(|path| [prefix.clone(), path].concat())
                .collect();
        }
        let ident = leading_ident(trimmed);
        if ident.is_empty() {
            return vec![prefix];
        }
        if ident != "self" {
            prefix.push(ident.to_owned());
        }
        match trimmed[ident.len()..].strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![prefix],
        }
    }
}

/// Every path `code` (of module `module`) names after `crate::`, `super::` or `self::`,
/// made absolute (from the crate root).
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|ch| ch.is_alphanumeric() || ch == '_' || ch == ':') {
                continue; // `super::super::x` is read from its first `super`.
            }
            let mut rest = &code[at + start.len()..];
            let mut base: Vec<String> = match start {
                "crate::" => Vec::new(),
                "self::" => module.to_vec(),
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            for path in tree_paths(rest) {
                found.push([base.clone(), path].concat());
            }
        }
    }
    found
}

/// The module of a file under `src/` (`cluster/remote.rs` -> `cluster::remote`),
/// `None` for the crate roots and test files.
fn module_of(relative: &str) -> Option<Module> {
    let module: Module = relative
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    let root = matches!(relative, "lib.rs" | "main.rs");
    let test = module.iter().any(|part| part == "tests");
    (!root && !test).then_some(module)
}

/// `path`'s module: its longest prefix that is a known module.
fn module_named(path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|len| path[..len].to_vec())
        .find(|prefix| modules.contains(prefix))
}

/// Adds the edge `from` -> `to` to the graph of the module where they part: the children of
/// their common ancestor that hold each. Nothing when one holds the other.
fn add_edge(graphs: &mut Graphs, from: &[String], to: &[String], file: &str) {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    let (Some(from_child), Some(to_child)) = (from.get(common), to.get(common)) else {
        return;
    };
    graphs
        .entry(from[..common].to_vec())
        .or_default()
        .entry(from_child.clone())
        .or_default()
        .entry(to_child.clone())
        .or_default()
        .insert(file.to_owned());
}

/// The `src/` of every crate of the workspace: the server's (the root package) and those
/// under `crates/`.
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crates = root.join("crates");
    let mut sources = vec![root.join("src")];
    let entries =
        fs::read_dir(&crates).unwrap_or_else(|error| panic!("read {}: {error}", crates.display()));
    for entry in entries {
        let src = entry.expect("a directory entry").path().join("src");
        if src.is_dir() {
            sources.push(src);
        }
    }
    sources.sort();
    sources
}

fn module_graphs(src: &Path) -> Graphs {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let files: Vec<(String, Module, PathBuf)> = files
        .into_iter()
        .filter_map(|path| {
            let relative = path
                .strip_prefix(src)
                .expect("a file under src/")
                .to_string_lossy()
                .into_owned();
            Some((relative.clone(), module_of(&relative)?, path))
        })
        .collect();
    let modules: BTreeSet<Module> = files.iter().map(|(_, module, _)| module.clone()).collect();
    let mut graphs = Graphs::new();
    for (relative, module, path) in &files {
        let text = fs::read_to_string(path)
            .unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
        for named in named_paths(&code_of(&text), module) {
            if let Some(to) = module_named(&named, &modules) {
                add_edge(&mut graphs, module, &to, relative);
            }
        }
    }
    graphs
}

/// A cycle of `graph` as a path `[a, b, .., a]`, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|seen| seen == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut Vec::new(), &mut done))
}

/// The cycle of `graph`, if any, as `a -> b (files), b -> a (files)`.
fn describe_cycle(graph: &Graph) -> Option<String> {
    let cycle = find_cycle(graph)?;
    let edges: Vec<String> = cycle
        .windows(2)
        .map(|pair| {
            format!(
                "{} -> {} ({:?})",
                pair[0], pair[1], graph[&pair[0]][&pair[1]]
            )
        })
        .collect();
    Some(edges.join(", "))
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let server = module_graphs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let top = &server[&Module::new()];
    assert!(
        top.len() > 10 && top["server"].contains_key("store"),
        "the scan sees the modules and their imports: {top:?}"
    );
    for src in crate_sources() {
        let graphs = module_graphs(&src);
        if let Some(cycle) = graphs.get(&Module::new()).and_then(describe_cycle) {
            panic!(
                "an import cycle between top-level modules of {}: {cycle}",
                src.display()
            );
        }
    }
}

#[test]
fn no_import_cycle_between_the_submodules_of_any_module() {
    let server = module_graphs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let cluster = ["cluster".to_owned()].to_vec();
    assert!(
        server[&cluster]["remote"].contains_key("convert")
            && server[&["store".to_owned()].to_vec()]["cluster"].contains_key("memory"),
        "the scan sees the submodules and their imports: {server:?}"
    );
    let mut cycles = Vec::new();
    for src in crate_sources() {
        for (parent, graph) in module_graphs(&src) {
            if let (false, Some(cycle)) = (parent.is_empty(), describe_cycle(&graph)) {
                let at = src.display();
                cycles.push(format!("{at}: inside {}: {cycle}", parent.join("::")));
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

/// The names in the `[dependencies]` table of the Cargo.toml at `path`.
fn dependencies(path: &Path) -> BTreeSet<String> {
    let text =
        fs::read_to_string(path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
    let mut in_table = false;
    let mut names = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = line == "[dependencies]";
        } else if let (true, false, Some((name, _))) =
            (in_table, line.starts_with('#'), line.split_once('='))
        {
            names.insert(name.trim().to_owned());
        }
    }
    names
}

/// Each library crate may use only the crates on its list: the core is what a Rust program
/// could embed (pure crates only), the injector needs none of the limiter and no runtime
/// or network. A new dependency that keeps to that goes in the list and in ARCHITECTURE.md's
/// table of crates; one that does not belongs in another crate.
#[test]
fn the_library_crates_use_only_the_crates_their_contract_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let contracts: [(&str, &[&str]); 2] = [
        (
            "crates/core/Cargo.toml",
            &[
                "arc-swap",
                "libc",
                "serde",
                "serde-saphyr",
                "serde_json",
                "smallvec",
                "thiserror",
                "tokio",
                "tracing",
            ],
        ),
        (
            "crates/inject/Cargo.toml",
            &[
                "ratekeeper-core",
                "base64",
                "clap",
                "serde",
                "serde-saphyr",
                "serde_json",
                "thiserror",
                "tracing",
            ],
        ),
    ];
    for (manifest, allowed) in contracts {
        let manifest = root.join(manifest);
        let extra: Vec<String> = dependencies(&manifest)
            .into_iter()
            .filter(|name| !allowed.contains(&name.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "{} depends on {extra:?}, which its contract does not allow",
            manifest.display()
        );
    }
    let core = root.join("crates/core/Cargo.toml");
    let text = fs::read_to_string(&core).expect("read the core's Cargo.toml");
    assert!(
        text.contains(
            r#"tokio = { version = "1", default-features = false, features = ["time"] }"#
        ),
        "the core uses tokio for its clock only (the `time` feature, nothing else)"
    );
    assert!(
        dependencies(&root.join("Cargo.toml")).contains("ratekeeper-core"),
        "the scan reads the server's dependencies"
    );
}

#[test]
fn the_scan_reads_paths_and_groups_and_finds_a_cycle() {
    let module = ["a", "b"].map(str::to_owned);
    let code = code_of(
        "use crate::a::b;\n\
         // crate::commented\n\
         use crate::{c, d::{e, f}, g::h};\n\
         use super::{x::{self, y}, z};\n\
         use self::w::V;\n\
         fn x() { crate::i::j(); super::super::k(); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::l;\n}\n",
    );
    let mut found: Vec<String> = named_paths(&code, &module)
        .iter()
        .map(|path| path.join("::"))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            "a::b",
            "a::b::w::V",
            "a::x",
            "a::x::y",
            "a::z",
            "c",
            "d::e",
            "d::f",
            "g::h",
            "i::j",
            "k"
        ]
    );

    let modules: BTreeSet<Module> = [vec!["a"], vec!["a", "x"], vec!["a", "b"]]
        .iter()
        .map(|module| module.iter().map(|part| (*part).to_owned()).collect())
        .collect();
    let path = |text: &str| -> Module { text.split("::").map(str::to_owned).collect() };
    assert_eq!(module_named(&path("a::x::y"), &modules), Some(path("a::x")));
    assert_eq!(module_named(&path("a::Item"), &modules), Some(path("a")));
    assert_eq!(module_named(&path("std::mem"), &modules), None);

    let mut graphs = Graphs::new();
    add_edge(&mut graphs, &path("a::b"), &path("a::x"), "a/b.rs");
    add_edge(&mut graphs, &path("a::b::c"), &path("a"), "a/b/c.rs");
    add_edge(&mut graphs, &path("a"), &path("a::b"), "a.rs");
    add_edge(&mut graphs, &path("a::b"), &path("e::f"), "a/b.rs");
    assert_eq!(
        graphs.keys().cloned().collect::<Vec<_>>(),
        [Module::new(), path("a")],
        "only siblings make edges: a child using its parent, or a parent its child, does not"
    );
    assert!(graphs[&path("a")]["b"].contains_key("x"));
    assert!(graphs[&Module::new()]["a"].contains_key("e"));

    let edge = |from: &str, to: &str| {
        (
            from.to_owned(),
            BTreeMap::from([(to.to_owned(), BTreeSet::from([format!("{from}.rs")]))]),
        )
    };
    let acyclic = Graph::from([edge("a", "b"), edge("b", "c")]);
    assert_eq!(find_cycle(&acyclic), None);
    let cyclic = Graph::from([edge("a", "b"), edge("b", "c"), edge("c", "a")]);
    assert_eq!(
        find_cycle(&cyclic),
        Some(["a", "b", "c", "a"].map(str::to_owned).to_vec())
    );
}
