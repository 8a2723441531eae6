//! put and get: copy between local files and the store in 1 MiB pieces, the size HPC
//! checkpoint writers typically use, with positional I/O on both sides.

use std::fs::File as LocalFile;
use std::io::{self, IsTerminal, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use cascade_config::{format_rate, format_size, Config};
use cascade_store::{OpenOptions, Store};
use indicatif::{ProgressBar, ProgressStyle};

use crate::admin::attach;
use crate::failure::Failure;
use crate::format::join;

const BUFFER_BYTES: usize = 1 << 20;
/// Smaller transfers finish before a progress bar would be worth drawing.
const PROGRESS_MIN_BYTES: u64 = 64 << 20;
const STDIO: &str = "-";

/// Where put reads from.
enum Source {
    /// Standard input, a pipe or a device: read until EOF.
    Stream(Box<dyn Read>),
    /// A regular file of known length: positional reads.
    File { file: LocalFile, len: u64 },
}

impl Source {
    /// Fills as much of `buf` as the source has left from `offset`; 0 at the end.
    fn read_next(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match self {
            Source::Stream(reader) => read_full(reader, buf),
            Source::File { file, len } => {
                let left = len.saturating_sub(offset);
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                read_at_full(file, &mut buf[..want], offset)
            }
        }
    }
}

pub fn put(
    config: &Config,
    local: &Path,
    store_path: &str,
    parents: bool,
) -> Result<ExitCode, Failure> {
    let local_name = local.display().to_string();
    let from_stdin = local.as_os_str() == STDIO;
    let (mut source, total, mode) = if from_stdin {
        (Source::Stream(Box::new(io::stdin().lock())), None, 0o644)
    } else {
        let file = LocalFile::open(local).map_err(|e| Failure::io(&local_name, &e))?;
        let meta = file.metadata().map_err(|e| Failure::io(&local_name, &e))?;
        if meta.is_dir() {
            return Err(Failure::new(format!("{local_name}: Is a directory")));
        } else if meta.is_file() {
            let len = meta.len();
            (Source::File { file, len }, Some(len), meta.mode() & 0o777)
        } else {
            // e.g. `cascade put <(generate) /x`: a pipe whose length is unknown.
            (Source::Stream(Box::new(file)), None, 0o644)
        }
    };

    let store = attach(config)?;
    let dest = destination_in_store(&store, store_path, local, from_stdin)?;
    if parents {
        if let Some(parent) = parent_of(&dest) {
            store
                .create_dir_all(parent, 0o755)
                .map_err(|err| Failure::store(parent, &err))?;
        }
    }
    let options = OpenOptions::new()
        .read(false)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode);
    let file = store.open(&dest, &options).map_err(|err| {
        let mut failure = Failure::store(&dest, &err);
        if err.errno() == libc::ENOENT && !parents {
            failure
                .message
                .push_str(" (put -p creates missing parent directories)");
        }
        failure
    })?;

    let started = Instant::now();
    let progress = progress_bar(total);
    let mut buffer = vec![0u8; BUFFER_BYTES];
    let mut offset: u64 = 0;
    loop {
        let filled = source
            .read_next(&mut buffer, offset)
            .map_err(|e| Failure::io(&local_name, &e))?;
        if filled == 0 {
            break;
        }
        if let Err(err) = file.write_all_at(&buffer[..filled], offset) {
            progress.abandon();
            let kept = file.len().unwrap_or(offset);
            let mut failure = Failure::store(&dest, &err);
            if err.errno() == libc::ENOSPC {
                let of_total = total.map(|t| format!(" of {t}")).unwrap_or_default();
                failure.message.push_str(&format!(
                    " after {offset}{of_total} bytes; the first {kept} bytes are kept ('cascade status' shows why)"
                ));
            }
            return Err(failure);
        }
        offset += filled as u64;
        progress.set_position(offset);
    }
    progress.finish_and_clear();
    drop(file);
    let seconds = started.elapsed().as_secs_f64();
    crate::format::summary_line(&summary("put", &local_name, &dest, offset, seconds));
    Ok(ExitCode::SUCCESS)
}

