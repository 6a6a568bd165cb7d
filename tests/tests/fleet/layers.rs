//! The workspace's layering, read from its sources: in every crate, at every depth, the modules
//! under one parent depend on each other one way, and no type name is defined twice in the
//! production crates.
//!
//! A module's graph is read from its production code (comments, string literals and `#[cfg(test)]`
//! items left out): the paths it names from `crate::`, `super::` or `self::`, and from a child it
//! declares (`mod x;`, then `x::...`). Each resolves to the longest prefix that is a module file.
//! Then, for every module with two or more children (and each crate's root), each child stands for
//! its whole subtree: a child names another when any file under it names any file under the other.
//! That graph must have no circle, at every depth, so each part of a crate can be read, tested and
//! moved with only what lies below it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// A module as its path from its crate's root: `jobs/turn/mod.rs` is `["jobs", "turn"]`.
type Module = Vec<String>;

/// One crate's modules: each one's file, and the modules it names, each with the paths naming it.
struct Crate {
    files: BTreeMap<Module, PathBuf>,
    edges: BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>>,
}

/// An import circle: under `parent`, children whose subtrees name each other round.
struct Circle {
    parent: Module,
    members: BTreeSet<String>,
    /// One way round, from the first member back to it.
    cycle: Vec<String>,
    /// The file-level references that make the circle: `from -> to (names the paths)`.
    edges: Vec<String>,
}

