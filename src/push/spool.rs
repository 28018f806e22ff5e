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

use std::borrow::Cow;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::{push_items, Coalescer, ItemResult, PushError, PushItem};

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
    #[serde(borrow)]
    payload: &'a RawValue,
    #[serde(rename = "producerSub", default, skip_serializing_if = "Option::is_none")]
    #[serde(borrow)]
    producer_sub: Option<Cow<'a, str>>,
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
    current: tokio::sync::Mutex<Option<(PathBuf, std::fs::File)>>,
    pending: AtomicBool,
    replaying: tokio::sync::Mutex<()>,
}

impl Spool {
    /// Opens (creating) the spool directory; files left by an earlier run
    /// are pending work.
    pub fn open(dir: &Path) -> Result<Spool, SpoolError> {
        std::fs::create_dir_all(dir)?;
        let spool = Spool {
            dir: dir.to_path_buf(),
            current: tokio::sync::Mutex::new(None),
            pending: AtomicBool::new(false),
            replaying: tokio::sync::Mutex::new(()),
        };
        spool.pending.store(!spool.files()?.is_empty(), Ordering::SeqCst);
        Ok(spool)
    }

    fn files(&self) -> Result<Vec<PathBuf>, SpoolError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// Spooled work is waiting for replay.
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Appends a request's items as one line and fsyncs it. Items without a
    /// transactionId get one now. Returns the transactionIds, in item order.
    pub async fn append(&self, items: &[PushItem<'_>], producer: Option<&str>) -> Result<Vec<String>, SpoolError> {
        let txns: Vec<String> =
            items.iter().map(|i| i.transaction_id.as_deref().map_or_else(|| Uuid::now_v7().to_string(), str::to_string)).collect();
        let mut line = Vec::new();
        line.push(b'[');
        for (n, (item, txn)) in items.iter().zip(&txns).enumerate() {
            if n > 0 {
                line.push(b',');
            }
            let payload: &RawValue = serde_json::from_str(item.payload).map_err(|e| SpoolError::Push(e.to_string()))?;
            let l = Line {
                queue: Cow::Borrowed(&item.queue),
                partition: Cow::Borrowed(&item.partition),
                transaction_id: txn.clone(),
                trace_id: item.trace_id,
                payload,
                producer_sub: producer.map(Cow::Borrowed),
            };
            serde_json::to_writer(&mut line, &l).map_err(|e| SpoolError::Push(e.to_string()))?;
        }
        line.extend_from_slice(b"]\n");
        let mut current = self.current.lock().await;
        if current.is_none() {
            let name = format!("spool-{:020}-{}.jsonl", chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0), std::process::id());
            let path = self.dir.join(name);
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
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
        Ok(txns)
    }

    /// Replays every spooled line in order through the coalescer. Stops at
    /// the first failure (PostgreSQL still away) and leaves the rest for the
    /// next call. `on_commit` learns what each line wrote.
    pub async fn replay(&self, coalescer: &Coalescer, on_commit: impl Fn(&[ItemResult])) -> Result<usize, SpoolError> {
        let _one_at_a_time = self.replaying.lock().await;
        // New appends go to a new file from here on.
        self.current.lock().await.take();
        let mut replayed = 0;
        for path in self.files()? {
            let file = std::fs::File::open(&path)?;
            for line in std::io::BufReader::new(file).lines() {
                let line = line?;
                if line.trim().is_empty() {
                    continue;
                }
                // A torn last line (crash mid-append) was never answered: skip it.
                let Ok(lines) = serde_json::from_str::<Vec<Line<'_>>>(&line) else { continue };
                let items: Vec<PushItem<'_>> = lines
                    .iter()
                    .map(|l| PushItem {
                        queue: Cow::Borrowed(&l.queue),
                        partition: Cow::Borrowed(&l.partition),
                        transaction_id: Some(l.transaction_id.as_str().into()),
                        trace_id: l.trace_id,
                        payload: l.payload.get(),
                        message_id: None,
                    })
                    .collect();
                // One request per line, so one producer per line.
                let producer = lines.first().and_then(|l| l.producer_sub.as_deref());
                let results = push_items(coalescer, &items, producer).await.map_err(|e: std::sync::Arc<PushError>| SpoolError::Push(e.to_string()))?;
                replayed += results.len();
                on_commit(&results);
            }
            std::fs::remove_file(&path)?;
        }
        let still = !self.files()?.is_empty();
        self.pending.store(still, Ordering::SeqCst);
        Ok(replayed)
    }
}
