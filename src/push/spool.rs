//! The push spool: where pushes go while push maintenance is on, or while
//! PostgreSQL cannot take them.
//!
//! Each spooled request is one JSON line appended to a file in
//! `FILE_BUFFER_DIR` and fsynced before the answer (`buffered`) goes out, so
//! a broker crash loses nothing it answered. Every item carries a
//! transactionId fixed at spool time, which is what makes a replay
//! idempotent: replaying a line twice (a crash mid-replay) writes nothing
//! the second time. Files are replayed oldest first, line by line, and a
//! file is deleted only after everything in it committed. While any spooled
//! work is waiting, new pushes join the spool behind it, so the order of a
//! partition's messages is the order their pushes were answered.
//!
//! A spool belongs to one database. Each file opens with a header line naming
//! the cluster's system identifier and the database ([`SpoolOwner`]); a
//! broker replays only its own database's files, and logs (once) and leaves
//! every other file where it is: a spool directory shared by brokers of
//! different databases used to replay each one's pushes into all of them.
//! A file is held under an OS lock by the broker appending to it, so a second
//! broker of the same database neither replays it under the writer's feet nor
//! counts it as its own pending work; once the writer is gone (crashed, or
//! replaying it itself) the file is anyone's of that database.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::{push_items, Coalescer, ItemResult, PushError, PushItem};

/// Spool lines (requests) replayed per push call.
const REPLAY_LINES: usize = 100;

/// Replay passes made while producers may still append, before the handoff.
const UNLOCKED_PASSES: usize = 8;

/// What may be left for the handoff, which holds appends back while it
/// replays: about a tenth of a second of replay.
const HANDOFF_BYTES: u64 = 256 << 10;

/// One spooled push item. Names borrow from the line unless they hold JSON
/// escapes (a `"` or `\` is a legal name character): a plain `&str` field
/// made such a line unreadable, and replay skipped it as torn.
#[derive(Serialize, Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    queue: Cow<'a, str>,
    #[serde(borrow)]
    partition: Cow<'a, str>,
    #[serde(rename = "transactionId")]
    transaction_id: String,
    #[serde(rename = "traceId", skip_serializing_if = "Option::is_none")]
    trace_id: Option<Uuid>,
    /// The payload, absent when `sealed` holds it.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    payload: Option<&'a RawValue>,
    /// The payload's envelope (base64) when its queue encrypts: the spool
    /// never holds an encrypted queue's plaintext on disk. Bound to the
    /// transactionId; the replay opens it and the push seals it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed: Option<String>,
    #[serde(rename = "producerSub", default, skip_serializing_if = "Option::is_none")]
    #[serde(borrow)]
    producer_sub: Option<Cow<'a, str>>,
}

/// The JSON text of a spooled envelope.
fn open_spooled(ring: Option<&crate::crypto::KeyRing>, b64: &str, txn: &str) -> Result<String, SpoolError> {
    use base64::Engine as _;
    let env = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| SpoolError::Push(format!("sealed payload of {txn:?} is not base64: {e}")))?;
    let plain = crate::crypto::open(ring, &env, txn.as_bytes()).map_err(|e| SpoolError::Push(format!("sealed payload of {txn:?}: {e}")))?;
    String::from_utf8(plain).map_err(|_| SpoolError::Push(format!("sealed payload of {txn:?} is not UTF-8")))
}

/// A look at the spool directory (`Spool::stats`).
#[derive(Debug, Default, Clone, Serialize)]
pub struct SpoolStats {
    pub dir: String,
    /// Spool files in the directory (of any database).
    pub files: u64,
    pub bytes: u64,
    /// This broker has spooled work waiting for replay.
    pub pending: bool,
    /// Files moved to `quarantine/` because a line in them does not parse.
    pub quarantined: u64,
}

/// Where a spool file goes when a line other than its last does not parse:
/// those pushes were answered `201 buffered`, so the file is kept whole for
/// the operator rather than replayed in part and deleted.
pub const QUARANTINE_DIR: &str = "quarantine";

/// The database a spool file's pushes belong to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolOwner {
    /// `pg_control_system().system_identifier`: the cluster (kept by its
    /// physical standbys, so a promoted standby replays its primary's spool).
    #[serde(rename = "systemIdentifier")]
    pub system_identifier: String,
    pub database: String,
}

impl SpoolOwner {
    /// The owner the broker's pool connects to.
    pub async fn of(pool: &deadpool_postgres::Pool) -> Result<SpoolOwner, crate::db::DbError> {
        let client = pool.get().await?;
        let row = client
            .query_one("SELECT (SELECT system_identifier::text FROM pg_control_system()), current_database()::text", &[])
            .await?;
        Ok(SpoolOwner { system_identifier: row.get(0), database: row.get(1) })
    }
}

