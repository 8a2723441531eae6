//! Pack uploads beside the chunking: a writer hands each full pack to one uploader thread and
//! goes on cutting, scoring and compressing the next, so a checkpoint's time is the larger of
//! the two, not their sum (over a 1 Gbit/s link the upload is the longer one).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use cascade_durable::DurableStore;

use super::{Error, Result};

/// Packs waiting for the uploader besides the one it is sending: at most one pack queued, one
/// in flight and one being filled.
const QUEUED_PACKS: usize = 1;

type Upload = (String, Bytes);

/// One thread writing packs to the durable store in the order they were handed over.
pub(super) struct PackUploader {
    durable: Arc<DurableStore>,
    worker: Option<(SyncSender<Upload>, JoinHandle<Result<()>>)>,
}

impl PackUploader {
    pub(super) fn new(durable: Arc<DurableStore>) -> PackUploader {
        PackUploader {
            durable,
            worker: None,
        }
    }

    /// Queues `pack` for writing at `key`; blocks while the queue is full. An earlier upload's
    /// failure is returned here (or by [`PackUploader::wait`]).
    pub(super) fn send(&mut self, key: String, pack: Bytes) -> Result<()> {
        if self.worker.is_none() {
            let (tx, rx) = sync_channel(QUEUED_PACKS);
            let durable = Arc::clone(&self.durable);
            let handle = std::thread::Builder::new()
                .name("cascade-pack-upload".to_string())
                .spawn(move || upload_all(&durable, rx))
                .map_err(Error::Io)?;
            self.worker = Some((tx, handle));
        }
        let sent = match &self.worker {
            Some((tx, _)) => tx.send((key, pack)).is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            // The thread stopped on a failed upload: its error says why.
            self.wait()
        }
    }

    /// Waits until every queued pack is written; the first failure, if any.
    pub(super) fn wait(&mut self) -> Result<()> {
        let Some((tx, handle)) = self.worker.take() else {
            return Ok(());
        };
        drop(tx);
        handle
            .join()
            .map_err(|_| Error::Invalid("the pack upload thread panicked".to_string()))?
    }
}

impl Drop for PackUploader {
    fn drop(&mut self) {
        // A writer dropped without `finish`: its packs are garbage either way, but the thread
        // must not outlive the writer.
        let _ = self.wait();
    }
}

fn upload_all(durable: &DurableStore, rx: Receiver<Upload>) -> Result<()> {
    for (key, pack) in rx {
        durable.put_buffers(&key, vec![pack])?;
    }
    Ok(())
}
