//! Huge pages for the store where /dev/shm offers them on request (docs/store-layout.md,
//! "Memory and faults"): in a mount namespace of its own, the test mounts a tmpfs with
//! `huge=advise` on /dev/shm, creates a store there and has a program under `cascade run`
//! write into it; the writer's page tables then map the store in 2 MiB pages (its
//! `ShmemPmdMapped`), which without the store's MADV_HUGEPAGE stays 0.

use std::process::Command;

use cascade_testkit::{cascade_bin, number_printed_by, output_within};

#[test]
fn a_store_on_a_dev_shm_that_offers_huge_pages_is_mapped_in_huge_pages() {
    let bin = cascade_bin().display().to_string();
    let write = "f = open('/cascade/x', 'wb'); f.write(b'x' * (16 << 20)); f.flush(); \
                 print(*[l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('ShmemPmdMapped')])";
    let script = format!(
        "set -e
mount -t tmpfs -o huge=advise,size=256M tmpfs /dev/shm
export CASCADE_STORE=/cascade-huge-test CASCADE_CONFIG=/dev/null CASCADE_DURABLE=
{bin} init --capacity 64MiB --spill-size 0 >/dev/null
{bin} run -- /usr/bin/python3 -c \"{write}\"
{bin} destroy --force >/dev/null"
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    let kib = number_printed_by(cmd, std::time::Duration::from_secs(120), "ShmemPmdMapped");
    // The 16 MiB written, in 2 MiB pages (the writer maps each chunk it fills).
    assert!(kib >= 16 << 10, "the writer maps {kib} KiB in huge pages");
}

/// `cascade init` says whether the store got huge pages: on a tmpfs with `huge=advise` it
/// names how much of the block is in 2 MiB pages; on one mounted with `huge=never` it says
/// none and how to enable them.
#[test]
fn init_says_whether_the_store_has_huge_pages() {
    let bin = cascade_bin().display().to_string();
    let init_on = |huge: &str| {
        let script = format!(
            "set -e
mount -t tmpfs -o huge={huge},size=256M tmpfs /dev/shm
export CASCADE_STORE=/cascade-huge-init CASCADE_CONFIG=/dev/null CASCADE_DURABLE=
{bin} init --capacity 64MiB --spill-size 0
{bin} destroy --force >/dev/null"
        );
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
        let out = output_within(cmd, std::time::Duration::from_secs(120));
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with("huge pages"))
            .unwrap_or_else(|| panic!("no huge pages line with huge={huge}:\n{stdout}"))
            .trim()
            .to_string()
    };
    let with = init_on("advise");
    assert!(
        with.starts_with("huge pages 64 MiB of the block in 2 MiB pages"),
        "{with}"
    );
    let without = init_on("never");
    assert!(without.starts_with("huge pages none"), "{without}");
    assert!(without.contains("huge=advise"), "{without}");
}
