//! Commands about programs rather than the store: `link-flags` (linking a static program
//! against the wrappers) and `check-binary` (can LD_PRELOAD reach this program's I/O?).

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::dependencies::{self, NotElf, Object, Tree};
use crate::failure::{Failure, EXIT_FAILURE, EXIT_USAGE};
use crate::intercepted::Intercepted;
use crate::io_functions;

/// The static archive of the wrappers (`__wrap_NAME`), for programs linked with
/// `-Wl,--wrap=NAME`.
pub const WRAP_ARCHIVE: &str = "libcascade_wrap.a";
/// Libraries to link after the archive.
const WRAP_SYSTEM_LIBS: [&str; 4] = ["-lpthread", "-ldl", "-lm", "-lrt"];

/// Where the `cascade` executable's companions may be: its own directory (a cargo target
/// directory), then `../lib` (an installed `bin/` and `lib/` pair).
pub fn companion_paths(file_name: &str) -> Result<Vec<PathBuf>, Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::io("the cascade executable", &e))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let mut paths = vec![dir.join(file_name)];
    if let Some(prefix) = dir.parent() {
        paths.push(prefix.join("lib").join(file_name));
    }
    Ok(paths)
}

pub fn link_flags() -> Result<ExitCode, Failure> {
    let list = Intercepted::load()?;
    let candidates = companion_paths(WRAP_ARCHIVE)?;
    let archive = candidates.iter().find(|p| p.is_file());
    let mut out = String::new();
    for name in &list.wrapped {
        out.push_str(&format!("-Wl,--wrap={name}\n"));
    }
    if let Some(archive) = archive {
        out.push_str(&format!("{}\n", archive.display()));
        // What the Rust standard library inside the archive needs from the C library.
        for lib in WRAP_SYSTEM_LIBS {
            out.push_str(&format!("{lib}\n"));
        }
    }
    print!("{out}");
    if archive.is_none() {
        let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        return Err(Failure {
            message: format!(
                "{WRAP_ARCHIVE} is not built (looked for {}); build it with `cargo build -p cascade-wrap`",
                looked.join(" and ")
            ),
            code: 1,
        });
    }
    Ok(ExitCode::SUCCESS)
}

/// What kind of program a file is, as far as interposition is concerned.
#[derive(Debug, PartialEq, Eq)]
enum Linkage {
    /// Loaded by the dynamic linker, so LD_PRELOAD applies.
    Dynamic,
    /// No program interpreter and no shared libraries: nothing to preload into.
    Static,
    /// Built by the Go toolchain (`static` says whether it is also statically linked).
    Go { static_linked: bool },
}

fn linkage(program: &Object) -> Linkage {
    // A static-PIE program has a dynamic section but no interpreter and no libraries; a
    // shared library has no interpreter but does need libraries (and can be preloaded into).
    let static_linked = !program.has_interpreter && !program.needs_libraries;
    if program.go {
        Linkage::Go { static_linked }
    } else if static_linked {
        Linkage::Static
    } else {
        Linkage::Dynamic
    }
}