/// The crates whose code must not define a type name twice (the test crate is left out: its
/// helpers are no production code).
const PRODUCTION: [&str; 5] = ["protocol", "platform", "dispatcher", "worker", "fleetctl"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The workspace's crates: its folders holding a `Cargo.toml` and a `src/`.
fn crates() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(workspace()).unwrap() {
        let path = entry.unwrap().path();
        if path.join("Cargo.toml").is_file() && path.join("src").is_dir() {
            found.insert(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    found
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The production code of every `.rs` file of `krate`, by path.
fn production_files(krate: &str) -> Vec<(PathBuf, String)> {
    let mut paths = Vec::new();
    rust_files(&workspace().join(krate).join("src"), &mut paths);
    paths.into_iter().map(|p| (p.clone(), production_code(&std::fs::read_to_string(&p).unwrap()))).collect()
}

/// The module a file under `src/` is: `jobs/turn/mod.rs` is `jobs::turn`, `lib.rs` the root.
fn module_of(relative: &Path) -> Module {
    let mut parts: Module = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_string());
    }
    parts
}

/// A file's production code: comments blanked, literals emptied and `#[cfg(test)]` items dropped,
/// with every line kept where it was (the type check reports lines).
fn production_code(text: &str) -> String {
    without_test_items(&without_comments_and_literals(text))
}

/// `text` with its comments blanked and its string and character literals emptied: a path or a
/// keyword inside either is no code. Newlines inside them stay, so lines keep their numbers.
fn without_comments_and_literals(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < s.len() {
        let after_ident = i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_');
        let (end, stand_in) = if s[i..].starts_with(&['/', '/']) {
            (Some(s[i..].iter().position(|c| *c == '\n').map_or(s.len(), |n| i + n)), " ")
        } else if s[i..].starts_with(&['/', '*']) {
            (Some(block_comment_end(&s, i)), " ")
        } else if s[i] == '\'' {
            (char_literal_end(&s, i), "' '")
        } else if !after_ident {
            (string_end(&s, i), "\"\"")
        } else {
            (None, "")
        };
        match end {
            Some(end) => {
                out.push_str(stand_in);
                out.extend(s[i..end].iter().filter(|c| **c == '\n'));
                i = end;
            }
            None => {
                out.push(s[i]);
                i += 1;
            }
        }
    }
    out
}

/// Where the block comment at `i` ends; they nest.
fn block_comment_end(s: &[char], i: usize) -> usize {
    let (mut depth, mut j) = (0, i);
    while j < s.len() {
        if s[j..].starts_with(&['/', '*']) {
            depth += 1;
            j += 2;
        } else if s[j..].starts_with(&['*', '/']) {
            depth -= 1;
            j += 2;
            if depth == 0 {
                return j;
            }
        } else {
            j += 1;
        }
    }
    s.len()
}

/// Where the character literal at `i` ends, or None where the quote starts a lifetime or a label.
fn char_literal_end(s: &[char], i: usize) -> Option<usize> {
    match (s.get(i + 1), s.get(i + 2)) {
        (Some('\\'), _) => (i + 3..s.len()).find(|&k| s[k] == '\'').map(|k| k + 1),
        (Some(_), Some('\'')) => Some(i + 3),
        _ => None,
    }
}

/// Where the string literal at `i` ends (`"…"`, `b"…"`, `c"…"`, raw `r#"…"#` and their byte and C
/// forms), or None where no string starts at `i` (`r#type` is an identifier).
fn string_end(s: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if matches!(s.get(j), Some('b' | 'c')) {
        j += 1;
    }
    let raw = s.get(j) == Some(&'r');
    j += usize::from(raw);
    let hashes = s[j.min(s.len())..].iter().take_while(|c| **c == '#').count();
    if (!raw && hashes > 0) || s.get(j + hashes) != Some(&'"') {
        return None;
    }
    j += hashes + 1;
    if raw {
        let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
        return Some((j..s.len()).find(|&k| s[k..].starts_with(&close)).map_or(s.len(), |k| k + close.len()));
    }
    while j < s.len() {
        match s[j] {
            '\\' => j += 2,
            '"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    Some(s.len())
}

/// `code` without the items marked `#[cfg(test)]` (a test module may name anything; what follows
/// it in the file is production code again). Their lines stay, blank.
fn without_test_items(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let (mut out, mut rest) = (String::with_capacity(code.len()), code);
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let end = at + MARK.len() + item_end(&rest[at + MARK.len()..]);
        out.extend(rest[at..end].chars().filter(|c| *c == '\n'));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the item at the start of `code` ends: its `;`, or the brace closing its body (further
/// attributes are part of it; a `;` inside brackets, as in `[u8; 4]`, is not its end).
fn item_end(code: &str) -> usize {
    let mut depth = 0;
    for (i, c) in code.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' => depth -= 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            ';' if depth == 0 => return i + 1,
            _ => {}
        }
    }
    code.len()
}

/// The child modules a file declares from files of their own: `mod x;`, `pub(crate) mod x;`.
fn child_modules(code: &str) -> BTreeSet<String> {
    let declared = |line: &str| -> Option<String> {
        let mut line = line.trim_start();
        if let Some(after) = line.strip_prefix("pub") {
            let after = match after.strip_prefix('(') {
                Some(scope) => &scope[scope.find(')')? + 1..],
                None => after,
            };
            line = after.strip_prefix(char::is_whitespace)?.trim_start();
        }
        let name = line.strip_prefix("mod")?.strip_prefix(char::is_whitespace)?.trim_start();
        let len = name.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))?;
        (len > 0 && name[len..].trim_start().starts_with(';')).then(|| name[..len].to_string())
    };
    code.lines().filter_map(declared).collect()
}

/// The module paths `code` (the file of `module`) names: from `crate::`, `super::` and `self::`,
/// and from its own children, each made absolute (`crate::` of a binary under `bin/` is the
/// binary's root). Where a path stops (`x::Type`, `x::*`) is left to `resolve`.
fn references(code: &str, module: &[String], children: &BTreeSet<String>) -> Vec<Module> {
    let root: Module = if module.len() >= 2 && module[0] == "bin" { module[..2].to_vec() } else { Vec::new() };
    let mut found = Vec::new();
    for word in ["crate", "super", "self"] {
        for at in anchored(code, word) {
            let (base, rest) = match code[at..].strip_prefix("crate::") {
                Some(rest) => (root.clone(), rest),
                None => relative_base(&code[at..], module),
            };
            found.extend(paths(rest).into_iter().map(|p| [base.clone(), p].concat()));
        }
    }
    for child in children {
        for at in anchored(code, child) {
            found.extend(paths(&code[at..]).into_iter().map(|p| [module.to_vec(), p].concat()));
        }
    }
    found
}

/// Where `word::` starts a path in `code`: not inside a longer name or path (`super::super::x` is
/// read once, from its first `super`).
fn anchored(code: &str, word: &str) -> Vec<usize> {
    let needle = format!("{word}::");
    let inside = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    code.match_indices(&needle).map(|(at, _)| at).filter(|&at| !code[..at].ends_with(inside)).collect()
}

/// The module a `self::`/`super::` path starts from, and the path after those words.
fn relative_base<'a>(path: &'a str, module: &[String]) -> (Module, &'a str) {
    let mut base = module.to_vec();
    let mut rest = path.strip_prefix("self::").unwrap_or(path);
    while let Some(after) = rest.strip_prefix("super::") {
        base.pop();
        rest = after;
    }
    (base, rest)
}

/// The paths at the start of `rest`: `a::b::C`, or a group `{a::{self, B}, c}` at any depth.
fn paths(rest: &str) -> Vec<Module> {
    if let Some(group) = rest.strip_prefix('{') {
        return group_items(group).into_iter().filter(|i| !i.trim().is_empty()).flat_map(|i| paths(i.trim())).collect();
    }
    let (mut path, mut rest) = (Module::new(), rest);
    loop {
        let len = ident_len(rest);
        if len == 0 {
            break;
        }
        path.push(rest[..len].to_string());
        match rest[len..].strip_prefix("::") {
            Some(after) if after.starts_with('{') => {
                return paths(after).into_iter().map(|p| [path.clone(), p].concat()).collect();
            }
            Some(after) => rest = after,
            None => break,
        }
    }
    vec![path]
}

/// The items of a group whose `{` is just before `group`, split at its own commas.
fn group_items(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

fn ident_len(s: &str) -> usize {
    let b = s.as_bytes();
    if !b.first().is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') {
        return 0;
    }
    b.iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count()
}

/// The module a path names: its longest prefix that is a module file (`jobs::claim::Mode` is
/// `jobs::claim`); `self` in a group names the path before it.
fn resolve(path: &[String], modules: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let named: Module = path.iter().filter(|s| *s != "self").cloned().collect();
    (0..=named.len()).rev().map(|n| named[..n].to_vec()).find(|m| modules.contains_key(m))
}

/// The module graph of crate `name`'s production code.
fn read_crate(name: &str) -> Crate {
    let src = workspace().join(name).join("src");
    let mut sources = production_files(name);
    // `main.rs` beside `lib.rs` is a binary of its own, reaching the library by its crate name:
    // the root is the library's, so `lib.rs` comes last and its entry wins.
    sources.sort_by_key(|(p, _)| p.ends_with("lib.rs"));
    let files: BTreeMap<Module, PathBuf> =
        sources.iter().map(|(p, _)| (module_of(p.strip_prefix(&src).unwrap()), p.clone())).collect();
    let code_of: BTreeMap<&PathBuf, &String> = sources.iter().map(|(p, code)| (p, code)).collect();
    let mut edges: BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> = BTreeMap::new();
    for (module, file) in &files {
        let code = code_of[file];
        let out = edges.entry(module.clone()).or_default();
        for path in references(code, module, &child_modules(code)) {
            if let Some(target) = resolve(&path, &files).filter(|t| t != module) {
                let named: Vec<&str> = path.iter().map(String::as_str).filter(|s| *s != "self").collect();
                out.entry(target).or_default().insert(named.join("::"));
            }
        }
    }
    Crate { files, edges }
}

fn shown(module: &[String]) -> String {
    if module.is_empty() {
        "<root>".into()
    } else {
        module.join("::")
    }
}

/// The child of `parent` that `module` is or lies under, if any.
fn child_of<'a>(parent: &[String], module: &'a [String]) -> Option<&'a str> {
    (module.len() > parent.len() && module.starts_with(parent)).then(|| module[parent.len()].as_str())
}

