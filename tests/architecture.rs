//! What ARCHITECTURE.md promises about the module graph, checked on the source: no import
//! cycle between the top-level modules of `src/`. A submodule counts with its parent
//! (`src/shard/tests.rs` is `shard`); unit tests and comments do not count, code does
//! (`use crate::x`, `crate::x::y(..)`, `use crate::{x, y::z}`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// From module -> to module -> the files (relative to `src/`) that make the edge.
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
    let text = text.trim_start();
    let end = text
        .find(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The top-level modules `code` names after `crate::`.
fn crate_modules(code: &str) -> BTreeSet<&str> {
    let mut modules = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            modules.insert(leading_ident(rest));
            continue;
        };
        // `crate::{a, b::{c, d}, e}`: the first name of each item at depth 1.
        let mut depth = 1;
        let mut item_start = 0;
        for (index, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' | ',' if depth == 1 => {
                    modules.insert(leading_ident(&group[item_start..index]));
                    item_start = index + 1;
                    if ch == '}' {
                        break;
                    }
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
    }
    modules.remove("");
    modules
}

fn module_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph = Graph::new();
    for path in files {
        let relative = path
            .strip_prefix(&src)
            .expect("a file under src/")
            .to_string_lossy()
            .into_owned();
        let top = relative
            .split('/')
            .next()
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_owned();
        if matches!(top.as_str(), "lib" | "main") || relative.ends_with("/tests.rs") {
            continue;
        }
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
        let edges = graph.entry(top.clone()).or_default();
        for module in crate_modules(&code_of(&text)) {
            if module != top {
                edges
                    .entry(module.to_owned())
                    .or_default()
                    .insert(relative.clone());
            }
        }
    }
    graph
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

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = module_graph();
    assert!(
        graph.len() > 15 && graph["server"].contains_key("store"),
        "the scan sees the modules and their imports: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        let edges: Vec<String> = cycle
            .windows(2)
            .map(|pair| {
                format!(
                    "{} -> {} ({:?})",
                    pair[0], pair[1], graph[&pair[0]][&pair[1]]
                )
            })
            .collect();
        panic!("an import cycle: {}", edges.join(", "));
    }
}

#[test]
fn the_scan_reads_paths_and_groups_and_finds_a_cycle() {
    let code = code_of(
        "use crate::a::b;\n\
         // crate::commented\n\
         use crate::{c, d::{e, f}, g::h};\n\
         fn x() { crate::i::j(); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::k;\n}\n",
    );
    let found: Vec<&str> = crate_modules(&code).into_iter().collect();
    assert_eq!(found, ["a", "c", "d", "g", "i"]);

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
