//! `cascade stage-server` and `cascade stage-server status` (docs/staging.md), and the
//! agent's staging settings.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cascade_agent::{DedupStaging, Placement, StagingOptions};
use cascade_config::{format_size, Config};
use cascade_staging::auth::{Credential, JobKey};
use cascade_staging::chunks::ChunkOptions;
use cascade_staging::engine::EngineOptions;
use cascade_staging::tls::{self, rustls};
use cascade_staging::{ClientOptions, Connection, Server, ServerOptions};

use crate::failure::Failure;
use crate::lifecycle::{block_stop_signals, wait_for_signal};

/// The cluster secret (servers, operators' tools, `credential`).
fn secret(config: &Config) -> Result<&str, Failure> {
    Some(config.text("staging.secret"))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            Failure::new(
                "no staging secret: set staging.secret_file (CASCADE_STAGING_SECRET_FILE) to a \
                 file holding it, or CASCADE_STAGING_SECRET (or staging.secret in the config file)",
            )
        })
}

/// What a client proves itself with: the job's credential if one is given, else the
/// cluster secret.
fn client_credential(config: &Config) -> Result<Credential, Failure> {
    let credential = config.text("staging.credential");
    if !credential.is_empty() {
        return JobKey::from_credential(credential)
            .map(Credential::Job)
            .map_err(|why| Failure::new(format!("staging.credential: {why}")));
    }
    if config.text("staging.secret").is_empty() {
        return Err(Failure::new(
            "no staging credential: give the job's credential (staging.credential_file, \
             CASCADE_STAGING_CREDENTIAL_FILE; `cascade stage-server credential` prints it) or \
             the cluster secret (staging.secret_file, CASCADE_STAGING_SECRET_FILE, or \
             CASCADE_STAGING_SECRET)",
        ));
    }
    Ok(Credential::ClusterSecret(
        config.text("staging.secret").into(),
    ))
}

