//! glibc functions that reach files through glibc's internal aliases, which LD_PRELOAD never
//! sees unless the library wraps the function itself (issue 20): mkstemp, mkdtemp, glob,
//! nftw, scandir, fts, posix_spawn file actions, dlopen, system() and exec of programs stored
//! in the store, a program that returns from main without closing its files, and GROMACS.
//!
//! Each C program takes a base directory, prints one line per call (its result, errno by
//! name, paths relative to the base) and exits 0; it runs once on a host directory without
//! Cascade (the reference) and once under `cascade run` on a store directory, and the two
//! outputs must be identical.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use cascade_testkit::{levels_line, output_within};
use common::compile_c;
use common::env::Env;

/// How long one program may take (GROMACS's steps included).
const TIMEOUT: Duration = Duration::from_secs(120);

/// Included by every program: `say(call, r)` prints "call: r" or "call: -1 ENAME".
const PRELUDE: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fts.h>
#include <ftw.h>
#include <glob.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
/* Not every program uses every helper. */
#define U __attribute__((unused))
static const char *base;
static char pbuf[4096];
/* base/rel */
U static const char *P(const char *rel) { snprintf(pbuf, sizeof pbuf, "%s/%s", base, rel); return pbuf; }
U static void say(const char *call, long r) {
    if (r < 0) printf("%s: -1 %s\n", call, strerrorname_np(errno));
    else printf("%s: %ld\n", call, r);
}
/* a path relative to the base */
U static const char *rel(const char *p) {
    size_t n = strlen(base);
    if (strncmp(p, base, n) == 0 && p[n] == '/') return p + n + 1;
    if (strcmp(p, base) == 0) return ".";
    return p;
}
U static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
/* the sorted names of a directory (opendir/readdir), "." and ".." left out */
U static void list(const char *what, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) { say(what, -1); return; }
    char *names[256]; int n = 0; struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    printf("%s:", what);
    for (int i = 0; i < n; i++) { printf(" %s", names[i]); free(names[i]); }
    printf("\n");
}
U static void file_size(const char *what, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) { say(what, -1); return; }
    /* A directory's size is the file system's own business (tmpfs and ext4 differ too). */
    if (S_ISDIR(st.st_mode))
        printf("%s: directory mode %o\n", what, (unsigned)(st.st_mode & 07777));
    else
        printf("%s: mode %o size %ld\n", what, (unsigned)(st.st_mode & 07777), (long)st.st_size);
}
U static void contents(const char *what, const char *path) {
    char b[512] = {0};
    int fd = open(path, O_RDONLY);
    if (fd < 0) { say(what, -1); return; }
    ssize_t n = read(fd, b, sizeof b - 1);
    close(fd);
    if (n < 0) { say(what, -1); return; }
    printf("%s: %zd bytes \"%s\"\n", what, n, b);
}
U static int put(const char *path, const char *text, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    return close(fd) == 0 && n == (ssize_t)strlen(text) ? 0 : -1;
}
U static void status(const char *what, int st) {
    if (st == -1) say(what, -1);
    else if (WIFEXITED(st)) printf("%s: exit %d\n", what, WEXITSTATUS(st));
    else printf("%s: status %#x\n", what, st);
}
"#;

/// Compiles `PRELUDE + body` as `name`.
fn program(name: &str, body: &str) -> PathBuf {
    compile_c(name, &format!("{PRELUDE}{body}"), &[])
}

