//! Secrets (docs/security.md, "Secrets"): the staging secret and S3 secret keys never show in
//! an error or a warning, can be given without the command line or the environment (a secret
//! file, a credentials file), give a one-line warning where they are exposed (a flag, a config
//! file others can read), and are not passed on to the application under `cascade run`. Every
//! test runs the real `cascade` binary; S3 is a real versitygw, the staging server a real
//! `cascade stage-server`.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cascade_testkit::versitygw::{ACCESS, SECRET};
use cascade_testkit::{cascade_bin, StageServer, Versitygw};
use support::{s, Sandbox};

const TOPSECRET: &str = "T0PSECRET-do-not-print";

/// `cascade stage-server status` of a server that is not there (nothing listens on port 1).
const STATUS_NOWHERE: [&str; 3] = ["stage-server", "status", "127.0.0.1:1"];

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write_private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn a_bad_durable_url_is_reported_without_its_secret_key() {
    let sb = Sandbox::new("sec-url");
    let bad_urls = [
        format!("s3://b?endpoint=ftp://h&access_key=a&secret_key={TOPSECRET}"),
        format!("s3://b?access_key=a&secret_key={TOPSECRET}&bogus=1"),
        format!("s3://b?access_key=a&{TOPSECRET}"),
    ];
    for url in &bad_urls {
        // As a flag, in the environment, and as a command's own argument.
        let err = sb.fails(&["stage-server", "status", "--drain-to", url], 1);
        assert!(!err.contains(TOPSECRET), "{err}");
        assert!(err.contains("--durable="), "{err}");

        let out = sb
            .command(&["config"])
            .env("CASCADE_DURABLE", url)
            .output()
            .expect("run cascade");
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("CASCADE_DURABLE=") && !err.contains(TOPSECRET),
            "{err}"
        );

        let out = sb
            .command(&["prune", "ckpt.1", "--durable", url])
            .output()
            .expect("run cascade");
        let err = stderr_of(&out);
        assert!(!out.status.success(), "{err}");
        assert!(!err.contains(TOPSECRET), "{err}");
    }
    // The same in a config file.
    let config = sb.dir.path().join("bad.toml");
    write_private(
        &config,
        &format!("[durable]\nurl = \"{}\"\n", bad_urls[0]),
        0o600,
    );
    let out = sb
        .command(&["config"])
        .env("CASCADE_CONFIG", &config)
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains(TOPSECRET), "{err}");
}

#[test]
fn a_store_that_refuses_the_credentials_is_named_without_them() {
    let gw = Versitygw::start();
    gw.create_bucket("sec");
    let sb = Sandbox::new("sec-auth");
    let wrong = gw.url_with("sec", ACCESS, TOPSECRET);
    let out = sb
        .command(&["prune", "ckpt.1", "--durable", &wrong])
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("s3://sec"), "{err}");
    assert!(!err.contains(TOPSECRET), "{err}");
}

#[test]
fn a_secret_on_the_command_line_gives_one_warning_that_does_not_repeat_it() {
    let sb = Sandbox::new("sec-flag");
    // No server listens on port 1: the command fails after the warning.
    let status = STATUS_NOWHERE;
    let out = sb
        .command(&[&status[..], &["--staging-secret", TOPSECRET]].concat())
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
    let warning = err.lines().next().unwrap_or_default();
    assert!(
        warning.contains("warning: flag --staging-secret")
            && warning.contains("staging.secret_file"),
        "{err}"
    );
    assert!(!err.contains(TOPSECRET), "{err}");

    let url = format!("s3://b?endpoint=http://127.0.0.1:1&access_key=a&secret_key={TOPSECRET}");
    let out = sb
        .command(&[&status[..], &["--drain-to", &url]].concat())
        .env("CASCADE_STAGING_SECRET", "x")
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(err.contains("warning: flag --durable"), "{err}");
    assert!(!err.contains(TOPSECRET), "{err}");

    // The same secret from the environment: no warning.
    let out = sb
        .command(&status)
        .env("CASCADE_STAGING_SECRET", TOPSECRET)
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn a_config_file_with_a_secret_that_others_can_read_gives_one_warning() {
    let sb = Sandbox::new("sec-file");
    let config = sb.dir.path().join("secret.toml");
    write_private(
        &config,
        &format!("[staging]\nsecret = \"{TOPSECRET}\"\n"),
        0o644,
    );
    let run = || {
        sb.command(&["config"])
            .env("CASCADE_CONFIG", &config)
            .output()
            .expect("run cascade")
    };
    let out = run();
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("readable by others") && err.contains("staging.secret"),
        "{err}"
    );
    assert!(!err.contains(TOPSECRET), "{err}");

    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = run();
    assert!(out.status.success());
    assert_eq!(stderr_of(&out), "");

    // A readable config file without secrets is fine.
    write_private(&config, "[store]\nchunk_size = \"1MiB\"\n", 0o644);
    let out = run();
    assert!(out.status.success());
    assert_eq!(stderr_of(&out), "");
}

