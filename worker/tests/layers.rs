//! The worker's modules depend on each other one way: read from its sources, the graph of its
//! top-level modules, the graph of the job kinds' modules under `jobs/`, and the graph of the
//! modules under any other module (a turn's stages under `jobs/turn/`), have no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, with its path relative to `src`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file is (`jobs/turn/mod.rs` is `jobs::turn`), as path segments.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_string());
    }
    parts
}

/// The paths a file names with `crate::` and `super::`, resolved to absolute module paths (each as
/// far as it goes: `crate::jobs::claim::renewing` gives `jobs::claim::renewing`).
fn references(text: &str, module: &[String], is_mod_file: bool) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    // The module `super` is relative to: a `mod.rs` or a plain file's own module.
    let own: Vec<String> = module.to_vec();
    let _ = is_mod_file;
    // Production code only: a test module's `super` is its own file, and tests may reach anywhere.
    let production = text.split("#[cfg(test)]").next().unwrap_or_default();
    let code: String = production.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    for (start, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        if start > 0 && code[..start].ends_with("::") {
            continue; // `super::super::` is read from its first `super::`
        }
        let mut base: Vec<String> = Vec::new();
        let mut rest = &code[start..];
        if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
        } else {
            base = own.clone();
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
        }
        for path in paths(rest) {
            let mut full = base.clone();
            full.extend(path);
            found.push(full);
        }
    }
    found
}

/// The module paths at the start of `rest`: `a::b::c` or a `{a::b, c}` group (first level only).
fn paths(rest: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut end = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        let mut items = Vec::new();
        let mut depth = 0;
        let mut item = String::new();
        for c in group[..end].chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                _ => {}
            }
            item.push(c);
        }
        items.push(item);
        return items.iter().flat_map(|i| paths(i.trim_start_matches(',').trim())).collect();
    }
    let mut path = Vec::new();
    let mut rest = rest;
    loop {
        let name = ident(rest);
        if name.is_empty() {
            break;
        }
        path.push(name.clone());
        match rest[name.len()..].strip_prefix("::") {
            Some(r) if !r.starts_with('{') => rest = r,
            _ => break,
        }
    }
    vec![path]
}

/// Whether `graph` has a cycle; the cycle's modules if so.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(path[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The module graph at `depth` segments under `within` (empty: the crate's top level).
fn graph(within: &[&str], depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let unit = |module: &[String]| -> Option<String> {
        let inside = module.len() > within.len() && module.iter().zip(within).all(|(a, b)| a == b);
        inside.then(|| module[within.len()..].iter().take(depth).cloned().collect::<Vec<_>>().join("::"))
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let module = module_of(relative);
        let Some(from) = unit(&module) else { continue };
        let text = std::fs::read_to_string(&file).unwrap();
        let is_mod = relative.ends_with("mod.rs");
        graph.entry(from.clone()).or_default();
        for reference in references(&text, &module, is_mod) {
            if let Some(to) = unit(&reference).filter(|to| *to != from && !to.is_empty()) {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

#[test]
fn the_workers_top_level_modules_depend_one_way() {
    let g = graph(&[], 1);
    assert!(g.contains_key("settle") && g.contains_key("jobs") && g.contains_key("outcome"), "{g:?}");
    assert!(g["outcome"].is_empty(), "outcome.rs imports nothing from the crate: {:?}", g["outcome"]);
    assert_eq!(cycle(&g), None, "{g:#?}");
}

#[test]
fn the_job_kinds_modules_depend_one_way() {
    let g = graph(&["jobs"], 1);
    assert!(g.contains_key("claim") && g.contains_key("turn"), "{g:?}");
    assert_eq!(cycle(&g), None, "{g:#?}");
}

/// Every module that has modules of its own (the crate's root as the empty path).
fn parents() -> BTreeSet<Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut parents = BTreeSet::new();
    for file in files {
        let mut module = module_of(file.strip_prefix(&src).unwrap());
        while module.pop().is_some() {
            parents.insert(module.clone());
        }
    }
    parents
}

#[test]
fn the_modules_under_every_module_depend_one_way() {
    let parents = parents();
    assert!(parents.contains(&vec!["jobs".to_string(), "turn".to_string()]), "{parents:?}");
    for parent in &parents {
        let within: Vec<&str> = parent.iter().map(String::as_str).collect();
        let g = graph(&within, 1);
        assert_eq!(cycle(&g), None, "under {parent:?}: {g:#?}");
    }
}

#[test]
fn the_checks_find_a_cycle_where_there_is_one() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    assert_eq!(cycle(&g), None);
    g.entry("c".into()).or_default().insert("a".into());
    assert!(cycle(&g).is_some());
    let refs = references(
        "use super::{claim::{self, Mode}, limits};\nuse crate::publish::retire;",
        &["jobs".into(), "x".into()],
        false,
    );
    assert!(refs.contains(&vec!["jobs".into(), "claim".into()]), "{refs:?}");
    assert!(refs.contains(&vec!["jobs".into(), "limits".into()]), "{refs:?}");
    assert!(refs.contains(&vec!["publish".into(), "retire".into()]), "{refs:?}");
}