/// The program's stdout on a fresh host directory `host` (no Cascade), which must succeed.
fn run_on_host(exe: &Path, host: &Path) -> String {
    let mut cmd = Command::new(exe);
    cmd.arg(host)
        .current_dir(host.parent().expect("host dir has a parent"))
        .env_remove("LD_PRELOAD");
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{} on the host directory {} failed ({}):\n{}\n{}",
        exe.display(),
        host.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The program's stdout under `cascade run` on the store directory `store_dir` (a path of
/// the mount), with the scratch directory as the kernel's working directory.
fn run_in_store(env: &Env, exe: &Path, store_dir: &str) -> String {
    let out = output_within(
        env.cascade_run(exe.to_str().expect("utf-8"), &[store_dir]),
        TIMEOUT,
    );
    assert!(
        out.status.success(),
        "{} under cascade run on {store_dir} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fresh base directories: `<tmp>/host/base` on the host and `/base` in the store, with
/// `setup` run on each (`setup(dir, in_store)`, e.g. to copy a file in).
fn bases(env: &Env, setup: impl Fn(&str)) -> (PathBuf, String) {
    let host = env.tmp.join("host").join("base");
    std::fs::create_dir_all(&host).expect("host base dir");
    let store = format!("{}/base", env.mount);
    env.ok(&format!("mkdir {store}"));
    setup(host.to_str().expect("utf-8"));
    setup(&store);
    (host, store)
}

/// Runs `exe` on a host directory and on a store directory; the outputs must be identical
/// (the host's is also checked to contain `expect`, so the reference is known good).
fn same_on_host_and_store(env: &Env, exe: &Path, setup: impl Fn(&str), expect: &[&str]) -> String {
    let (host, store) = bases(env, setup);
    let reference = run_on_host(exe, &host);
    for e in expect {
        assert!(
            reference.contains(e),
            "the host run lacks {e:?}:\n{reference}"
        );
    }
    let got = run_in_store(env, exe, &store);
    assert_eq!(
        got,
        reference,
        "{} differs in the store (left) from a host directory (right)",
        exe.display()
    );
    reference
}

#[test]
fn mkstemp_with_an_absolute_template() {
    let env = Env::new();
    let exe = program(
        "mkstemp_abs",
        r#"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    char t[4096];
    snprintf(t, sizeof t, "%s/tmpXXXXXX", base);
    int fd = mkstemp(t);
    say("mkstemp", fd < 0 ? -1 : 0);
    if (fd < 0) return 0;
    say("write", write(fd, "hello\n", 6));
    struct stat st;
    say("fstat", fstat(fd, &st));
    printf("fstat: mode %o size %ld\n", (unsigned)(st.st_mode & 07777), (long)st.st_size);
    say("close", close(fd));
    say("rename", rename(t, P("final")));
    file_size("final", P("final"));
    contents("final", P("final"));
    snprintf(t, sizeof t, "%s/tmpXXXXXX.dat", base);
    fd = mkstemps(t, 4);
    say("mkstemps", fd < 0 ? -1 : 0);
    if (fd >= 0) { close(fd); say("rename", rename(t, P("final.dat"))); }
    snprintf(t, sizeof t, "%s/tmpXXXXXX", base);
    fd = mkostemp(t, O_APPEND | O_CLOEXEC);
    say("mkostemp", fd < 0 ? -1 : 0);
    if (fd >= 0) {
        printf("mkostemp: append %d cloexec %d\n", !!(fcntl(fd, F_GETFL) & O_APPEND), !!(fcntl(fd, F_GETFD) & FD_CLOEXEC));
        close(fd);
        say("rename", rename(t, P("final.o")));
    }
    list("base", base);
    return 0;
}
"#,
    );
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &["final: mode 600 size 6", "base: final final.dat final.o"],
    );
}

#[test]
fn mkstemp_relative_to_a_working_directory_in_the_store() {
    let env = Env::new();
    let exe = program(
        "mkstemp_rel",
        r#"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    say("chdir", chdir(base));
    char t[] = "relXXXXXX";
    int fd = mkstemp(t);
    say("mkstemp", fd < 0 ? -1 : 0);
    if (fd < 0) return 0;
    say("write", write(fd, "relative\n", 9));
    say("close", close(fd));
    char abs[4096];
    snprintf(abs, sizeof abs, "%s/%s", base, t);
    file_size("by absolute path", abs);
    say("rename", rename(t, "rel.final"));
    char d[] = "dXXXXXX";
    say("mkdtemp", mkdtemp(d) ? 0 : -1);
    say("rename", rename(d, "d.final"));
    list("base", base);
    return 0;
}
"#,
    );
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &[
            "by absolute path: mode 600 size 9",
            "base: d.final rel.final",
        ],
    );
    // Nothing leaked into the kernel's working directory (the scratch directory).
    let leaked: Vec<String> = std::fs::read_dir(&env.tmp)
        .expect("scratch dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rel") || n.starts_with('d'))
        .collect();
    assert!(
        leaked.is_empty(),
        "mkstemp/mkdtemp relative to a store cwd created {leaked:?} on the host"
    );
}

