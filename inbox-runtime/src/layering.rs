//! The runtime's modules form layers: no module depends, directly or
//! through others, on a module that depends on it. Read from the sources:
//! a module depends on another when its code (not its comments) names
//! `crate::other` or an item the crate root re-exports from `other`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The modules whose dependencies are checked: every top-level module but
/// the macro's glue (`__private`, which forwards to everything).
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules = BTreeMap::new();
    for entry in fs::read_dir(src).expect("the runtime's src") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_owned();
        if matches!(name.as_str(), "lib" | "private" | "layering") {
            continue;
        }
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            modules.insert(name, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            modules.insert(name, vec![path]);
        }
    }
    modules
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a module directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The items the crate root re-exports (`pub use module::{A, B}`), by the
/// module they come from.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    let text = code_lines(lib).collect::<Vec<_>>().join(" ");
    for statement in text.split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        for item in rest
            .trim_matches(|c| c == '{' || c == '}' || c == ' ')
            .split(',')
        {
            let item = item.trim().rsplit("::").next().unwrap_or("").trim();
            if !item.is_empty() {
                items.insert(item.to_owned(), module.trim().to_owned());
            }
        }
    }
    items
}

/// The lines of `source` that are code: comments left out, and string
/// literals (a diagnostic's text naming `inbox_runtime::…`) blanked.
fn code_lines(source: &str) -> impl Iterator<Item = String> + '_ {
    source
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with("//"))
        .map(|line| {
            line.split('"')
                .enumerate()
                .filter(|(at, _)| at % 2 == 0)
                .map(|(_, code)| code)
                .collect::<Vec<_>>()
                .join("\"\"")
        })
}

/// What each module depends on.
fn dependencies(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let lib = fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let reexported = reexports(&lib);
    let mut graph = BTreeMap::new();
    for (module, files) in &modules {
        let mut uses = BTreeSet::new();
        for file in files {
            let source = fs::read_to_string(file).expect("a source file");
            for line in code_lines(&source) {
                for prefix in ["crate::", "inbox_runtime::"] {
                    for (at, _) in line.match_indices(prefix) {
                        let name: String = line[at + prefix.len()..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        let target = match modules.contains_key(&name) {
                            true => Some(name),
                            false => reexported.get(&name).cloned(),
                        };
                        if let Some(target) = target.filter(|target| target != module) {
                            uses.insert(target);
                        }
                    }
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// The modules in layers, bottom first (each depends only on layers below
/// it), or the modules left over that sit on a cycle.
fn layers(
    graph: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Vec<Vec<String>>, BTreeSet<String>> {
    let mut placed = BTreeSet::new();
    let mut layers = Vec::new();
    while placed.len() < graph.len() {
        let layer: Vec<String> = graph
            .iter()
            .filter(|(module, uses)| !placed.contains(*module) && uses.is_subset(&placed))
            .map(|(module, _)| module.clone())
            .collect();
        if layer.is_empty() {
            return Err(graph
                .keys()
                .filter(|module| !placed.contains(*module))
                .cloned()
                .collect());
        }
        placed.extend(layer.iter().cloned());
        layers.push(layer);
    }
    Ok(layers)
}

#[test]
fn the_modules_form_layers_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = dependencies(&src);
    assert!(graph.contains_key("delivery") && graph["batch"].contains("delivery"));
    match layers(&graph) {
        Ok(layers) => {
            for (depth, layer) in layers.iter().enumerate() {
                println!("layer {depth}: {}", layer.join(" "));
            }
        }
        Err(cyclic) => {
            let edges: Vec<String> = cyclic
                .iter()
                .map(|module| {
                    let within: Vec<&str> = graph[module]
                        .iter()
                        .filter(|target| cyclic.contains(*target))
                        .map(String::as_str)
                        .collect();
                    format!("{module} -> {}", within.join(", "))
                })
                .collect();
            panic!("modules on a dependency cycle:\n{}", edges.join("\n"));
        }
    }
}

#[test]
fn a_cycle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["a"]), ("c", vec![])]
            .into_iter()
            .map(|(module, uses)| {
                (
                    module.to_owned(),
                    uses.into_iter().map(str::to_owned).collect(),
                )
            })
            .collect();
    let cyclic = layers(&graph).unwrap_err();
    assert_eq!(cyclic, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
}