/// The graph among `parent`'s children, each standing for its whole subtree.
fn children_graph<'a>(krate: &'a Crate, parent: &[String]) -> BTreeMap<&'a str, BTreeSet<&'a str>> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for module in krate.files.keys() {
        if let Some(child) = child_of(parent, module) {
            graph.entry(child).or_default();
        }
    }
    for (from, targets) in &krate.edges {
        let Some(a) = child_of(parent, from) else { continue };
        for to in targets.keys() {
            if let Some(b) = child_of(parent, to).filter(|b| *b != a) {
                graph.entry(a).or_default().insert(b);
            }
        }
    }
    graph
}

/// The nodes each node reaches by one edge or more.
fn reachable<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>, from: &'a str) -> BTreeSet<&'a str> {
    let (mut seen, mut todo) = (BTreeSet::new(), vec![from]);
    while let Some(node) = todo.pop() {
        for next in graph.get(node).into_iter().flatten() {
            if seen.insert(*next) {
                todo.push(next);
            }
        }
    }
    seen
}

/// The graph's circles: each set of two or more nodes that all reach each other.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<BTreeSet<&'a str>> {
    let reach: BTreeMap<&str, BTreeSet<&str>> = graph.keys().map(|n| (*n, reachable(graph, n))).collect();
    let (mut placed, mut circles) = (BTreeSet::new(), Vec::new());
    for node in graph.keys() {
        if placed.contains(node) || !reach[node].contains(node) {
            continue;
        }
        let circle: BTreeSet<&str> = reach[node].iter().copied().filter(|m| reach[m].contains(node)).collect();
        placed.extend(circle.iter().copied());
        circles.push(circle);
    }
    circles
}

