//! Logs and metrics of `cascade agent` and `cascade stage-server` (docs/operations.md), with
//! the real binaries and a real Prometheus (the Debian package `prometheus`, which
//! scripts/test.sh installs): log lines with RFC 3339 timestamps and levels, as text and as
//! JSON, repeats of a failing upload collapsed; both `--metrics` endpoints scraped by
//! Prometheus and a drained checkpoint seen in its query API; the example alert rules
//! accepted by promtool.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cascade_testkit::*;

const SECRET: &str = "observe-tests-shared-secret";
const WAIT: Duration = Duration::from_secs(60);
const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The Debian package's binary, or a failure saying how to get it (never a skip).
fn prometheus_tool(path: &str) -> &str {
    assert!(
        Path::new(path).exists(),
        "{path} is missing: install the Debian package prometheus (apt-get install -y \
         prometheus; scripts/test.sh does)"
    );
    path
}

/// `2026-01-02T03:04:05.678901Z`: RFC 3339 in UTC.
fn is_rfc3339(t: &str) -> bool {
    let b = t.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.into_iter().all(|i| b[i].is_ascii_digit());
    b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && t.ends_with('Z')
        && (b.len() == 20 || (b[19] == b'.' && digits(20..b.len() - 1)))
}

const LEVELS: [&str; 5] = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"];

/// An agent on `env`'s store draining to `url` (given in the environment, as a job would),
/// `envs` added; ready once it printed its start line (in whatever format).
fn agent_on(env: &Env, url: &str, envs: &[(&str, &str)]) -> Daemon {
    let mut cmd = env.cli();
    cmd.arg("agent").env("CASCADE_DURABLE", url);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut d = Daemon::spawn(cmd, "cascade agent");
    d.wait_line("its start line", WAIT, |l| {
        l.contains("cascade agent: store ")
    });
    d
}

/// Failed upload attempts the agent of `env` counted.
fn failures(env: &Env) -> u64 {
    cascade_agent::status(&env.name).map_or(0, |s| s.failures)
}

#[test]
fn agent_logs_have_timestamps_levels_json_and_collapse_repeats() {
    let (_serial, _started) = begin();
    // Two agents at once, one per format, draining to an S3 server that then goes away:
    // each retries the upload of one file against its dead port (0.5 s, 1 s, 2 s, ... apart).
    let mut s3 = Versitygw::start();
    s3.create_bucket("logs");
    let url = s3.url("logs");
    let text_env = Env::new("log-text", 16 << 20);
    let json_env = Env::new("log-json", 16 << 20);
    let mut text = agent_on(&text_env, &url, &[("CASCADE_LOG_REPEATS", "1")]);
    let mut json = agent_on(&json_env, &url, &[("CASCADE_LOG_FORMAT", "json")]);
    s3.stop();
    text_env.write("/f.bin", &random(64 << 10, 1));
    json_env.write("/f.bin", &random(64 << 10, 2));
    wait_for("4 failed uploads by the text agent", WAIT, || {
        failures(&text_env) >= 4
    });
    wait_for("2 failed uploads by the JSON agent", WAIT, || {
        failures(&json_env) >= 2
    });
    stop_agent(&mut text);
    stop_agent(&mut json);

    // Text: every line is "TIMESTAMP LEVEL message".
    let lines = text.raw_lines();
    for l in &lines {
        let mut words = l.split_whitespace();
        let (stamp, level) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        assert!(is_rfc3339(stamp), "no RFC 3339 timestamp in {l:?}");
        assert!(LEVELS.contains(&level), "no level in {l:?}");
    }
    // One failure a kind of line per window (log.repeats 1): the first attempt's line, then
    // at the end one line for the rest, with their number.
    let failed: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("cascade agent: upload of /f.bin failed"))
        .collect();
    assert_eq!(failed.len(), 2, "{}", lines.join("\n"));
    assert!(
        failed[0].contains(" WARN ") && failed[0].contains("(attempt 1)"),
        "{failed:?}"
    );
    let repeated: u64 = failed[1]
        .rsplit_once("(repeated ")
        .and_then(|(_, r)| r.strip_suffix(" times)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no repeat count in {:?}", failed[1]));
    assert!(repeated >= 3, "{failed:?}");

    // JSON: every line an object with timestamp, level and message.
    let lines = json.raw_lines();
    let mut warnings = 0;
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
        let field = |k: &str| v[k].as_str().unwrap_or_else(|| panic!("no {k} in {l}"));
        assert!(is_rfc3339(field("timestamp")), "{l}");
        assert!(LEVELS.contains(&field("level")), "{l}");
        if field("message").starts_with("cascade agent: upload of /f.bin failed") {
            assert_eq!(field("level"), "WARN", "{l}");
            warnings += 1;
        }
    }
    assert!(warnings >= 2, "{}", lines.join("\n"));
}

