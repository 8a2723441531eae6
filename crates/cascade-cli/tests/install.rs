//! scripts/install.sh into a temporary prefix, from the artefacts the tests build: then the
//! installed files are used as a user would, a C program compiled with
//! `cc $(pkg-config --cflags --libs cascade)` writes a store file through cascade.h, and the
//! installed `PREFIX/bin/cascade run` reads it back with PREFIX/lib/libcascade.so preloaded;
//! the completions and man pages are there and say something.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cascade_testkit::{build, repo_root, run_with_timeout, Env, Out};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A C program of cascade.h: writes argv[3] to the store file argv[2] of store argv[1] and
/// reads it back.
const PROGRAM: &str = r#"
#include <cascade.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    cascade_store *store = cascade_attach(argv[1]);
    if (!store) { fprintf(stderr, "attach: %s\n", cascade_strerror_last()); return 1; }
    size_t len = strlen(argv[3]);
    if (cascade_write_file(store, argv[2], argv[3], len) != 0) {
        fprintf(stderr, "write: %s\n", cascade_strerror_last());
        return 1;
    }
    char back[256];
    ssize_t n = cascade_read_file(store, argv[2], back, sizeof back, 0);
    if (n != (ssize_t)len || memcmp(back, argv[3], len) != 0) return 1;
    printf("wrote %zu bytes\n", len);
    cascade_detach(store);
    return 0;
}
"#;

