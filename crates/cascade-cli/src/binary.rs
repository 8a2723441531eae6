//! Commands about programs rather than the store: `link-flags` (linking a static program
//! against the wrappers) and `check-binary` (can LD_PRELOAD reach this program's I/O?).

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use object::elf;
use object::read::elf::{Dyn, ElfFile, FileHeader, ProgramHeader};
use object::read::ReadCache;
use object::{Endianness, FileKind, Object, ObjectSymbol, ReadRef};

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
    /// Loaded by the dynamic linker, so LD_PRELOAD applies; its undefined dynamic symbols.
    Dynamic { imports: Vec<String> },
    /// No program interpreter and no shared libraries: nothing to preload into.
    Static,
    /// Built by the Go toolchain (`static` says whether it is also statically linked).
    Go { static_linked: bool },
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
    let linkage = read_linkage(file).map_err(|why| match why {
        NotElf::Script(interpreter) => usage(format!(
            "{shown}: not an ELF file but a script for {interpreter}; check that program instead"
        )),
        NotElf::Other(what) => usage(format!("{shown}: not an ELF file ({what})")),
        NotElf::Io(e) => usage(io_message(&shown, &e)),
    })?;

    let mount_instead = "run it on a 'cascade mount' FUSE mount of the store instead";
    match linkage {
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
        Linkage::Dynamic { imports } => {
            let list = Intercepted::load()?;
            let file_io: Vec<(&str, &str)> = io_functions::FILE_IO_FUNCTIONS
                .iter()
                .filter(|(name, _)| imports.iter().any(|i| i == name))
                .copied()
                .collect();
            let missing: Vec<(&str, &str)> = file_io
                .iter()
                .filter(|(name, _)| !list.covers(name))
                .copied()
                .collect();
            if missing.is_empty() {
                println!(
                    "all {} file-I/O imports of {shown} are intercepted",
                    file_io.len()
                );
                return Ok(ExitCode::SUCCESS);
            }
            let width = missing.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            let mut out = String::new();
            for (name, note) in &missing {
                out.push_str(&format!("{name:<width$}  not intercepted: {note}\n"));
            }
            out.push_str(&format!(
                "{} of {} file-I/O imports of {shown} are not intercepted\n",
                missing.len(),
                file_io.len()
            ));
            print!("{out}");
            Ok(ExitCode::from(EXIT_FAILURE))
        }
    }
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

enum NotElf {
    /// A `#!` script, with its interpreter.
    Script(String),
    /// Something else; the text says what.
    Other(String),
    Io(std::io::Error),
}

fn read_linkage(mut file: File) -> Result<Linkage, NotElf> {
    let mut head = [0u8; 256];
    let n = read_up_to(&mut file, &mut head).map_err(NotElf::Io)?;
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
        let interpreter = String::from_utf8_lossy(line).trim().to_string();
        return Err(NotElf::Script(interpreter));
    }
    if !head.starts_with(&elf::ELFMAG) {
        return Err(NotElf::Other("no ELF magic number".to_string()));
    }
    let cache = ReadCache::new(file);
    let malformed = |e: object::Error| NotElf::Other(format!("malformed: {e}"));
    match FileKind::parse(&cache).map_err(malformed)? {
        FileKind::Elf64 => {
            linkage(&ElfFile::<elf::FileHeader64<Endianness>, _>::parse(&cache).map_err(malformed)?)
        }
        FileKind::Elf32 => {
            linkage(&ElfFile::<elf::FileHeader32<Endianness>, _>::parse(&cache).map_err(malformed)?)
        }
        other => Err(NotElf::Other(format!("{other:?}"))),
    }
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn linkage<'data, Elf, R>(file: &ElfFile<'data, Elf, R>) -> Result<Linkage, NotElf>
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let endian = file.endian();
    let data = file.data();
    let mut has_interpreter = false;
    let mut needs_libraries = false;
    let mut go_note = false;
    for segment in file.elf_program_headers() {
        match segment.p_type(endian) {
            elf::PT_INTERP => has_interpreter = true,
            elf::PT_DYNAMIC => {
                if let Ok(Some(entries)) = segment.dynamic(endian, data) {
                    needs_libraries |= entries
                        .iter()
                        .any(|d| d.d_tag(endian).into() == u64::from(elf::DT_NEEDED));
                }
            }
            elf::PT_NOTE => {
                if let Ok(Some(mut notes)) = segment.notes(endian, data) {
                    while let Ok(Some(note)) = notes.next() {
                        go_note |= note.name() == b"Go";
                    }
                }
            }
            _ => {}
        }
    }
    let go_section = [".go.buildinfo", ".note.go.buildid", ".gopclntab"]
        .iter()
        .any(|name| file.section_by_name(name).is_some());
    // A static-PIE program has a dynamic section but no interpreter and no libraries; a
    // shared library has no interpreter but does need libraries (and can be preloaded into).
    let static_linked = !has_interpreter && !needs_libraries;
    if go_note || go_section {
        return Ok(Linkage::Go { static_linked });
    }
    if static_linked {
        return Ok(Linkage::Static);
    }
    let mut imports: Vec<String> = file
        .dynamic_symbols()
        .filter(|symbol| symbol.is_undefined())
        .filter_map(|symbol| symbol.name().ok().map(str::to_string))
        .filter(|name| !name.is_empty())
        .collect();
    imports.sort_unstable();
    imports.dedup();
    Ok(Linkage::Dynamic { imports })
}
