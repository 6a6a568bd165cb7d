//! Positional parameters for MySQL and MariaDB, whose prepared statements take `?`: a query written
//! with PostgreSQL's `$1`, `$2` (the seed's form) is rewritten to `?` outside string literals,
//! quoted identifiers and comments, and the order of its parameters is kept. The values are still
//! bound by the driver, never spliced into the text.

/// A query ready for `?` binding: `order[i]` is the index (from 0) of the parameter bound to the
/// i-th `?`; `expects` is how many parameters the query takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholders {
    pub sql: String,
    pub order: Vec<usize>,
    pub expects: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    #[error("the query mixes `?` and `$n` placeholders: use one form")]
    Mixed,
    #[error("placeholder ${0} is out of range (from $1 to $65535)")]
    OutOfRange(u64),
}

/// What a scan is inside of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Inside {
    Code,
    Quoted(char),
    LineComment,
    BlockComment,
}

/// The query with `$n` placeholders as `?`, or as it was when it uses `?` (or none).
pub fn question_mark_placeholders(sql: &str) -> Result<Placeholders, PlaceholderError> {
    let chars: Vec<char> = sql.chars().collect();
    let (mut out, mut dollars, mut questions) = (String::with_capacity(sql.len()), Vec::new(), 0usize);
    let mut inside = Inside::Code;
    let mut i = 0;
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        match inside {
            Inside::Quoted(q) if c == '\\' && q != '`' => {
                // A backslash escapes the next character in MySQL's default mode.
                out.push(c);
                if let Some(n) = next {
                    out.push(n);
                }
                i += 2;
                continue;
            }
            Inside::Quoted(q) if c == q => inside = Inside::Code,
            Inside::LineComment if c == '\n' => inside = Inside::Code,
            Inside::BlockComment if c == '*' && next == Some('/') => {
                out.push_str("*/");
                inside = Inside::Code;
                i += 2;
                continue;
            }
            Inside::Code => match c {
                '\'' | '"' | '`' => inside = Inside::Quoted(c),
                '#' => inside = Inside::LineComment,
                '-' if next == Some('-') && chars.get(i + 2).is_none_or(|c| c.is_whitespace()) => {
                    inside = Inside::LineComment
                }
                '/' if next == Some('*') => inside = Inside::BlockComment,
                '?' => questions += 1,
                '$' if next.is_some_and(|n| n.is_ascii_digit()) && !ends_identifier(&out) => {
                    let digits: String = chars[i + 1..].iter().take_while(|c| c.is_ascii_digit()).collect();
                    let n: u64 = digits.parse().unwrap_or(u64::MAX);
                    if !(1..=65535).contains(&n) {
                        return Err(PlaceholderError::OutOfRange(n));
                    }
                    dollars.push(n as usize - 1);
                    out.push('?');
                    i += 1 + digits.len();
                    continue;
                }
                _ => {}
            },
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    match (dollars.is_empty(), questions) {
        (true, n) => Ok(Placeholders { sql: sql.to_string(), order: (0..n).collect(), expects: n }),
        (false, 0) => {
            let expects = dollars.iter().max().map_or(0, |m| m + 1);
            Ok(Placeholders { sql: out, order: dollars, expects })
        }
        (false, _) => Err(PlaceholderError::Mixed),
    }
}

/// Whether the text so far ends inside an identifier (`a$1` is a name in MySQL, not `a` and `$1`).
fn ends_identifier(out: &str) -> bool {
    out.chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_placeholders_become_question_marks_in_order() {
        let p = question_mark_placeholders("SELECT * FROM customers WHERE created_at > $1 LIMIT 10").unwrap();
        assert_eq!(p.sql, "SELECT * FROM customers WHERE created_at > ? LIMIT 10");
        assert_eq!((p.order, p.expects), (vec![0], 1));
        let p = question_mark_placeholders("SELECT $2, $1, $2").unwrap();
        assert_eq!((p.sql.as_str(), p.order, p.expects), ("SELECT ?, ?, ?", vec![1, 0, 1], 2));
    }

    #[test]
    fn literals_identifiers_and_comments_are_left_alone() {
        let sql = "SELECT '$1', 'it''s $2', \"$3\", `a$4`, 'x\\'$5', a$6 -- $7\n, $1 # $8\n/* $9 ? */ FROM t";
        let p = question_mark_placeholders(sql).unwrap();
        assert_eq!(p.sql, "SELECT '$1', 'it''s $2', \"$3\", `a$4`, 'x\\'$5', a$6 -- $7\n, ? # $8\n/* $9 ? */ FROM t");
        assert_eq!(p.order, vec![0]);
        // `--` without a space is two minus signs, not a comment.
        assert_eq!(question_mark_placeholders("SELECT 1--$1").unwrap().sql, "SELECT 1--?");
    }

    #[test]
    fn question_marks_pass_and_mixing_is_refused() {
        let p = question_mark_placeholders("SELECT ? + ?, '?'").unwrap();
        assert_eq!((p.sql.as_str(), p.order, p.expects), ("SELECT ? + ?, '?'", vec![0, 1], 2));
        assert_eq!(question_mark_placeholders("SELECT ?, $1"), Err(PlaceholderError::Mixed));
        assert_eq!(question_mark_placeholders("SELECT $0"), Err(PlaceholderError::OutOfRange(0)));
        assert_eq!(question_mark_placeholders("SELECT 1").unwrap().expects, 0);
    }
}
