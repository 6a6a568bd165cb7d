//! MySQL and MariaDB values as JSON (read from the binary protocol of prepared statements), and
//! JSON parameters as the values bound to `?`.

use base64::Engine;
use fleet_protocol::data_sources::decimal_json;
use mysql_async::consts::ColumnType;
use mysql_async::{Column, Value as MyValue};
use serde_json::{json, Value};

/// The character set number of binary strings (`BINARY`, `VARBINARY`, `BLOB`).
const BINARY_CHARSET: u16 = 63;

/// Whether a column's values have a JSON rendering here (spatial types have none).
pub(crate) fn renderable(column: &Column) -> bool {
    !matches!(column.column_type(), ColumnType::MYSQL_TYPE_GEOMETRY | ColumnType::MYSQL_TYPE_VECTOR)
}

/// The name a column's type is given in an error.
pub(crate) fn type_name(column: &Column) -> String {
    format!("{:?}", column.column_type()).trim_start_matches("MYSQL_TYPE_").to_ascii_lowercase()
}

/// One cell as JSON: integers and doubles as numbers, `DECIMAL` as [`decimal_json`] has it,
/// `DATETIME`/`TIMESTAMP` as RFC 3339 in UTC (`2026-01-15T10:00:00Z`), `DATE` as `2026-01-15`,
/// `TIME` as `[-]HH:MM:SS`, `BIT` as a number, `JSON` as JSON, binary strings as base64, and every
/// other string as text. `TINYINT(1)` is a number: the protocol does not say it is a boolean.
pub(crate) fn render(column: &Column, value: MyValue) -> Value {
    match value {
        MyValue::NULL => Value::Null,
        MyValue::Int(i) => json!(i),
        MyValue::UInt(u) => json!(u),
        // Through its shortest text, so 1.1 stays 1.1 and not 1.100000023841858.
        MyValue::Float(f) => decimal_json(&f.to_string()),
        MyValue::Double(d) => {
            serde_json::Number::from_f64(d).map(Value::Number).unwrap_or_else(|| json!(d.to_string()))
        }
        MyValue::Date(y, mo, d, h, mi, s, us) => match column.column_type() {
            ColumnType::MYSQL_TYPE_DATE | ColumnType::MYSQL_TYPE_NEWDATE => json!(format!("{y:04}-{mo:02}-{d:02}")),
            _ => json!(format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}Z", fraction(us))),
        },
        MyValue::Time(negative, days, h, mi, s, us) => {
            let hours = u64::from(days) * 24 + u64::from(h);
            let sign = if negative { "-" } else { "" };
            json!(format!("{sign}{hours:02}:{mi:02}:{s:02}{}", fraction(us)))
        }
        MyValue::Bytes(bytes) => render_bytes(column, bytes),
    }
}

fn render_bytes(column: &Column, bytes: Vec<u8>) -> Value {
    match column.column_type() {
        ColumnType::MYSQL_TYPE_NEWDECIMAL | ColumnType::MYSQL_TYPE_DECIMAL => {
            decimal_json(&String::from_utf8_lossy(&bytes))
        }
        ColumnType::MYSQL_TYPE_BIT if bytes.len() <= 8 => {
            json!(bytes.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)))
        }
        ColumnType::MYSQL_TYPE_JSON => {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        }
        _ if column.character_set() == BINARY_CHARSET => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(&bytes))
        }
        _ => match String::from_utf8(bytes) {
            Ok(text) => Value::String(text),
            Err(e) => Value::String(base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
        },
    }
}

fn fraction(micros: u32) -> String {
    match micros {
        0 => String::new(),
        us => format!(".{us:06}"),
    }
}

/// A JSON parameter as a bound value: a string's bytes, a number as an integer or a double, a
/// boolean as 1 or 0, `null` as NULL, an array or an object as its JSON text.
pub(crate) fn param(value: &Value) -> MyValue {
    match value {
        Value::Null => MyValue::NULL,
        Value::Bool(b) => MyValue::Int(i64::from(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => MyValue::Int(i),
            (None, Some(u), _) => MyValue::UInt(u),
            (_, _, f) => MyValue::Double(f.unwrap_or(f64::NAN)),
        },
        Value::String(s) => MyValue::Bytes(s.as_bytes().to_vec()),
        other => MyValue::Bytes(other.to_string().into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(kind: ColumnType, charset: u16) -> Column {
        Column::new(kind).with_character_set(charset)
    }

    #[test]
    fn values_render_as_json() {
        let datetime = column(ColumnType::MYSQL_TYPE_DATETIME, BINARY_CHARSET);
        assert_eq!(render(&datetime, MyValue::Date(2026, 1, 15, 10, 0, 0, 0)), json!("2026-01-15T10:00:00Z"));
        assert_eq!(render(&datetime, MyValue::Date(2026, 1, 15, 10, 0, 0, 500)), json!("2026-01-15T10:00:00.000500Z"));
        let date = column(ColumnType::MYSQL_TYPE_DATE, BINARY_CHARSET);
        assert_eq!(render(&date, MyValue::Date(2026, 1, 15, 0, 0, 0, 0)), json!("2026-01-15"));
        let time = column(ColumnType::MYSQL_TYPE_TIME, BINARY_CHARSET);
        assert_eq!(render(&time, MyValue::Time(true, 1, 2, 3, 4, 0)), json!("-26:03:04"));
        let decimal = column(ColumnType::MYSQL_TYPE_NEWDECIMAL, BINARY_CHARSET);
        assert_eq!(render(&decimal, MyValue::Bytes(b"19.99".to_vec())), json!(19.99));
        let text = column(ColumnType::MYSQL_TYPE_VAR_STRING, 45);
        assert_eq!(render(&text, MyValue::Bytes(b"john@example.com".to_vec())), json!("john@example.com"));
        let blob = column(ColumnType::MYSQL_TYPE_BLOB, BINARY_CHARSET);
        assert_eq!(render(&blob, MyValue::Bytes(vec![0, 255])), json!("AP8="));
        let bit = column(ColumnType::MYSQL_TYPE_BIT, BINARY_CHARSET);
        assert_eq!(render(&bit, MyValue::Bytes(vec![1, 0])), json!(256));
        assert_eq!(render(&text, MyValue::Float(1.1)), json!(1.1));
        assert_eq!(type_name(&column(ColumnType::MYSQL_TYPE_GEOMETRY, BINARY_CHARSET)), "geometry");
    }

    #[test]
    fn parameters_bind_as_values() {
        assert_eq!(param(&json!("2026-01-01")), MyValue::Bytes(b"2026-01-01".to_vec()));
        assert_eq!(param(&json!(-3)), MyValue::Int(-3));
        assert_eq!(param(&json!(u64::MAX)), MyValue::UInt(u64::MAX));
        assert_eq!(param(&json!(2.5)), MyValue::Double(2.5));
        assert_eq!(param(&json!(true)), MyValue::Int(1));
        assert_eq!(param(&json!(null)), MyValue::NULL);
        assert_eq!(param(&json!({"a": 1})), MyValue::Bytes(br#"{"a":1}"#.to_vec()));
    }
}