pub fn check_binary(program: &OsStr) -> Result<ExitCode, Failure> {
    let path = resolve_program(program);
    let shown = program.to_string_lossy().into_owned();
    let usage = |message: String| Failure {
        message,
        code: EXIT_USAGE,
    };
    let metadata = std::fs::metadata(&path).map_err(|e| usage(io_message(&shown, &e)))?;
    if metadata.is_dir() {
        return Err(usage(format!("{shown}: Is a directory")));
    }
    let file = File::open(&path).map_err(|e| usage(io_message(&shown, &e)))?;
    let object = dependencies::read_object(file).map_err(|why| match why {
        NotElf::Script(interpreter) => usage(format!(
            "{shown}: not an ELF file but a script for {interpreter}; check that program instead"
        )),
        NotElf::Other(what) => usage(format!("{shown}: not an ELF file ({what})")),
        NotElf::Io(e) => usage(io_message(&shown, &e)),
    })?;

    let mount_instead = "run it on a 'cascade mount' FUSE mount of the store instead";
    match linkage(&object) {
        Linkage::Go { static_linked } => {
            let linked = if static_linked {
                "statically linked "
            } else {
                ""
            };
            println!(
                "{shown} is a {linked}Go program: Go makes its system calls directly, not \
through libc, so LD_PRELOAD cannot reach its file I/O ({mount_instead})"
            );
            Ok(ExitCode::from(EXIT_FAILURE))
        }
        Linkage::Static => {
            println!(
                "{shown} is statically linked: there is no dynamic linker to load \
libcascade.so, so LD_PRELOAD cannot reach it ({mount_instead}, or relink it with the flags \
of 'cascade link-flags')"
            );
            Ok(ExitCode::from(EXIT_FAILURE))
        }
        Linkage::Dynamic => {
            let list = Intercepted::load()?;
            // The program is named by its file name among the importers, libraries by
            // the DT_NEEDED name they were loaded under.
            let label = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_else(|| shown.clone());
            let tree = dependencies::walk(&path, &object, &label);
            let (text, all_intercepted) = report(&shown, &label, &object, &tree, &list);
            print!("{text}");
            Ok(if all_intercepted {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_FAILURE)
            })
        }
    }
}

/// The report on a dynamic program and its library tree, and whether everything found is
/// intercepted and every library was found.
fn report(
    shown: &str,
    label: &str,
    program: &Object,
    tree: &Tree,
    list: &Intercepted,
) -> (String, bool) {
    let objects: Vec<(&str, &[String])> = std::iter::once((label, program.imports.as_slice()))
        .chain(
            tree.libraries
                .iter()
                .map(|lib| (lib.name.as_str(), lib.imports.as_slice())),
        )
        .collect();
    // Each file-I/O function once, with the objects that import it.
    let mut file_io = 0;
    let mut missing: Vec<(&str, &str, Vec<&str>)> = Vec::new();
    for (name, note) in io_functions::FILE_IO_FUNCTIONS {
        let importers: Vec<&str> = objects
            .iter()
            .filter(|(_, imports)| imports.binary_search_by(|i| i.as_str().cmp(name)).is_ok())
            .map(|(object, _)| *object)
            .collect();
        if importers.is_empty() {
            continue;
        }
        file_io += 1;
        if !list.covers(name) {
            missing.push((name, note, importers));
        }
    }

    let mut out = String::new();
    for lost in &tree.not_found {
        out.push_str(&format!(
            "{} => not found (needed by {}); its imports are not checked\n",
            lost.name, lost.needed_by
        ));
    }
    let width = missing.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    for (name, note, importers) in &missing {
        out.push_str(&format!(
            "{name:<width$}  not intercepted: {note}; imported by {}\n",
            importers.join(", ")
        ));
    }
    let libraries = tree.libraries.len();
    let subject = match libraries {
        0 => shown.to_string(),
        1 => format!("{shown} and its 1 library"),
        n => format!("{shown} and its {n} libraries"),
    };
    if missing.is_empty() {
        out.push_str(&format!(
            "all {file_io} file-I/O imports of {subject} are intercepted"
        ));
    } else {
        out.push_str(&format!(
            "{} of {file_io} file-I/O imports of {subject} are not intercepted",
            missing.len()
        ));
    }
    match tree.not_found.len() {
        0 => {}
        1 => out.push_str("; 1 needed library was not found"),
        n => out.push_str(&format!("; {n} needed libraries were not found")),
    }
    out.push('\n');
    (out, missing.is_empty() && tree.not_found.is_empty())
}

/// "cat" means ./cat if there is one, else the `cat` that PATH finds, as a shell would.
fn resolve_program(program: &OsStr) -> PathBuf {
    let given = PathBuf::from(program);
    if given.components().count() != 1 || given.exists() {
        return given;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(&given))
        .find(|candidate| candidate.is_file())
        .unwrap_or(given)
}

fn io_message(shown: &str, err: &std::io::Error) -> String {
    format!("{shown}: {}", cascade_config::io_text(err))
}
