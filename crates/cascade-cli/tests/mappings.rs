//! What processes hold in the store, and what is freed when they are gone. A mapping of a
//! store file never shows another file's bytes (docs/interposition.md, "mmap"): its chunks
//! stay the file's while any process maps them, through truncation, unlink and the death of
//! the mapping process, and come back to the store when the last mapping is gone. A writer
//! killed with its file open, whose file was removed since, holds nothing once found dead.

use cascade_testkit::Env;

const MIB: usize = 1 << 20;

/// Python under `cascade run` on the test's store (8 MiB, no agent: a full store is ENOSPC
/// at once).
fn python(env: &Env, script: &str) -> cascade_testkit::Out {
    env.cascade(&["run", "--", "/usr/bin/python3", "-c", script], &[])
}

#[test]
fn a_mapping_keeps_its_bytes_through_truncate_and_unlink_until_unmapped() {
    let env = Env::new("map-truncate", 8 * MIB as u64);
    let script = format!(
        r#"
import mmap, os
os.makedirs('/cascade/m', exist_ok=True)
with open('/cascade/m/a', 'wb') as f:
    f.write(b'A' * {six})
f = open('/cascade/m/a', 'rb')
m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
f.close()
os.truncate('/cascade/m/a', 0)
os.unlink('/cascade/m/a')
full = 0
for i in range(3):
    try:
        with open('/cascade/m/b%d' % i, 'wb') as g:
            g.write(b'B' * {two})
    except OSError as e:
        full += 1
print('mapping', 'intact' if m[:] == b'A' * {six} else 'CHANGED', 'full', full)
m.close()
for i in range(3):
    with open('/cascade/m/b%d' % i, 'wb') as g:
        g.write(b'B' * {two})
print('after unmap: three files written')
"#,
        // Not a whole number of pages: munmap gets the file's length, the mapping is whole
        // pages (torch.load(mmap=True) maps a file of any size).
        six = 6 * MIB - 100,
        two = 2 * MIB
    );
    let out = python(&env, &script);
    assert!(out.ok(), "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    // The truncated and unlinked file's chunks were not handed to the new files: they ran
    // out of space instead, and the mapping still reads its own bytes.
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("mapping intact full ") && !l.ends_with("full 0")),
        "{out}"
    );
    assert_eq!(
        lines.get(1),
        Some(&"after unmap: three files written"),
        "{out}"
    );
    let r = env.store().fsck(false).expect("fsck");
    assert!(r.errors.is_empty(), "{r:?}");
}

#[test]
fn a_killed_mapper_releases_its_pin_at_the_next_sweep() {
    let env = Env::new("map-killed", 8 * MIB as u64);
    let script = format!(
        r#"
import mmap, os, signal
os.makedirs('/cascade/k', exist_ok=True)
with open('/cascade/k/a', 'wb') as f:
    f.write(b'A' * {six})
fd = os.open('/cascade/k/a', os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
os.close(fd)
os.truncate('/cascade/k/a', 0)
print('mapped', flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"#,
        six = 6 * MIB
    );
    // Straight under the library (no `cascade run`, whose end would sweep at once).
    let out = env.preloaded("/usr/bin/python3", &["-c", &script]);
    assert!(out.stdout.contains("mapped"), "{out}");
    let used = |env: &Env| env.store().status().memory_used;
    // Held: the dead process's mapping pinned the truncated file's chunks.
    assert!(used(&env) >= 6 * MIB as u64, "{}", used(&env));
    // Nothing maps them any more: a sweep releases the pin and the last unpin trims them.
    env.store().sweep_descriptions();
    assert!(used(&env) < 2 * MIB as u64, "{}", used(&env));
    let r = env.store().fsck(false).expect("fsck");
    assert!(r.errors.is_empty(), "{r:?}");
}

#[test]
fn a_dead_writers_removed_file_is_freed_by_fsck_repair_and_by_a_full_store() {
    for how in ["fsck --repair", "a writer on the full store"] {
        let env = Env::new("orphan", 8 * MIB as u64);
        // Straight under the library: a writer killed with its file open.
        let script = format!(
            "import os, signal\n\
             os.makedirs('/cascade/w', exist_ok=True)\n\
             fd = os.open('/cascade/w/f', os.O_WRONLY | os.O_CREAT, 0o644)\n\
             os.write(fd, b'A' * {six})\n\
             print('written', flush=True)\n\
             os.kill(os.getpid(), signal.SIGKILL)\n",
            six = 6 * MIB
        );
        let out = env.preloaded("/usr/bin/python3", &["-c", &script]);
        assert!(out.stdout.contains("written"), "{out}");
        let out = env.cascade(&["rm", "-r", "/w"], &[]);
        assert!(out.ok(), "{out}");
        assert_eq!(env.store().orphans(), 1, "the removed file is still held");
        if how == "fsck --repair" {
            let out = env.cascade(&["fsck", "--repair"], &[]);
            assert!(out.ok(), "{out}");
        } else {
            let out = python(
                &env,
                &format!(
                    "open('/cascade/g', 'wb').write(b'B' * {four})",
                    four = 4 * MIB
                ),
            );
            assert!(out.ok(), "{how}: {out}");
        }
        assert_eq!(env.store().orphans(), 0, "{how}");
        let held = env.store().status().memory_used;
        let expected = if how == "fsck --repair" {
            0
        } else {
            4 * MIB as u64
        };
        assert!(
            held <= expected + MIB as u64,
            "{how}: {held} bytes still used"
        );
    }
}

/// A store attached inside a vfork child (Python starts subprocesses with vfork: the child
/// shares the parent's memory, not its descriptor table) must not leave the parent mapping
/// store files through the child's descriptor numbers. Before the fix the parent's mmap went
/// through whatever its own fd of that number was (here /dev/null: ENODEV; under torch a
/// memfd: SIGBUS on access).
#[test]
fn a_store_attached_in_a_vfork_child_maps_the_parents_files() {
    let env = Env::new("map-vfork", 8 * MIB as u64);
    let script = r#"
import mmap, os, subprocess
subprocess.run(["true"], check=True)
hold = [open("/dev/null", "rb") for _ in range(4)]
os.makedirs("/cascade/m", exist_ok=True)
data = bytes(range(256)) * (3 * 4096 + 17)
with open("/cascade/m/f", "wb") as f:
    f.write(data)
with open("/cascade/m/f", "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
print("mapped", "same" if m[:] == data else "DIFFERENT")
"#;
    let out = python(&env, script);
    assert!(out.ok(), "{out}");
    assert_eq!(out.stdout.trim(), "mapped same", "{out}");
}
