//! Pack uploads beside the chunking: a writer hands each full pack to the uploader threads
//! and goes on cutting, scoring and compressing the next, so a checkpoint's time is the
//! larger of the two, not their sum (over a 1 Gbit/s link the upload is the longer one). Two
//! packs are written at once, so the link stays busy during each request's round trip and
//! the store's own work on it. The threads also hash each pack for its id (the writer needs
//! the ids only at `finish`), and hand the written pack's buffer back to the repository for
//! the next pack of this or a later writer, so packs do not fault in fresh memory.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// Written packs' buffers, kept by the repository for every writer's next packs (at most
/// [`SPARE_BUFFERS`] of them, about 10 MiB each).
pub(super) type SparePacks = Arc<Mutex<Vec<Vec<u8>>>>;

/// Where a pack's bytes start in its buffer: a page boundary, so that a directory store
/// writes them with O_DIRECT straight from the buffer (cascade-durable's SyncedDir).
pub(super) const PACK_ALIGN: usize = 4096;

/// A pack's position among the writer's packs, its buffer, and where the pack starts in it.
type Job = (usize, Vec<u8>, usize);
/// An upload thread: the positions and ids of the packs it wrote, or its first failure.
type Worker = JoinHandle<Result<Vec<(usize, Score)>>>;

/// How long uploads kept the writer waiting and the link busy (the adaptive level's inputs,
/// crate::adaptive).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct UploadTiming {
    /// The writer blocked handing a pack over (the queue full) or waiting for the last ones.
    pub(super) blocked: Duration,
    /// At least one pack was being written.
    pub(super) busy: Duration,
    /// Bytes of the packs the durable store acknowledged.
    pub(super) bytes: u64,
}

/// When uploads are in flight: the busy time is the union of their intervals.
#[derive(Default)]
struct BusyClock {
    in_flight: usize,
    since: Option<Instant>,
    busy: Duration,
    bytes: u64,
}

impl BusyClock {
    fn start(clock: &Mutex<BusyClock>) {
        if let Ok(mut c) = clock.lock() {
            if c.in_flight == 0 {
                c.since = Some(Instant::now());
            }
            c.in_flight += 1;
        }
    }

    fn end(clock: &Mutex<BusyClock>, bytes: Option<u64>) {
        if let Ok(mut c) = clock.lock() {
            c.in_flight = c.in_flight.saturating_sub(1);
            c.bytes += bytes.unwrap_or(0);
            if c.in_flight == 0 {
                if let Some(since) = c.since.take() {
                    c.busy += since.elapsed();
                }
            }
        }
    }
}

/// Where a writer's packs and index object go: the durable store itself, or a staging
/// server that drains them there as they are (the agent staging a checkpoint as packs,
/// docs/dedup.md, "Through staging servers").
pub trait ObjectSink: Send + Sync {
    /// Stores object `key` (below the durable store's root) holding the bytes of `parts`.
    fn put(&self, key: &str, parts: Vec<Bytes>) -> Result<()>;
}

impl ObjectSink for DurableStore {
    fn put(&self, key: &str, parts: Vec<Bytes>) -> Result<()> {
        self.put_buffers(key, parts).map_err(Error::from)
    }
}

/// Threads writing packs to their sink; ids are reported in the order packs were sent.
pub(super) struct PackUploader {
    pub(super) sink: Arc<dyn ObjectSink>,
    prefix: String,
    workers: Option<(SyncSender<Job>, Vec<Worker>)>,
    /// Packs sent so far.
    sent: usize,
    /// Ids of the packs written, in the order they were sent.
    written: Vec<Score>,
    spare: SparePacks,
    clock: Arc<Mutex<BusyClock>>,
    blocked: Duration,
}

impl PackUploader {
    pub(super) fn new(
        sink: Arc<dyn ObjectSink>,
        prefix: String,
        spare: SparePacks,
    ) -> PackUploader {
        PackUploader {
            sink,
            prefix,
            workers: None,
            sent: 0,
            written: Vec::new(),
            spare,
            clock: Arc::default(),
            blocked: Duration::ZERO,
        }
    }

    /// How long uploads kept the writer waiting and the link busy so far.
    pub(super) fn timing(&self) -> UploadTiming {
        let (busy, bytes) = self
            .clock
            .lock()
            .map_or((Duration::ZERO, 0), |c| (c.busy, c.bytes));
        UploadTiming {
            blocked: self.blocked,
            busy,
            bytes,
        }
    }