#[test]
fn mkdtemp_in_the_store() {
    let env = Env::new();
    let exe = program(
        "mkdtemp",
        r#"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    char t[4096];
    snprintf(t, sizeof t, "%s/dXXXXXX", base);
    char *d = mkdtemp(t);
    say("mkdtemp", d ? 0 : -1);
    if (!d) return 0;
    file_size("dir", d);
    char f[4096];
    snprintf(f, sizeof f, "%s/inside", d);
    say("put inside", put(f, "x", 0644));
    say("rename", rename(d, P("dfinal")));
    list("dfinal", P("dfinal"));
    return 0;
}
"#,
    );
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &["dir: directory mode 700", "dfinal: inside"],
    );
}

/// A small tree for the directory walkers: w/{a,b,ab,sub/file,sub2/file,sub2/deep/x}.
const TREE: &str = r#"
static void tree(void) {
    mkdir(P("w"), 0755);
    mkdir(P("w/sub"), 0755);
    mkdir(P("w/sub2"), 0755);
    mkdir(P("w/sub2/deep"), 0755);
    const char *files[] = { "w/a", "w/b", "w/ab", "w/sub/file", "w/sub2/file", "w/sub2/deep/x" };
    for (unsigned i = 0; i < sizeof files / sizeof *files; i++) put(P(files[i]), "data", 0644);
}
"#;

#[test]
fn glob_patterns_in_the_store() {
    let env = Env::new();
    let exe = program(
        "glob",
        &format!(
            r#"{TREE}
static void g(const char *pattern, int flags, const char *shown) {{
    glob_t gl;
    int r = glob(P(pattern), flags, NULL, &gl);
    printf("glob %s %s: %s", pattern, shown, r == 0 ? "0" : r == GLOB_NOMATCH ? "GLOB_NOMATCH" : "error");
    if (r == 0) for (size_t i = 0; i < gl.gl_pathc; i++) printf(" %s", rel(gl.gl_pathv[i]));
    printf("\n");
    globfree(&gl);
}}
int main(int argc, char **argv) {{
    if (argc < 2) return 2;
    base = argv[1];
    tree();
    g("w/*", 0, "");
    g("w/?", 0, "");
    g("w/[ab]", 0, "");
    g("w/*/file", 0, "");
    g("w/*", GLOB_MARK, "GLOB_MARK");
    g("w/*", GLOB_ONLYDIR, "GLOB_ONLYDIR");
    g("w/zz*", GLOB_NOCHECK, "GLOB_NOCHECK");
    g("w/zz*", 0, "");
    say("chdir", chdir(P("w")));
    glob_t gl;
    int r = glob("s*", 0, NULL, &gl);
    printf("glob s* (cwd w): %d", r);
    if (r == 0) for (size_t i = 0; i < gl.gl_pathc; i++) printf(" %s", gl.gl_pathv[i]);
    printf("\n");
    return 0;
}}
"#
        ),
    );
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &[
            "glob w/* : 0 w/a w/ab w/b w/sub w/sub2\n",
            "glob w/*/file : 0 w/sub/file w/sub2/file\n",
            "glob s* (cwd w): 0 sub sub2\n",
        ],
    );
}

#[test]
fn nftw_ftw_and_scandir_in_the_store() {
    let env = Env::new();
    let exe = program(
        "walk",
        &format!(
            r#"{TREE}
static char *seen[64];
static int nseen;
static int cb(const char *path, const struct stat *st, int type, struct FTW *f) {{
    (void)st;
    char line[512];
    snprintf(line, sizeof line, "%s type %d level %d", rel(path), type, f->level);
    if (nseen < 64) seen[nseen++] = strdup(line);
    return 0;
}}
static int cb_old(const char *path, const struct stat *st, int type) {{
    (void)st;
    char line[512];
    snprintf(line, sizeof line, "%s type %d", rel(path), type);
    if (nseen < 64) seen[nseen++] = strdup(line);
    return 0;
}}
static void show(const char *what, int r) {{
    say(what, r);
    qsort(seen, nseen, sizeof *seen, by_name);
    for (int i = 0; i < nseen; i++) {{ printf("  %s\n", seen[i]); free(seen[i]); }}
    nseen = 0;
}}
int main(int argc, char **argv) {{
    if (argc < 2) return 2;
    base = argv[1];
    tree();
    show("nftw FTW_PHYS", nftw(P("w"), cb, 8, FTW_PHYS));
    show("nftw FTW_PHYS|FTW_DEPTH|FTW_MOUNT", nftw(P("w"), cb, 8, FTW_PHYS | FTW_DEPTH | FTW_MOUNT));
    show("ftw", ftw(P("w"), cb_old, 8));
    show("nftw missing", nftw(P("missing"), cb, 8, FTW_PHYS));
    struct dirent **names;
    int n = scandir(P("w"), &names, NULL, alphasort);
    say("scandir", n);
    for (int i = 0; i < n; i++) {{ printf("  %s\n", names[i]->d_name); free(names[i]); }}
    if (n >= 0) free(names);
    return 0;
}}
"#
        ),
    );
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &[
            "nftw FTW_PHYS: 0\n",
            "w/sub2/deep/x type 0 level 3",
            "scandir: 7\n",
        ],
    );
}