#[test]
fn the_staging_secret_can_come_from_a_file() {
    let env = cascade_testkit::Env::new("sec-stage", 16 << 20);
    let arenas = env.tmp.path().join("arenas");
    let drain = env.tmp.path().join("durable");
    std::fs::create_dir_all(&arenas).expect("arena dir");
    std::fs::create_dir_all(&drain).expect("durable dir");
    let server = StageServer::start(&env, &arenas, s(&drain), TOPSECRET, &[]);

    let sb = Sandbox::new("sec-stage-client");
    let right = sb.dir.path().join("right");
    let wrong = sb.dir.path().join("wrong");
    write_private(&right, &format!("{TOPSECRET}\n"), 0o600);
    write_private(&wrong, "not-it\n", 0o600);

    let out = sb
        .command(&["stage-server", "status", &server.addr])
        .env("CASCADE_STAGING_SECRET_FILE", &right)
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err, "");

    let out = sb
        .command(&[
            "stage-server",
            "status",
            &server.addr,
            "--staging-secret-file",
            s(&wrong),
        ])
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("secret"), "{err}");

    // `cascade config` says where it came from, not what it is.
    let out = sb
        .command(&["config"])
        .env("CASCADE_STAGING_SECRET_FILE", &right)
        .output()
        .expect("run cascade");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    let line = shown
        .lines()
        .find(|l| l.contains("staging.secret ") || l.starts_with("staging.secret="))
        .unwrap_or_default();
    assert!(!shown.contains(TOPSECRET), "{shown}");
    assert!(line.contains("***"), "{shown}");

    // A secret file others can read: one warning.
    std::fs::set_permissions(&right, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let out = sb
        .command(&["config"])
        .env("CASCADE_STAGING_SECRET_FILE", &right)
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("warning: staging.secret_file") && err.contains("readable by others"),
        "{err}"
    );
    assert!(!err.contains(TOPSECRET), "{err}");

    // Both the secret and its file: which one is meant is unclear.
    let out = sb
        .command(&["config"])
        .env("CASCADE_STAGING_SECRET_FILE", &right)
        .env("CASCADE_STAGING_SECRET", "x")
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("both given"), "{err}");
    // A missing file is one line naming it.
    let err = sb.fails(
        &[
            &STATUS_NOWHERE[..],
            &["--staging-secret-file", "/nonexistent/secret"],
        ]
        .concat(),
        1,
    );
    assert!(err.contains("/nonexistent/secret"), "{err}");
}

