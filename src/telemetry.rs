//! Logging: `tracing` to stdout, plain or JSON lines (`QUEEN_LOG_JSON`),
//! filtered by `LOG_LEVEL`/`RUST_LOG`. One line per lifecycle event, none per
//! message.

use tracing_subscriber::EnvFilter;

pub fn init(filter: &str, json: bool) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