    /// An empty buffer for the next pack: a written pack's, or a new one of `capacity`.
    pub(super) fn buffer(&self, capacity: usize) -> Vec<u8> {
        let reused = self.spare.lock().ok().and_then(|mut s| s.pop());
        reused.unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// Queues the pack `buffer[start..]` for writing (at the key of its id); blocks while the
    /// queue is full. An earlier upload's failure is returned here (or by
    /// [`PackUploader::wait`]).
    pub(super) fn send(&mut self, buffer: Vec<u8>, start: usize) -> Result<()> {
        if self.workers.is_none() {
            self.workers = Some(self.spawn()?);
        }
        let waiting = Instant::now();
        let sent = match &self.workers {
            Some((tx, _)) => tx.send((self.sent, buffer, start)).is_ok(),
            None => false,
        };
        self.blocked += waiting.elapsed();
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
            let sink = Arc::clone(&self.sink);
            let prefix = self.prefix.clone();
            let spare = Arc::clone(&self.spare);
            let clock = Arc::clone(&self.clock);
            let rx = Arc::clone(&rx);
            let handle = std::thread::Builder::new()
                .name("cascade-pack-upload".to_string())
                .spawn(move || upload_all(&*sink, &prefix, &spare, &clock, &rx))
                .map_err(Error::Io)?;
            workers.push(handle);
        }
        Ok((tx, workers))
    }

    /// Waits until every queued pack is written; the ids of all packs sent so far, in order,
    /// or the first failure.
    pub(super) fn wait(&mut self) -> Result<&[Score]> {
        if let Some((tx, handles)) = self.workers.take() {
            let waiting = Instant::now();
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
            self.blocked += waiting.elapsed();
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
    sink: &dyn ObjectSink,
    prefix: &str,
    spare: &Mutex<Vec<Vec<u8>>>,
    clock: &Mutex<BusyClock>,
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
        let Ok((position, buffer, start)) = next else {
            return Ok(ids);
        };
        let Some(pack) = buffer.get(start..) else {
            return Err(Error::Invalid(format!(
                "a pack starts at {start} of a {}-byte buffer",
                buffer.len()
            )));
        };
        let id = score(pack);
        let len = pack.len() as u64;
        let bytes = Bytes::from(buffer);
        BusyClock::start(clock);
        // The pack alone; `bytes` keeps the whole buffer for its reuse below.
        let put = sink.put(&pack_key(prefix, &id), vec![bytes.slice(start..)]);
        BusyClock::end(clock, put.is_ok().then_some(len));
        put?;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cascade_durable::DurableStore;
    use cascade_testkit::random;

    use crate::repo::{Repo, DEFAULT_PREFIX};
    use crate::{Chunking, Compression};

    /// The addresses of the pack buffers `repo` keeps for reuse.
    fn spare_addresses(repo: &Repo) -> Vec<usize> {
        let spare = repo.spare_packs.lock().expect("spare packs");
        spare.iter().map(|b| b.as_ptr() as usize).collect()
    }

    /// A writer per checkpoint, as the agent makes them, fills its packs in the buffers of
    /// the writers before it instead of faulting in new ones.
    #[test]
    fn a_later_writer_fills_its_packs_in_the_buffers_of_an_earlier_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("durable");
        let durable = Arc::new(DurableStore::open(root.to_str().expect("utf-8")).expect("open"));
        let chunking: Chunking = "fixed:64KiB".parse().expect("chunking");
        let repo = Repo::open(durable, DEFAULT_PREFIX, chunking, Compression::None)
            .expect("open")
            .with_pack_size(1 << 20);
        let mut kept = Vec::new();
        for seed in 0..3 {
            // New bytes each time, a few KiB: one pack per writer.
            let mut w = repo.writer();
            w.add_file("ckpt", &random(4 << 10, seed)[..]).expect("add");
            assert_eq!(w.finish().expect("finish").packs, 1);
            let spare = spare_addresses(&repo);
            assert_eq!(spare.len(), 1, "the written pack's buffer is kept");
            kept.extend(spare);
        }
        assert!(
            kept.iter().all(|&a| a == kept[0]),
            "each writer took a buffer of its own: {kept:x?}"
        );
    }
}
