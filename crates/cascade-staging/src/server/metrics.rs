//! The staging server's status ([`ServerStatus`], also `cascade stage-server status --json`)
//! as Prometheus metrics, with the free space of its arena directory's file system:
//! docs/operations.md lists them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use cascade_observe::metrics::{unix_seconds, Exposition};
use cascade_wire::status::ServerStatus;

use super::Server;

/// When the server last failed (milliseconds since the Unix epoch, 0 = never). One server
/// per process is what serves metrics, so a process-wide cell is enough.
static LAST_ERROR_MS: AtomicU64 = AtomicU64::new(0);

/// Called where a failure is logged and kept as `last_error`.
pub(super) fn note_error() {
    let ms = (unix_seconds(SystemTime::now()) * 1000.0) as u64;
    LAST_ERROR_MS.store(ms, Ordering::Relaxed);
}

impl Server {
    /// What a metrics endpoint serves: a scrape of this server for as long as it runs (it
    /// holds the server weakly; empty once it is gone).
    pub fn metrics_source(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let shared = Arc::downgrade(&self.shared);
        move || {
            shared
                .upgrade()
                .map(|s| render(&s.status()))
                .unwrap_or_default()
        }
    }
}

/// The size and free bytes of the file system holding `dir`, if statvfs answers.
fn filesystem(dir: &str) -> Option<(u64, u64)> {
    let path = std::ffi::CString::new(dir).ok()?;
    // SAFETY: statvfs is plain data; zeroed is a valid value that the call overwrites.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a valid statvfs to write.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// The text of a scrape of a server whose status is `s`.
pub fn render(s: &ServerStatus) -> String {
    let mut e = Exposition::new();
    let counters: [(&str, &str, u64); 14] = [
        (
            "cascade_stage_clients_total",
            "Client connections accepted.",
            s.clients,
        ),
        (
            "cascade_stage_refused_clients_total",
            "Connections refused at the handshake (bad proof, bad namespace, bad frames).",
            s.refused_clients,
        ),
        (
            "cascade_stage_busy_refusals_total",
            "Connections refused with BUSY: over the server's cap in total or per client address.",
            s.busy_refusals,
        ),
        (
            "cascade_stage_timed_out_clients_total",
            "Connections closed because a frame did not arrive, or a reply was not taken, in time.",
            s.timed_out_clients,
        ),
        (
            "cascade_stage_absorbed_files_total",
            "Files sealed (acknowledged on the SSD).",
            s.absorbed_files,
        ),
        (
            "cascade_stage_absorbed_bytes_total",
            "Bytes appended to the arenas.",
            s.absorbed_bytes,
        ),
        (
            "cascade_stage_drained_files_total",
            "Files drained to the durable store.",
            s.drained_files,
        ),
        (
            "cascade_stage_drained_bytes_total",
            "Bytes drained to the durable store.",
            s.drained_bytes,
        ),
        (
            "cascade_stage_superseded_files_total",
            "Versions not drained because the durable store had a newer one.",
            s.superseded_files,
        ),
        (
            "cascade_stage_checkpoints_complete_total",
            "Completion markers the server wrote.",
            s.markers,
        ),
        (
            "cascade_stage_drain_failures_total",
            "Failed drain attempts (each logged and retried).",
            s.drain_failures,
        ),
        (
            "cascade_stage_log_suppressed_lines_total",
            "Log lines not written because too many alike came within a minute.",
            s.log_suppressed,
        ),
        (
            "cascade_stage_watch_events_total",
            "Events a Watch waits on: something reached the durable store.",
            s.events,
        ),
        (
            "cascade_stage_watches_total",
            "Watch requests answered.",
            s.watches,
        ),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, v);
    }
    e.counter(
        "cascade_stage_watch_wakeups_total",
        "Watch requests answered because the event counter moved (not because the wait ran out).",
        s.watch_wakeups,
    );
    e.family(
        "cascade_stage_rechecks_total",
        "counter",
        "Looks at pending checkpoints or manifests: asked (a client's Pull or GetManifest) or timed (the fallback timer).",
        &[
            (&[("cause", "asked")], s.asked_rechecks as f64),
            (&[("cause", "timed")], s.timed_rechecks as f64),
        ],
    );
    let gauges: [(&str, &str, u64); 6] = [
        ("cascade_stage_pending_files", "Sealed files not yet in the durable store.", s.pending_files),
        ("cascade_stage_pending_bytes", "Bytes of cascade_stage_pending_files.", s.pending_bytes),
        ("cascade_stage_pending_checkpoints", "Checkpoints waiting for their files to drain.", s.pending_checkpoints),
        ("cascade_stage_drain_failed_versions", "Versions whose drain failed stage_server.drain_attempts times in a row (kept, retried every few minutes).", s.drain_failed),
        ("cascade_stage_arena_files", "Arena files on the SSD.", s.usage.arena_files),
        ("cascade_stage_arena_bytes", "Bytes of the arena files.", s.usage.arena_bytes),
    ];
    for (name, help, v) in gauges {
        e.gauge(name, help, v as f64);
    }
    if let Some(capacity) = s.usage.capacity {
        e.gauge(
            "cascade_stage_capacity_bytes",
            "The arenas' capacity (stage_server.capacity); absent when the file system's space is the limit.",
            capacity as f64,
        );
    }
    if let Some((size, avail)) = filesystem(&s.dir) {
        e.gauge(
            "cascade_stage_filesystem_size_bytes",
            "Size of the file system holding the arena directory.",
            size as f64,
        );
        e.gauge(
            "cascade_stage_filesystem_avail_bytes",
            "Bytes of that file system available to the server.",
            avail as f64,
        );
    }
    let more: [(&str, &str, u64); 3] = [
        (
            "cascade_stage_live_versions",
            "Sealed versions not drained and not superseded.",
            s.usage.live_versions,
        ),
        (
            "cascade_stage_index_bytes",
            "Bytes of the arenas' index.",
            s.usage.index_bytes,
        ),
        (
            "cascade_stage_manifests_held",
            "Checkpoint manifests held in memory.",
            s.usage.manifests_held,
        ),
    ];
    for (name, help, v) in more {
        e.gauge(name, help, v as f64);
    }
    let d = &s.dedup;
    let dedup_counters: [(&str, &str, u64); 11] = [
        (
            "cascade_stage_dedup_chunks_absorbed_total",
            "Dedup chunks stored on this server's SSD.",
            d.chunks_absorbed,
        ),
        (
            "cascade_stage_dedup_chunk_raw_bytes_total",
            "Raw bytes of those chunks.",
            d.chunk_bytes_raw,
        ),
        (
            "cascade_stage_dedup_chunk_stored_bytes_total",
            "Stored (compressed) bytes of those chunks.",
            d.chunk_bytes_stored,
        ),
        (
            "cascade_stage_dedup_delta_chunks_absorbed_total",
            "Of them, chunks that came as deltas.",
            d.delta_chunks_absorbed,
        ),
        (
            "cascade_stage_dedup_chunks_deduplicated_total",
            "Chunks sent that this server or the repository already had.",
            d.chunks_deduplicated,
        ),
        (
            "cascade_stage_dedup_chunks_pushed_total",
            "Chunks written into packs of the durable repository.",
            d.chunks_pushed,
        ),
        (
            "cascade_stage_dedup_pushed_bytes_total",
            "Stored bytes of the chunks pushed.",
            d.pushed_bytes,
        ),
        (
            "cascade_stage_dedup_manifests_written_total",
            "Dedup manifests written into the repository.",
            d.manifests_written,
        ),
        (
            "cascade_stage_dedup_refused_chunks_total",
            "Chunks refused because their bytes did not match their scores.",
            d.refused_chunks,
        ),
        (
            "cascade_stage_dedup_lost_chunks_total",
            "Acknowledged chunks whose records failed their checksum when pushed.",
            d.lost_chunks,
        ),
        (
            "cascade_stage_dedup_push_failures_total",
            "Failed pushes to the repository.",
            d.push_failures,
        ),
    ];
    for (name, help, v) in dedup_counters {
        e.counter(name, help, v);
    }
    let dedup_gauges: [(&str, &str, u64); 5] = [
        (
            "cascade_stage_dedup_pending_chunks",
            "Acknowledged chunks not yet pushed.",
            d.pending_chunks,
        ),
        (
            "cascade_stage_dedup_pending_bytes",
            "Stored bytes of those chunks.",
            d.pending_bytes,
        ),
        (
            "cascade_stage_dedup_pending_manifests",
            "Manifests waiting for their chunks.",
            d.pending_manifests,
        ),
        (
            "cascade_stage_dedup_segment_bytes",
            "Bytes of the chunk segment files.",
            d.segment_bytes,
        ),
        (
            "cascade_stage_dedup_index_memory_bytes",
            "Memory of the in-memory chunk index.",
            d.index_memory_bytes,
        ),
    ];
    for (name, help, v) in dedup_gauges {
        e.gauge(name, help, v as f64);
    }
    e.gauge(
        "cascade_stage_uptime_seconds",
        "Seconds since the server started.",
        s.uptime_s,
    );
    let last = LAST_ERROR_MS.load(Ordering::Relaxed);
    e.gauge(
        "cascade_stage_last_error_timestamp_seconds",
        "When the server last failed (Unix time); 0 if not since it started.",
        last as f64 / 1000.0,
    );
    e.finish()
}
