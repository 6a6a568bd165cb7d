//! PostgreSQL values as JSON (read from the binary format tokio-postgres asks for), and query
//! parameters sent as text for the server to parse into whatever type the query gives them.

use std::error::Error;

use base64::Engine;
use bytes::BytesMut;
use fleet_protocol::data_sources::decimal_json;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use tokio_postgres::types::{to_sql_checked, Format, FromSql, IsNull, Kind, ToSql, Type};

type BoxError = Box<dyn Error + Sync + Send>;

/// One cell rendered as JSON; NULL is `null`.
pub(crate) struct Cell(pub(crate) Value);

impl<'a> FromSql<'a> for Cell {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        render(ty, raw).map(Cell)
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(Cell(Value::Null))
    }

    fn accepts(ty: &Type) -> bool {
        renderable(ty)
    }
}

/// Whether values of `ty` have a JSON rendering here (checked on a query's columns before any
/// row is read, so a query fails at once, naming its column).
pub(crate) fn renderable(ty: &Type) -> bool {
    match ty.kind() {
        Kind::Array(member) => renderable(member),
        Kind::Domain(base) => renderable(base),
        Kind::Enum(_) => true,
        _ => {
            matches!(
                *ty,
                Type::BOOL
                    | Type::CHAR
                    | Type::INT2
                    | Type::INT4
                    | Type::INT8
                    | Type::OID
                    | Type::FLOAT4
                    | Type::FLOAT8
                    | Type::NUMERIC
                    | Type::TEXT
                    | Type::VARCHAR
                    | Type::BPCHAR
                    | Type::NAME
                    | Type::UNKNOWN
                    | Type::JSON
                    | Type::JSONB
                    | Type::UUID
                    | Type::TIMESTAMP
                    | Type::TIMESTAMPTZ
                    | Type::DATE
                    | Type::TIME
                    | Type::INTERVAL
                    | Type::BYTEA
                    | Type::VOID
            ) || ty.name() == "citext"
        }
    }
}

fn render(ty: &Type, raw: &[u8]) -> Result<Value, BoxError> {
    match ty.kind() {
        Kind::Array(_) => return Ok(Value::Array(Vec::<Cell>::from_sql(ty, raw)?.into_iter().map(|c| c.0).collect())),
        Kind::Domain(base) => return render(base, raw),
        Kind::Enum(_) => return Ok(Value::String(std::str::from_utf8(raw)?.to_string())),
        _ => {}
    }
    Ok(match *ty {
        Type::BOOL => Value::Bool(bool::from_sql(ty, raw)?),
        Type::CHAR => Value::String(char::from(i8::from_sql(ty, raw)? as u8).to_string()),
        Type::INT2 => json!(i16::from_sql(ty, raw)?),
        Type::INT4 => json!(i32::from_sql(ty, raw)?),
        Type::INT8 => json!(i64::from_sql(ty, raw)?),
        Type::OID => json!(u32::from_sql(ty, raw)?),
        // Through its shortest text, so 1.1 stays 1.1 and not 1.100000023841858.
        Type::FLOAT4 => decimal_json(&f32::from_sql(ty, raw)?.to_string()),
        Type::FLOAT8 => float(f64::from_sql(ty, raw)?),
        Type::NUMERIC => decimal_json(&numeric_text(raw)?),
        Type::JSON | Type::JSONB => Value::from_sql(ty, raw)?,
        Type::UUID => Value::String(uuid::Uuid::from_sql(ty, raw)?.to_string()),
        Type::TIMESTAMP => timestamp(raw, |raw| Ok(time::PrimitiveDateTime::from_sql(ty, raw)?.assume_utc()))?,
        Type::TIMESTAMPTZ => timestamp(raw, |raw| time::OffsetDateTime::from_sql(ty, raw))?,
        Type::DATE => match raw {
            [0x7f, 0xff, 0xff, 0xff] => json!("infinity"),
            [0x80, 0, 0, 0] => json!("-infinity"),
            _ => Value::String(time::Date::from_sql(ty, raw)?.to_string()),
        },
        Type::TIME => Value::String(clock(time::Time::from_sql(ty, raw)?)),
        Type::INTERVAL => Value::String(interval(raw)?),
        Type::BYTEA => Value::String(base64::engine::general_purpose::STANDARD.encode(raw)),
        // What `SELECT pg_sleep(1)` returns: nothing.
        Type::VOID => Value::Null,
        _ => Value::String(String::from_sql(ty, raw)?),
    })
}

fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f).map(Value::Number).unwrap_or_else(|| Value::String(f.to_string()))
}

/// A timestamp in RFC 3339, UTC (`2026-01-15T10:00:00Z`, the seed's form); PostgreSQL's
/// `infinity` and `-infinity` as those words. A timestamp without time zone is read as UTC.
fn timestamp(raw: &[u8], read: impl Fn(&[u8]) -> Result<time::OffsetDateTime, BoxError>) -> Result<Value, BoxError> {
    match raw {
        [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff] => Ok(json!("infinity")),
        [0x80, 0, 0, 0, 0, 0, 0, 0] => Ok(json!("-infinity")),
        _ => Ok(Value::String(read(raw)?.to_offset(time::UtcOffset::UTC).format(&Rfc3339)?)),
    }
}

/// `HH:MM:SS`, with the microseconds when there are any.
fn clock(t: time::Time) -> String {
    let (h, m, s, micros) = t.as_hms_micro();
    match micros {
        0 => format!("{h:02}:{m:02}:{s:02}"),
        _ => format!("{h:02}:{m:02}:{s:02}.{micros:06}"),
    }
}

