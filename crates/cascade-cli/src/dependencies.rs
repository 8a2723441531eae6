//! What `cascade check-binary` reads from ELF files, and the tree of shared libraries a
//! dynamic program loads, found the way glibc's dynamic linker (and `ldd`) finds them but
//! without running the program.
//!
//! For each DT_NEEDED name, breadth first from the program as the linker loads them: a name
//! with a slash is a path; otherwise the DT_RPATH of the loading object and of the objects
//! that loaded it (only if the loading object has no DT_RUNPATH; an object's own DT_RPATH
//! is ignored if it has a DT_RUNPATH), LD_LIBRARY_PATH, the DT_RUNPATH of the loading
//! object, `/etc/ld.so.cache`, then the default directories (the last two not for an
//! object linked with `-z nodeflib`). A candidate of another ELF class, byte order or
//! machine is passed over, as the linker passes it over. A name already resolved is not
//! searched again (the linker matches it against the objects it has loaded), and a file
//! reached under two names is read once. glibc-hwcaps subdirectories are not searched.
//!
//! glibc's own libraries (libc, libm, libpthread, ld.so, ...) are neither searched nor
//! read: what they import from each other is glibc's implementation, and the program's
//! calls into them are already seen as imports of the calling object.

use std::cell::OnceCell;
use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{Dyn, ElfFile, FileHeader, ProgramHeader};
use object::read::ReadCache;
use object::{Endian, Endianness, FileKind, Object as _, ObjectSymbol, ReadRef};

/// The cache `ldconfig` writes, parsed here rather than running `ldconfig -p`.
const LD_CACHE: &str = "/etc/ld.so.cache";

/// What the dynamic linker requires of a library to load it into a program: the same ELF
/// class, byte order and machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfKind {
    pub is_64: bool,
    pub big_endian: bool,
    pub machine: u16,
}

/// The facts of one ELF file that check-binary uses.
#[derive(Debug)]
pub struct Object {
    pub kind: ElfKind,
    pub has_interpreter: bool,
    /// Has a DT_NEEDED entry (read from PT_DYNAMIC, so also without section headers).
    pub needs_libraries: bool,
    /// Built by the Go toolchain (a Go note or Go sections).
    pub go: bool,
    pub needed: Vec<String>,
    pub rpath: Option<String>,
    pub runpath: Option<String>,
    /// DF_1_NODEFLIB: its dependencies are not looked up in the cache or default dirs.
    pub nodeflib: bool,
    /// Undefined dynamic symbols, sorted, without duplicates.
    pub imports: Vec<String>,
}

/// Why a file is not an ELF object.
pub enum NotElf {
    /// A `#!` script, with its interpreter.
    Script(String),
    /// Something else; the text says what.
    Other(String),
    Io(std::io::Error),
}

pub fn read_object(mut file: File) -> Result<Object, NotElf> {
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
        FileKind::Elf64 => Ok(facts(
            &ElfFile::<elf::FileHeader64<Endianness>, _>::parse(&cache).map_err(malformed)?,
        )),
        FileKind::Elf32 => Ok(facts(
            &ElfFile::<elf::FileHeader32<Endianness>, _>::parse(&cache).map_err(malformed)?,
        )),
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

fn facts<'data, Elf, R>(file: &ElfFile<'data, Elf, R>) -> Object
where
    Elf: FileHeader<Endian = Endianness>,
    R: ReadRef<'data>,
{
    let endian = file.endian();
    let data = file.data();
    let kind = ElfKind {
        is_64: file.elf_header().is_class_64(),
        big_endian: endian.is_big_endian(),
        machine: file.elf_header().e_machine(endian),
    };
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

    // The names need the dynamic string table, which the section headers locate.
    let mut needed = Vec::new();
    let mut rpath = None;
    let mut runpath = None;
    let mut nodeflib = false;
    let sections = file.elf_section_table();
    if let Ok(Some((entries, link))) = sections.dynamic(endian, data) {
        let strings = sections.strings(endian, data, link).unwrap_or_default();
        for entry in entries {
            let text = || {
                let offset = entry.val32(endian)?;
                let bytes = strings.get(offset).ok()?;
                Some(String::from_utf8_lossy(bytes).into_owned())
            };
            match entry.tag32(endian) {
                Some(elf::DT_NULL) => break,
                Some(elf::DT_NEEDED) => needed.extend(text()),
                Some(elf::DT_RPATH) => rpath = text(),
                Some(elf::DT_RUNPATH) => runpath = text(),
                Some(elf::DT_FLAGS_1) => {
                    nodeflib = entry.d_val(endian).into() & u64::from(elf::DF_1_NODEFLIB) != 0
                }
                _ => {}
            }
        }
    }

    let mut imports: Vec<String> = file
        .dynamic_symbols()
        .filter(|symbol| symbol.is_undefined())
        .filter_map(|symbol| symbol.name().ok().map(str::to_string))
        .filter(|name| !name.is_empty())
        .collect();
    imports.sort_unstable();
    imports.dedup();
    Object {
        kind,
        has_interpreter,
        needs_libraries: needs_libraries || !needed.is_empty(),
        go: go_note || go_section,
        needed,
        rpath,
        runpath,
        nodeflib,
        imports,
    }
}

