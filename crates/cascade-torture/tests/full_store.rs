//! (e) A full store: the writer gets ENOSPC, its file is intact up to the last successful
//! write, other files are untouched, `status` says why, and deleting files makes the space
//! usable again, chunk for chunk. Also a full file table.

mod common;

use cascade_store::{OpenOptions, Store};
use common::*;

const CS: u64 = 4096;

fn used_chunks(store: &Store) -> u64 {
    let st = store.status();
    (st.memory_used + st.spill_used) / st.chunk_size
}

fn fill_and_reuse(p: Params) {
    let total_chunks = (p.capacity + p.spill.unwrap_or(0)) / CS;
    let guard = create_detached("full", p);
    let store = Store::attach(&guard.0).unwrap();

    // Another file, written and closed by a process that then exits.
    let mut a = Server::spawn(&guard.0);
    assert_eq!(a.call("write /other 9 0 200000"), "ok 200000");
    a.exit();
    let other_chunks = 200_000u64.div_ceil(CS);
    assert_eq!(used_chunks(&store), other_chunks);

    // A writer fills the store: a short count, then ENOSPC with nothing written.
    let mut b = Server::spawn(&guard.0);
    let reply = b.call("write /big 5 0 100000000");
    let fields: Vec<&str> = reply.split_whitespace().collect();
    assert_eq!(fields[..2], ["err", &libc::ENOSPC.to_string()], "{reply}");
    let written: u64 = fields[2].parse().unwrap();
    assert_eq!(
        written,
        (total_chunks - other_chunks) * CS,
        "the writer did not get every free chunk: {reply}"
    );
    let again = b.call(&format!("write /big 5 {written} 10"));
    assert!(
        again.starts_with(&format!("err {} 0", libc::ENOSPC)),
        "{again}"
    );

    // Intact up to the last successful write, nothing more; the other file untouched.
    assert_eq!(b.call("size /big"), format!("ok {written}"));
    let mut c = Server::spawn(&guard.0);
    assert_eq!(c.call(&format!("check /big 5 0 {written}")), "ok");
    assert_eq!(c.call("check /other 9 0 200000"), "ok");
    assert_eq!(c.call("size /other"), "ok 200000");

    // Why, and who.
    let st = store.status();
    let rec = st.last_enospc.clone().expect("status records the ENOSPC");
    assert!(!rec.reason.is_empty(), "{rec:?}");
    assert_eq!(rec.pid, b.pid, "{rec:?}");
    assert_eq!(st.memory_used, st.memory_capacity, "{st:?}");
    assert_eq!(st.spill_used, st.spill_capacity, "{st:?}");
    eprintln!("ENOSPC reason: {}", rec.reason);

    // Free the space: all of it can be written again, by another process.
    b.ok("close /big");
    b.ok("unlink /big");
    b.exit();
    assert_eq!(used_chunks(&store), other_chunks);
    let reply = c.call("write /big2 6 0 100000000");
    assert!(
        reply.starts_with(&format!("err {} {written} ", libc::ENOSPC)),
        "the freed space is not reusable in full: {reply}"
    );
    assert_eq!(c.call(&format!("check /big2 6 0 {written}")), "ok");
    assert_eq!(c.call("check /other 9 0 200000"), "ok");

    // Shrinking frees at once too.
    c.ok("truncate /big2 40960");
    assert_eq!(used_chunks(&store), other_chunks + 10);
    assert_eq!(c.call("write /big3 7 0 81920"), "ok 81920");
    assert_eq!(c.call("check /big2 6 0 40960"), "ok");
    c.exit();

    let report = store.fsck(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
    assert_accounting(&store, &report);
}

#[test]
fn full_memory_store() {
    fill_and_reuse(Params {
        capacity: 1 << 20,
        chunk_size: CS,
        max_files: 64,
        spill: None,
    });
}

#[test]
fn full_memory_and_spill() {
    fill_and_reuse(Params {
        capacity: 512 << 10,
        chunk_size: CS,
        max_files: 64,
        spill: Some(512 << 10),
    });
}

#[test]
fn full_file_table() {
    let ts = TestStore::create(
        "fulltable",
        Params {
            capacity: 1 << 20,
            chunk_size: CS,
            max_files: 16,
            spill: None,
        },
    );
    let s = &ts.store;
    s.mkdir("/d", 0o755).unwrap();
    let opts = OpenOptions::new().write(true).create_new(true);
    // The root and /d take two entries.
    for i in 0..14 {
        s.open(&format!("/d/f{i}"), &opts).unwrap();
    }
    let err = s.open("/d/f14", &opts).err().expect("a 17th entry");
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    let err = s.mkdir("/d2", 0o755).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(s.stat("/d/f14").is_err() && s.stat("/d2").is_err());
    assert_eq!(s.read_dir("/d").unwrap().len(), 14);
    // Writing to existing files still works; removing one makes room for one.
    s.open("/d/f0", &OpenOptions::new().write(true))
        .unwrap()
        .write_all_at(b"still fine", 0)
        .unwrap();
    s.unlink("/d/f1").unwrap();
    s.open("/d/f14", &opts).unwrap();
    assert_eq!(s.open("/d/f15", &opts).err().unwrap().errno(), libc::ENOSPC);
    let report = s.fsck(false).unwrap();
    assert!(
        report.is_clean() && report.warnings.is_empty(),
        "{report:?}"
    );
    assert_eq!(report.files + report.dirs, 16);
}