#[test]
fn fts_walks_the_store() {
    let env = Env::new();
    let exe = program(
        "fts",
        &format!(
            r#"{TREE}
static int cmp(const FTSENT **a, const FTSENT **b) {{ return strcmp((*a)->fts_name, (*b)->fts_name); }}
static void walk(const char *what, int (*compar)(const FTSENT **, const FTSENT **)) {{
    char *argv[] = {{ (char *)P("w"), NULL }};
    FTS *f = fts_open(argv, FTS_PHYSICAL | FTS_NOCHDIR, compar);
    if (!f) {{ say(what, -1); return; }}
    char *lines[64]; int n = 0; FTSENT *e;
    while ((e = fts_read(f)) && n < 64) {{
        char line[512];
        snprintf(line, sizeof line, "info %d level %d %s", e->fts_info, e->fts_level, rel(e->fts_path));
        lines[n++] = strdup(line);
    }}
    int err = errno;
    printf("%s: %d entries, end errno %d, close %d\n", what, n, e ? -1 : err, fts_close(f));
    if (!compar) qsort(lines, n, sizeof *lines, by_name);
    for (int i = 0; i < n; i++) {{ printf("  %s\n", lines[i]); free(lines[i]); }}
}}
int main(int argc, char **argv) {{
    if (argc < 2) return 2;
    base = argv[1];
    tree();
    errno = 0;
    walk("fts by name", cmp);
    errno = 0;
    walk("fts unsorted", NULL);
    return 0;
}}
"#
        ),
    );
    // w, a, ab, b, sub, sub/file, sub2, deep, x, sub2/file: 10 entries, and the 4
    // directories a second time (FTS_DP).
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &["fts by name: 14 entries, end errno 0, close 0"],
    );
}

#[test]
fn posix_spawn_file_actions_on_store_paths() {
    let env = Env::new();
    let exe = program(
        "spawn_actions",
        r#"
static void run(const char *what, const char *script, posix_spawn_file_actions_t *fa) {
    char *argv[] = { "sh", "-c", (char *)script, NULL };
    pid_t pid;
    int r = posix_spawn(&pid, "/bin/sh", fa, NULL, argv, environ);
    if (r != 0) { errno = r; say(what, -1); return; }
    int st;
    waitpid(pid, &st, 0);
    status(what, st);
}
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    char out[4096], copy[4096], dir[4096];
    snprintf(out, sizeof out, "%s/out", base);
    snprintf(copy, sizeof copy, "%s/copy", base);
    snprintf(dir, sizeof dir, "%s/d", base);
    say("mkdir d", mkdir(dir, 0755));
    posix_spawn_file_actions_t fa;
    for (int i = 0; i < 2; i++) {
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        run("addopen(1, out, O_APPEND) echo", "echo hello", &fa);
        posix_spawn_file_actions_destroy(&fa);
    }
    contents("out", out);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, out, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, copy, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    run("addopen(0, out) addopen(1, copy) cat", "cat", &fa);
    posix_spawn_file_actions_destroy(&fa);
    contents("copy", copy);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, dir);
    run("addchdir_np(d) echo > rel", "echo relative > rel && pwd > where", &fa);
    posix_spawn_file_actions_destroy(&fa);
    contents("d/rel", P("d/rel"));
    list("d", dir);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, P("missing"), O_RDONLY, 0);
    run("addopen(0, missing)", "cat", &fa);
    posix_spawn_file_actions_destroy(&fa);
    return 0;
}
"#,
    );
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &[
            "out: 12 bytes \"hello\nhello\n\"",
            "copy: 12 bytes",
            "d/rel: 9 bytes \"relative\n\"",
            "addopen(0, missing): -1 ENOENT",
        ],
    );
}

