//! Pack uploads beside the chunking: a writer hands each full pack to the uploader threads
//! and goes on cutting, scoring and compressing the next, so a checkpoint's time is the
//! larger of the two, not their sum (over a 1 Gbit/s link the upload is the longer one). Two
//! packs are written at once, so the link stays busy during each request's round trip and
//! the store's own work on it. The threads also hash each pack for its id (the writer needs
//! the ids only at `finish`), and hand the written pack's buffer back for the next pack, so
//! packs do not fault in fresh memory.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use cascade_durable::DurableStore;

use super::{pack_key, Error, Result};
use crate::{score, Score};

/// Packs written at once.
const UPLOAD_THREADS: usize = 2;
/// Packs waiting for a thread besides those being written: at most one queued, two in
/// flight and one being filled.
const QUEUED_PACKS: usize = 1;
/// Written packs' buffers kept for reuse (one per pack that can be queued or in flight).
const SPARE_BUFFERS: usize = QUEUED_PACKS + UPLOAD_THREADS;

/// A pack and its position among the writer's packs.
type Job = (usize, Vec<u8>);
/// An upload thread: the positions and ids of the packs it wrote, or its first failure.
type Worker = JoinHandle<Result<Vec<(usize, Score)>>>;

/// Threads writing packs to the durable store; ids are reported in the order packs were sent.
pub(super) struct PackUploader {
    durable: Arc<DurableStore>,
    prefix: String,
    workers: Option<(SyncSender<Job>, Vec<Worker>)>,
    /// Packs sent so far.
    sent: usize,
    /// Ids of the packs written, in the order they were sent.
    written: Vec<Score>,
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl PackUploader {
    pub(super) fn new(durable: Arc<DurableStore>, prefix: String) -> PackUploader {
        PackUploader {
            durable,
            prefix,
            workers: None,
            sent: 0,
            written: Vec::new(),
            spare: Arc::default(),
        }
    }

    /// An empty buffer for the next pack: a written pack's, or a new one of `capacity`.
    pub(super) fn buffer(&self, capacity: usize) -> Vec<u8> {
        let reused = self.spare.lock().ok().and_then(|mut s| s.pop());
        reused.unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// Queues `pack` for writing (at the key of its id); blocks while the queue is full. An
    /// earlier upload's failure is returned here (or by [`PackUploader::wait`]).
    pub(super) fn send(&mut self, pack: Vec<u8>) -> Result<()> {
        if self.workers.is_none() {
            self.workers = Some(self.spawn()?);
        }
        let sent = match &self.workers {
            Some((tx, _)) => tx.send((self.sent, pack)).is_ok(),
            None => false,
        };
        if sent {
            self.sent += 1;
            Ok(())
        } else {
            // Every thread stopped on a failed upload: the error says why.
            self.wait().map(|_| ())
        }
    }

    fn spawn(&self) -> Result<(SyncSender<Job>, Vec<Worker>)> {
        let (tx, rx) = sync_channel(QUEUED_PACKS);
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::with_capacity(UPLOAD_THREADS);
        for _ in 0..UPLOAD_THREADS {
            let durable = Arc::clone(&self.durable);
            let prefix = self.prefix.clone();
            let spare = Arc::clone(&self.spare);
            let rx = Arc::clone(&rx);
            let handle = std::thread::Builder::new()
                .name("cascade-pack-upload".to_string())
                .spawn(move || upload_all(&durable, &prefix, &spare, &rx))
                .map_err(Error::Io)?;
            workers.push(handle);
        }
        Ok((tx, workers))
    }

    /// Waits until every queued pack is written; the ids of all packs sent so far, in order,
    /// or the first failure.
    pub(super) fn wait(&mut self) -> Result<&[Score]> {
        if let Some((tx, handles)) = self.workers.take() {
            drop(tx);
            let mut ids = Vec::new();
            let mut failure = None;
            for handle in handles {
                match handle.join() {
                    Ok(Ok(written)) => ids.extend(written),
                    Ok(Err(e)) => failure = failure.or(Some(e)),
                    Err(_) => {
                        failure = failure.or(Some(Error::Invalid(
                            "a pack upload thread panicked".to_string(),
                        )))
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            ids.sort_unstable_by_key(|(position, _)| *position);
            self.written.extend(ids.into_iter().map(|(_, id)| id));
        }
        if self.written.len() != self.sent {
            return Err(Error::Invalid(format!(
                "{} of {} packs were written",
                self.written.len(),
                self.sent
            )));
        }
        Ok(&self.written)
    }
}

impl Drop for PackUploader {
    fn drop(&mut self) {
        // A writer dropped without `finish`: its packs are garbage either way, but the threads
        // must not outlive the writer.
        let _ = self.wait();
    }
}

fn upload_all(
    durable: &DurableStore,
    prefix: &str,
    spare: &Mutex<Vec<Vec<u8>>>,
    rx: &Mutex<Receiver<Job>>,
) -> Result<Vec<(usize, Score)>> {
    let mut ids = Vec::new();
    loop {
        // The lock is held only while taking the next pack, not while writing it.
        let next = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => {
                return Err(Error::Invalid(
                    "the pack queue lock is poisoned".to_string(),
                ))
            }
        };
        let Ok((position, pack)) = next else {
            return Ok(ids);
        };
        let id = score(&pack);
        let bytes = Bytes::from(pack);
        durable.put_buffers(&pack_key(prefix, &id), vec![bytes.clone()])?;
        ids.push((position, id));
        // The store has let go of it (unless a client keeps it): reuse the buffer.
        if bytes.is_unique() {
            let mut buffer = Vec::from(bytes);
            buffer.clear();
            if let Ok(mut spare) = spare.lock() {
                if spare.len() < SPARE_BUFFERS {
                    spare.push(buffer);
                }
            }
        }
    }
}