/// glibc's libraries by the name before `.so` (ld.so is `ld-linux*`, `ld64` or `ld`).
const GLIBC_LIBRARIES: &[&str] = &[
    "libc",
    "libm",
    "libmvec",
    "libpthread",
    "libdl",
    "librt",
    "libresolv",
    "libutil",
    "libanl",
    "libnsl",
    "libcidn",
    "libBrokenLocale",
    "libthread_db",
    "libc_malloc_debug",
    "libmemusage",
    "libpcprofile",
    "libSegFault",
    "ld",
    "ld64",
];

/// Whether a DT_NEEDED name is one of glibc's own libraries.
pub fn is_glibc(needed: &str) -> bool {
    let file = needed.rsplit('/').next().unwrap_or(needed);
    let stem = file.split(".so").next().unwrap_or(file);
    GLIBC_LIBRARIES.contains(&stem) || stem.starts_with("ld-linux") || stem.starts_with("libnss_")
}

/// A library of the tree, read.
#[derive(Debug)]
pub struct Library {
    /// The DT_NEEDED name it was first asked for by (its soname, as a rule).
    pub name: String,
    pub imports: Vec<String>,
}

/// A needed library that no search found.
#[derive(Debug)]
pub struct NotFound {
    pub name: String,
    /// The object that needs it: the program's label or a library's name.
    pub needed_by: String,
}

#[derive(Debug, Default)]
pub struct Tree {
    /// In load order (breadth first), each once; glibc's libraries are not included.
    pub libraries: Vec<Library>,
    pub not_found: Vec<NotFound>,
}

/// An object in the walk: what its dependencies are looked up with.
struct Node {
    label: String,
    needed: Vec<String>,
    rpath: Vec<PathBuf>,
    runpath: Option<Vec<PathBuf>>,
    nodeflib: bool,
    /// The object that loaded it (DT_RPATH is inherited down this chain).
    loader: Option<usize>,
}

/// The library tree of `program` (at `path`, already read), `label` naming it in the tree.
pub fn walk(path: &Path, program: &Object, label: &str) -> Tree {
    let walker = Walker::new(program.kind);
    // The linker takes the program's $ORIGIN from /proc/self/exe: symbolic links resolved.
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| absolute(path));
    let mut nodes = vec![walker.node(label.to_string(), &real, program, None)];
    let mut tree = Tree::default();
    let mut by_name: HashSet<String> = HashSet::new();
    let mut by_file: HashSet<PathBuf> = HashSet::from([real]);
    let mut queue = VecDeque::from([0usize]);
    while let Some(index) = queue.pop_front() {
        for name in nodes[index].needed.clone() {
            if is_glibc(&name) || !by_name.insert(name.clone()) {
                continue;
            }
            let Some((found, object)) = walker.find(&name, index, &nodes) else {
                tree.not_found.push(NotFound {
                    name,
                    needed_by: nodes[index].label.clone(),
                });
                continue;
            };
            let real = std::fs::canonicalize(&found).unwrap_or_else(|_| found.clone());
            if !by_file.insert(real) {
                continue;
            }
            queue.push_back(nodes.len());
            nodes.push(walker.node(name.clone(), &found, &object, Some(index)));
            tree.libraries.push(Library {
                name,
                imports: object.imports,
            });
        }
    }
    tree
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

struct Walker {
    kind: ElfKind,
    ld_library_path: Vec<PathBuf>,
    /// (name, path, hwcap) of `/etc/ld.so.cache`, read on first use; empty if unreadable.
    cache: OnceCell<Vec<CacheEntry>>,
    defaults: Vec<PathBuf>,
    /// What `$LIB` and `$PLATFORM` expand to.
    lib: String,
    platform: Option<&'static str>,
}

