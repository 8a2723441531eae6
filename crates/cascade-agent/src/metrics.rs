//! The agent's counters ([`AgentStats`], also `cascade status --json`) as Prometheus
//! metrics: docs/operations.md lists them.

use cascade_observe::metrics::Exposition;

use crate::AgentStats;

/// The text of a scrape of the agent whose counters are `s`.
pub fn render(s: &AgentStats) -> String {
    let mut e = Exposition::new();
    e.family(
        "cascade_agent_drained_files_total",
        "counter",
        "Files the agent moved to a level below the node store: staged (acknowledged by a staging server) or durable (uploaded to the durable store).",
        &[
            (&[("level", "staged")], s.staged_files as f64),
            (&[("level", "durable")], s.uploaded_files as f64),
        ],
    );
    e.family(
        "cascade_agent_drained_bytes_total",
        "counter",
        "Bytes of the files in cascade_agent_drained_files_total, by level.",
        &[
            (&[("level", "staged")], s.staged_bytes as f64),
            (&[("level", "durable")], s.uploaded_bytes as f64),
        ],
    );
    e.counter(
        "cascade_agent_checkpoints_complete_total",
        "Checkpoints whose completion marker the agent wrote (durable and complete).",
        s.markers,
    );
    e.counter(
        "cascade_agent_failures_total",
        "Failed attempts (uploads, markers, pushes, store reads); each is logged and retried with backoff.",
        s.failures,
    );
    e.gauge(
        "cascade_agent_last_error_timestamp_seconds",
        "When the last failure happened (Unix time); 0 if none since the agent started.",
        s.last_error_time.unwrap_or(0.0),
    );
    e.gauge(
        "cascade_agent_retrying",
        "Files and checkpoints waiting for a retry after a failure.",
        s.retrying as f64,
    );
    e.gauge(
        "cascade_agent_pending_files",
        "Closed files waiting to be drained at the end of the agent's last pass.",
        s.pending_files as f64,
    );
    e.gauge(
        "cascade_agent_pending_bytes",
        "Bytes of cascade_agent_pending_files.",
        s.pending_bytes as f64,
    );
    e.gauge(
        "cascade_agent_uploads_in_flight",
        "Files being uploaded right now.",
        s.uploading.len() as f64,
    );
    e.counter(
        "cascade_agent_evicted_checkpoints_total",
        "Durable checkpoints evicted from the node store (older than checkpoint.keep, or for room).",
        s.evicted_checkpoints,
    );
    e.counter(
        "cascade_agent_evicted_files_total",
        "Durable files outside every checkpoint made remote for writers waiting for space.",
        s.evicted_files,
    );
    e.counter(
        "cascade_agent_evicted_bytes_total",
        "Bytes freed in the node store by evictions.",
        s.evicted_bytes,
    );
    e.counter(
        "cascade_agent_fetched_files_total",
        "Files fetched back into the node store from the levels below (read-through).",
        s.fetched_files,
    );
    e.counter(
        "cascade_agent_fetched_bytes_total",
        "Bytes of cascade_agent_fetched_files_total.",
        s.fetched_bytes,
    );
    e.counter(
        "cascade_agent_untrusted_staged_total",
        "Staged copies passed over by read-through because this job did not write them.",
        s.untrusted_staged,
    );
    e.counter(
        "cascade_agent_staged_given_up_total",
        "Staged files sent again, and staged checkpoints stored by the node (dedup), because their staging server had not answered for staging.give_up_after.",
        s.staged_given_up,
    );
    e.gauge(
        "cascade_agent_cached_digests",
        "File digests the agent remembers (bounded by the store's entries).",
        s.cached_digests as f64,
    );
    e.counter(
        "cascade_agent_dedup_checkpoints_total",
        "Checkpoints stored in the dedup repository.",
        s.dedup_checkpoints,
    );
    e.counter(
        "cascade_agent_dedup_file_bytes_total",
        "File bytes of the checkpoints stored in the dedup repository.",
        s.dedup_bytes,
    );
    e.counter(
        "cascade_agent_dedup_new_bytes_total",
        "Bytes of chunks the dedup repository did not have yet.",
        s.dedup_new_bytes,
    );
    e.counter(
        "cascade_agent_dedup_stored_bytes_total",
        "Bytes those new chunks took in packs (compressed where it paid).",
        s.dedup_stored_bytes,
    );
    e.counter(
        "cascade_agent_dedup_delta_chunks_total",
        "New chunks stored as deltas against the previous checkpoint.",
        s.dedup_delta_chunks,
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_labels_and_a_missing_error_is_zero() {
        let s = AgentStats {
            uploaded_bytes: 7,
            staged_bytes: 3,
            ..AgentStats::default()
        };
        let text = render(&s);
        assert!(text.contains("cascade_agent_drained_bytes_total{level=\"durable\"} 7\n"));
        assert!(text.contains("cascade_agent_drained_bytes_total{level=\"staged\"} 3\n"));
        assert!(text.contains("cascade_agent_last_error_timestamp_seconds 0\n"));
    }
}