/// A shortest way round `members`, from their first back to it (found breadth first).
fn shortest_cycle(graph: &BTreeMap<&str, BTreeSet<&str>>, members: &BTreeSet<&str>) -> Vec<String> {
    let start = *members.first().unwrap();
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &next in &graph[node] {
            if next == start {
                let mut cycle = vec![start.to_string(), node.to_string()];
                let mut at = node;
                while at != start {
                    at = came_from[at];
                    cycle.push(at.to_string());
                }
                cycle.reverse();
                return cycle;
            }
            if members.contains(next) && !came_from.contains_key(next) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    unreachable!("the members of a circle reach each other")
}

/// The file-level references from one member of a circle under `parent` into another.
fn circle_edges(krate: &Crate, parent: &[String], members: &BTreeSet<&str>) -> Vec<String> {
    let mut edges = Vec::new();
    for (from, targets) in &krate.edges {
        let Some(a) = child_of(parent, from).filter(|a| members.contains(a)) else { continue };
        for (to, via) in targets {
            if child_of(parent, to).is_some_and(|b| b != a && members.contains(b)) {
                let mut named: Vec<&str> = via.iter().map(String::as_str).take(4).collect();
                if via.len() > named.len() {
                    named.push("…");
                }
                edges.push(format!("{} -> {} (names {})", shown(from), shown(to), named.join(", ")));
            }
        }
    }
    edges
}

/// Every circle of `krate`, at every depth: under its root and under each module with children.
fn circles(krate: &Crate) -> Vec<Circle> {
    let parents: BTreeSet<Module> =
        krate.files.keys().filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).chain([vec![]]).collect();
    let mut found = Vec::new();
    for parent in &parents {
        let graph = children_graph(krate, parent);
        if graph.len() < 2 {
            continue;
        }
        for members in strongly_connected(&graph) {
            found.push(Circle {
                parent: parent.clone(),
                cycle: shortest_cycle(&graph, &members),
                edges: circle_edges(krate, parent, &members),
                members: members.into_iter().map(String::from).collect(),
            });
        }
    }
    found
}

