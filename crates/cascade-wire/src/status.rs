//! What a staging server answers a Status request with: JSON of [`ServerStatus`]
//! (docs/staging-protocol.md, "Status (`0x09`)"). Servers fill it in, clients and
//! `cascade stage-server status` read it; fields added later default when absent.

use serde::{Deserialize, Serialize};

/// What `cascade stage-server status` shows (the Status reply, JSON).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerStatus {
    pub server: String,
    pub pid: u32,
    pub instance: u64,
    pub listen: String,
    pub dir: String,
    pub drain_to: String,
    pub uptime_s: f64,
    pub clients: u64,
    pub refused_clients: u64,
    /// Connections refused with Error BUSY: over the server's cap in total or per client
    /// address (docs/staging.md, "Limits on clients").
    #[serde(default)]
    pub busy_refusals: u64,
    /// Connections closed because a frame did not arrive, or a reply was not taken, within
    /// the frame timeout.
    #[serde(default)]
    pub timed_out_clients: u64,
    /// Files sealed and bytes appended since the server started.
    pub absorbed_files: u64,
    pub absorbed_bytes: u64,
    pub drained_files: u64,
    pub drained_bytes: u64,
    /// Versions not drained because the durable store had a newer one.
    #[serde(default)]
    pub superseded_files: u64,
    pub markers: u64,
    /// Sealed files not yet in the durable tier.
    pub pending_files: u64,
    pub pending_bytes: u64,
    pub pending_checkpoints: u64,
    pub drain_failures: u64,
    /// Versions whose drain failed `stage_server.drain_attempts` times in a row: kept (they
    /// were acknowledged) and retried only every few minutes (docs/staging.md, "Drain").
    #[serde(default)]
    pub drain_failed: u64,
    /// Log lines not printed because too many alike came within a minute.
    #[serde(default)]
    pub log_suppressed: u64,
    pub last_error: Option<String>,
    pub usage: Usage,
    /// Dedup chunks and manifests (docs/staging.md, "Dedup through the servers").
    #[serde(default)]
    pub dedup: DedupStatus,
    /// The event counter a Watch waits on: something reached the durable store (a file
    /// drained, a marker, a dedup push round, a dedup manifest).
    #[serde(default)]
    pub events: u64,
    /// Watch requests answered, and of them those answered because the counter moved
    /// (not because the wait ran out).
    #[serde(default)]
    pub watches: u64,
    #[serde(default)]
    pub watch_wakeups: u64,
    /// Looks at pending checkpoints or dedup manifests a client's Pull or GetManifest
    /// started, and those the fallback timer (`recheck_every`) started while one waited.
    #[serde(default)]
    pub asked_rechecks: u64,
    #[serde(default)]
    pub timed_rechecks: u64,
    /// Bytes of received frames kept in memory for the drain (`drain_memory`, the
    /// budget), so that sealed versions upload without reading the arenas back.
    #[serde(default)]
    pub drain_memory: u64,
    #[serde(default)]
    pub drain_memory_budget: u64,
    /// Bytes of receive buffers faulted in and out of service, ready to keep frames of the
    /// next checkpoint (`stage_server.prefault_drain_memory` fills them up to the budget at start).
    #[serde(default)]
    pub drain_memory_spare: u64,
    /// Versions drained from those kept bytes; bytes the drain read from the arenas
    /// (versions over the budget, or staged before a restart); versions that did not fit.
    #[serde(default)]
    pub drained_from_memory: u64,
    #[serde(default)]
    pub drain_arena_bytes: u64,
    #[serde(default)]
    pub drain_memory_spills: u64,
    /// Streaming drain (docs/staging.md, "Streaming drain"): versions whose upload started
    /// with their first bytes and completed at their seal; uploads started so but given up
    /// (client gone, out of order, over the memory budget, failed: the ordinary drain takes
    /// them); bytes handed to streaming uploads so far.
    #[serde(default)]
    pub drained_streaming: u64,
    #[serde(default)]
    pub streaming_fallbacks: u64,
    #[serde(default)]
    pub streamed_bytes: u64,
    /// Turns of the drain that left a sealed version for later because clients were
    /// writing (docs/staging.md, "Absorbing first").
    #[serde(default)]
    pub drain_yields: u64,
}

/// The arenas on a server's SSD (the engine's levels now).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Usage {
    pub arena_files: u64,
    pub arena_bytes: u64,
    pub capacity: Option<u64>,
    /// Sealed, not drained, not superseded.
    pub live_versions: u64,
    /// Bytes of the live versions (waiting to be drained).
    pub pending_bytes: u64,
    pub index_bytes: u64,
    /// Checkpoint manifests held in memory: pending ones and the newest completed names.
    #[serde(default)]
    pub manifests_held: u64,
}

/// What `cascade stage-server status` shows about dedup (counters since the server started,
/// levels now).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupStatus {
    /// Chunks stored on this server's SSD, and their raw and stored bytes.
    pub chunks_absorbed: u64,
    pub chunk_bytes_raw: u64,
    pub chunk_bytes_stored: u64,
    /// Of the chunks stored, those that came as deltas against a base in the repository.
    #[serde(default)]
    pub delta_chunks_absorbed: u64,
    /// Chunks sent that this server or the durable repository already had.
    pub chunks_deduplicated: u64,
    /// Chunks written into packs of the durable repository, and their stored bytes.
    pub chunks_pushed: u64,
    pub pushed_bytes: u64,
    /// Chunks the push found in the repository already (another writer pushed them first).
    pub chunks_already_durable: u64,
    /// Acknowledged chunks not yet pushed, and their stored bytes.
    pub pending_chunks: u64,
    pub pending_bytes: u64,
    /// Manifests waiting for their blobs, and manifests written into the repository.
    pub pending_manifests: u64,
    pub manifests_written: u64,
    /// Chunks refused because their bytes did not match their scores.
    pub refused_chunks: u64,
    /// Acknowledged chunks whose records failed their checksum when pushed.
    pub lost_chunks: u64,
    pub push_failures: u64,
    pub segment_files: u64,
    pub segment_bytes: u64,
    /// Chunks in the in-memory score index and the memory its tables take.
    pub index_chunks: u64,
    pub index_memory_bytes: u64,
    /// Namespace repositories open (or looked for) now: at most 64, idle ones are closed.
    #[serde(default)]
    pub open_repositories: u64,
    /// Bases of delta chunks checked here: found in the base cache (their bytes hashed to
    /// their scores), and read from the durable repository instead (with their raw bytes and
    /// the microseconds those reads took); cache entries that did not hash to their scores
    /// (dropped, the base read from the repository).
    #[serde(default)]
    pub delta_bases_from_cache: u64,
    #[serde(default)]
    pub delta_bases_from_durable: u64,
    #[serde(default)]
    pub delta_base_bytes_from_durable: u64,
    #[serde(default)]
    pub delta_base_read_micros: u64,
    #[serde(default)]
    pub base_cache_corrupt: u64,
    /// Entries of the base cache and their bytes now.
    #[serde(default)]
    pub base_cache_chunks: u64,
    #[serde(default)]
    pub base_cache_bytes: u64,
}
