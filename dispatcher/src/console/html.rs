//! HTML building blocks for the console: escaping (every value a page shows passes `esc`), the
//! page layout, tables and forms. Pure functions, so what a page can render is unit-tested.

/// Escapes text for an HTML element body or a quoted attribute value.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a value for a URL's path segment or query.
pub(crate) fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Who is looking, as the layout shows it.
pub(crate) struct Viewer<'a> {
    pub actor: &'a str,
    pub can_change: bool,
    pub csrf: &'a str,
}

const NAV: [(&str, &str); 9] = [
    ("/console", "Overview"),
    ("/console/dead-letters", "Dead letters"),
    ("/console/executions", "Executions"),
    ("/console/tools", "Tools"),
    ("/console/approvals", "Approvals"),
    ("/console/webhooks", "Webhooks"),
    ("/console/sessions", "Sessions"),
    ("/console/audit", "Audit log"),
    ("/v1/openapi.json", "API"),
];

/// A whole page: the navigation, who is logged in (and whether read-only), then `body` (already
/// escaped HTML).
pub(crate) fn page(title: &str, viewer: Option<&Viewer<'_>>, body: &str) -> String {
    let nav: String = NAV.iter().map(|(href, label)| format!("<a href=\"{href}\">{label}</a>")).collect();
    let who = match viewer {
        Some(v) => format!(
            "<span class=\"who\">{}{}</span><form method=\"post\" action=\"/console/logout\">{}<button>Log out</button></form>",
            esc(v.actor),
            if v.can_change { "" } else { " · read-only" },
            csrf_field(v.csrf)
        ),
        None => String::new(),
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · fleet console</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><link rel=\"stylesheet\" href=\"/console/static/console.css\">\
         <script src=\"/console/static/console.js\" defer></script></head><body>\
         <header><strong>fleet console</strong><nav>{}</nav>{}</header><main><h1>{}</h1>{}</main></body></html>",
        esc(title),
        if viewer.is_some() { nav } else { String::new() },
        who,
        esc(title),
        body
    )
}

pub(crate) fn csrf_field(csrf: &str) -> String {
    format!("<input type=\"hidden\" name=\"csrf\" value=\"{}\">", esc(csrf))
}

/// A table: a header row and rows of cells (each cell already HTML).
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    if rows.is_empty() {
        return "<p class=\"empty\">Nothing here.</p>".to_string();
    }
    let head: String = headers.iter().map(|h| format!("<th>{}</th>", esc(h))).collect();
    let body: String = rows
        .iter()
        .map(|cells| format!("<tr>{}</tr>", cells.iter().map(|c| format!("<td>{c}</td>")).collect::<String>()))
        .collect();
    format!("<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
}

/// An optional value as text (`—` for none), escaped.
pub(crate) fn opt(v: Option<&str>) -> String {
    v.map(esc).unwrap_or_else(|| "—".to_string())
}

/// A link, its text escaped.
pub(crate) fn link(href: &str, text: &str) -> String {
    format!("<a href=\"{}\">{}</a>", esc(href), esc(text))
}

/// A one-button form that posts to `action` (rendered only for a viewer who may change things).
pub(crate) fn button(viewer: &Viewer<'_>, action: &str, label: &str, class: &str) -> String {
    if !viewer.can_change {
        return String::new();
    }
    format!(
        "<form method=\"post\" action=\"{}\" class=\"inline\">{}<button class=\"{}\">{}</button></form>",
        esc(action),
        csrf_field(viewer.csrf),
        esc(class),
        esc(label)
    )
}

/// A text input keeping its value.
pub(crate) fn input(name: &str, label: &str, value: Option<&str>) -> String {
    format!("<label>{} <input name=\"{}\" value=\"{}\"></label>", esc(label), esc(name), esc(value.unwrap_or_default()))
}

/// A notice at the top of a page (an action's outcome).
pub(crate) fn notice(text: &str, ok: bool) -> String {
    format!("<p class=\"notice {}\" role=\"status\">{}</p>", if ok { "ok" } else { "bad" }, esc(text))
}

/// A JSON value, pretty and escaped.
pub(crate) fn json_block(v: &serde_json::Value) -> String {
    format!("<pre>{}</pre>", esc(&serde_json::to_string_pretty(v).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_any_value_renders_as_text() {
        let evil = "<script>alert('x')</script>\"&";
        assert_eq!(esc(evil), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;");
        let viewer = Viewer { actor: "<b>", can_change: true, csrf: "\"><script>" };
        let html = page(evil, Some(&viewer), &table(&["<th>"], &[vec![opt(Some(evil))]]));
        assert!(!html.contains("<script>alert") && !html.contains("<b>") && !html.contains("\"><script>"));
        assert!(link("/x?a=\"b", "<i>").contains("&lt;i&gt;"));
        assert_eq!(url("a b/<c>"), "a%20b%2F%3Cc%3E");
    }

    #[test]
    fn a_read_only_viewer_gets_no_buttons() {
        let ro = Viewer { actor: "token:ab", can_change: false, csrf: "c" };
        assert_eq!(button(&ro, "/console/x", "Retry", "primary"), "");
        let rw = Viewer { can_change: true, ..ro };
        let b = button(&rw, "/console/x", "Retry", "primary");
        assert!(b.contains("name=\"csrf\" value=\"c\"") && b.contains("Retry"));
    }
}