/// `put x /dir` stores /dir/x when /dir is an existing directory, as cp does.
fn destination_in_store(
    store: &Store,
    store_path: &str,
    local: &Path,
    from_stdin: bool,
) -> Result<String, Failure> {
    match store.stat(store_path) {
        Ok(meta) if meta.is_dir() => {
            let name = local.file_name().filter(|_| !from_stdin).ok_or_else(|| {
                Failure::new(format!(
                    "{store_path}: Is a directory (give a file name to store standard input under)"
                ))
            })?;
            Ok(join(store_path, &name.to_string_lossy()))
        }
        _ => Ok(store_path.to_string()),
    }
}

fn parent_of(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    let cut = trimmed.rfind('/')?;
    match &trimmed[..cut] {
        "" => None,
        parent => Some(parent),
    }
}

pub fn get(config: &Config, store_path: &str, local: &Path) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    let read_only = OpenOptions::new();
    let file = store
        .open(store_path, &read_only)
        .map_err(|err| Failure::store(store_path, &err))?;
    let meta = file
        .metadata()
        .map_err(|err| Failure::store(store_path, &err))?;
    if meta.is_dir() {
        return Err(Failure::new(format!("{store_path}: Is a directory")));
    }

    let to_stdout = local.as_os_str() == STDIO;
    let local_path = if !to_stdout && local.is_dir() {
        let name = file_name_of(store_path);
        local.join(name)
    } else {
        local.to_path_buf()
    };
    let local_name = if to_stdout {
        "standard output".to_string()
    } else {
        local_path.display().to_string()
    };
    let mut sink = if to_stdout {
        Sink::Stream(Box::new(io::stdout().lock()))
    } else {
        let out = LocalFile::create(&local_path).map_err(|e| Failure::io(&local_name, &e))?;
        let regular = out.metadata().map(|m| m.is_file()).unwrap_or(false);
        if regular {
            Sink::File(out)
        } else {
            // A pipe or device (`get x /dev/stdout`) cannot take positional writes.
            Sink::Stream(Box::new(out))
        }
    };

    let started = Instant::now();
    let progress = progress_bar(Some(meta.size));
    let mut buffer = vec![0u8; BUFFER_BYTES];
    let mut offset: u64 = 0;
    loop {
        let n = file
            .read_at(&mut buffer, offset)
            .map_err(|err| Failure::store(store_path, &err))?;
        if n == 0 {
            break;
        }
        sink.write_at(&buffer[..n], offset)
            .map_err(|e| Failure::io(&local_name, &e))?;
        offset += n as u64;
        progress.set_position(offset);
    }
    sink.finish().map_err(|e| Failure::io(&local_name, &e))?;
    progress.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let line = summary("get", store_path, &local_name, offset, seconds);
    // Data may be going to stdout (`-`, /dev/stdout): keep the summary out of it.
    if !crate::format::quiet() {
        if matches!(sink, Sink::Stream(_)) {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The last component of a store path, as the local file name for `get x DIR`.
fn file_name_of(store_path: &str) -> PathBuf {
    let name = store_path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    PathBuf::from(if name.is_empty() { "cascade.out" } else { name })
}

/// Where get writes to.
enum Sink {
    /// Standard output, a pipe or a device: sequential writes.
    Stream(Box<dyn Write>),
    /// A regular file: positional writes.
    File(LocalFile),
}

impl Sink {
    fn write_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        match self {
            Sink::Stream(out) => out.write_all(data),
            Sink::File(file) => file.write_all_at(data, offset),
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        match self {
            Sink::Stream(out) => out.flush(),
            Sink::File(_) => Ok(()),
        }
    }
}

/// Reads until `buf` is full or EOF, retrying EINTR.
fn read_at_full(file: &LocalFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Reads a stream until `buf` is full or EOF, so the store sees whole 1 MiB writes.
fn read_full(reader: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A byte progress bar on stderr for big transfers when a person is watching.
fn progress_bar(total: Option<u64>) -> ProgressBar {
    match total {
        Some(total) if total >= PROGRESS_MIN_BYTES && io::stderr().is_terminal() => {
            let style = ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(total).with_style(style)
        }
        _ => ProgressBar::hidden(),
    }
}

fn summary(verb: &str, from: &str, to: &str, bytes: u64, seconds: f64) -> String {
    format!(
        "{verb} {from} -> {to}: {bytes} bytes ({}) in {seconds:.3} s, {}",
        format_size(bytes),
        format_rate(bytes, seconds)
    )
}
