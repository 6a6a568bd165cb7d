//! Lua scripts are built here: each starts with a prelude that names the execution record's
//! fields (`F`), statuses (`S`) and job kinds (`K`) from `fleet_protocol`, so a script spells none
//! of them, and a name that does not exist is an error where it is read, not a silent `nil`.

use std::fmt::Write;
use std::sync::LazyLock;

use fleet_protocol::envelope::JobKind;
use fleet_protocol::execution::{field, ExecutionStatus};

/// A script built once per process: `Script::new` hashes its source (SHA-1).
pub(crate) type Lua = LazyLock<redis::Script>;

static PRELUDE: LazyLock<String> = LazyLock::new(prelude);

/// The tables `F`, `S` and `K`, each failing on a name it lacks.
fn prelude() -> String {
    let mut lua = String::new();
    let table = |lua: &mut String, name: &str, entries: &mut dyn Iterator<Item = (&str, &str)>| {
        write!(lua, "local {name} = {{").unwrap();
        for (key, value) in entries {
            write!(lua, "{key} = '{value}', ").unwrap();
        }
        writeln!(lua, "}}").unwrap();
        writeln!(lua, "setmetatable({name}, {{__index = function(_, k) error('{name} has no ' .. tostring(k)) end}})")
            .unwrap();
    };
    table(&mut lua, "F", &mut field::ALL.iter().copied());
    table(&mut lua, "S", &mut ExecutionStatus::ALL.iter().map(|s| (s.as_str(), s.as_str())));
    table(&mut lua, "K", &mut JobKind::ALL.iter().map(|k| (k.as_str(), k.as_str())));
    lua
}

/// A script of `parts` (a shared piece first, then the script's own), after the prelude.
pub(crate) fn load(parts: &[&str]) -> redis::Script {
    let mut source = PRELUDE.clone();
    for part in parts {
        source.push_str(part);
        source.push('\n');
    }
    redis::Script::new(&source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prelude_names_every_field_status_and_kind() {
        let lua = prelude();
        assert!(lua.contains("step_round = 's_round'"), "{lua}");
        assert!(lua.contains("dead_lettered = 'dead_lettered'"), "{lua}");
        assert!(lua.contains("tool_call = 'tool_call'"), "{lua}");
        assert_eq!(lua.lines().count(), 6);
    }

    /// Every `.lua` file under `src/store`, with its text.
    fn scripts() -> Vec<(std::path::PathBuf, String)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "lua") {
                    out.push((path.clone(), std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        let mut out = Vec::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store"), &mut out);
        out
    }

    #[test]
    fn no_script_spells_a_status_or_a_record_field() {
        let found = scripts();
        assert!(found.len() > 40, "{} scripts", found.len());
        let names: Vec<&str> = field::ALL
            .iter()
            .map(|(_, v)| *v)
            .chain(ExecutionStatus::ALL.iter().map(|s| s.as_str()))
            .chain(JobKind::ALL.iter().map(|k| k.as_str()))
            .collect();
        for (path, text) in found {
            for name in &names {
                let quoted = format!("'{name}'");
                // A script's answer may start with a tag that happens to share a name.
                let spelled = text.match_indices(&quoted).any(|(at, _)| !text[..at].ends_with("return {"));
                assert!(!spelled, "{} spells {quoted}: read it from the prelude's F, S or K", path.display());
            }
        }
    }

    /// The arguments of the `redis.call(…)` that starts `call`, split at its top-level commas.
    fn call_args(call: &str) -> Vec<&str> {
        let inner = &call["redis.call(".len()..];
        let (mut depth, mut start, mut args) = (0, 0, Vec::new());
        for (i, c) in inner.char_indices() {
            match c {
                '(' | '{' => depth += 1,
                ')' | '}' if depth == 0 => {
                    args.push(inner[start..i].trim());
                    break;
                }
                ')' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    args.push(inner[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        args
    }

    #[test]
    fn no_script_builds_a_key_name() {
        assert_eq!(call_args("redis.call('ZADD', KEYS[1], f(x, y), 'a')"), ["'ZADD'", "KEYS[1]", "f(x, y)", "'a'"]);
        for (path, text) in scripts() {
            for (at, _) in text.match_indices("redis.call(") {
                let args = call_args(&text[at..]);
                // The key a command names comes first: one of KEYS, or a local bound to one.
                let Some(key) = args.get(1) else { continue };
                let built = key.contains("..") || key.contains('(');
                assert!(!built, "{}: {:?} names a key built in the script", path.display(), args);
            }
        }
    }
}
