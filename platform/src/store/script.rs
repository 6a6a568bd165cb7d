//! Lua scripts are built here. A script names the execution record's fields as `F.<name>`, its
//! statuses as `S.<name>` and job kinds as `K.<name>`; each is replaced by its value from
//! `fleet_protocol` (a quoted string) when the script is built, so a script spells none of them and
//! running it costs nothing for them. A name that does not exist stops the script's build.

use std::sync::LazyLock;

use fleet_protocol::envelope::JobKind;
use fleet_protocol::execution::{field, ExecutionStatus};

/// A script built once per process: `Script::new` hashes its source (SHA-1).
pub(crate) type Lua = LazyLock<redis::Script>;

/// The value `table.name` stands for (`F`: fields, `S`: statuses, `K`: job kinds).
fn named(table: char, name: &str) -> Option<&'static str> {
    match table {
        'F' => field::ALL.iter().find(|(n, _)| *n == name).map(|(_, v)| *v),
        'S' => ExecutionStatus::ALL.iter().map(|s| s.as_str()).find(|s| *s == name),
        'K' => JobKind::ALL.iter().map(|k| k.as_str()).find(|k| *k == name),
        _ => None,
    }
}

/// `source` with every `F.<name>`, `S.<name>` and `K.<name>` replaced by its quoted value; the
/// first unknown name is the error.
pub(crate) fn expand(source: &str) -> Result<String, String> {
    let bytes = source.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let table = bytes[i];
        let starts = matches!(table, b'F' | b'S' | b'K') && bytes.get(i + 1) == Some(&b'.');
        let alone = i == 0 || !(word(bytes[i - 1]) || bytes[i - 1] == b'.');
        if starts && alone {
            let end = (i + 2..bytes.len()).find(|&j| !word(bytes[j])).unwrap_or(bytes.len());
            let name = &source[i + 2..end];
            let value = named(table as char, name).ok_or_else(|| format!("{}.{name} names nothing", table as char))?;
            out.push('\'');
            out.push_str(value);
            out.push('\'');
            i = end;
        } else {
            let next = source[i..].chars().next().expect("a char at a boundary");
            out.push(next);
            i += next.len_utf8();
        }
    }
    Ok(out)
}

/// A script of `parts` (a shared piece first, then the script's own), its names expanded.
pub(crate) fn load(parts: &[&str]) -> redis::Script {
    let source: String = parts.iter().flat_map(|p| [*p, "\n"]).collect();
    redis::Script::new(&expand(&source).unwrap_or_else(|e| panic!("a store script: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_replaced_by_their_values_and_an_unknown_one_is_refused() {
        let lua = "if r[F.status] == S.dead_lettered and kind == K.tool_call then KEYS.F = F end";
        let expanded = expand(lua).unwrap();
        assert_eq!(expanded, "if r['status'] == 'dead_lettered' and kind == 'tool_call' then KEYS.F = F end");
        assert_eq!(expand("x = F.step_round").unwrap(), "x = 's_round'");
        assert_eq!(expand("x = S.finished").unwrap_err(), "S.finished names nothing");
    }

    #[test]
    fn every_script_expands() {
        for (path, text) in scripts() {
            if let Err(e) = expand(&text) {
                panic!("{}: {e}", path.display());
            }
        }
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
                assert!(!spelled, "{} spells {quoted}: name it F.<name>, S.<name> or K.<name>", path.display());
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
