//! How the CLI prints: a table for people (comfy-table, no borders, sized to
//! the terminal), the broker's own JSON with `--json` for scripts.

use serde_json::Value;

/// Prints `value` as JSON, or what `human` renders.
pub fn print(json: bool, value: &Value, human: impl FnOnce() -> String) {
    if json {
        println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
    } else {
        println!("{}", human());
    }
}

/// A JSON value as a table cell: text without quotes, `-` for nothing.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// At most `max` characters of `s`, with an ellipsis when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max.saturating_sub(1)).collect::<String>())
    }
}

/// A table with a header row.
pub struct Table(comfy_table::Table);

impl Table {
    pub fn new(header: &[&str]) -> Table {
        let mut t = comfy_table::Table::new();
        t.load_style(comfy_table::presets::NOTHING);
        if header.iter().any(|h| !h.is_empty()) {
            t.set_header(header.iter().copied());
        }
        Table(t)
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.0.add_row(cells);
    }

    pub fn render(&self) -> String {
        self.0.to_string()
    }
}
