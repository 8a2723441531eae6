//! TLS between agents and staging servers, end to end with the real `cascade` binary
//! (docs/staging.md, "TLS"): `cascade stage-server --tls-cert --tls-key`, an agent and
//! `cascade stage-server status` given `--staging-tls-ca` / `CASCADE_STAGING_TLS_CA`, and
//! the one-line errors of a client without the CA, with the wrong CA, and of half a server
//! setting. Certificates are made by rcgen (the test kit's [`TestPki`]).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use cascade_testkit::*;

const SECRET: &str = "tls-tests-shared-secret";
const WAIT: Duration = Duration::from_secs(90);

fn s(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn an_agent_stages_a_checkpoint_over_tls_and_status_needs_the_ca() {
    let (_serial, _started) = begin();
    let env = Env::new("stage-tls", 64 << 20);
    let pki = TestPki::generate(env.tmp.path());
    let arenas = env.tmp.path().join("arenas");
    let durable = env.tmp.path().join("durable");
    std::fs::create_dir_all(&arenas).expect("arena dir");
    std::fs::create_dir_all(&durable).expect("durable dir");
    let server = StageServer::start_tls(&env, &arenas, s(&durable), SECRET, &pki, &[]);
    assert!(
        server.start_line().contains(" over TLS "),
        "{}",
        server.start_line()
    );

    // `stage-server status` with the CA (as a flag), without it, and trusting another CA.
    let secret = [("CASCADE_STAGING_SECRET", SECRET)];
    let status = |extra: &[&str]| {
        let mut args = vec!["stage-server", "status", &server.addr];
        args.extend_from_slice(extra);
        env.cascade(&args, &secret)
    };
    let out = status(&["--staging-tls-ca", s(&pki.ca)]);
    assert!(out.ok() && out.stdout.contains("staging server "), "{out}");
    let out = status(&[]);
    assert!(!out.ok(), "{out}");
    assert_eq!(out.err_lines().len(), 1, "{out}");
    assert!(out.stderr.contains("requires TLS"), "{out}");
    let out = status(&["--staging-tls-ca", s(&pki.other_ca)]);
    assert!(!out.ok(), "{out}");
    assert_eq!(out.err_lines().len(), 1, "{out}");
    assert!(
        out.stderr
            .contains("TLS handshake failed: invalid peer certificate: UnknownIssuer"),
        "{out}"
    );
    let out = status(&["--staging-tls-ca", "/nonexistent/ca.pem"]);
    assert!(!out.ok(), "{out}");
    assert_eq!(out.err_lines().len(), 1, "{out}");
    assert!(out.stderr.contains("/nonexistent/ca.pem"), "{out}");

    // An agent given the CA in the environment stages a checkpoint, which drains.
    let files: Vec<Expected> = (0..3)
        .map(|i| {
            expected(
                &format!("part{i}.bin"),
                random((3 << 20) + i * 11, i as u64),
            )
        })
        .collect();
    env.store().create_dir_all("/ck1", 0o755).expect("mkdir");
    for f in &files {
        env.write(&format!("/ck1/{}", f.rel), &f.data);
    }
    env.cascade_ok(&["commit", "/ck1"], &[]);
    let agent = env.agent(
        s(&durable),
        &[
            ("CASCADE_STAGING", &server.addr),
            ("CASCADE_STAGING_SECRET", SECRET),
            ("CASCADE_STAGING_TLS_CA", s(&pki.ca)),
        ],
    );
    let out = env.cascade(
        &[
            "wait",
            "/ck1",
            "--level",
            "durable",
            "--timeout",
            &WAIT.as_secs().to_string(),
        ],
        &[],
    );
    assert!(
        out.ok(),
        "{out}\nagent:\n{}\nserver:\n{}",
        agent.log(),
        server.log()
    );
    let staged = agent
        .lines()
        .iter()
        .filter(|l| l.starts_with("cascade agent: staged ") && l.ends_with(&server.addr))
        .count();
    assert_eq!(staged, files.len(), "agent:\n{}", agent.log());
    let status = server.status();
    assert_eq!(status.absorbed_files, files.len() as u64, "{status:?}");
    let refs: Vec<&Expected> = files.iter().collect();
    assert_durable_checkpoint(&durable_at(&durable), "ck1", &refs);
}

#[test]
fn half_a_tls_setting_and_a_readable_key_are_one_line_each() {
    let env = Env::without_store("stage-tls-config");
    let pki = TestPki::generate(env.tmp.path());
    let arenas = env.tmp.path().join("arenas");
    std::fs::create_dir_all(&arenas).expect("arena dir");
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "stage-server",
            "--listen",
            "127.0.0.1:0",
            "--dir",
            s(&arenas),
            "--drain-to",
            s(&arenas),
        ];
        args.extend_from_slice(extra);
        env.cascade(&args, &[("CASCADE_STAGING_SECRET", SECRET)])
    };
    let out = serve(&["--tls-cert", s(&pki.cert)]);
    assert!(!out.ok(), "{out}");
    assert_eq!(out.err_lines().len(), 1, "{out}");
    assert!(out.stderr.contains("both or neither"), "{out}");

    // A key file that is not a key: one line naming it.
    let not_a_key = env.tmp.path().join("not-a-key.pem");
    std::fs::copy(&pki.cert, &not_a_key).expect("copy");
    std::fs::set_permissions(&not_a_key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = serve(&["--tls-cert", s(&pki.cert), "--tls-key", s(&not_a_key)]);
    assert!(!out.ok(), "{out}");
    assert_eq!(out.err_lines().len(), 1, "{out}");
    assert!(
        out.stderr.contains(&format!(
            "TLS key file {}: no PRIVATE KEY block",
            s(&not_a_key)
        )),
        "{out}"
    );

    // `cascade config` warns about a key others can read, once.
    std::fs::set_permissions(&pki.key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = env.cascade(
        &["config"],
        &[
            ("CASCADE_STAGE_TLS_CERT", s(&pki.cert)),
            ("CASCADE_STAGE_TLS_KEY", s(&pki.key)),
        ],
    );
    assert!(out.ok(), "{out}");
    assert_eq!(out.err_lines().len(), 1, "{out}");
    assert!(
        out.stderr.contains("stage_server.tls_key") && out.stderr.contains("readable by others"),
        "{out}"
    );
}
