//! Pack uploads beside the chunking: a writer hands each full pack to one uploader thread and
//! goes on cutting, scoring and compressing the next, so a checkpoint's time is the larger of
//! the two, not their sum (over a 1 Gbit/s link the upload is the longer one). The thread
//! also hashes each pack for its id (the writer needs the ids only at `finish`), and hands
//! the written pack's buffer back for the next pack, so packs do not fault in fresh memory.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use cascade_durable::DurableStore;

use super::{pack_key, Error, Result};
use crate::{score, Score};

/// Packs waiting for the uploader besides the one it is sending: at most one pack queued, one
/// in flight and one being filled.
const QUEUED_PACKS: usize = 1;
/// Written packs' buffers kept for reuse (one per pack that can be queued or in flight).
const SPARE_BUFFERS: usize = QUEUED_PACKS + 1;

/// The upload thread: the ids of the packs it wrote, or its first failure.
type Worker = JoinHandle<Result<Vec<Score>>>;

/// One thread writing packs to the durable store in the order they were handed over.
pub(super) struct PackUploader {
    durable: Arc<DurableStore>,
    prefix: String,
    worker: Option<(SyncSender<Vec<u8>>, Worker)>,
    /// Ids of the packs written, in the order they were sent.
    written: Vec<Score>,
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl PackUploader {
    pub(super) fn new(durable: Arc<DurableStore>, prefix: String) -> PackUploader {
        PackUploader {
            durable,
            prefix,
            worker: None,
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
        if self.worker.is_none() {
            let (tx, rx) = sync_channel(QUEUED_PACKS);
            let durable = Arc::clone(&self.durable);
            let prefix = self.prefix.clone();
            let spare = Arc::clone(&self.spare);
            let handle = std::thread::Builder::new()
                .name("cascade-pack-upload".to_string())
                .spawn(move || upload_all(&durable, &prefix, &spare, rx))
                .map_err(Error::Io)?;
            self.worker = Some((tx, handle));
        }
        let sent = match &self.worker {
            Some((tx, _)) => tx.send(pack).is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            // The thread stopped on a failed upload: its error says why.
            self.wait().map(|_| ())
        }
    }

    /// Waits until every queued pack is written; the ids of all packs sent so far, in order,
    /// or the first failure.
    pub(super) fn wait(&mut self) -> Result<&[Score]> {
        if let Some((tx, handle)) = self.worker.take() {
            drop(tx);
            let ids = handle
                .join()
                .map_err(|_| Error::Invalid("the pack upload thread panicked".to_string()))??;
            self.written.extend(ids);
        }
        Ok(&self.written)
    }
}

impl Drop for PackUploader {
    fn drop(&mut self) {
        // A writer dropped without `finish`: its packs are garbage either way, but the thread
        // must not outlive the writer.
        let _ = self.wait();
    }
}

fn upload_all(
    durable: &DurableStore,
    prefix: &str,
    spare: &Mutex<Vec<Vec<u8>>>,
    rx: Receiver<Vec<u8>>,
) -> Result<Vec<Score>> {
    let mut ids = Vec::new();
    for pack in rx {
        let id = score(&pack);
        let bytes = Bytes::from(pack);
        durable.put_buffers(&pack_key(prefix, &id), vec![bytes.clone()])?;
        ids.push(id);
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
    Ok(ids)
}
