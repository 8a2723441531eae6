//! The kit's own behaviour where a test relies on it: readiness from whole lines only,
//! deadlines that end waits and commands.

use std::process::Command;
use std::time::{Duration, Instant};

use cascade_testkit::{output_within, poll, wait_output, wait_until, Daemon};

fn sh(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]);
    cmd
}

#[test]
fn a_daemon_line_counts_only_once_it_is_whole() {
    // The second line is never finished: it must not be taken as a line (the way a half
    // written start line once gave an address of "127.").
    let mut d = Daemon::spawn(
        sh("printf 'listening on 127.0.0.1:5\\n' >&2; printf 'listening on 127.' >&2"),
        "printf",
    );
    let line = d.wait_line("the first line", Duration::from_secs(30), |l| {
        l.starts_with("listening on ")
    });
    assert_eq!(line, "listening on 127.0.0.1:5");
    assert!(d.wait(Duration::from_secs(30)).success());
    assert_eq!(d.lines(), vec!["listening on 127.0.0.1:5".to_string()]);
    assert!(d.log().ends_with("\nlistening on 127."), "{:?}", d.log());
}

#[test]
#[should_panic(expected = "exited")]
fn a_daemon_that_exits_without_its_line_fails_the_wait() {
    let mut d = Daemon::spawn(sh("printf 'half' >&2"), "printf");
    d.wait_line("a whole line", Duration::from_secs(30), |l| {
        l.contains("half")
    });
}

#[test]
fn waits_end_at_their_deadline() {
    let start = Instant::now();
    assert!(!wait_until(Duration::from_millis(50), || false));
    assert!(start.elapsed() >= Duration::from_millis(50));
    let mut n = 0;
    assert_eq!(
        poll(Duration::from_secs(30), || {
            n += 1;
            (n == 3).then_some(n)
        }),
        Some(3)
    );
}

#[test]
fn a_command_past_its_deadline_is_killed() {
    let out = output_within(sh("echo out; echo err >&2"), Duration::from_secs(30));
    assert!(out.status.success());
    assert_eq!(
        (&out.stdout[..], &out.stderr[..]),
        (&b"out\n"[..], &b"err\n"[..])
    );

    let child = sh("exec sleep 60")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sleep");
    let start = Instant::now();
    let err = wait_output(child, Duration::from_millis(200)).expect_err("killed");
    assert!(err.contains("did not finish"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));
}