/// `cascade stage-server credential`: the credential of a job's namespace.
pub fn credential(config: &Config, namespace: Option<&str>) -> Result<ExitCode, Failure> {
    let namespace = match namespace {
        Some(n) => n.trim_matches('/').to_string(),
        None => config.staging_namespace(),
    };
    if !namespace.is_empty() {
        cascade_staging::protocol::check_key(&namespace)
            .map_err(|e| Failure::new(format!("namespace {namespace:?}: {e}")))?;
    }
    let key = JobKey::derive(secret(config)?, &namespace);
    println!("{}", key.credential());
    if namespace.is_empty() {
        eprintln!(
            "cascade: warning: this is the credential of the empty namespace, which opens every \
             namespace on the servers: give it to no job"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The TLS config a client trusts the servers with (`staging.tls_ca`), if one is set.
pub fn client_tls(config: &Config) -> Result<Option<Arc<rustls::ClientConfig>>, Failure> {
    let ca = config.text("staging.tls_ca");
    if ca.is_empty() {
        return Ok(None);
    }
    tls::client_config(Path::new(ca))
        .map(Some)
        .map_err(Failure::new)
}

/// The staging server's TLS config (`stage_server.tls_cert` and `tls_key`, which the
/// config checked come together), if they are set.
fn server_tls(config: &Config) -> Result<Option<Arc<rustls::ServerConfig>>, Failure> {
    let (cert, key) = (
        config.text("stage_server.tls_cert"),
        config.text("stage_server.tls_key"),
    );
    if cert.is_empty() || key.is_empty() {
        return Ok(None);
    }
    tls::server_config(Path::new(cert), Path::new(key))
        .map(Some)
        .map_err(Failure::new)
}

/// The agent's staging servers, if any are configured.
pub fn staging_options(config: &Config) -> Result<Option<StagingOptions>, Failure> {
    let servers: Vec<String> = config
        .text("staging.servers")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if servers.is_empty() {
        return Ok(None);
    }
    let mut opts = StagingOptions::with(servers, client_credential(config)?);
    opts.tls = client_tls(config)?;
    opts.namespace = config.staging_namespace();
    opts.placement = config
        .text("staging.placement")
        .parse::<Placement>()
        .map_err(Failure::new)?;
    opts.dedup = config
        .text("staging.dedup")
        .parse::<DedupStaging>()
        .map_err(Failure::new)?;
    opts.give_up_after = Duration::from_millis(config.number("staging.give_up_after"));
    Ok(Some(opts))
}

/// `cascade stage-server`: serves until SIGINT or SIGTERM.
pub fn serve(config: &Config, verbose: bool) -> Result<ExitCode, Failure> {
    cascade_staging::server::limit_malloc_arenas();
    crate::umask::restrict(config)?;
    let signals = block_stop_signals()?;
    let listen = config.text("stage_server.listen");
    if listen.is_empty() {
        return Err(Failure::new(
            "no address to listen on: give --listen ADDR:PORT (or CASCADE_STAGE_LISTEN)",
        ));
    }
    let dir = config.text("stage_server.dir");
    if dir.is_empty() {
        return Err(Failure::new(
            "no arena directory: give --dir PATH on the server's SSD (or CASCADE_STAGE_DIR)",
        ));
    }
    let drain_to = config.text("stage_server.drain_to");
    if drain_to.is_empty() {
        return Err(Failure::new(
            "nowhere to drain to: give --drain-to URL (a directory or s3://bucket?endpoint=URL)",
        ));
    }
    let mut opts = ServerOptions::new(listen, PathBuf::from(dir), drain_to, secret(config)?);
    let capacity = config.number("stage_server.capacity");
    opts.engine = EngineOptions {
        // The engine lowers it to a quarter of the capacity, if one is set.
        arena_size: config.number("stage_server.arena_size").max(1 << 20),
        capacity: (capacity > 0).then_some(capacity),
        writers: config.number("stage_server.io_threads").max(1) as usize,
        ..EngineOptions::default()
    };
    let chunk_capacity = config.number("stage_server.chunk_capacity");
    opts.chunks = ChunkOptions {
        segment_size: config.number("stage_server.chunk_segment_size"),
        capacity: (chunk_capacity > 0).then_some(chunk_capacity),
        max_chunks: usize::try_from(config.number("stage_server.chunk_index_limit"))
            .unwrap_or(usize::MAX),
        base_cache_bytes: config.number("stage_server.base_cache"),
    };
    opts.buffers = config.number("stage_server.buffers").max(1) as usize;
    opts.io_threads = config.number("stage_server.io_threads").max(1) as usize;
    opts.writes_in_flight = config.number("stage_server.writes_in_flight").max(1) as usize;
    opts.drain_memory = config.number("stage_server.drain_memory");
    opts.prefault = config.text("stage_server.prefault_drain_memory") == "on";
    opts.max_connections = usize::try_from(config.number("stage_server.max_connections"))
        .unwrap_or(usize::MAX)
        .max(1);
    opts.max_connections_per_client =
        usize::try_from(config.number("stage_server.max_connections_per_client"))
            .unwrap_or(usize::MAX)
            .max(1);
    opts.drain_attempts = u32::try_from(config.number("stage_server.drain_attempts"))
        .unwrap_or(u32::MAX)
        .max(1);
    // Milliseconds; at least 0.1 s, and a Hello gets at most 10 s.
    opts.frame_timeout =
        Duration::from_millis(config.number("stage_server.frame_timeout").max(100));
    opts.hello_timeout = opts.frame_timeout.min(Duration::from_secs(10));
    opts.recheck_every =
        Duration::from_millis(config.number("stage_server.recheck_every").max(100));
    opts.tls = server_tls(config)?;
    opts.verbose = verbose;
    let with_tls = if opts.tls.is_some() { " over TLS" } else { "" };
    let server = Server::bind(opts).map_err(|e| Failure::new(e.to_string()))?;
    let status = server.status();
    crate::observe::serve_metrics(
        config,
        "stage_server.metrics",
        "cascade stage-server",
        server.metrics_source(),
    )?;
    cascade_observe::info!(
        "cascade stage-server: listening on {}{with_tls} (pid {}), arenas in {} ({}), draining to {}; recovered: {}",
        server.local_addr(),
        std::process::id(),
        status.dir,
        server.arena_io(),
        status.drain_to,
        pending_text(&status),
    );
    let stopper = server.stopper();
    std::thread::spawn(move || {
        wait_for_signal(&signals);
        stopper.stop();
    });
    server.run().map_err(|e| Failure::new(e.to_string()))?;
    cascade_observe::info!("cascade stage-server: stopped");
    Ok(ExitCode::SUCCESS)
}

fn pending_text(s: &cascade_staging::ServerStatus) -> String {
    format!(
        "{} file(s) ({}) and {} checkpoint(s) waiting to drain",
        s.pending_files,
        format_size(s.pending_bytes),
        s.pending_checkpoints
    )
}

/// `cascade stage-server status [HOST:PORT]`.
pub fn status(config: &Config, server: Option<&str>, json: bool) -> Result<ExitCode, Failure> {
    let listen = config.text("stage_server.listen");
    let first = config
        .text("staging.servers")
        .split(',')
        .next()
        .unwrap_or("");
    let addr = server
        .or(Some(listen).filter(|l| !l.is_empty()))
        .or(Some(first).filter(|f| !f.is_empty()))
        .ok_or_else(|| Failure::new("which server? give HOST:PORT"))?;
    // A job's credential opens only the job's namespace (the status is the same in any).
    let mut opts = ClientOptions::with(client_credential(config)?);
    opts.namespace = config.staging_namespace();
    opts.tls = client_tls(config)?;
    let mut conn = Connection::connect(addr, &opts).map_err(|e| Failure::new(e.to_string()))?;
    let s = conn.status().map_err(|e| Failure::new(e.to_string()))?;
    conn.goodbye();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&s).map_err(|e| Failure::new(e.to_string()))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let u = &s.usage;
    println!(
        "staging server {} (pid {}, up {:.0} s)",
        s.server, s.pid, s.uptime_s
    );
    println!(
        "  arenas     {} ({} files) in {}",
        format_size(u.arena_bytes),
        u.arena_files,
        s.dir
    );
    match u.capacity {
        Some(c) => println!(
            "  capacity   {} ({:.0}% used)",
            format_size(c),
            100.0 * u.arena_bytes as f64 / c.max(1) as f64
        ),
        None => println!("  capacity   the file system's"),
    }
    println!(
        "  clients    {} connected, {} refused, {} busy, {} timed out",
        s.clients, s.refused_clients, s.busy_refusals, s.timed_out_clients
    );
    println!(
        "  absorbed   {} file(s), {}",
        s.absorbed_files,
        format_size(s.absorbed_bytes)
    );
    println!(
        "  drained    {} file(s), {} to {}; {} checkpoint(s) completed",
        s.drained_files,
        format_size(s.drained_bytes),
        s.drain_to,
        s.markers
    );
    println!("  pending    {}", pending_text(&s));
    if s.superseded_files > 0 {
        println!(
            "  superseded {} older version(s) not drained: the durable store had newer ones",
            s.superseded_files
        );
    }
    if s.drain_failures > 0 {
        println!("  failures   {} drain attempt(s) failed", s.drain_failures);
    }
    if s.drain_failed > 0 {
        println!(
            "  stuck      {} file(s) failed every drain attempt: kept staged, retried every 5 minutes",
            s.drain_failed
        );
    }
    if s.log_suppressed > 0 {
        println!(
            "  log        {} line(s) suppressed as repeats",
            s.log_suppressed
        );
    }
    if let Some(e) = &s.last_error {
        println!("  last error {e}");
    }
    Ok(ExitCode::SUCCESS)
}