impl Walker {
    fn new(kind: ElfKind) -> Walker {
        let triple = multiarch(kind);
        let lib = match triple {
            Some(t) if Path::new("/usr/lib").join(t).is_dir() => format!("lib/{t}"),
            _ if kind.is_64 => "lib64".to_string(),
            _ => "lib".to_string(),
        };
        let wide = if kind.is_64 { "64" } else { "32" };
        let mut defaults = Vec::new();
        if let Some(t) = triple {
            defaults.push(PathBuf::from("/lib").join(t));
            defaults.push(PathBuf::from("/usr/lib").join(t));
        }
        for dir in [format!("/lib{wide}"), format!("/usr/lib{wide}")] {
            defaults.push(PathBuf::from(dir));
        }
        defaults.push(PathBuf::from("/lib"));
        defaults.push(PathBuf::from("/usr/lib"));
        let ld_library_path = std::env::var("LD_LIBRARY_PATH")
            .map(|value| {
                value
                    .split([':', ';'])
                    .map(|dir| PathBuf::from(if dir.is_empty() { "." } else { dir }))
                    .collect()
            })
            .unwrap_or_default();
        Walker {
            kind,
            ld_library_path,
            cache: OnceCell::new(),
            defaults,
            lib,
            platform: platform(kind),
        }
    }

    fn node(&self, label: String, path: &Path, object: &Object, loader: Option<usize>) -> Node {
        let origin = absolute(path)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let dirs = |list: &str| -> Vec<PathBuf> {
            list.split(':')
                .map(|dir| {
                    PathBuf::from(self.expand(if dir.is_empty() { "." } else { dir }, &origin))
                })
                .collect()
        };
        Node {
            label,
            needed: object
                .needed
                .iter()
                .map(|name| self.expand(name, &origin))
                .collect(),
            rpath: object.rpath.as_deref().map(dirs).unwrap_or_default(),
            runpath: object.runpath.as_deref().map(dirs),
            nodeflib: object.nodeflib,
            loader,
        }
    }

