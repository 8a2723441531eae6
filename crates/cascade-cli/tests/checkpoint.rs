//! `cascade drain` and `cascade restore`, run as the real binary against a real store and the
//! durable tier's directory backend.

use std::path::Path;
use std::process::{Command, Output};

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");

struct Sandbox {
    dir: tempfile::TempDir,
    store: String,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("empty.toml"), "").unwrap();
        Sandbox {
            store: format!("/cascade-ckpt-test-{}", std::process::id()),
            dir,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(CASCADE)
            .args(args)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("CASCADE_STORE", &self.store)
            .env("CASCADE_CONFIG", self.dir.path().join("empty.toml"))
            .env("CASCADE_SPILL_PATH", self.dir.path().join("store.spill"))
            .output()
            .expect("run cascade")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "cascade {args:?} failed ({:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Must fail with `code` and exactly one line on stderr; returns it.
    fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "cascade {args:?}: {stderr}");
        assert_eq!(
            stderr.lines().count(),
            1,
            "one line from {args:?}: {stderr}"
        );
        stderr
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.run(&["destroy", "--force"]);
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn drain_then_restore_round_trips_through_a_directory() {
    let sb = Sandbox::new();
    // 256 KiB of memory and a spill file, so the bigger file spills.
    sb.ok(&[
        "init",
        "--capacity",
        "256KiB",
        "--chunk-size",
        "64KiB",
        "--max-files",
        "64",
        "--spill-size",
        "4MiB",
        "--prefault",
        "off",
    ]);
    let a: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let b: Vec<u8> = (0..400_000u32).map(|i| (i * 13 % 253) as u8).collect();
    let local = sb.dir.path().join("in");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("a"), &a).unwrap();
    std::fs::write(local.join("b"), &b).unwrap();
    sb.ok(&["mkdir", "-p", "/ckpt.0001/sub"]);
    sb.ok(&["put", s(&local.join("a")), "/ckpt.0001/rank0.dat"]);
    sb.ok(&["put", s(&local.join("b")), "/ckpt.0001/sub/rank1.dat"]);

    let durable = sb.dir.path().join("durable");
    let url = format!("file://{}", durable.display());
    let out = sb.ok(&["drain", "/ckpt.0001", "--to", &url]);
    assert!(out.contains("2 files, 500000 bytes"), "{out}");
    assert!(out.contains("GB/s") && out.contains(" s, "), "{out}");
    assert!(durable.join("ckpt.0001/.cascade-complete").exists());
    assert_eq!(
        std::fs::read(durable.join("ckpt.0001/sub/rank1.dat")).unwrap(),
        b
    );

    let dest = sb.dir.path().join("restored");
    let out = sb.ok(&["restore", "ckpt.0001", s(&dest), "--from", &url]);
    assert!(out.contains("2 files, 500000 bytes"), "{out}");
    assert_eq!(std::fs::read(dest.join("rank0.dat")).unwrap(), a);
    assert_eq!(std::fs::read(dest.join("sub/rank1.dat")).unwrap(), b);

    sb.ok(&[
        "restore",
        "ckpt.0001",
        "/copy",
        "--from",
        &url,
        "--into-store",
    ]);
    let got = sb.dir.path().join("got");
    sb.ok(&["get", "/copy/sub/rank1.dat", s(&got)]);
    assert_eq!(std::fs::read(&got).unwrap(), b);

    // Errors: one line, exit 1.
    let line = sb.fails(&["drain", "/missing", "--to", &url], 1);
    assert!(
        line.contains("/missing: No such file or directory"),
        "{line}"
    );
    std::fs::remove_file(durable.join("ckpt.0001/.cascade-complete")).unwrap();
    let line = sb.fails(&["restore", "ckpt.0001", s(&dest), "--from", &url], 1);
    assert!(line.contains("not complete"), "{line}");
    let line = sb.fails(&["restore", "ckpt.0001", "--from", "s3://"], 1);
    assert!(line.contains("durable store"), "{line}");
    // No durable store given or configured.
    let line = sb.fails(&["drain", "/ckpt.0001"], 1);
    assert!(
        line.contains("--to") && line.contains("CASCADE_DURABLE"),
        "{line}"
    );
    let help = sb.ok(&["restore", "--help"]);
    assert!(
        help.contains("--into-store") && help.contains("marker"),
        "{help}"
    );
}