impl Circle {
    fn describe(&self) -> String {
        let members: Vec<&str> = self.members.iter().map(String::as_str).collect();
        let mut text = format!("under {}: {} ({})\n", shown(&self.parent), members.join(", "), self.cycle.join(" -> "));
        for edge in &self.edges {
            text.push_str(&format!("    {edge}\n"));
        }
        text
    }
}

/// Fails naming every circle of crate `name`, with the references that make it.
fn assert_no_circles(name: &str) {
    let krate = read_crate(name);
    assert!(krate.files.contains_key(&Module::new()), "{name}/src has no lib.rs or main.rs");
    let circles = circles(&krate);
    let report: String = circles.iter().map(Circle::describe).collect();
    assert!(
        circles.is_empty(),
        "the {name} crate has {} import circle(s): children of one module must name each other one way. \
         Each circle, its members (one way round), then the references making it:\n{report}",
        circles.len()
    );
}

#[test]
fn every_crate_of_the_workspace_is_checked() {
    let checked: BTreeSet<String> = PRODUCTION.iter().chain(&["tests"]).map(|c| c.to_string()).collect();
    assert_eq!(crates(), checked, "a crate without its `the_<crate>_crate_has_no_import_circle` test here");
}

#[test]
fn the_protocol_crate_has_no_import_circle() {
    assert_no_circles("protocol");
}

#[test]
fn the_platform_crate_has_no_import_circle() {
    assert_no_circles("platform");
}

#[test]
fn the_dispatcher_crate_has_no_import_circle() {
    assert_no_circles("dispatcher");
}

#[test]
fn the_worker_crate_has_no_import_circle() {
    assert_no_circles("worker");
}

#[test]
fn the_fleetctl_crate_has_no_import_circle() {
    assert_no_circles("fleetctl");
}

#[test]
fn the_tests_crate_has_no_import_circle() {
    assert_no_circles("tests");
}

/// How a delivery ends is the worker's lowest layer: everything else may name it, so it names
/// nothing of the crate.
#[test]
fn the_workers_outcome_imports_nothing_from_the_crate() {
    let worker = read_crate("worker");
    let outcome = &worker.edges[&vec!["outcome".to_string()]];
    let named: Vec<String> = outcome.keys().map(|m| shown(m)).collect();
    assert!(named.is_empty(), "worker/src/outcome.rs names {named:?}");
}

/// The token stream of `code` (identifiers, `r#` ones whole, and single punctuation characters),
/// each with its line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let (mut out, mut line) = (Vec::new(), 1);
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut word = c.to_string();
            while let Some(&next) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_' || **n == '#') {
                // `#` only joins `r#name`, a raw identifier.
                if next == '#' && word != "r" {
                    break;
                }
                word.push(next);
                chars.next();
            }
            out.push((word.trim_start_matches("r#").to_string(), line));
        } else if !c.is_whitespace() {
            out.push((c.to_string(), line));
        }
    }
    out
}

/// The types production code defines (struct, enum, trait, type alias), with their lines. An
/// associated type (`type Item` in an `impl` or a `trait`) is a trait's name, not a new type.
fn type_definitions(code: &str) -> Vec<(String, usize)> {
    let tokens = tokens(code);
    // Per open brace: whether it opened an `impl` or `trait` body.
    let (mut blocks, mut body_next, mut found) = (Vec::<bool>::new(), false, Vec::new());
    for (k, (token, line)) in tokens.iter().enumerate() {
        let previous = k.checked_sub(1).map(|p| tokens[p].0.as_str());
        let name = tokens.get(k + 1).map(|t| t.0.as_str()).filter(|n| n.starts_with(|c: char| c.is_alphabetic()));
        match token.as_str() {
            // `impl` starting an item, not `impl Trait` as a type.
            "impl" if matches!(previous, None | Some(";" | "}" | "{" | "]" | "unsafe")) => body_next = true,
            "trait" => body_next = true,
            "{" => blocks.push(std::mem::take(&mut body_next)),
            "}" => {
                blocks.pop();
            }
            _ => {}
        }
        let associated = token == "type" && blocks.last() == Some(&true);
        if matches!(token.as_str(), "struct" | "enum" | "trait" | "type") && !associated {
            if let Some(name) = name {
                found.push((name.to_string(), *line));
            }
        }
    }
    found
}