    /// `$ORIGIN`, `$LIB` and `$PLATFORM` (also in braces); other `$` text is kept as is,
    /// as the linker keeps it.
    fn expand(&self, text: &str, origin: &Path) -> String {
        let origin = origin.to_string_lossy();
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            rest = &rest[at..];
            let tokens = [
                ("ORIGIN", Some(origin.as_ref())),
                ("LIB", Some(self.lib.as_str())),
                ("PLATFORM", self.platform),
            ];
            let matched = tokens.iter().find_map(|(token, value)| {
                let braced = format!("${{{token}}}");
                let bare = format!("${token}");
                if rest.starts_with(&braced) {
                    return Some((braced.len(), *value));
                }
                let after = rest.get(bare.len()..).unwrap_or_default();
                let ends = !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
                (rest.starts_with(&bare) && ends).then_some((bare.len(), *value))
            });
            match matched {
                Some((len, Some(value))) => {
                    out.push_str(value);
                    rest = &rest[len..];
                }
                _ => {
                    out.push('$');
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Where the linker would find `name` for the object `nodes[index]`, and the file read.
    fn find(&self, name: &str, index: usize, nodes: &[Node]) -> Option<(PathBuf, Object)> {
        if name.contains('/') {
            let path = PathBuf::from(name);
            return self.load(&path).map(|object| (path, object));
        }
        let node = &nodes[index];
        let mut dirs: Vec<&Path> = Vec::new();
        if node.runpath.is_none() {
            let mut next = Some(index);
            while let Some(at) = next {
                if nodes[at].runpath.is_none() {
                    dirs.extend(nodes[at].rpath.iter().map(PathBuf::as_path));
                }
                next = nodes[at].loader;
            }
        }
        dirs.extend(self.ld_library_path.iter().map(PathBuf::as_path));
        dirs.extend(node.runpath.iter().flatten().map(PathBuf::as_path));
        let found = dirs
            .into_iter()
            .map(|dir| dir.join(name))
            .find_map(|path| self.load(&path).map(|object| (path, object)));
        if found.is_some() || node.nodeflib {
            return found;
        }
        let cache = self.cache.get_or_init(|| {
            std::fs::read(LD_CACHE)
                .ok()
                .and_then(|bytes| parse_ld_cache(&bytes))
                .unwrap_or_default()
        });
        // Entries of glibc-hwcaps subdirectories (hwcap set) after the baseline ones.
        let mut cached: Vec<&CacheEntry> = cache.iter().filter(|e| e.name == name).collect();
        cached.sort_by_key(|entry| entry.hwcap != 0);
        cached
            .into_iter()
            .map(|entry| PathBuf::from(&entry.path))
            .chain(self.defaults.iter().map(|dir| dir.join(name)))
            .find_map(|path| self.load(&path).map(|object| (path, object)))
    }

    /// The file at `path` if the linker would load it into this program.
    fn load(&self, path: &Path) -> Option<Object> {
        let file = File::open(path).ok()?;
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        read_object(file)
            .ok()
            .filter(|object| object.kind == self.kind)
    }
}

/// The Debian multiarch directory name for programs of this kind.
fn multiarch(kind: ElfKind) -> Option<&'static str> {
    Some(match (kind.machine, kind.is_64, kind.big_endian) {
        (elf::EM_X86_64, true, _) => "x86_64-linux-gnu",
        (elf::EM_X86_64, false, _) => "x86_64-linux-gnux32",
        (elf::EM_386, false, _) => "i386-linux-gnu",
        (elf::EM_AARCH64, true, false) => "aarch64-linux-gnu",
        (elf::EM_ARM, false, false) => "arm-linux-gnueabihf",
        (elf::EM_PPC64, true, false) => "powerpc64le-linux-gnu",
        (elf::EM_PPC64, true, true) => "powerpc64-linux-gnu",
        (elf::EM_RISCV, true, _) => "riscv64-linux-gnu",
        (elf::EM_S390, true, _) => "s390x-linux-gnu",
        _ => return None,
    })
}

/// What the kernel's AT_PLATFORM says on the usual machines of this kind.
fn platform(kind: ElfKind) -> Option<&'static str> {
    match kind.machine {
        elf::EM_X86_64 => Some("x86_64"),
        elf::EM_386 => Some("i686"),
        elf::EM_AARCH64 => Some("aarch64"),
        _ => None,
    }
}

/// One library of `/etc/ld.so.cache`.
#[derive(Debug, PartialEq, Eq)]
struct CacheEntry {
    name: String,
    path: String,
    /// Non-zero for a library of a glibc-hwcaps subdirectory (or a legacy hwcap one).
    hwcap: u64,
}

const CACHE_OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const CACHE_NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const CACHE_NEW_HEADER: usize = 48;
const CACHE_NEW_ENTRY: usize = 24;

/// The entries of a "glibc-ld.so.cache1.1" cache (alone, as glibc 2.32 and later write it,
/// or after an old "ld.so-1.7.0" one), in the byte order of this machine; None if the
/// bytes are not such a cache.
///
/// Header: magic and version (20 bytes), nlibs u32, len_strings u32, flags u8 (byte order
/// in bits 0-1: 2 little, 3 big), 3 padding, extension_offset u32, 3 unused u32. Entries:
/// flags i32, key u32, value u32, osversion u32, hwcap u64; key and value are offsets of
/// NUL-terminated strings from the start of the new header.
fn parse_ld_cache(bytes: &[u8]) -> Option<Vec<CacheEntry>> {
    let u32_at = |data: &[u8], at: usize| -> Option<u32> {
        let raw = data.get(at..at.checked_add(4)?)?;
        Some(u32::from_ne_bytes(raw.try_into().ok()?))
    };
    let start = if bytes.starts_with(CACHE_OLD_MAGIC) {
        // Old header: magic padded to 12 bytes, nlibs u32; 12-byte entries; the new cache
        // follows, aligned to 8.
        let old_libs = usize::try_from(u32_at(bytes, 12)?).ok()?;
        let end = old_libs.checked_mul(12)?.checked_add(16)?;
        end.checked_add(7)? & !7
    } else {
        0
    };
    let cache = bytes.get(start..)?;
    if !cache.starts_with(CACHE_NEW_MAGIC) {
        return None;
    }
    let order = cache.get(28)? & 3;
    let native = if cfg!(target_endian = "big") { 3 } else { 2 };
    if order != 0 && order != native {
        return None;
    }
    let count = usize::try_from(u32_at(cache, 20)?).ok()?;
    let string = |offset: u32| -> Option<String> {
        let tail = cache.get(usize::try_from(offset).ok()?..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&tail[..end]).into_owned())
    };
    let mut entries = Vec::with_capacity(count.min(1 << 16));
    for index in 0..count {
        let at = CACHE_NEW_HEADER.checked_add(index.checked_mul(CACHE_NEW_ENTRY)?)?;
        let entry = cache.get(at..at.checked_add(CACHE_NEW_ENTRY)?)?;
        let hwcap = u64::from_ne_bytes(entry.get(16..24)?.try_into().ok()?);
        entries.push(CacheEntry {
            name: string(u32_at(entry, 4)?)?,
            path: string(u32_at(entry, 8)?)?,
            hwcap,
        });
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_libraries_are_recognised_by_name() {
        for name in [
            "libc.so.6",
            "libm.so.6",
            "libpthread.so.0",
            "libdl.so.2",
            "librt.so.1",
            "libresolv.so.2",
            "ld-linux-x86-64.so.2",
            "/lib64/ld-linux-x86-64.so.2",
            "ld64.so.2",
            "libnss_files.so.2",
        ] {
            assert!(is_glibc(name), "{name}");
        }
        for name in [
            "libz.so.1",
            "libcrypt.so.1",
            "libcurl.so.4",
            "libmd.so.0",
            "libgromacs.so.7",
        ] {
            assert!(!is_glibc(name), "{name}");
        }
    }

    fn walker() -> Walker {
        let mut walker = Walker::new(ElfKind {
            is_64: true,
            big_endian: false,
            machine: elf::EM_X86_64,
        });
        walker.lib = "lib64".to_string();
        walker
    }

    #[test]
    fn origin_lib_and_platform_expand_and_other_dollars_stay() {
        let w = walker();
        let origin = Path::new("/opt/app/bin");
        assert_eq!(w.expand("$ORIGIN/../lib", origin), "/opt/app/bin/../lib");
        assert_eq!(w.expand("${ORIGIN}/x:$LIB", origin), "/opt/app/bin/x:lib64");
        assert_eq!(w.expand("/p/$PLATFORM/${LIB}", origin), "/p/x86_64/lib64");
        assert_eq!(w.expand("$ORIGINAL/$HOME/$", origin), "$ORIGINAL/$HOME/$");
        assert_eq!(w.expand("plain", origin), "plain");
    }

    /// A cache in the new format, as `ldconfig` writes it, with the given entries.
    fn cache_bytes(entries: &[(&str, &str, u64)]) -> Vec<u8> {
        let strings_at = CACHE_NEW_HEADER + entries.len() * CACHE_NEW_ENTRY;
        let mut strings = Vec::new();
        let mut table = Vec::new();
        for (name, path, hwcap) in entries {
            let key = (strings_at + strings.len()) as u32;
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            let value = (strings_at + strings.len()) as u32;
            strings.extend_from_slice(path.as_bytes());
            strings.push(0);
            table.extend_from_slice(&0x303i32.to_ne_bytes());
            table.extend_from_slice(&key.to_ne_bytes());
            table.extend_from_slice(&value.to_ne_bytes());
            table.extend_from_slice(&0u32.to_ne_bytes());
            table.extend_from_slice(&hwcap.to_ne_bytes());
        }
        let mut out = CACHE_NEW_MAGIC.to_vec();
        out.extend_from_slice(&(entries.len() as u32).to_ne_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_ne_bytes());
        out.push(if cfg!(target_endian = "big") { 3 } else { 2 });
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&[0; 16]);
        out.extend(table);
        out.extend(strings);
        out
    }