/// A spool file's first line.
#[derive(Serialize, Deserialize)]
struct Header {
    #[serde(rename = "queenSpool")]
    version: u32,
    #[serde(flatten)]
    owner: SpoolOwner,
}

/// A header is one short line; a legacy file's first line is a whole request.
const HEADER_LIMIT: u64 = 4096;

/// Tries an exclusive `flock` without waiting: false when another open file
/// (another broker's writer) holds it.
fn try_lock(file: &std::fs::File) -> std::io::Result<bool> {
    // SAFETY: flock on a descriptor the caller owns; no memory is shared.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Why spooling or replaying failed.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool: {0}")]
    Io(#[from] std::io::Error),
    #[error("spool replay: {0}")]
    Push(String),
}

pub struct Spool {
    dir: PathBuf,
    owner: SpoolOwner,
    /// Which queues' payloads are sealed before they touch the disk.
    encryption: std::sync::Arc<crate::crypto::Encryption>,
    /// The file this broker appends to, locked while it is open.
    current: tokio::sync::Mutex<Option<(PathBuf, std::fs::File)>>,
    pending: AtomicBool,
    replaying: tokio::sync::Mutex<()>,
    /// Files of other databases already logged, so each is said once.
    noted: std::sync::Mutex<HashSet<PathBuf>>,
    /// The path of `current`, for `files` (which cannot wait on its lock):
    /// this broker's own open file is pending work, not another's.
    current_path: std::sync::Mutex<Option<PathBuf>>,
}

impl Spool {
    /// Opens (creating) the spool directory of `owner`'s pushes; its files
    /// left by an earlier run are pending work.
    pub fn open(dir: &Path, owner: SpoolOwner, encryption: std::sync::Arc<crate::crypto::Encryption>) -> Result<Spool, SpoolError> {
        std::fs::create_dir_all(dir)?;
        let spool = Spool {
            dir: dir.to_path_buf(),
            owner,
            encryption,
            current: tokio::sync::Mutex::new(None),
            pending: AtomicBool::new(false),
            replaying: tokio::sync::Mutex::new(()),
            noted: std::sync::Mutex::new(HashSet::new()),
            current_path: std::sync::Mutex::new(None),
        };
        spool.pending.store(!spool.files()?.is_empty(), Ordering::SeqCst);
        Ok(spool)
    }

    /// This database's spool files that no other broker is appending to,
    /// oldest first. Every other file is logged once and left alone.
    fn files(&self) -> Result<Vec<PathBuf>, SpoolError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        files.sort();
        let mut mine = Vec::new();
        for path in files {
            let Ok(mut file) = std::fs::File::open(&path) else { continue };
            let mut first = String::new();
            let _ = std::io::BufReader::new((&mut file).take(HEADER_LIMIT)).read_line(&mut first);
            match serde_json::from_str::<Header>(first.trim_end()) {
                Ok(h) if h.owner == self.owner => {
                    let own_open = self.current_path.lock().expect("current path lock poisoned").as_ref() == Some(&path);
                    if own_open || try_lock(&file)? {
                        mine.push(path);
                    }
                }
                Ok(h) => self.note(&path, || {
                    tracing::warn!(file = %path.display(), database = %h.owner.database, system_identifier = %h.owner.system_identifier,
                                   "spool file of another database; left in place")
                }),
                Err(_) => self.note(&path, || {
                    tracing::warn!(file = %path.display(), "spool file names no database (written before spools had owners); left in place")
                }),
            }
        }
        Ok(mine)
    }

    fn note(&self, path: &Path, log: impl FnOnce()) {
        if self.noted.lock().expect("noted lock poisoned").insert(path.to_path_buf()) {
            log();
        }
    }

    /// What the spool directory holds now, for the operator
    /// (`GET /api/v1/status/buffers`): every spool file, this database's
    /// or another's, and their bytes. Read from the directory, never cached.
    pub fn stats(&self) -> SpoolStats {
        let mut stats = SpoolStats { dir: self.dir.display().to_string(), pending: self.has_pending(), ..SpoolStats::default() };
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return stats };
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "jsonl") {
                stats.files += 1;
                stats.bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        stats.quarantined = std::fs::read_dir(self.dir.join(QUARANTINE_DIR)).map(|d| d.flatten().count() as u64).unwrap_or(0);
        stats
    }

    /// The line number (1-based, the header is line 1) of the first line of
    /// `path` that does not parse as a spooled request, when it is not the
    /// last one: only a torn last line (a crash mid-append, never answered)
    /// may be skipped.
    fn unreadable_line(path: &Path) -> Result<Option<usize>, SpoolError> {
        let file = std::fs::File::open(path)?;
        let mut bad = None;
        for (n, line) in std::io::BufReader::new(file).lines().enumerate().skip(1) {
            let line = line?;
            if let Some(at) = bad {
                // A bad line followed by another one: not a torn tail.
                return Ok(Some(at));
            }
            if !line.trim().is_empty() && serde_json::from_str::<Vec<Line<'_>>>(&line).is_err() {
                bad = Some(n + 1);
            }
        }
        Ok(None)
    }

    /// Moves `path` to the quarantine folder, said in the log.
    fn quarantine(&self, path: &Path, line: usize) -> Result<(), SpoolError> {
        let dir = self.dir.join(QUARANTINE_DIR);
        std::fs::create_dir_all(&dir)?;
        let to = dir.join(path.file_name().expect("a spool file has a name"));
        std::fs::rename(path, &to)?;
        tracing::error!(file = %to.display(), line, "spool file has a line that does not parse: moved to quarantine, not replayed (its pushes were answered 201 buffered; repair the line and move the file back to replay it)");
        Ok(())
    }

    /// Spooled work is waiting for replay.
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Appends a request's items as one line and fsyncs it. Items without a
    /// transactionId get one now. Returns the transactionIds, in item order.
    pub async fn append(&self, items: &[PushItem<'_>], producer: Option<&str>) -> Result<Vec<String>, SpoolError> {
        Ok(self.append_when(items, producer, true).await?.expect("a forced append appends"))
    }

    /// [`Spool::append`] only if spooled work is still waiting, decided
    /// under the append lock: `None` means the spool has drained and the
    /// push goes to PostgreSQL, behind everything that was spooled. Deciding
    /// by [`Spool::has_pending`] alone let a push join a spool the replay
    /// had just found empty, and under steady load the spool never drained.
    pub async fn append_if_pending(&self, items: &[PushItem<'_>], producer: Option<&str>) -> Result<Option<Vec<String>>, SpoolError> {
        self.append_when(items, producer, false).await
    }

    async fn append_when(&self, items: &[PushItem<'_>], producer: Option<&str>, force: bool) -> Result<Option<Vec<String>>, SpoolError> {
        use base64::Engine as _;
        let txns: Vec<String> =
            items.iter().map(|i| i.transaction_id.as_deref().map_or_else(|| Uuid::now_v7().to_string(), str::to_string)).collect();
        let mut line = Vec::new();
        line.push(b'[');
        for (n, (item, txn)) in items.iter().zip(&txns).enumerate() {
            if n > 0 {
                line.push(b',');
            }
            let (payload, sealed) = match self.encryption.sealing(&item.queue).map_err(|e| SpoolError::Push(e.to_string()))? {
                Some(ring) => (None, Some(base64::engine::general_purpose::STANDARD.encode(ring.seal(item.payload.as_bytes(), txn.as_bytes())))),
                None => (Some(serde_json::from_str::<&RawValue>(item.payload).map_err(|e| SpoolError::Push(e.to_string()))?), None),
            };
            let l = Line {
                queue: Cow::Borrowed(&item.queue),
                partition: Cow::Borrowed(&item.partition),
                transaction_id: txn.clone(),
                trace_id: item.trace_id,
                payload,
                sealed,
                producer_sub: producer.map(Cow::Borrowed),
            };
            serde_json::to_writer(&mut line, &l).map_err(|e| SpoolError::Push(e.to_string()))?;
        }
        line.extend_from_slice(b"]\n");
        let mut current = self.current.lock().await;
        if !force && !self.pending.load(Ordering::SeqCst) {
            return Ok(None);
        }
        if current.is_none() {
            let name = format!("spool-{:020}-{}.jsonl", chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0), std::process::id());
            let path = self.dir.join(name);
            let file = std::fs::OpenOptions::new().create_new(true).append(true).open(&path)?;
            try_lock(&file)?;
            let mut header = serde_json::to_vec(&Header { version: 1, owner: self.owner.clone() }).map_err(|e| SpoolError::Push(e.to_string()))?;
            header.push(b'\n');
            // Synced with the first line below: a file never holds a line without its header.
            (&file).write_all(&header)?;
            *self.current_path.lock().expect("current path lock poisoned") = Some(path.clone());
            *current = Some((path, file));
        }
        let (_, file) = current.as_mut().expect("opened above");
        let file = file.try_clone()?;
        // The write and the fsync block; the lock keeps lines whole and ordered.
        tokio::task::block_in_place(|| -> std::io::Result<()> {
            let mut f = &file;
            f.write_all(&line)?;
            f.sync_data()
        })?;
        self.pending.store(true, Ordering::SeqCst);
        Ok(Some(txns))
    }

    /// Replays every spooled line in order through the coalescer. Stops at
    /// the first failure (PostgreSQL still away) and leaves the rest for the
    /// next call. `on_commit` learns what each line wrote.
    ///
    /// Producers keep appending while it replays, so it ends with a handoff:
    /// once what is left is small, the append lock is held while the last
    /// lines replay and the spool is declared empty, so appends waiting on
    /// the lock find it drained and go to PostgreSQL themselves
    /// ([`Spool::append_if_pending`]). Without it a spool under steady load
    /// never drained: each pass left the lines of the pass before.
    pub async fn replay(&self, coalescer: &Coalescer, on_commit: impl Fn(&[ItemResult])) -> Result<usize, SpoolError> {
        let _one_at_a_time = self.replaying.lock().await;
        let mut replayed = 0;
        for _ in 0..UNLOCKED_PASSES {
            self.close_current(&mut *self.current.lock().await);
            replayed += self.replay_files(coalescer, &on_commit).await?;
            if self.waiting_bytes()? <= HANDOFF_BYTES {
                break;
            }
        }
        let mut current = self.current.lock().await;
        self.close_current(&mut current);
        replayed += self.replay_files(coalescer, &on_commit).await?;
        let still = !self.files()?.is_empty();
        self.pending.store(still, Ordering::SeqCst);
        Ok(replayed)
    }

    /// New appends go to a new file from here on; the one being appended
    /// to becomes replayable. Called with the append lock held.
    fn close_current<T>(&self, current: &mut Option<T>) {
        current.take();
        self.current_path.lock().expect("current path lock poisoned").take();
    }

    /// Bytes in this database's spool files.
    fn waiting_bytes(&self) -> Result<u64, SpoolError> {
        Ok(self.files()?.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum())
    }

    /// Replays this database's files, oldest first, deleting each once all
    /// of it committed.
    async fn replay_files(&self, coalescer: &Coalescer, on_commit: &impl Fn(&[ItemResult])) -> Result<usize, SpoolError> {
        let mut replayed = 0;
        for path in self.files()? {
            let file = std::fs::File::open(&path)?;
            // Held while it replays: a second broker of this database skips it.
            if !try_lock(&file)? {
                continue;
            }
            if let Some(line) = Self::unreadable_line(&path)? {
                drop(file);
                self.quarantine(&path, line)?;
                continue;
            }
            let mut lines = std::io::BufReader::new(&file).lines().skip(1);
            loop {
                // Many lines per push: replaying one request per round trip
                // could not outrun producers appending behind it.
                let chunk: Vec<String> = lines.by_ref().take(REPLAY_LINES).collect::<Result<_, _>>()?;
                if chunk.is_empty() {
                    break;
                }
                replayed += self.replay_lines(coalescer, &chunk, on_commit).await?;
            }
            std::fs::remove_file(&path)?;
        }
        Ok(replayed)
    }

    /// Pushes the requests of consecutive spool lines, as few calls as
    /// their producers allow (a call has one producer), in file order.
    async fn replay_lines(&self, coalescer: &Coalescer, chunk: &[String], on_commit: &impl Fn(&[ItemResult])) -> Result<usize, SpoolError> {
        // A torn last line (crash mid-append) was never answered: skip it.
        let parsed: Vec<Vec<Line<'_>>> = chunk
            .iter()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|l| serde_json::from_str::<Vec<Line<'_>>>(l).ok())
            .collect();
        let mut replayed = 0;
        let mut rest: &[Vec<Line<'_>>] = &parsed;
        while let Some(first) = rest.first() {
            let producer = first.first().and_then(|l| l.producer_sub.as_deref());
            let same = rest.iter().take_while(|ls| ls.first().and_then(|l| l.producer_sub.as_deref()) == producer).count().max(1);
            let (run, tail) = rest.split_at(same);
            rest = tail;
            let all: Vec<&Line<'_>> = run.iter().flatten().collect();
            // Sealed payloads open first; one that does not (the key is
            // gone) stops the replay: a spooled push is never dropped.
            let opened: Vec<Option<String>> = all
                .iter()
                .map(|l| l.sealed.as_deref().map(|b64| open_spooled(self.encryption.ring(), b64, &l.transaction_id)).transpose())
                .collect::<Result<_, _>>()?;
            let items: Vec<PushItem<'_>> = all
                .iter()
                .zip(&opened)
                .map(|(l, opened)| PushItem {
                    queue: Cow::Borrowed(&l.queue),
                    partition: Cow::Borrowed(&l.partition),
                    transaction_id: Some(l.transaction_id.as_str().into()),
                    trace_id: l.trace_id,
                    payload: opened.as_deref().or(l.payload.map(RawValue::get)).unwrap_or("null"),
                    message_id: None,
                })
                .collect();
            if items.is_empty() {
                continue;
            }
            let results = push_items(coalescer, &items, producer).await.map_err(|e: std::sync::Arc<PushError>| SpoolError::Push(e.to_string()))?;
            replayed += results.len();
            on_commit(&results);
        }
        Ok(replayed)
    }
}
