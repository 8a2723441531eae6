//! The job `cascade run` starts maps the store's memory in as soon as it attaches the store,
//! not at its first checkpoint (docs/store-layout.md, "Memory and faults"): a program under
//! `cascade run` that has only looked at the namespace ends up with the whole block in its
//! page tables (its `RssShmem`), which without the early map-in stays near zero until it
//! touches file data.

use std::process::Command;

use cascade_testkit::{cascade_bin, number_printed_by};

#[test]
fn the_job_maps_the_store_in_when_it_attaches_it() {
    let bin = cascade_bin().display().to_string();
    let store = format!("/cascade-map-in-{}", std::process::id());
    // Namespace only (a stat of the mount attaches the store), then the page tables are
    // watched until the 64 MiB block is in them, with a deadline.
    let watch = "import os, time
os.stat('/cascade')
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('RssShmem:'):
            return int(line.split()[1]) * 1024
deadline = time.monotonic() + 60
while rss() < 60 << 20 and time.monotonic() < deadline:
    time.sleep(0.01)
print(rss())";
    let script = format!(
        "set -e
export CASCADE_STORE={store} CASCADE_CONFIG=/dev/null CASCADE_DURABLE=
{bin} init --capacity 64MiB --spill-size 0 >/dev/null
{bin} run -- /usr/bin/python3 -c \"{watch}\" || status=$?
{bin} destroy --force >/dev/null
exit ${{status:-0}}"
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    let bytes = number_printed_by(cmd, std::time::Duration::from_secs(120), "RssShmem");
    assert!(
        bytes >= 60 << 20,
        "the job mapped only {} MiB of the 64 MiB block in",
        bytes >> 20
    );
}