    #[test]
    fn ld_cache_entries_are_read_and_junk_is_refused() {
        let bytes = cache_bytes(&[
            ("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", 0),
            (
                "libfoo.so.2",
                "/usr/lib/glibc-hwcaps/x86-64-v3/libfoo.so.2",
                1 << 62,
            ),
        ]);
        let entries = parse_ld_cache(&bytes).expect("parses");
        assert_eq!(
            entries,
            [
                CacheEntry {
                    name: "libz.so.1".into(),
                    path: "/lib/x86_64-linux-gnu/libz.so.1".into(),
                    hwcap: 0
                },
                CacheEntry {
                    name: "libfoo.so.2".into(),
                    path: "/usr/lib/glibc-hwcaps/x86-64-v3/libfoo.so.2".into(),
                    hwcap: 1 << 62
                },
            ]
        );
        // Truncated anywhere: refused, no panic.
        for len in 0..bytes.len() {
            let _ = parse_ld_cache(&bytes[..len]);
        }
        assert!(parse_ld_cache(&bytes[..bytes.len() - 3]).is_none());
        assert!(parse_ld_cache(b"not a cache at all, not at all").is_none());
    }

    #[test]
    fn the_real_ld_cache_finds_libc() {
        let Ok(bytes) = std::fs::read(LD_CACHE) else {
            return; // A system without a cache (musl, some containers).
        };
        let entries = parse_ld_cache(&bytes).expect("/etc/ld.so.cache parses");
        let libc = entries
            .iter()
            .find(|e| e.name == "libc.so.6")
            .expect("libc.so.6 in the cache");
        assert!(Path::new(&libc.path).is_file(), "{libc:?}");
    }
}
