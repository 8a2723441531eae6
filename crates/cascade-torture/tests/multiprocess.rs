//! (c) Several processes on one store at once: each writes its own files and its part of a
//! shared file, and the others verify the data as soon as the writer's call has returned
//! (replies through pipes sequence the steps, no sleeps). Plus torture writers running to
//! completion side by side, in their own trees and in one shared tree.

mod common;

use std::process::Stdio;

use common::*;

const PROCS: usize = 3;
const PART: u64 = 300_000; // not chunk aligned: neighbours share chunks of the shared file

#[test]
fn writes_are_visible_to_other_processes_as_soon_as_write_returns() {
    let ts = TestStore::create("mp", Params::default());
    let mut servers: Vec<Server> = (0..PROCS).map(|_| Server::spawn(&ts.name)).collect();
    servers[0].ok("mkdirs /mp/own");

    for round in 0..4u64 {
        // Everyone writes at once: its own file, and its slice of the shared file.
        for (i, s) in servers.iter_mut().enumerate() {
            let i = i as u64;
            let seed = 1000 + i;
            s.send(&format!(
                "write /mp/own/p{i} {seed} {} {PART}",
                round * PART
            ));
        }
        for s in servers.iter_mut() {
            assert_eq!(s.reply(), format!("ok {PART}"));
        }
        for (i, s) in servers.iter_mut().enumerate() {
            let off = (round * PROCS as u64 + i as u64) * PART;
            s.send(&format!("write /mp/shared 4242 {off} {PART}"));
        }
        for s in servers.iter_mut() {
            assert_eq!(s.reply(), format!("ok {PART}"));
        }
        // Each process checks the data of the next one, through its own handle.
        for (i, s) in servers.iter_mut().enumerate() {
            let j = (i + 1) % PROCS;
            let seed = 1000 + j as u64;
            assert_eq!(
                s.call(&format!(
                    "check /mp/own/p{j} {seed} 0 {}",
                    (round + 1) * PART
                )),
                "ok"
            );
            let off = (round * PROCS as u64 + j as u64) * PART;
            assert_eq!(s.call(&format!("check /mp/shared 4242 {off} {PART}")), "ok");
        }
    }
    let total = 4 * PROCS as u64 * PART;
    for s in servers.iter_mut() {
        assert_eq!(s.call("size /mp/shared"), format!("ok {total}"));
        assert_eq!(s.call(&format!("check /mp/shared 4242 0 {total}")), "ok");
    }

    // A write by one process, then at once a read by another, many times over.
    for k in 0..50u64 {
        let (w, r) = ((k % 3) as usize, ((k + 1) % 3) as usize);
        let off = k * 7919;
        assert_eq!(
            servers[w].call(&format!("write /mp/pingpong {k} {off} 5000")),
            "ok 5000"
        );
        assert_eq!(
            servers[r].call(&format!("check /mp/pingpong {k} {off} 5000")),
            "ok",
            "step {k}: process {r} does not see what process {w} just wrote"
        );
    }

    for s in servers.iter_mut() {
        s.exit();
    }
    // Everyone detached cleanly: nothing is left over, not even a warning.
    let report = ts.store.fsck(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
    assert_accounting(&ts.store, &report);
}

#[test]
fn torture_writers_run_to_completion_side_by_side() {
    let ts = TestStore::create(
        "mptort",
        Params {
            capacity: 32 << 20,
            chunk_size: 16384,
            max_files: 1024,
            spill: None,
        },
    );
    let mut kids = Children::default();
    let roots = ["/a", "/b", "/s", "/s"];
    for (i, root) in roots.iter().enumerate() {
        let mut args = vec![
            "run".to_string(),
            "--root".into(),
            root.to_string(),
            "--ops".into(),
            "800".into(),
            "--seed".into(),
            (7 + i).to_string(),
            "--max-file-size".into(),
            "200000".into(),
        ];
        if *root == "/s" {
            args.push("--shared".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kids.0.push(
            torture(&ts.name, &args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    for child in std::mem::take(&mut kids.0) {
        let out = wait_output(child, CHILD_TIMEOUT).unwrap();
        assert!(out.status.success(), "{}", describe(&out));
        let stats = String::from_utf8_lossy(&out.stdout);
        assert!(stats.contains("ops=800"), "{stats}");
    }
    let report = ts.store.fsck(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
    assert_accounting(&ts.store, &report);
    let (_, summary) = check_after_crash(&ts.store, 200_000);
    assert!(
        summary.files > 0 && summary.written_bytes > 0,
        "{summary:?}"
    );
}
