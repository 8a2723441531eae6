//! The streaming drain (docs/staging.md, "Streaming drain"): a large version's upload to an
//! S3 durable store starts when its first Write segment arrives, and is fed its bytes in
//! order as the disk writers keep them, so that the upload overlaps the receiving instead of
//! following it. The last byte is held back until the drain thread hands over the seal and
//! the hash of everything sent equals the client's: an upload whose version is never sealed,
//! or sealed with another hash, never completes, and S3 keeps nothing of it. The commit
//! (checksum object, Drained record) stays the drain thread's, as for every version.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use cascade_durable::{DurableStore, FileDigest};

use super::{lock, Shared};
use crate::engine::{VersionId, VersionInfo};
use crate::{hex, ServerError as Error, ServerResult as Result};

/// Versions from this size up stream; smaller ones upload whole at their seal (a thread and
/// a request each would cost more than the overlap gains).
pub(super) const STREAMED_DRAIN_MIN: u64 = 8 << 20;

/// Most uploads streaming at once; the versions begun beyond them drain at their seal.
pub(super) const MAX_STREAMS: usize = 4;

enum FeedMsg {
    /// Bytes at an offset of the version, as kept (in any order).
    Bytes(u64, Bytes),
    /// The version is sealed with this BLAKE3: complete the upload if it matches.
    Seal([u8; 32]),
}

/// A version whose upload is streaming: its feeder thread and the way to it. Dropping it
/// (without [`Shared::finish_stream`]) aborts the upload.
pub(super) struct Feed {
    tx: mpsc::Sender<FeedMsg>,
    thread: JoinHandle<Result<Streamed>>,
}

/// How a streaming upload ended at the seal.
pub(super) enum Streamed {
    /// Uploaded whole: the digest of what was sent, equal to the client's.
    Uploaded(FileDigest),
    /// What was received hashes to another digest than the client sealed: the upload was
    /// aborted (nothing written).
    Mismatch(FileDigest),
}

/// Bytes handed to streaming uploads (Status `streamed_bytes`).
#[derive(Default)]
pub(super) struct StreamStats {
    streamed_bytes: AtomicU64,
}

impl StreamStats {
    pub(super) fn streamed_bytes(&self) -> u64 {
        self.streamed_bytes.load(Ordering::Relaxed)
    }
}

