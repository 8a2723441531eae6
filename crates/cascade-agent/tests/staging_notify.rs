//! An agent through two staging servers learns that a checkpoint is durable from the
//! servers' events, not from a timer (docs/staging.md, "Watch"): two real `cascade
//! stage-server` processes with a fallback timer of an hour (`--recheck-every 3600`), an
//! agent in this process whose own fallback (`ask_every`) is an hour too, a directory as the
//! durable store. The test runs the agent's passes and sleeps between them only on the node
//! store's wake-up, which only the agent's watcher threads ring: were a timer needed, a wait
//! would run into the hang guard and fail.
//!
//! 1. plain files striped over both servers, the checkpoint pushed to one: its marker needs
//!    the other server's drain;
//! 2. dedup as chunks: blobs on both servers, the manifest on one: it needs the other's push;
//! 3. dedup as packs: packs, index object and manifest staged on one server, which writes
//!    the manifest after its own drain.

use std::path::Path;
use std::time::{Duration, Instant};

use cascade_agent::{Agent, AgentOptions, DedupOptions, DedupStaging, StagingOptions};
use cascade_durable::DurableStore;
use cascade_testkit::{random, write_store_file, Env, StageServer};

const SECRET: &str = "staging-notify-secret";
/// A hang guard only: each step is woken by an event long before.
const DEADLINE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// `dedup`: None for plain files, else how the checkpoint goes through the servers.
fn checkpoint_durable_on_events(test: &str, via: Option<DedupStaging>) {
    let dedup = via.is_some();
    let env = Env::new(test, 64 << 20);
    let durable = env.tmp.path().join("durable");
    std::fs::create_dir_all(&durable).expect("durable dir");
    let durable_url = durable.to_str().expect("utf-8").to_string();
    let servers: Vec<StageServer> = ["a", "b"]
        .iter()
        .map(|n| {
            let ssd = env.tmp.path().join(n);
            std::fs::create_dir_all(&ssd).expect("server dir");
            StageServer::start(
                &env,
                &ssd,
                &durable_url,
                SECRET,
                &["--recheck-every", "3600"],
            )
        })
        .collect();
    let staging = StagingOptions {
        ask_every: HOUR,
        dedup: via.unwrap_or(DedupStaging::Packs),
        ..StagingOptions::new(servers.iter().map(|s| s.addr.clone()).collect(), SECRET)
    };
    let opts = AgentOptions {
        staging: Some(staging),
        dedup: dedup.then(|| DedupOptions {
            chunking: "fixed:16KiB".parse().expect("chunking"),
            compression: cascade_dedup::Compression::Zstd { level: 1 },
            delta: true,
            adaptive: false,
            session_lease: cascade_dedup::repo::DEFAULT_SESSION_LEASE,
        }),
        rescan: HOUR,
        retry_min: Duration::from_millis(1),
        ..AgentOptions::default()
    };
    let store = env.store().clone();
    let agent = Agent::start(
        store.clone(),
        DurableStore::open(&durable_url).expect("durable store"),
        opts,
    )
    .expect("agent");

    for (i, name) in ["rank.0.bin", "rank.1.bin", "rank.2.bin", "rank.3.bin"]
        .iter()
        .enumerate()
    {
        write_store_file(
            &store,
            &format!("/run/ckpt.1/{name}"),
            &random(1 << 20, i as u64),
        );
    }
    store.commit("/run/ckpt.1", false).expect("commit");

    let started = Instant::now();
    let mut passes = 0u32;
    loop {
        let seen = store.work_counter();
        let outcome = agent.pass();
        passes += 1;
        if store.life_tree("/run/ckpt.1").expect("life_tree")[0].complete() {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "not complete after {passes} passes: {:?}\n{}",
            agent.stats().last_error,
            servers
                .iter()
                .map(|s| s.log())
                .collect::<Vec<_>>()
                .join("\n")
        );
        if !outcome.progressed {
            store.wait_for_work(seen, DEADLINE);
        }
    }
    let statuses: Vec<_> = servers.iter().map(|s| s.status()).collect();
    let used = |s: &cascade_wire::ServerStatus| {
        if via == Some(DedupStaging::Chunks) {
            s.dedup.chunks_absorbed > 0
        } else {
            s.absorbed_files > 0
        }
    };
    for s in &statuses {
        assert_eq!(s.timed_rechecks, 0, "a fallback timer looked: {s:#?}");
        // As packs, the agent has nothing on the other server to wait for.
        assert!(
            s.watches >= 1 || (via == Some(DedupStaging::Packs) && !used(s)),
            "the agent did not watch {}: {s:#?}",
            s.server
        );
    }
    let wakeups: u64 = statuses.iter().map(|s| s.watch_wakeups).sum();
    assert!(wakeups >= 1, "{statuses:#?}");
    if via == Some(DedupStaging::Packs) {
        // One server per node takes its packs.
        assert_eq!(
            statuses.iter().filter(|s| used(s)).count(),
            1,
            "{statuses:#?}"
        );
    } else {
        assert!(
            statuses.iter().all(used),
            "both servers took a share: {statuses:#?}"
        );
    }
    if dedup {
        assert!(Path::new(&durable)
            .join(".cascade-dedup/manifests/run/ckpt.1.json")
            .is_file());
    } else {
        assert!(Path::new(&durable)
            .join("run/ckpt.1/.cascade-complete")
            .is_file());
    }
    drop(agent);
}

#[test]
fn plain_checkpoint_over_two_servers_is_complete_on_their_events() {
    checkpoint_durable_on_events("notify-plain", None);
}

#[test]
fn dedup_checkpoint_as_chunks_over_two_servers_is_complete_on_their_events() {
    checkpoint_durable_on_events("notify-dedup", Some(DedupStaging::Chunks));
}

#[test]
fn dedup_checkpoint_as_packs_is_complete_on_its_servers_events() {
    checkpoint_durable_on_events("notify-packs", Some(DedupStaging::Packs));
}
