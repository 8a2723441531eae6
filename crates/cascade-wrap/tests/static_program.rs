//! A statically linked C program (which LD_PRELOAD cannot reach), linked with the flags
//! `cascade link-flags` prints, writes and reads a checkpoint in a real store through the
//! `__wrap_` functions of libcascade_wrap.a.

use std::path::{Path, PathBuf};
use std::process::Command;

use cascade_store::{OpenOptions, Prefault, Store, StoreConfig};

/// Builds the archive and the CLI with the cargo running this test; returns the CLI's path.
fn build() -> PathBuf {
    cascade_testkit::build(&["cascade-wrap", "cascade-cli"]).join("cascade")
}

const PROGRAM: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
int main(void) {
    char dir[256], p[300];
    snprintf(dir, sizeof dir, "%s/ckpt.1", getenv("CASCADE_MOUNT"));
    snprintf(p, sizeof p, "%s/rank0.dat", dir);
    if (mkdir(dir, 0755) != 0) { perror("mkdir"); return 1; }
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) { perror("open"); return 1; }
    static double v[100000];
    for (int i = 0; i < 100000; i++) v[i] = i * 0.25;
    if (write(fd, v, sizeof v) != (ssize_t)sizeof v) { perror("write"); return 1; }
    if (close(fd) != 0) return 1;
    FILE *f = fopen(p, "a");
    fprintf(f, "end");
    fclose(f);
    struct stat st;
    if (stat(p, &st) != 0 || st.st_size != (off_t)sizeof v + 3) return 2;
    static double w[100000];
    fd = open(p, O_RDONLY);
    if (read(fd, w, sizeof w) != (ssize_t)sizeof w || memcmp(v, w, sizeof v) != 0) return 3;
    close(fd);
    puts("ok");
    return 0;
}
"#;

#[test]
fn static_program_linked_with_link_flags_uses_the_store() {
    let cascade = build();
    let flags = Command::new(&cascade)
        .arg("link-flags")
        .output()
        .expect("link-flags");
    assert!(
        flags.status.success(),
        "{}",
        String::from_utf8_lossy(&flags.stderr)
    );
    let flags: Vec<String> = String::from_utf8_lossy(&flags.stdout)
        .split_whitespace()
        .map(String::from)
        .collect();

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("static-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("ckpt.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join("ckpt");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()))
        .arg("-static")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(&flags)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc -static failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // check-binary agrees that preload cannot reach it.
    let check = Command::new(&cascade)
        .arg("check-binary")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("static"),
        "{check:?}"
    );

    let name = format!("/cascade-static-{}", std::process::id());
    let store = Store::create(&StoreConfig {
        name: name.clone(),
        capacity: 64 << 20,
        chunk_size: 64 << 10,
        max_files: 256,
        spill: None,
        prefault: Prefault::Off,
    })
    .unwrap();
    let mount = format!("/cascade-static-{}", std::process::id());
    let run = Command::new(&exe)
        .env_remove("LD_PRELOAD")
        .env("CASCADE_STORE", &name)
        .env("CASCADE_MOUNT", &mount)
        .output()
        .unwrap();
    let stored = store
        .open("/ckpt.1/rank0.dat", &OpenOptions::new())
        .map(|f| f.len());
    drop(store);
    let _ = Store::destroy_forced(&name);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.status.success(), "{run:?}");
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "ok");
    assert_eq!(
        stored.unwrap().unwrap(),
        800_003,
        "the data went to the store"
    );
    assert!(
        !Path::new(&mount).exists(),
        "nothing written to the host under the mount prefix"
    );
}
