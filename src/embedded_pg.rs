//! The embedded default: a private PostgreSQL cluster the broker starts when
//! no database is configured, so `queen serve` works on a fresh machine.
//!
//! The cluster lives under `QUEEN_DATA_DIR` (`pgdata/` for the data,
//! `run/` for the unix socket, `postgres.log`) and listens on the socket only,
//! never on TCP. It is started with `pg_ctl`, which detaches the server: after
//! the broker is killed the cluster keeps running, and the next start finds it
//! (`pg_ctl status`) and reuses it; a stale pid file is cleared. PostgreSQL
//! refuses to run as root, so when the broker is root every command runs as
//! the `postgres` OS user through `runuser`.
//!
//! A data directory belongs to one broker at a time ([`DirLock`]): a second
//! broker started on it exits before it touches the cluster, so it can
//! neither share the first's cluster nor stop it on its way out.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The socket's port number: only names the socket file, since there is no
/// TCP listener and the directory is private.
pub const SOCKET_PORT: u16 = 5432;

/// Why the embedded cluster could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl) not found in PATH, `pg_config --bindir` or \
         /usr/lib/postgresql/*/bin: install the `postgresql` package (apt-get install postgresql), \
         or point the broker at an existing database with QUEEN_DATABASE_URL or PG_HOST/PG_PORT/\
         PG_USER/PG_PASSWORD/PG_DATABASE"
    )]
    BinariesMissing,
    #[error("embedded PostgreSQL: {0}")]
    Io(#[from] std::io::Error),
    #[error("embedded PostgreSQL: `{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("embedded PostgreSQL: {0}")]
    Unusable(String),
    #[error(
        "QUEEN_DATA_DIR {dir} is in use by another broker (pid {owner}); stop that broker first, \
         or give this one another QUEEN_DATA_DIR"
    )]
    InUse { dir: String, owner: String },
}

/// The broker's exclusive claim on its data directory: an OS lock
/// (`flock`) on `broker.lock` inside it, held by an open file for the
/// broker's whole life, with the owner's PID written in the file for the
/// message a second broker prints.
///
/// An OS lock, not a PID file, because the kernel drops it when its process
/// dies however it dies: a broker killed with -9 leaves its cluster running
/// and the lock free, and the next broker takes the lock and adopts the
/// cluster, as before.
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Takes the lock without waiting, or says who holds it.
    pub fn acquire(data_dir: &Path) -> Result<DirLock, EmbeddedError> {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        let path = data_dir.join("broker.lock");
        let mut file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        // SAFETY: flock on a descriptor this function owns; no memory is shared.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err.into());
            }
            let mut owner = String::new();
            let _ = file.read_to_string(&mut owner);
            let owner = Some(owner.trim().to_string()).filter(|o| !o.is_empty()).unwrap_or_else(|| "unknown".into());
            return Err(EmbeddedError::InUse { dir: data_dir.display().to_string(), owner });
        }
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        file.sync_data()?;
        Ok(DirLock { _file: file })
    }
}

/// Finds the directory holding `initdb` and `pg_ctl` (and the rest of the
/// server's tools: symlinks found on PATH are followed to the real directory).
pub fn find_bindir() -> Result<PathBuf, EmbeddedError> {
    let dir = search_bindir()?;
    Ok(dir.join("initdb").canonicalize().ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or(dir))
}

fn search_bindir() -> Result<PathBuf, EmbeddedError> {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|d| has_tools(d)) {
            return Ok(dir);
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_tools(&dir) {
            return Ok(dir);
        }
    }
    // Debian's layout: /usr/lib/postgresql/<major>/bin; prefer the newest major.
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, dir)| has_tools(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or(EmbeddedError::BinariesMissing)
}

/// True when this process runs as root, so PostgreSQL must run as `postgres`.
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A command that runs as the `postgres` user when we are root.
pub fn as_postgres(program: &Path) -> Command {
    if running_as_root() {
        let mut c = Command::new("runuser");
        c.arg("-u").arg("postgres").arg("--").arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Gives `dir` to the `postgres` user when we are root (no-op otherwise).
pub fn hand_to_postgres(dir: &Path) -> Result<(), EmbeddedError> {
    if running_as_root() {
        run(Command::new("chown").arg("-R").arg("postgres:postgres").arg(dir))?;
    }
    Ok(())
}

/// Runs a command, turning a non-zero exit into an error carrying its stderr.
pub fn run(cmd: &mut Command) -> Result<Output, EmbeddedError> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(EmbeddedError::Command {
            command: format!("{cmd:?}"),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// Creates a fresh cluster in `pgdata` (which must not exist or be empty):
/// superuser `postgres`, local trust authentication (the socket directory is
/// the access control), UTF-8.
pub fn initdb(bindir: &Path, pgdata: &Path, extra: &[&str]) -> Result<(), EmbeddedError> {
    run(as_postgres(&bindir.join("initdb"))
        .arg("-D")
        .arg(pgdata)
        .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
        .args(extra))?;
    Ok(())
}

/// Settings the embedded cluster runs with, written to `queen.conf` in its
/// data directory (included from `postgresql.conf`) on every start, so a
/// broker upgrade retunes an existing cluster. PostgreSQL's defaults are
/// sized for a small shared machine; a broker's cluster is written to all
/// day. Durability is untouched: `fsync` and `synchronous_commit` stay on.
pub const TUNING: &[(&str, &str)] = &[
    // Hot partitions, consumer rows and recent segments stay cached (the WAL
    // buffers follow at 1/32 of this).
    ("shared_buffers", "256MB"),
    // Checkpoints far apart: after each one, the first change of every hot
    // row (partition offsets, cursors) writes a full page image to the WAL.
    ("checkpoint_timeout", "15min"),
    ("max_wal_size", "4GB"),
    ("min_wal_size", "512MB"),
];

const INCLUDE_LINE: &str = "include_if_exists = 'queen.conf'";

/// Writes `queen.conf` from [`TUNING`] and makes `postgresql.conf` include it.
fn write_tuning(pgdata: &Path) -> Result<(), EmbeddedError> {
    let mut conf = String::from("# Written by queen at every start; edits here are overwritten.\n");
    for (name, value) in TUNING {
        conf.push_str(&format!("{name} = '{value}'\n"));
    }
    let file = pgdata.join("queen.conf");
    std::fs::write(&file, conf)?;
    if running_as_root() {
        run(Command::new("chown").arg("postgres:postgres").arg(&file))?;
    }
    let main = pgdata.join("postgresql.conf");
    let text = std::fs::read_to_string(&main)?;
    if !text.lines().any(|l| l.trim() == INCLUDE_LINE) {
        let mut f = std::fs::OpenOptions::new().append(true).open(&main)?;
        std::io::Write::write_all(&mut f, format!("\n{INCLUDE_LINE}\n").as_bytes())?;
    }
    Ok(())
}

/// A running private cluster that this broker owns and stops on shutdown.
pub struct EmbeddedCluster {
    bindir: PathBuf,
    pgdata: PathBuf,
    socket_dir: PathBuf,
    /// Released when the cluster is dropped, after `stop`.
    _lock: DirLock,
}

impl EmbeddedCluster {
    /// Brings the cluster under `data_dir` up: initializes it on first use,
    /// reuses it when it is already running (a previous broker was killed),
    /// starts it otherwise.
    pub fn start(data_dir: &Path) -> Result<EmbeddedCluster, EmbeddedError> {
        let bindir = find_bindir()?;
        std::fs::create_dir_all(data_dir)?;
        let data_dir = data_dir.canonicalize()?;
        // First, before anything of the cluster is looked at or started.
        let lock = DirLock::acquire(&data_dir)?;
        let pgdata = data_dir.join("pgdata");
        let socket_dir = data_dir.join("run");
        let socket = socket_dir.join(format!(".s.PGSQL.{SOCKET_PORT}"));
        if socket.as_os_str().len() > 100 {
            return Err(EmbeddedError::Unusable(format!(
                "the socket path {} is too long for a unix socket; choose a shorter QUEEN_DATA_DIR",
                socket.display()
            )));
        }
        std::fs::create_dir_all(&socket_dir)?;
        hand_to_postgres(&data_dir)?;
        if running_as_root() {
            let probe = Command::new("runuser")
                .args(["-u", "postgres", "--", "test", "-w"])
                .arg(&data_dir)
                .status()?;
            if !probe.success() {
                return Err(EmbeddedError::Unusable(format!(
                    "the postgres user cannot write {} (a parent directory is not traversable by it); \
                     choose another QUEEN_DATA_DIR",
                    data_dir.display()
                )));
            }
        }
        let cluster = EmbeddedCluster { bindir, pgdata, socket_dir, _lock: lock };
        if !cluster.pgdata.join("PG_VERSION").is_file() {
            tracing::info!(dir = %cluster.pgdata.display(), "initializing embedded PostgreSQL cluster");
            initdb(&cluster.bindir, &cluster.pgdata, &[])?;
        }
        if cluster.is_running() {
            tracing::info!("embedded PostgreSQL already running; reusing it");
        } else {
            write_tuning(&cluster.pgdata)?;
            cluster.clear_stale_pid_file();
            cluster.pg_ctl_start(&data_dir)?;
        }
        tracing::info!(data = %data_dir.display(), "embedded PostgreSQL ready: data lives in {}", data_dir.display());
        Ok(cluster)
    }

    fn is_running(&self) -> bool {
        as_postgres(&self.bindir.join("pg_ctl"))
            .arg("status")
            .arg("-D")
            .arg(&self.pgdata)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// `pg_ctl status` said no server runs, so a leftover pid file is stale
    /// (the server died with its broker's machine, or was killed).
    fn clear_stale_pid_file(&self) {
        let pid_file = self.pgdata.join("postmaster.pid");
        if pid_file.exists() {
            tracing::warn!(file = %pid_file.display(), "removing stale PostgreSQL pid file");
            let _ = std::fs::remove_file(pid_file);
        }
    }

    fn pg_ctl_start(&self, data_dir: &Path) -> Result<(), EmbeddedError> {
        let options = format!(
            "-c listen_addresses='' -k {} -p {SOCKET_PORT} -c max_connections=300 -c TimeZone=UTC",
            self.socket_dir.display()
        );
        run(as_postgres(&self.bindir.join("pg_ctl"))
            .arg("start")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-w", "-t", "120", "-s"])
            .arg("-l")
            .arg(data_dir.join("postgres.log"))
            .arg("-o")
            .arg(options))?;
        Ok(())
    }

    /// Connection settings for the cluster's socket.
    pub fn pg_config(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host_path(&self.socket_dir).port(SOCKET_PORT).user("postgres").dbname("postgres");
        c
    }

    /// A fast shutdown: sessions are disconnected, everything committed stays.
    pub fn stop(&self) -> Result<(), EmbeddedError> {
        tracing::info!("stopping embedded PostgreSQL");
        run(as_postgres(&self.bindir.join("pg_ctl"))
            .arg("stop")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-m", "fast", "-w", "-s"]))?;
        Ok(())
    }
}
