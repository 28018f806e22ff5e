//! The `queen` command: `queen serve` (the default) runs the broker,
//! `queen migrate` applies the schema and exits, `queen migrate --reset
//! --yes` drops the schema and applies it afresh. The operator commands
//! (`queues`, `groups`, `dlq`, `push`, `tail`, `status`, `completions`) talk
//! to a running broker over HTTP (`queen::cli`).

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
    #[command(flatten)]
    target: queen::cli::Target,
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
    /// List, show, configure or delete queues of a running broker
    #[command(subcommand)]
    Queues(queen::cli::Queues),
    /// Consumer groups: list, show, lag, seek, delete
    #[command(subcommand)]
    Groups(queen::cli::Groups),
    /// Dead letters: list, show, retry, purge
    #[command(subcommand)]
    Dlq(queen::cli::Dlq),
    /// Push a message, or JSON lines from a file or standard input
    Push(queen::cli::Push),
    /// Follow a queue, printing its messages as they arrive
    Tail(queen::cli::Tail),
    /// The broker's health and totals
    Status,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions { shell: clap_complete::Shell },
}

fn main() -> std::process::ExitCode {
    let Cli { command, target } = Cli::parse();
    let command = match command.map(|c| operator_command(c, &target)) {
        Some(Ok(code)) => return code,
        Some(Err(broker)) => Some(broker),
        None => None,
    };
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
        match command.unwrap_or(Command::Serve { host: None, port: None }) {
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
            _ => unreachable!("operator commands ran above"),
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

/// Runs an operator command (a client of a running broker: no broker
/// configuration is read), or gives back the broker's own commands.
fn operator_command(command: Command, t: &queen::cli::Target) -> Result<std::process::ExitCode, Command> {
    use queen::cli;
    let run = |work: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), cli::http::Failure>> + '_>>| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime starts");
        match runtime.block_on(work) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(f) => f.exit(),
        }
    };
    Ok(match command {
        Command::Queues(c) => run(Box::pin(cli::queues(t, c))),
        Command::Groups(c) => run(Box::pin(cli::groups(t, c))),
        Command::Dlq(c) => run(Box::pin(cli::dlq(t, c))),
        Command::Push(p) => run(Box::pin(cli::push(t, p))),
        Command::Tail(a) => run(Box::pin(cli::tail(t, a))),
        Command::Status => run(Box::pin(cli::status(t))),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "queen", &mut std::io::stdout());
            std::process::ExitCode::SUCCESS
        }
        broker => return Err(broker),
    })
}