#[test]
fn dlopen_of_a_library_stored_in_the_store() {
    let env = Env::new();
    let lib = compile_c(
        "libplug.so",
        "int plug(int x) { return 40 + x; }\n",
        &["-shared", "-fPIC"],
    );
    let exe = program(
        "dlopen",
        r#"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    void *h = dlopen(P("libplug.so"), RTLD_NOW);
    if (!h) { printf("dlopen: failed\n"); fprintf(stderr, "dlopen: %s\n", dlerror()); return 0; }
    int (*plug)(int) = (int (*)(int))dlsym(h, "plug");
    printf("dlopen: ok, plug(2) = %d\n", plug ? plug(2) : -1);
    say("dlclose", dlclose(h));
    return 0;
}
"#,
    );
    let lib = lib.to_str().expect("utf-8").to_string();
    same_on_host_and_store(
        &env,
        &exe,
        |dir| {
            env.ok(&format!("cp {lib} {dir}/libplug.so"));
        },
        &["dlopen: ok, plug(2) = 42"],
    );
}

#[test]
fn system_and_posix_spawn_of_a_script_stored_in_the_store() {
    let env = Env::new();
    let exe = program(
        "script",
        r##"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    char s[4096], cmd[8192];
    snprintf(s, sizeof s, "%s/s.sh", base);
    say("write s.sh", put(s, "#!/bin/sh\necho \"ran $1\" >> \"$(dirname \"$0\")/out\"\nexit 3\n", 0755));
    snprintf(cmd, sizeof cmd, "%s viasystem", s);
    status("system(s.sh)", system(cmd));
    char *av[] = { s, "viaspawn", NULL };
    pid_t pid;
    int r = posix_spawn(&pid, s, NULL, NULL, av, environ);
    if (r) { errno = r; say("posix_spawn(s.sh)", -1); }
    else { int st; waitpid(pid, &st, 0); status("posix_spawn(s.sh)", st); }
    contents("out", P("out"));
    say("chmod 644", chmod(s, 0644));
    snprintf(cmd, sizeof cmd, "%s 2>/dev/null", s);
    status("system(non-executable)", system(cmd));
    r = posix_spawn(&pid, s, NULL, NULL, av, environ);
    if (r) { errno = r; say("posix_spawn(non-executable)", -1); }
    else { int st; waitpid(pid, &st, 0); status("posix_spawn(non-executable)", st); }
    return 0;
}
"##,
    );
    same_on_host_and_store(
        &env,
        &exe,
        |_| {},
        &[
            "system(s.sh): exit 3",
            "posix_spawn(s.sh): exit 3",
            "out: 27 bytes \"ran viasystem\nran viaspawn\n\"",
            "system(non-executable): exit 126",
            "posix_spawn(non-executable): -1 EACCES",
        ],
    );
}

#[test]
fn exec_of_a_program_stored_in_the_store() {
    let env = Env::new();
    let hello = compile_c(
        "hello_elf",
        "#include <stdio.h>\nint main(int c, char **v) { printf(\"hello from %s, %d args\\n\", c > 1 ? v[1] : \"?\", c); return 5; }\n",
        &[],
    );
    let exe = program(
        "exec_elf",
        r#"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    /* The children write to the same stdout: line buffering keeps the order. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    char h[4096];
    snprintf(h, sizeof h, "%s/hello", base);
    file_size("hello", h);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char *av[] = { h, "execv", NULL };
        execv(h, av);
        printf("execv: -1 %s\n", strerrorname_np(errno));
        fflush(stdout);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    status("fork+execv(hello)", st);
    char *av[] = { h, "posix_spawn", NULL };
    int r = posix_spawn(&pid, h, NULL, NULL, av, environ);
    if (r) { errno = r; say("posix_spawn(hello)", -1); }
    else { waitpid(pid, &st, 0); status("posix_spawn(hello)", st); }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s system", h);
    fflush(stdout);
    status("system(hello)", system(cmd));
    return 0;
}
"#,
    );
    let hello = hello.to_str().expect("utf-8").to_string();
    same_on_host_and_store(
        &env,
        &exe,
        |dir| {
            env.ok(&format!("cp {hello} {dir}/hello && chmod 755 {dir}/hello"));
        },
        &[
            "hello from execv, 2 args\nfork+execv(hello): exit 5",
            "hello from posix_spawn, 2 args\nposix_spawn(hello): exit 5",
            "hello from system, 2 args\nsystem(hello): exit 5",
        ],
    );
}