/// `GET target` from 127.0.0.1:`port` with HTTP/1.0 (the server closes the connection);
/// the body if the status is 200.
fn http_get(port: u16, target: &str) -> Option<String> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(c, "GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut reply = String::new();
    c.read_to_string(&mut reply).ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then_some(())?;
    head.split_whitespace()
        .nth(1)
        .filter(|code| *code == "200")?;
    Some(body.to_string())
}

/// The address in a "...: metrics on http://ADDR/metrics" line.
fn metrics_port(d: &mut Daemon) -> u16 {
    let line = d.wait_line("its metrics line", WAIT, |l| {
        l.contains("metrics on http://")
    });
    line.rsplit_once("http://")
        .and_then(|(_, r)| r.strip_suffix("/metrics"))
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"))
}

fn percent_encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of `query` (an instant vector of one series) in Prometheus on `port`.
fn query(port: u16, query: &str) -> Option<f64> {
    let body = http_get(
        port,
        &format!("/api/v1/query?query={}", percent_encode(query)),
    )?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// Prometheus killed on drop.
struct Prometheus(std::process::Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn prometheus_scrapes_the_agent_and_the_staging_server() {
    let prometheus = prometheus_tool(PROMETHEUS);
    let (_serial, _started) = begin();
    let env = Env::new("metrics", 64 << 20);
    let arenas = env.tmp.path().join("arenas");
    let durable = env.tmp.path().join("durable");
    std::fs::create_dir_all(&arenas).expect("arena dir");
    std::fs::create_dir_all(&durable).expect("durable dir");
    let mut server = StageServer::start(
        &env,
        &arenas,
        s(&durable),
        SECRET,
        &["--metrics", "127.0.0.1:0"],
    );
    let stage_port = metrics_port(&mut server.daemon);
    let mut agent = env.agent(
        s(&durable),
        &[
            ("CASCADE_STAGING", &server.addr),
            ("CASCADE_STAGING_SECRET", SECRET),
            ("CASCADE_AGENT_METRICS", "127.0.0.1:0"),
        ],
    );
    let agent_port = metrics_port(&mut agent);

    // Prometheus scraping both every second.
    let tmp = env.tmp.path();
    let config = tmp.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
             - job_name: cascade-agent\n    static_configs:\n      \
             - targets: ['127.0.0.1:{agent_port}']\n  \
             - job_name: cascade-stage\n    static_configs:\n      \
             - targets: ['127.0.0.1:{stage_port}']\n"
        ),
    )
    .expect("prometheus.yml");
    let port = free_port();
    let log = std::fs::File::create(tmp.join("prometheus.log")).expect("log file");
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", s(&config)))
        .arg(format!("--storage.tsdb.path={}", s(&tmp.join("tsdb"))))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{prometheus}: {e}"));
    let _prometheus = Prometheus(child);
    let prometheus_log = || std::fs::read_to_string(tmp.join("prometheus.log")).unwrap_or_default();

    let up = poll(WAIT, || {
        let body = http_get(port, "/api/v1/targets")?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let targets = v["data"]["activeTargets"].as_array()?;
        (targets.len() == 2 && targets.iter().all(|t| t["health"] == "up")).then_some(())
    });
    assert!(
        up.is_some(),
        "the targets did not come up: {:?}\n{}",
        http_get(port, "/api/v1/targets"),
        prometheus_log()
    );

    // A checkpoint through the staging server to the durable store.
    let data = random(3 << 20, 7);
    env.store().create_dir_all("/ck", 0o755).expect("mkdir");
    env.write("/ck/a.bin", &data);
    env.cascade_ok(&["commit", "/ck"], &[]);
    env.cascade_ok(
        &["wait", "/ck", "--level", "durable", "--timeout", "60"],
        &[],
    );
    let len = data.len() as f64;
    for (q, at_least) in [
        ("cascade_agent_drained_bytes_total{level=\"staged\"}", len),
        ("cascade_stage_absorbed_bytes_total", len),
        ("cascade_stage_drained_bytes_total", len),
        ("cascade_stage_checkpoints_complete_total", 1.0),
    ] {
        let seen = poll(WAIT, || query(port, q).filter(|v| *v >= at_least));
        assert!(
            seen.is_some(),
            "{q} did not reach {at_least}: {:?}\nagent metrics:\n{:?}\nserver metrics:\n{:?}",
            query(port, q),
            http_get(agent_port, "/metrics"),
            http_get(stage_port, "/metrics"),
        );
    }
    stop_agent(&mut agent);
}

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/prometheus")
}

#[test]
fn promtool_accepts_the_example_alert_rules_and_scrape_config() {
    let promtool = prometheus_tool(PROMTOOL);
    for args in [
        ["check", "rules", "alerts.yml"],
        ["check", "config", "prometheus.yml"],
    ] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(docs())
            .output()
            .unwrap_or_else(|e| panic!("{promtool}: {e}"));
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