/// Runs `cmd` (to completion within TIMEOUT) and fails the test unless it exits 0.
fn ok(cmd: Command, what: &str) -> Out {
    let out = run_with_timeout(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{what} failed ({:?}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out
}

/// `PREFIX/bin/cascade` with nothing of the test's environment that would point it
/// elsewhere: no CASCADE_* variables (CASCADE_PRELOAD_LIB above all), an empty config.
fn installed_cascade(prefix: &Path, env: &Env) -> Command {
    let mut cmd = Command::new(prefix.join("bin/cascade"));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CASCADE_") || k.starts_with("AWS_") || k == "LD_PRELOAD" {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOME", env.tmp.path())
        .env("CASCADE_CONFIG", env.tmp.path().join("config.toml"))
        .env("CASCADE_STORE", &env.name);
    cmd
}

fn has_cc_and_pkg_config() -> bool {
    ["cc", "pkg-config"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn install_sh_installs_a_prefix_that_works() {
    assert!(
        has_cc_and_pkg_config(),
        "this test needs cc and pkg-config (scripts/test.sh installs build-essential and pkg-config)"
    );
    let artefacts = build(&["cascade-cli", "cascade-preload", "cascade-wrap"]);
    let env = Env::new("install", 16 << 20);
    let prefix = env.tmp.path().join("prefix");
    let mut install = Command::new("bash");
    install
        .arg(repo_root().join("scripts/install.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .arg("--bin-dir")
        .arg(artefacts)
        .env_remove("DESTDIR");
    let out = ok(install, "scripts/install.sh");
    assert!(out.stdout.contains("installed in"), "{}", out.stdout);

    for file in [
        "bin/cascade",
        "lib/libcascade.so",
        "lib/libcascade_wrap.a",
        "include/cascade.h",
        "lib/pkgconfig/cascade.pc",
        "share/cascade/systemd/cascade-agent@.service",
        "share/cascade/systemd/cascade-stage-server.service",
        "share/cascade/slurm/prolog.sh",
        "share/doc/cascade/LICENSE",
    ] {
        assert!(prefix.join(file).is_file(), "{file} not installed");
    }
    // The units start the installed binary.
    let unit = fs::read_to_string(prefix.join("share/cascade/systemd/cascade-agent@.service"))
        .expect("unit");
    let exec = format!("ExecStart={}/bin/cascade agent", prefix.display());
    assert!(unit.contains(&exec), "{unit}");

    // pkg-config gives -I and -L/-lcascade of the prefix.
    let pc_path = prefix.join("lib/pkgconfig");
    let mut pkg = Command::new("pkg-config");
    pkg.args(["--cflags", "--libs", "cascade"])
        .env("PKG_CONFIG_PATH", &pc_path);
    let flags = ok(pkg, "pkg-config --cflags --libs cascade").stdout;
    let include = format!("-I{}/include", prefix.display());
    let lib = format!("-L{}/lib", prefix.display());
    assert!(flags.contains(&include), "{flags}");
    assert!(
        flags.contains(&lib) && flags.contains("-lcascade"),
        "{flags}"
    );

    // A C program built with those flags (and an rpath to the prefix, as a program installed
    // outside the loader's path needs) calls cascade.h on the test's store.
    let src = env.tmp.path().join("hello.c");
    fs::write(&src, PROGRAM).expect("write hello.c");
    let exe = env.tmp.path().join("hello");
    let mut cc = Command::new("sh");
    cc.arg("-c")
        .arg(r#"cc -Wall -Werror -o "$1" "$2" $(pkg-config --cflags --libs cascade) -Wl,-rpath,"$(pkg-config --variable=libdir cascade)""#)
        .arg("sh")
        .arg(&exe)
        .arg(&src)
        .env("PKG_CONFIG_PATH", &pc_path);
    ok(cc, "cc $(pkg-config --cflags --libs cascade)");
    let mut hello = Command::new(&exe);
    hello.args([&env.name, "/hello.txt", "hello from cascade.h"]);
    let out = ok(hello, "the C program");
    assert_eq!(out.stdout.trim(), "wrote 20 bytes");

    // The installed cascade runs a program with PREFIX/lib/libcascade.so preloaded (found
    // from its own directory; there is none beside it), which reads the file under /cascade.
    assert!(!prefix.join("bin/libcascade.so").exists());
    let mut run = installed_cascade(&prefix, &env);
    run.args([
        "run",
        "--",
        "sh",
        "-c",
        r#"printf '%s\n' "$LD_PRELOAD"; cat /cascade/hello.txt"#,
    ]);
    let out = ok(run, "PREFIX/bin/cascade run");
    let mut lines = out.stdout.lines();
    let preloaded = lines.next().unwrap_or_default();
    assert_eq!(
        preloaded,
        prefix.join("lib/libcascade.so").display().to_string(),
        "{}",
        out.stdout
    );
    assert_eq!(lines.next(), Some("hello from cascade.h"), "{}", out.stdout);

    // link-flags finds the installed archive too.
    let mut link = installed_cascade(&prefix, &env);
    link.arg("link-flags");
    let flags = ok(link, "PREFIX/bin/cascade link-flags").stdout;
    let archive = prefix.join("lib/libcascade_wrap.a").display().to_string();
    assert!(flags.contains(&archive), "{flags}");

    // Completions for bash, zsh and fish, generated from the command line: they know the
    // subcommands and their flags.
    for (file, marker) in [
        ("share/bash-completion/completions/cascade", "complete -F"),
        ("share/zsh/site-functions/_cascade", "#compdef cascade"),
        (
            "share/fish/vendor_completions.d/cascade.fish",
            "complete -c cascade",
        ),
    ] {
        let text = fs::read_to_string(prefix.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.len() > 10_000, "{file} is {} bytes", text.len());
        assert!(text.contains(marker), "{file} lacks {marker}");
        for word in ["stage-server", "check-binary", "durable", "chunk-size"] {
            assert!(text.contains(word), "{file} lacks {word}");
        }
    }
    // Man pages: one per subcommand (nested ones too), each a roff page of its own.
    let man = prefix.join("share/man/man1");
    for page in [
        "cascade.1",
        "cascade-run.1",
        "cascade-init.1",
        "cascade-stage-server.1",
        "cascade-stage-server-status.1",
        "cascade-completions.1",
    ] {
        let text = fs::read_to_string(man.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH "),
            "{page}: not roff"
        );
        assert!(text.len() > 500, "{page} is {} bytes", text.len());
    }
    let run_page = fs::read_to_string(man.join("cascade-run.1")).expect("cascade-run.1");
    assert!(run_page.contains("LD_PRELOAD") && run_page.contains("mount"));
    // --chunk-size comes from the settings table (cascade-config), not from cli.rs.
    let init_page = fs::read_to_string(man.join("cascade-init.1")).expect("cascade-init.1");
    assert!(
        init_page.contains("chunk"),
        "cascade-init.1 lacks the store flags"
    );

    // A second run over the same prefix (an upgrade) works and leaves one copy of each.
    let mut again = Command::new("bash");
    again
        .arg(repo_root().join("scripts/install.sh"))
        .arg(format!("--prefix={}", prefix.display()))
        .arg(format!("--bin-dir={}", artefacts.display()));
    ok(again, "scripts/install.sh again");
}

#[test]
fn install_sh_says_how_to_use_it() {
    let mut help = Command::new("bash");
    help.arg(repo_root().join("scripts/install.sh"))
        .arg("--help");
    let out = ok(help, "install.sh --help");
    for word in [
        "--prefix",
        "--bin-dir",
        "--target-dir",
        "pkg-config",
        "man1",
    ] {
        assert!(
            out.stdout.contains(word),
            "--help lacks {word}:\n{}",
            out.stdout
        );
    }
    let mut bad = Command::new("bash");
    bad.arg(repo_root().join("scripts/install.sh"))
        .arg("--frobnicate");
    let out = run_with_timeout(bad, TIMEOUT);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("unknown argument '--frobnicate'"),
        "{}",
        out.stderr
    );
    // Missing artefacts: one line saying which, nothing installed.
    let tmp = tempfile::tempdir().expect("tempdir");
    let prefix = tmp.path().join("p");
    let mut missing = Command::new("bash");
    missing
        .arg(repo_root().join("scripts/install.sh"))
        .arg("--prefix")
        .arg(&prefix)
        .arg("--bin-dir")
        .arg(tmp.path());
    let out = run_with_timeout(missing, TIMEOUT);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("cascade is missing"), "{}", out.stderr);
    assert!(!prefix.exists());
}