/// Writes with write() and fprintf() and returns from main with both files still open.
const NO_CLOSE: &str = r#"
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    base = argv[1];
    int fd = open(P("raw.dat"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror("open raw.dat"); return 1; }
    static char buf[100000];
    for (int i = 0; i < (int)sizeof buf; i++) buf[i] = (char)(i * 7 + 3);
    if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) { perror("write"); return 1; }
    FILE *f = fopen(P("log.txt"), "w");
    if (!f) { perror("fopen log.txt"); return 1; }
    for (int i = 0; i < 5000; i++) fprintf(f, "line %d\n", i);
    return 0; /* neither fd nor f is closed: exit() flushes f, the kernel closes fd */
}
"#;

fn no_close_expected() -> (Vec<u8>, Vec<u8>) {
    let raw: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(7).wrapping_add(3)) as u8)
        .collect();
    let log: String = (0..5000).map(|i| format!("line {i}\n")).collect();
    (raw, log.into_bytes())
}

#[test]
fn a_program_that_returns_without_closing_leaves_complete_untorn_files() {
    let env = Env::new();
    let exe = program("no_close", NO_CLOSE);
    let (raw, log) = no_close_expected();
    let (host, store) = bases(&env, |_| {});
    run_on_host(&exe, &host);
    assert_eq!(
        std::fs::read(host.join("raw.dat")).expect("host raw.dat"),
        raw
    );
    assert_eq!(
        std::fs::read(host.join("log.txt")).expect("host log.txt"),
        log
    );
    run_in_store(&env, &exe, &store);
    assert_eq!(env.read_store("/base/raw.dat"), raw, "raw.dat in the store");
    assert_eq!(env.read_store("/base/log.txt"), log, "log.txt in the store");
    let levels = env.cascade(&["ls", "--levels"]);
    for f in ["/base/raw.dat", "/base/log.txt"] {
        let line = levels_line(&levels, f).unwrap_or_default();
        assert!(
            !line.is_empty() && !line.contains("torn") && !line.contains("writing"),
            "{f} after its writer returned from main: {line:?}\n{levels}"
        );
    }
}

#[test]
fn with_a_durable_store_files_left_open_at_exit_become_durable() {
    let env = Env::new();
    let exe = program("no_close", NO_CLOSE);
    let (raw, log) = no_close_expected();
    let durable = env.tmp.join("durable");
    std::fs::create_dir_all(&durable).expect("durable dir");
    let store = format!("{}/base", env.mount);
    env.ok(&format!("mkdir {store}"));
    let mut cmd = env.cascade_run(exe.to_str().expect("utf-8"), &[&store]);
    cmd.env("CASCADE_DURABLE", &durable);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "cascade run with a durable store: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // `cascade run` returns once what the job left is durable.
    let levels = env.cascade(&["ls", "--levels"]);
    for (f, want) in [("raw.dat", &raw), ("log.txt", &log)] {
        let line = levels_line(&levels, &format!("/base/{f}")).unwrap_or_default();
        assert!(
            line.contains("durable") && !line.contains("torn"),
            "/base/{f} is not durable after cascade run: {line:?}\n{levels}"
        );
        let copies: Vec<PathBuf> = cascade_testkit::files_below(&durable)
            .into_iter()
            .filter(|p| p.ends_with(format!("base/{f}")))
            .collect();
        assert!(
            copies
                .iter()
                .any(|p| std::fs::read(p).ok().as_ref() == Some(want)),
            "no complete copy of base/{f} in the durable store {}: {copies:?}",
            durable.display()
        );
    }
}

// ---- GROMACS --------------------------------------------------------------------------------

const TOPOLOGY: &str = "#include \"oplsaa.ff/forcefield.itp\"\n#include \"oplsaa.ff/spce.itp\"\n\n[ system ]\nwater\n\n[ molecules ]\n";

/// 100 steps of SPC/E water, energies every 10 steps; both seeds fixed (the thermostat's
/// ld-seed is random by default, which would make two runs differ).
const MDP: &str = "integrator = md\ndt = 0.002\nnsteps = 100\ncutoff-scheme = Verlet\n\
nstlist = 10\ncoulombtype = reaction-field\nrcoulomb = 0.8\nvdwtype = cut-off\nrvdw = 0.8\n\
tcoupl = v-rescale\ntc-grps = System\ntau-t = 0.1\nref-t = 300\ngen-vel = yes\n\
gen-temp = 300\ngen-seed = 42\nld-seed = 1234\nconstraints = h-bonds\nnstenergy = 10\nnstlog = 10\n\
nstcalcenergy = 10\n";