/// A job given only its staging credential (`cascade stage-server credential`, run where the
/// cluster secret is) reaches its own namespace on the servers and no other; the credential
/// never shows in an error.
#[test]
fn a_job_credential_opens_its_own_namespace_only() {
    let env = cascade_testkit::Env::new("sec-cred", 16 << 20);
    let arenas = env.tmp.path().join("arenas");
    let drain = env.tmp.path().join("durable");
    std::fs::create_dir_all(&arenas).expect("arena dir");
    std::fs::create_dir_all(&drain).expect("durable dir");
    let server = StageServer::start(&env, &arenas, s(&drain), TOPSECRET, &[]);
    let sb = Sandbox::new("sec-cred-client");
    let secret_file = sb.dir.path().join("secret");
    write_private(&secret_file, TOPSECRET, 0o600);

    let out = sb
        .command(&["stage-server", "credential", "--namespace", "alice/job7"])
        .env("CASCADE_STAGING_SECRET_FILE", &secret_file)
        .output()
        .expect("run cascade");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let credential = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(credential.len(), 64, "{credential}");
    let credential_file = sb.dir.path().join("credential");
    write_private(&credential_file, &format!("{credential}\n"), 0o600);

    let status = |namespace: &str| {
        sb.command(&["stage-server", "status", &server.addr])
            .env("CASCADE_STAGING_CREDENTIAL_FILE", &credential_file)
            .env("CASCADE_STAGING_NAMESPACE", namespace)
            .output()
            .expect("run cascade")
    };
    let out = status("alice/job7");
    assert!(out.status.success(), "{}", stderr_of(&out));
    for other in ["alice/job8", "alice", ""] {
        let out = status(other);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{other:?}: {err}");
        assert!(err.contains("does not open"), "{other:?}: {err}");
        assert!(
            !err.contains(&credential) && !err.contains(TOPSECRET),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // Without the cluster secret no credential can be made; a malformed one is one line.
    let err = sb.fails(&["stage-server", "credential", "--namespace", "x"], 1);
    assert!(err.contains("no staging secret"), "{err}");
    let out = sb
        .command(&["stage-server", "status", &server.addr])
        .env("CASCADE_STAGING_CREDENTIAL", "0123")
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("64 hexadecimal digits"), "{err}");
}

#[test]
fn s3_credentials_can_come_from_a_credentials_file() {
    let gw = Versitygw::start();
    gw.create_bucket("creds");
    let sb = Sandbox::new("sec-creds");
    let url = format!("s3://creds?endpoint=http://127.0.0.1:{}", gw.port);
    let creds = sb.dir.path().join("credentials");
    write_private(
        &creds,
        &format!("[other]\naws_access_key_id = x\n[default]\naws_access_key_id = {ACCESS}\naws_secret_access_key = {SECRET}\n"),
        0o600,
    );
    sb.init_small("4MiB");
    let local = sb.dir.path().join("a");
    std::fs::write(&local, b"checkpoint data").expect("local file");
    sb.ok(&["mkdir", "/ckpt.1"]);
    sb.ok(&["put", s(&local), "/ckpt.1/a"]);
    let drain = |creds: &Path| {
        sb.command(&["drain", "/ckpt.1", "--to", &url])
            .env("CASCADE_S3_CREDENTIALS_FILE", creds)
            .output()
            .expect("run cascade")
    };
    let out = drain(&creds);
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("warning"), "{err}");
    assert!(gw.has("creds", "ckpt.1/.cascade-complete"));

    // A wrong secret in the file: refused, and not shown.
    write_private(
        &creds,
        &format!("aws_access_key_id = {ACCESS}\naws_secret_access_key = {TOPSECRET}\n"),
        0o600,
    );
    let out = drain(&creds);
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("access denied"), "{err}");
    assert!(!err.contains(TOPSECRET), "{err}");
}

/// `cascade run`'s child (a real shell) prints its own /proc/PID/environ: Cascade's secrets
/// are gone, what the application may need is still there.
#[test]
fn cascade_run_does_not_pass_its_secrets_to_the_application() {
    cascade_bin();
    let gw = Versitygw::start();
    gw.create_bucket("run");
    let sb = Sandbox::new("sec-run");
    let durable = gw.url_with("run", ACCESS, SECRET);
    let out = sb
        .command(&["run", "--", "sh", "-c", "tr '\\0' '\\n' < /proc/$$/environ"])
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CASCADE_CAPACITY", "16MiB")
        .env("CASCADE_SPILL_SIZE", "0")
        .env("CASCADE_PREFAULT", "off")
        .env("CASCADE_DURABLE", &durable)
        .env("CASCADE_STAGING_SECRET", TOPSECRET)
        .env("CASCADE_STAGING_CREDENTIAL", TOPSECRET)
        .env("CASCADE_S3_SECRET_ACCESS_KEY", TOPSECRET)
        .env(
            "CASCADE_STAGE_DRAIN_TO",
            format!("s3://x?endpoint=http://127.0.0.1:1&access_key=a&secret_key={TOPSECRET}"),
        )
        .env("CASCADE_S3_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_SECRET_ACCESS_KEY", "the-applications-own")
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    let environ = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = environ
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    assert!(!environ.contains(TOPSECRET), "{environ}");
    assert!(!environ.contains(SECRET), "{environ}");
    for gone in [
        "CASCADE_STAGING_SECRET",
        "CASCADE_STAGING_CREDENTIAL",
        "CASCADE_S3_SECRET_ACCESS_KEY",
        "CASCADE_DURABLE",
        "CASCADE_STAGE_DRAIN_TO",
    ] {
        assert!(!names.contains(&gone), "{gone} passed on: {environ}");
    }
    // Kept: what the library and the application need, and the AWS chain, which is the
    // application's as much as Cascade's; a file's name is no secret.
    for kept in [
        "CASCADE_STORE",
        "CASCADE_MOUNT",
        "LD_PRELOAD",
        "CASCADE_S3_CREDENTIALS_FILE",
    ] {
        assert!(names.contains(&kept), "{kept} missing: {environ}");
    }
    assert!(
        environ.contains("AWS_SECRET_ACCESS_KEY=the-applications-own"),
        "{environ}"
    );
    // A durable URL without a secret in it is passed on.
    let plain = sb.dir.path().join("durable");
    std::fs::create_dir_all(&plain).expect("durable dir");
    let out = sb
        .command(&["run", "--", "sh", "-c", "tr '\\0' '\\n' < /proc/$$/environ"])
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CASCADE_CAPACITY", "16MiB")
        .env("CASCADE_SPILL_SIZE", "0")
        .env("CASCADE_PREFAULT", "off")
        .env("CASCADE_DURABLE", &plain)
        .output()
        .expect("run cascade");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let environ = String::from_utf8_lossy(&out.stdout);
    assert!(
        environ.contains(&format!("CASCADE_DURABLE={}", plain.display())),
        "{environ}"
    );
}

