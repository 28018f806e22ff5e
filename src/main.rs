//! The `queen` command: `queen serve` (the default) runs the broker,
//! `queen migrate` applies the schema and exits, `queen migrate --reset
//! --yes` drops the schema and applies it afresh.

use clap::{Parser, Subcommand};
use queen::config::Config;

/// jemalloc instead of glibc malloc: it leaves the untouched pages of a
/// reserved buffer unbacked (hyper's 8 KB per-connection buffers of a parked
/// long-poll) and keeps per-thread caches small; see docs/PERFORMANCE.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "queen",
    version,
    about = "Queen: a partitioned message-queue broker on PostgreSQL",
    long_about = "Queen keeps queues in PostgreSQL, split into ordered partitions that consumer groups \
                  read independently through leased pops and offset-commit acks.\n\n\
                  With no database configured (neither QUEEN_DATABASE_URL nor PG_HOST), `queen serve` \
                  starts a private PostgreSQL cluster under QUEEN_DATA_DIR.",
    after_long_help = Config::variables_help()
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker (the default when no command is given)
    Serve {
        /// Bind address; overrides HOST
        #[arg(long)]
        host: Option<String>,
        /// HTTP port; overrides PORT
        #[arg(long)]
        port: Option<u16>,
    },
    /// Apply pending schema migrations, then exit
    Migrate {
        /// Drop the `queen` schema (every queue, message and cursor in it) and
        /// create it afresh; asks for --yes
        #[arg(long)]
        reset: bool,
        /// Confirm --reset
        #[arg(long, requires = "reset")]
        yes: bool,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("queen: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    queen::telemetry::init(&config.log_filter, config.log_json);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime starts");
    let result = runtime.block_on(async move {
        match cli.command.unwrap_or(Command::Serve { host: None, port: None }) {
            Command::Serve { host, port } => {
                if let Some(h) = host {
                    config.host = h;
                }
                if let Some(p) = port {
                    config.port = p;
                }
                queen::app::serve(config).await
            }
            Command::Migrate { reset: false, .. } => queen::app::migrate(config).await,
            Command::Migrate { reset: true, yes } => queen::app::reset(config, yes).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("queen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