/// An interval in ISO 8601 (`P1Y2M3DT4H5M6.5S`): microseconds, days and months as the server
/// sends them, each part keeping its own sign.
fn interval(raw: &[u8]) -> Result<String, BoxError> {
    let [m0, m1, m2, m3, m4, m5, m6, m7, d0, d1, d2, d3, o0, o1, o2, o3] =
        raw.try_into().map_err(|_| "bad interval")?;
    let micros = i64::from_be_bytes([m0, m1, m2, m3, m4, m5, m6, m7]);
    let days = i32::from_be_bytes([d0, d1, d2, d3]);
    let months = i32::from_be_bytes([o0, o1, o2, o3]);
    let mut out = String::from("P");
    let (years, months) = (months / 12, months % 12);
    for (n, unit) in [(years as i64, 'Y'), (months as i64, 'M'), (days as i64, 'D')] {
        if n != 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if micros != 0 {
        let (hours, rest) = (micros / 3_600_000_000, micros % 3_600_000_000);
        let (minutes, rest) = (rest / 60_000_000, rest % 60_000_000);
        out.push('T');
        for (n, unit) in [(hours, 'H'), (minutes, 'M')] {
            if n != 0 {
                out.push_str(&format!("{n}{unit}"));
            }
        }
        if rest != 0 {
            let seconds = format!("{}", rest as f64 / 1e6);
            out.push_str(&format!("{seconds}S"));
        }
    }
    Ok(if out == "P" { "PT0S".to_string() } else { out })
}

/// A `numeric` in its binary form (digits in base 10,000 with a weight, a sign and a display
/// scale) as decimal text: `NaN`, `Infinity` and `-Infinity` as those words.
pub(crate) fn numeric_text(raw: &[u8]) -> Result<String, BoxError> {
    let word = |at: usize| -> Result<u16, BoxError> {
        Ok(u16::from_be_bytes([*raw.get(at).ok_or("short numeric")?, *raw.get(at + 1).ok_or("short numeric")?]))
    };
    let (count, weight, sign, scale) = (word(0)? as usize, word(2)? as i16 as i32, word(4)?, word(6)? as usize);
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => {}
    }
    let digits: Vec<u16> = (0..count).map(|i| word(8 + 2 * i)).collect::<Result<_, _>>()?;
    let digit = |i: i32| if i >= 0 { digits.get(i as usize).copied().unwrap_or(0) } else { 0 };
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    if weight < 0 {
        text.push('0');
    } else {
        text.push_str(&digit(0).to_string());
        (1..=weight).for_each(|i| text.push_str(&format!("{:04}", digit(i))));
    }
    if scale > 0 {
        let mut fraction = String::new();
        let mut group = weight + 1;
        while fraction.len() < scale {
            fraction.push_str(&format!("{:04}", digit(group)));
            group += 1;
        }
        fraction.truncate(scale);
        text.push('.');
        text.push_str(&fraction);
    }
    Ok(text)
}

/// A query parameter sent in text format, whatever type the server infers for its placeholder: the
/// server parses `"2026-01-01"` as a timestamp, `"42"` as an integer, and so on. It is a bound
/// value, never part of the statement's text.
#[derive(Debug)]
pub(crate) struct TextParam(Option<String>);

impl TextParam {
    /// A JSON parameter's text: a string as it is, a number or a boolean as written, `null` as
    /// NULL, an array or an object as JSON (for a `json`/`jsonb` placeholder).
    pub(crate) fn of(value: &Value) -> TextParam {
        TextParam(match value {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        })
    }
}

impl ToSql for TextParam {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match &self.0 {
            None => Ok(IsNull::Yes),
            Some(text) => {
                out.extend_from_slice(text.as_bytes());
                Ok(IsNull::No)
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(count: u16, weight: i16, sign: u16, scale: u16, digits: &[u16]) -> Vec<u8> {
        let mut raw = Vec::new();
        for word in [count, weight as u16, sign, scale].iter().chain(digits) {
            raw.extend_from_slice(&word.to_be_bytes());
        }
        raw
    }

    #[test]
    fn numerics_read_as_decimal_text() {
        assert_eq!(numeric_text(&numeric(2, 0, 0, 2, &[19, 9900])).unwrap(), "19.99");
        assert_eq!(numeric_text(&numeric(2, 1, 0x4000, 0, &[12, 3456])).unwrap(), "-123456");
        assert_eq!(numeric_text(&numeric(1, -1, 0, 4, &[1])).unwrap(), "0.0001");
        assert_eq!(numeric_text(&numeric(1, -2, 0, 8, &[12])).unwrap(), "0.00000012");
        assert_eq!(numeric_text(&numeric(1, 1, 0, 1, &[5])).unwrap(), "50000.0");
        assert_eq!(numeric_text(&numeric(0, 0, 0, 0, &[])).unwrap(), "0");
        assert_eq!(numeric_text(&numeric(0, 0, 0xC000, 0, &[])).unwrap(), "NaN");
        assert!(numeric_text(&[0, 1]).is_err());
    }

    #[test]
    fn intervals_read_as_iso_8601() {
        let raw = |micros: i64, days: i32, months: i32| {
            [micros.to_be_bytes().as_slice(), &days.to_be_bytes(), &months.to_be_bytes()].concat()
        };
        assert_eq!(interval(&raw(0, 0, 0)).unwrap(), "PT0S");
        assert_eq!(interval(&raw(3_723_500_000, 3, 14)).unwrap(), "P1Y2M3DT1H2M3.5S");
        assert_eq!(interval(&raw(-60_000_000, 0, 0)).unwrap(), "PT-1M");
    }

    #[test]
    fn times_read_as_clock_text() {
        assert_eq!(clock(time::Time::from_hms(10, 0, 0).unwrap()), "10:00:00");
        assert_eq!(clock(time::Time::from_hms_micro(9, 5, 1, 250).unwrap()), "09:05:01.000250");
    }
}