#[test]
fn no_type_name_is_defined_twice_in_production_code() {
    let root = workspace();
    let mut defined: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for krate in PRODUCTION {
        let mut files = production_files(krate);
        files.sort();
        for (file, code) in files {
            let at = file.strip_prefix(&root).unwrap().display().to_string();
            for (name, line) in type_definitions(&code) {
                defined.entry(name).or_default().push(format!("{at}:{line}"));
            }
        }
    }
    assert!(defined.len() > 100, "too few types read: {}", defined.len());
    let twice: Vec<String> =
        defined.iter().filter(|(_, at)| at.len() > 1).map(|(name, at)| format!("{name}: {}", at.join(", "))).collect();
    assert!(
        twice.is_empty(),
        "{} type name(s) defined more than once in production code (a reader, a search or an import \
         cannot tell which is meant); give each its own name:\n{}",
        twice.len(),
        twice.join("\n")
    );
}

/// A crate of files `a::x`, `a::y`, `b`, `c` (and the root) whose references are `edges`.
fn example(edges: &[(&str, &str)]) -> Crate {
    let module = |m: &str| -> Module { m.split("::").filter(|s| !s.is_empty()).map(String::from).collect() };
    let files = ["", "a", "a::x", "a::y", "b", "c"].into_iter().map(|m| (module(m), PathBuf::new())).collect();
    let mut graph: BTreeMap<Module, BTreeMap<Module, BTreeSet<String>>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(module(from)).or_default().entry(module(to)).or_default().insert(to.to_string());
    }
    Crate { files, edges: graph }
}

#[test]
fn the_circle_finder_finds_a_circle_where_there_is_one() {
    let one_way = example(&[("a::x", "b"), ("b", "c"), ("a::x", "a::y")]);
    assert!(circles(&one_way).is_empty());
    // `c` names something under `a`: the subtrees of `a`, `b` and `c` name each other round.
    let round = example(&[("a::x", "b"), ("b", "c"), ("c", "a::y"), ("a::y", "a::x"), ("a::x", "a::y")]);
    let found: Vec<String> = circles(&round).iter().map(Circle::describe).collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].starts_with("under <root>: a, b, c (a -> b -> c -> a)"), "{found:#?}");
    assert!(found[0].contains("    c -> a::y (names a::y)"), "{found:#?}");
    assert!(found[1].starts_with("under a: x, y (x -> y -> x)"), "{found:#?}");
}

#[test]
fn references_are_read_through_groups_but_not_comments_strings_or_tests() {
    let code = production_code(
        "use super::{claim::{self, Mode}, limits};\n\
         use crate::publish::retire; // crate::in_a_comment\n\
         const S: &str = \"crate::in_a_string\"; const C: char = '\"';\n\
         mod child;\n\
         fn f() { child::run(); }\n\
         #[cfg(test)]\n\
         mod tests { use crate::in_a_test; }\n\
         fn after() { super::super::after_the_tests::f(); }\n",
    );
    let module: Module = vec!["jobs".into(), "x".into()];
    let found: BTreeSet<String> =
        references(&code, &module, &child_modules(&code)).iter().map(|p| p.join("::")).collect();
    let expected = [
        "jobs::claim::self",
        "jobs::claim::Mode",
        "jobs::limits",
        "publish::retire",
        "jobs::x::child::run",
        "after_the_tests::f",
    ];
    assert_eq!(found, expected.iter().map(|p| p.to_string()).collect(), "{code}");
    let files: BTreeMap<Module, PathBuf> = [vec![], vec!["jobs".to_string()], vec!["jobs".into(), "claim".into()]]
        .into_iter()
        .map(|m| (m, PathBuf::new()))
        .collect();
    let claim_self: Module = "jobs::claim::self".split("::").map(String::from).collect();
    assert_eq!(resolve(&claim_self, &files), Some(vec!["jobs".into(), "claim".into()]));
}