/// The whole GROMACS sequence in directory $1 (inputs copied from $2): solvate (which
/// rewrites topol.top through a temporary file), grompp, 100 steps writing checkpoints,
/// a restart from state.cpt for 100 more; then the last energies block of md.log.
const GMX_SCRIPT: &str = r#"set -e
cd "$1"
cp "$2/topol.top" "$2/md.mdp" .
export GMX_MAXBACKUP=5
gmx -quiet solvate -cs spc216.gro -box 1.8 1.8 1.8 -o conf.gro -p topol.top
gmx -quiet grompp -f md.mdp -c conf.gro -p topol.top -o topol.tpr
gmx -quiet mdrun -ntmpi 1 -ntomp 1 -reprod -s topol.tpr -cpt 0.001 -cpo state.cpt -nsteps 100
gmx -quiet mdrun -ntmpi 1 -ntomp 1 -reprod -s topol.tpr -cpi state.cpt -nsteps 100
echo "== molecules: $(tail -1 topol.top)"
echo "== restart: $(grep -c 'Started mdrun' md.log) runs in md.log"
awk '/Energies \(kJ\/mol\)/{b=""; f=1} f{b=b $0 "\n"} f && /^$/{f=0; last=b} /^ +Step +Time/{getline; step=$1} END{print "== last step " step; printf "%s", last}' md.log
"#;

#[test]
fn gromacs_solvate_grompp_mdrun_and_restart_in_the_store() {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("gmx").is_file()));
    assert!(
        found,
        "gmx is not installed: install the Debian package gromacs (scripts/test.sh does)"
    );
    let env = Env::new();
    let inputs = env.tmp.join("inputs");
    std::fs::create_dir_all(&inputs).expect("inputs dir");
    std::fs::write(inputs.join("topol.top"), TOPOLOGY).expect("topol.top");
    std::fs::write(inputs.join("md.mdp"), MDP).expect("md.mdp");
    let script = env.tmp.join("gmx.sh");
    std::fs::write(&script, GMX_SCRIPT).expect("gmx.sh");
    let inputs = inputs.to_str().expect("utf-8");
    let script = script.to_str().expect("utf-8");

    // Twice on the host: the sequence is deterministic, so the comparison below means
    // something.
    let on_host = |dir: &str| {
        let host = env.tmp.join(dir);
        std::fs::create_dir_all(&host).expect("host dir");
        let mut cmd = Command::new("/bin/sh");
        cmd.args([script, host.to_str().expect("utf-8"), inputs])
            .env_remove("LD_PRELOAD");
        let out = output_within(cmd, TIMEOUT);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "GROMACS on the host directory failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let reference = on_host("host-gmx-1");
    assert!(
        reference.contains("== restart: 2 runs in md.log")
            && reference.contains("== last step 200")
            && reference.contains("Potential"),
        "{reference}"
    );
    assert_eq!(
        on_host("host-gmx-2"),
        reference,
        "two GROMACS runs on the host differ: the test is not deterministic"
    );

    let store = format!("{}/gmx", env.mount);
    env.ok(&format!("mkdir {store}"));
    let out = output_within(
        env.cascade_run("/bin/sh", &[script, &store, inputs]),
        TIMEOUT,
    );
    let got = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "GROMACS in the store failed ({}):\nstdout:\n{got}\nstderr (last 40 lines):\n{}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stderr), 40)
    );
    assert_eq!(
        got, reference,
        "GROMACS's final energies differ in the store (left) from a host directory (right)"
    );
    // Everything GROMACS wrote is in the store, none of it torn.
    let levels = env.cascade(&["ls", "--levels"]);
    for f in [
        "conf.gro",
        "topol.top",
        "topol.tpr",
        "state.cpt",
        "ener.edr",
        "md.log",
    ] {
        let line = levels_line(&levels, &format!("/gmx/{f}")).unwrap_or_default();
        assert!(
            !line.is_empty() && !line.contains("torn"),
            "/gmx/{f}: {line:?}\n{levels}"
        );
    }
    assert!(
        !Path::new(&store).join("md.log").exists(),
        "GROMACS wrote to the host directory under the mount prefix"
    );
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