/// The AWS chain (docs/security.md, "Secrets"): a named profile of ~/.aws/credentials, and
/// with no static credentials anywhere, the instance metadata service, here a real HTTP
/// server on 127.0.0.1 speaking IMDSv2 (a token, the role's name, its credentials).
#[test]
fn s3_credentials_follow_the_aws_chain() {
    let gw = Versitygw::start();
    gw.create_bucket("chain");
    let sb = Sandbox::new("sec-chain");
    let url = format!("s3://chain?endpoint=http://127.0.0.1:{}", gw.port);
    sb.init_small("4MiB");
    let local = sb.dir.path().join("a");
    std::fs::write(&local, b"checkpoint data").expect("local file");
    for ckpt in ["/ckpt.1", "/ckpt.2"] {
        sb.ok(&["mkdir", ckpt]);
        sb.ok(&["put", s(&local), &format!("{ckpt}/a")]);
    }

    // A profile of the shared credentials file in $HOME/.aws, chosen by AWS_PROFILE.
    std::fs::create_dir_all(sb.dir.path().join(".aws")).expect(".aws");
    write_private(
        &sb.dir.path().join(".aws/credentials"),
        &format!("[default]\naws_access_key_id = nobody\naws_secret_access_key = {TOPSECRET}\n[ci]\naws_access_key_id = {ACCESS}\naws_secret_access_key = {SECRET}\n"),
        0o600,
    );
    let out = sb
        .command(&["drain", "/ckpt.1", "--to", &url])
        .env("AWS_PROFILE", "ci")
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert!(gw.has("chain", "ckpt.1/.cascade-complete"));
    // The default profile holds wrong keys: refused, the source named, the secret not shown.
    let out = sb
        .command(&["drain", "/ckpt.1", "--to", &url])
        .output()
        .expect("run cascade");
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("access denied"), "{err}");
    assert!(err.contains("profile default of"), "{err}");
    assert!(!err.contains(TOPSECRET), "{err}");
    std::fs::remove_dir_all(sb.dir.path().join(".aws")).expect("rm .aws");

    // Nothing static: the instance metadata service gives temporary credentials.
    let imds = format!(
        r#"
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, body):
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_PUT(self):
        assert self.path == "/latest/api/token", self.path
        self.reply(b"imds-token")
    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != "imds-token":
            self.send_response(401); self.end_headers(); return
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base:
            self.reply(b"cascade-role")
        elif self.path == base + "cascade-role":
            self.reply(json.dumps({{"AccessKeyId": "{ACCESS}", "SecretAccessKey": "{SECRET}", "Token": "", "Expiration": "2099-01-01T00:00:00Z"}}).encode())
        else:
            self.send_response(404); self.end_headers()
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#
    );
    let mut server = std::process::Command::new("python3")
        .args(["-c", &imds])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the metadata server");
    let mut port = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().expect("stdout")),
        &mut port,
    )
    .expect("metadata server port");
    let out = sb
        .command(&["drain", "/ckpt.2", "--to", &url])
        .env(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            format!("http://127.0.0.1:{}", port.trim()),
        )
        .output()
        .expect("run cascade");
    let _ = server.kill();
    let _ = server.wait();
    let err = stderr_of(&out);
    assert!(out.status.success(), "{err}");
    assert!(gw.has("chain", "ckpt.2/.cascade-complete"));
}