#[test]
fn type_definitions_are_items_not_associated_types() {
    let code = production_code(
        "pub struct A;\nimpl Iterator for A { type Item = u8; }\ntrait T { type Out; }\n\
         enum E {}\npub(crate) type Alias = u8;\nfn f(x: impl Fn()) { struct Local; }\n\
         const S: &str = \"struct InAString\";\nfn g(r#type: u8) {}\n",
    );
    let names: Vec<(String, usize)> = type_definitions(&code);
    let expected = [("A", 1), ("T", 3), ("E", 4), ("Alias", 5), ("Local", 6)];
    assert_eq!(names, expected.map(|(n, l)| (n.to_string(), l)), "{code}");
}

#[test]
fn nothing_in_protocol_does_io() {
    let manifest = std::fs::read_to_string(workspace().join("protocol/Cargo.toml")).unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    for io in ["tokio", "reqwest", "redis", "lapin", "hyper", "axum"] {
        let named = dependencies.lines().any(|l| l.trim_start().starts_with(&format!("{io} ")) || l.starts_with(io));
        assert!(!named, "protocol depends on {io}");
    }
    for (path, code) in production_files("protocol") {
        // `std::net`'s address types are data; its sockets and lookups are I/O.
        let io_names = ["std::fs", "std::env", "std::process", "stdin", "File::", "TcpStream", "TcpListener"];
        for io in io_names.iter().chain(&["UdpSocket", "ToSocketAddrs", "lookup_host", "SystemTime::now"]) {
            assert!(!code.contains(io), "{} uses {io}", path.display());
        }
    }
}

#[test]
fn no_task_is_spawned_without_an_owner_that_awaits_it() {
    for krate in PRODUCTION {
        for (path, code) in production_files(krate) {
            for (n, line) in code.lines().enumerate() {
                let statement = line.trim_start();
                let dropped = ["tokio::spawn(", "tokio::task::spawn(", "let _ = tokio::spawn(", "drop(tokio::spawn("]
                    .iter()
                    .any(|s| statement.starts_with(s));
                assert!(!dropped, "{}:{}: a spawned task's handle is dropped: {statement}", path.display(), n + 1);
            }
        }
    }
}

/// The arms of the `match` whose block opens at `open` (a `{`), as the text at its own depth.
fn match_arms(code: &str, open: usize) -> String {
    let mut depth = 0;
    let mut arms = String::new();
    for c in code[open..].chars() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            break;
        }
        if depth == 1 && c != '{' {
            arms.push(c);
        }
    }
    arms
}

#[test]
fn no_job_kind_is_dispatched_by_a_wildcard_arm() {
    let mut matches_by_kind = 0;
    for krate in PRODUCTION {
        for (path, code) in production_files(krate) {
            for (at, _) in code.match_indices("match ") {
                let Some(open) = code[at..].find('{').map(|o| at + o) else { continue };
                let arms = match_arms(&code, open);
                let by_kind = ["JobKind::", "Job::"].iter().any(|k| arms.trim_start().starts_with(k));
                if !by_kind {
                    continue;
                }
                matches_by_kind += 1;
                assert!(!has_wildcard(&arms), "{}: a match on a job's kind has a wildcard arm: {arms}", path.display());
            }
        }
    }
    assert!(matches_by_kind > 5, "the matches on a job's kind were found: {matches_by_kind}");
    assert!(has_wildcard(&match_arms("match k { Job::A(x) => { f(x) } _ => g() }", 8)));
    assert!(!has_wildcard(&match_arms("match k { Job::A(_) => f(), Job::B(x_) => g(x_) }", 8)));
}

/// Whether `arms` (a match's text at its own depth) has an arm that is `_` alone.
fn has_wildcard(arms: &str) -> bool {
    arms.match_indices("_ =>").any(|(at, _)| arms[..at].chars().last().is_none_or(|c| c.is_whitespace() || c == '}' || c == ','))
}