impl Shared {
    /// Starts streaming the upload of version `id` (just begun on a connection) if it is
    /// worth it and allowed: an S3 durable store, the kept-bytes memory on and room for the
    /// whole version in it, at most one request's worth, fewer than [`MAX_STREAMS`] at once.
    pub(super) fn start_stream(&self, id: VersionId, key: &str, stamp: u64, size: u64) {
        if !(STREAMED_DRAIN_MIN..=cascade_durable::SINGLE_PUT_MAX).contains(&size)
            || size > self.opts.drain_memory
            || !self.durable.can_stream()
        {
            return;
        }
        // Bytes of it kept already: a resend, which the ordinary drain sorts out.
        if lock(&self.kept).contains_key(&id) {
            return;
        }
        let mut feeds = lock(&self.feeds);
        if feeds.len() >= MAX_STREAMS || feeds.contains_key(&id) {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let durable = Arc::clone(&self.durable);
        let stats = Arc::clone(&self.stream_stats);
        let key = key.to_string();
        let spawned = super::spawn_named(super::threads::STREAM.into(), move || {
            upload(&durable, &stats, &key, stamp, size, rx)
        });
        match spawned {
            Ok(thread) => {
                feeds.insert(id, Feed { tx, thread });
            }
            Err(e) => {
                drop(feeds);
                self.log(|| format!("cannot start a streaming upload: {e}"));
            }
        }
    }

    /// Hands bytes just kept of version `id` to its streaming upload, if it has one.
    pub(super) fn feed_stream(&self, id: VersionId, offset: u64, part: &Bytes) {
        if let Some(feed) = lock(&self.feeds).get(&id) {
            // A feeder that has already failed is told at the seal (or dropped).
            let _ = feed.tx.send(FeedMsg::Bytes(offset, part.clone()));
        }
    }

    /// Gives up the streaming upload of `id` (its client went away before sealing it, it
    /// no longer fits in memory, the server stops): the upload is aborted, and the ordinary
    /// drain takes the version if it is ever sealed.
    pub(super) fn stop_stream(&self, id: VersionId, why: &str) {
        let feed = lock(&self.feeds).remove(&id);
        if let Some(feed) = feed {
            lock(&self.counters).streaming_fallbacks += 1;
            // The feeder sees its channel closed and aborts the upload; it is not waited for.
            drop(feed.tx);
            drop(feed.thread);
            self.log(|| format!("streaming upload stopped: {why}"));
        }
    }

    /// Stops every streaming upload whose version is no longer being received or waiting to
    /// drain, or all of them when the server stops.
    pub(super) fn prune_streams(&self, all: bool) {
        let stale: Vec<VersionId> = lock(&self.feeds)
            .keys()
            .copied()
            .filter(|id| all || !self.engine.is_live(*id))
            .collect();
        for id in stale {
            self.stop_stream(
                id,
                "its version is gone (abandoned, superseded or stopping)",
            );
        }
    }

    /// Hands version `id`, just sealed with `blake3`, to its streaming upload (if it has
    /// one), which completes at once if the hash matches: the upload's last byte does not
    /// wait for the drain thread (which may be busy with another version while the store
    /// times the idle request out). The drain thread collects the outcome
    /// ([`Shared::finish_stream`]).
    pub(super) fn seal_stream(&self, id: VersionId, blake3: [u8; 32]) {
        if let Some(feed) = lock(&self.feeds).get(&id) {
            let _ = feed.tx.send(FeedMsg::Seal(blake3));
        }
    }

    /// For sealed version `v` with a streaming upload: hands it the seal (unless
    /// [`Shared::seal_stream`] did) and waits for the outcome. None without one.
    pub(super) fn finish_stream(&self, v: &VersionInfo) -> Option<Result<Streamed>> {
        let feed = lock(&self.feeds).remove(&v.id)?;
        let _ = feed.tx.send(FeedMsg::Seal(v.blake3));
        drop(feed.tx);
        Some(match feed.thread.join() {
            Ok(r) => r,
            Err(_) => Err(Error::Invalid(format!(
                "{}: the streaming upload panicked",
                v.key
            ))),
        })
    }
}

/// The feeder of one streaming upload: starts the PUT (unless the durable store has a newer
/// version), sends the bytes in order as they come (all but the last one), and at the seal,
/// if the hash of what was sent is the client's, writes the version object and completes
/// the PUT. The version object waits for the seal: written at the start, it would claim the
/// name for a version that may never be sealed, and an older sealed version of the same key
/// would then be retired as superseded (docs/staging.md, "Version order") and lost.
fn upload(
    durable: &DurableStore,
    stats: &StreamStats,
    key: &str,
    stamp: u64,
    size: u64,
    rx: mpsc::Receiver<FeedMsg>,
) -> Result<Streamed> {
    let stopped = |why: &str| Error::Invalid(format!("{key}: streaming upload given up: {why}"));
    let newer = || -> Result<()> {
        match durable.recorded_version(key)?.filter(|&s| s > stamp) {
            Some(newer) => Err(stopped(&format!(
                "the durable store has a newer version (stamp {newer})"
            ))),
            None => Ok(()),
        }
    };
    newer()?;
    let mut put = durable.put_stream(key, size)?;
    let mut hasher = blake3::Hasher::new();
    let mut next = 0u64;
    // Bytes that arrived ahead of `next` (the disk writers keep extents in any order).
    let mut early: BTreeMap<u64, Bytes> = BTreeMap::new();
    let mut last_byte = None;
    loop {
        match rx.recv() {
            Ok(FeedMsg::Bytes(offset, part)) => {
                let end = offset + part.len() as u64;
                // A resend overlaps bytes sent on or bytes still waiting for their turn,
                // whichever copy the disk writers kept first.
                let overlaps_early = early
                    .range(..end)
                    .next_back()
                    .is_some_and(|(&at, p)| at + p.len() as u64 > offset);
                if offset < next || overlaps_early || end > size {
                    return Err(stopped(
                        "its segments overlap (a resend) or overrun its size",
                    ));
                }
                early.insert(offset, part);
                while let Some(mut part) = early.remove(&next) {
                    hasher.update(&part);
                    next += part.len() as u64;
                    if next == size {
                        last_byte = Some(part.split_off(part.len() - 1));
                    }
                    let n = part.len() as u64;
                    if !put.send(part) {
                        return Err(match durable.finish_stream(put) {
                            Err(e) => e.into(),
                            Ok(()) => stopped("the upload ended early"),
                        });
                    }
                    stats.streamed_bytes.fetch_add(n, Ordering::Relaxed);
                }
            }
            Ok(FeedMsg::Seal(expected)) => {
                let Some(last) = last_byte.take().filter(|_| early.is_empty()) else {
                    return Err(stopped("its bytes did not all arrive in order"));
                };
                let blake3 = *hasher.finalize().as_bytes();
                let digest = FileDigest {
                    size,
                    blake3: hex(&blake3),
                };
                if blake3 != expected {
                    put.abort();
                    return Ok(Streamed::Mismatch(digest));
                }
                // Version order: the version object before the data object appears (S3
                // shows a PUT's object only once its last byte arrived), never over a newer
                // one. The upload is dropped (aborted) on either failure.
                newer()?;
                durable.put_version(key, stamp)?;
                put.send(last);
                stats.streamed_bytes.fetch_add(1, Ordering::Relaxed);
                durable.finish_stream(put)?;
                return Ok(Streamed::Uploaded(digest));
            }
            // Stopped (the client went away, over budget, the server stops): dropping `put`
            // aborts the upload.
            Err(_) => return Err(stopped("stopped before its seal")),
        }
    }
}

/// Streaming uploads in progress, by version.
pub(super) type Feeds = HashMap<VersionId, Feed>;

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_testkit::versitygw::SECRET;
    use cascade_testkit::{random, Versitygw};

    /// A frame sent twice is a resend however the disk writers ordered the copies: here
    /// both copies come before the bytes ahead of them, so neither has been sent on yet.
    #[test]
    fn a_segment_resent_before_its_turn_gives_the_stream_up() {
        let gw = Versitygw::start();
        gw.create_bucket("cascade");
        let durable =
            DurableStore::open(&gw.spec("cascade/resend", SECRET)).expect("open the store");
        let frame = 4 << 20;
        let data = Bytes::from(random(3 * frame, 7));
        let (tx, rx) = mpsc::channel();
        for (offset, range) in [
            (frame, frame..2 * frame),
            (frame, frame..2 * frame),
            (0, 0..frame),
            (2 * frame, 2 * frame..3 * frame),
        ] {
            tx.send(FeedMsg::Bytes(offset as u64, data.slice(range)))
                .expect("feed");
        }
        tx.send(FeedMsg::Seal(*blake3::hash(&data).as_bytes()))
            .expect("seal");
        let stats = StreamStats::default();
        match upload(&durable, &stats, "ckpt/f", 1, data.len() as u64, rx) {
            Err(e) => assert!(e.to_string().contains("overlap"), "{e}"),
            Ok(_) => panic!("a resent segment was streamed as if sent once"),
        }
        assert!(
            durable.list("").expect("list").is_empty(),
            "the given-up upload left an object"
        );
    }
}
