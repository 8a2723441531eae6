//! `cascade._native`: the node store, commit, wait, levels and status for Python, over the
//! same crates the `cascade` command uses (cascade-store, cascade-config, cascade-lifecycle).
//! The public API is the pure-Python package in python/cascade, which wraps these classes in
//! `io` objects and turns errors into its exception classes (docs/python.md).

use std::time::Duration;

use cascade_agent::{ReadThrough, ReadThroughRequest};
use cascade_config::{Config, Inputs};
use cascade_lifecycle::Level;
use cascade_store::{FileKind, OpenOptions, Store};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;

/// The factory python/cascade/_errors.py registers: `(kind, errno, message) -> exception`.
static ERROR_FACTORY: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// What went wrong, before it becomes a Python exception.
enum Kind {
    /// An operation failed (errno and the one-line reason).
    Store,
    /// There is no store to attach.
    NoStore,
    /// The path is not a path in the store.
    Outside,
}

fn raise(py: Python<'_>, kind: Kind, errno: i32, message: String) -> PyErr {
    let kind = match kind {
        Kind::Store => "store",
        Kind::NoStore => "nostore",
        Kind::Outside => "outside",
    };
    if let Some(factory) = ERROR_FACTORY.get(py) {
        match factory.call1(py, (kind, errno, message.clone())) {
            Ok(exc) => return PyErr::from_value(exc.into_bound(py)),
            Err(e) => return e,
        }
    }
    // OSError(errno, text) picks the subclass (FileNotFoundError for ENOENT, ...).
    PyOSError::new_err((errno, message))
}

/// A failed operation: the package's StoreError subclass for `errno`.
fn failure(errno: i32, message: String) -> PyErr {
    Python::with_gil(|py| raise(py, Kind::Store, errno, message))
}

fn store_err(path: &str, err: &cascade_store::Error) -> PyErr {
    failure(
        err.errno(),
        cascade_lifecycle::Error::store(path, err).message,
    )
}

fn lifecycle_err(err: cascade_lifecycle::Error) -> PyErr {
    // Lifecycle failures without an errno (no agent, a torn file) are EIO-like: the level
    // cannot be reached; keep EIO so `except OSError` callers see a number.
    failure(err.errno.unwrap_or(libc::EIO), err.message)
}

#[pyfunction]
fn _set_error_factory(py: Python<'_>, factory: Py<PyAny>) {
    // Set once at import; a second import of the package reuses the first factory.
    let _ = ERROR_FACTORY.set(py, factory);
}

fn load_config(name: Option<&str>) -> PyResult<Config> {
    let mut inputs = Inputs::from_process();
    if let Some(name) = name {
        inputs.flags.push(("store.name", name.to_string()));
    }
    Config::load(&inputs).map_err(|e| failure(libc::EINVAL, e.0))
}

/// An attached store and the configuration it was found with.
#[pyclass(module = "cascade._native", frozen)]
struct NativeStore {
    store: Store,
    config: Config,
}

/// Lexically normalised store path of `path`: the mount prefix (e.g. "/cascade") is
/// stripped; relative paths and ".." above the root are outside the store.
fn store_path(prefix: &str, path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!(
            "{path}: not a path in the store (give an absolute path, /run1/ckpt.1 or {prefix}/run1/ckpt.1)"
        ));
    }
    let prefix = prefix.trim_end_matches('/');
    let rest = match path.strip_prefix(prefix) {
        Some(rest) if !prefix.is_empty() && (rest.is_empty() || rest.starts_with('/')) => rest,
        _ => path,
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in rest.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!(
                        "{path}: not a path in the store (.. above its root)"
                    ));
                }
            }
            c => parts.push(c),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

impl NativeStore {
    fn path(&self, path: &str) -> PyResult<String> {
        store_path(self.config.mount_prefix(), path)
            .map_err(|m| Python::with_gil(|py| raise(py, Kind::Outside, libc::EINVAL, m)))
    }

    /// Runs `op` on store path `p`; if it fails with ENOENT and the node agent brings the
    /// path in from the levels below (read-through, as the preload library does for a
    /// program), runs it once more. Without an agent the ENOENT stands.
    fn with_read_through<T>(
        &self,
        shown: &str,
        p: &str,
        op: impl Fn() -> Result<T, cascade_store::Error>,
    ) -> PyResult<T> {
        let missing = match op() {
            Err(e) if e.errno() == libc::ENOENT => e,
            other => return other.map_err(|e| store_err(shown, &e)),
        };
        let name = self.store.name();
        // Listing the parent brings the name (a stat needs no more); else fetch the path.
        if let Some((parent, _)) = p.rsplit_once('/') {
            let parent = if parent.is_empty() { "/" } else { parent };
            if cascade_agent::read_through(name, ReadThroughRequest::List, parent)
                == ReadThrough::Done
            {
                if let found @ Ok(_) = op() {
                    return found.map_err(|e| store_err(shown, &e));
                }
            }
        }
        if self.fetch(shown, p)? {
            op().map_err(|e| store_err(shown, &e))
        } else {
            Err(store_err(shown, &missing))
        }
    }

    /// Asks the node agent to fetch `p` from the levels below: true once it is in the store,
    /// false when no agent runs, the agent's error otherwise.
    fn fetch(&self, shown: &str, p: &str) -> PyResult<bool> {
        match cascade_agent::read_through(self.store.name(), ReadThroughRequest::Fetch, p) {
            ReadThrough::Done => Ok(true),
            ReadThrough::NoAgent => Ok(false),
            ReadThrough::Failed { errno, message } => {
                Err(failure(errno, format!("{shown}: {message}")))
            }
        }
    }

    /// Opens `p`, reading it through from the levels below when the store lacks it, or has
    /// only its name (a remote file: listed from below, or evicted from memory).
    fn open_through(
        &self,
        shown: &str,
        p: &str,
        opts: &OpenOptions,
    ) -> PyResult<cascade_store::File> {
        let again = OpenOptions {
            create_new: false,
            ..*opts
        };
        let mut file = if opts.create_new {
            self.store.open(p, opts).map_err(|e| store_err(shown, &e))?
        } else {
            self.with_read_through(shown, p, || self.store.open(p, opts))?
        };
        // Another process's fetch may replace the remote file again before we open it.
        for _ in 0..4 {
            if !file.is_remote() {
                return Ok(file);
            }
            drop(file);
            if !self.fetch(shown, p)? {
                return Err(failure(
                    libc::EIO,
                    format!(
                        "{shown}: the content is only in a level below this node's store and no \
                         node agent runs to fetch it (start `cascade agent`, or `cascade \
                         restore` it)"
                    ),
                ));
            }
            file = self
                .store
                .open(p, &again)
                .map_err(|e| store_err(shown, &e))?;
        }
        Err(failure(
            libc::EIO,
            format!("{shown}: replaced by other processes each time it was fetched"),
        ))
    }
}

#[pymethods]
impl NativeStore {
    #[new]
    #[pyo3(signature = (name=None))]
    fn new(py: Python<'_>, name: Option<&str>) -> PyResult<NativeStore> {
        let config = load_config(name)?;
        let store_name = config.store_name().to_string();
        let store = py
            .allow_threads(|| Store::attach(&store_name))
            .map_err(|err| {
                if err.errno() == libc::ENOENT {
                    raise(
                        py,
                        Kind::NoStore,
                        libc::ENOENT,
                        format!(
                            "no Cascade store {store_name}: run `cascade init` or start the job \
                         under `cascade run`"
                        ),
                    )
                } else {
                    store_err(&format!("store {store_name}"), &err)
                }
            })?;
        Ok(NativeStore { store, config })
    }

    #[getter]
    fn name(&self) -> String {
        self.store.name().to_string()
    }

    /// This node's name in a multi-node job (docs/cluster.md), None outside a job.
    #[getter]
    fn node(&self) -> Option<String> {
        self.config.job().map(|job| job.node.value)
    }

    #[getter]
    fn mount_prefix(&self) -> String {
        self.config.mount_prefix().to_string()
    }

    /// The store path `path` names (mount prefix stripped, normalised).
    fn resolve(&self, path: &str) -> PyResult<String> {
        self.path(path)
    }

    #[pyo3(signature = (path, read, write, create, create_new, truncate, append))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        py: Python<'_>,
        path: &str,
        read: bool,
        write: bool,
        create: bool,
        create_new: bool,
        truncate: bool,
        append: bool,
    ) -> PyResult<NativeFile> {
        let p = self.path(path)?;
        let opts = OpenOptions::new()
            .read(read)
            .write(write || append)
            .create(create)
            .create_new(create_new)
            .truncate(truncate)
            .append(append)
            .mode(0o600);
        let file = py.allow_threads(|| self.open_through(path, &p, &opts))?;
        if file.is_dir() {
            return Err(failure(libc::EISDIR, format!("{path}: Is a directory")));
        }
        let pos = if append {
            file.len().map_err(|e| store_err(path, &e))?
        } else {
            0
        };
        Ok(NativeFile {
            file: Some(file),
            path: path.to_string(),
            pos,
            readable: read,
            writable: write || append,
            append,
        })
    }

    /// `through`: the names the levels below hold appear too (read-through); else only what
    /// this node's store has.
    #[pyo3(signature = (path, through=true))]
    fn listdir(&self, py: Python<'_>, path: &str, through: bool) -> PyResult<Vec<String>> {
        let p = self.path(path)?;
        let entries = py.allow_threads(|| {
            if !through {
                return self.store.read_dir(&p).map_err(|e| store_err(path, &e));
            }
            // Without an agent the listing is what the store has.
            let _ = cascade_agent::read_through(self.store.name(), ReadThroughRequest::List, &p);
            self.with_read_through(path, &p, || self.store.read_dir(&p))
        })?;
        Ok(entries.into_iter().map(|e| e.name).collect())
    }

    /// (size, mtime_ns, is_dir, mode, chunks_in_memory, chunks_spilled, remote)
    #[allow(clippy::type_complexity)]
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<(u64, i64, bool, u32, u64, u64, bool)> {
        let p = self.path(path)?;
        let m = py.allow_threads(|| self.with_read_through(path, &p, || self.store.stat(&p)))?;
        Ok((
            m.size,
            m.mtime,
            m.kind == FileKind::Dir,
            m.mode,
            m.chunks_in_memory,
            m.chunks_spilled,
            m.remote,
        ))
    }

    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let p = self.path(path)?;
        py.allow_threads(|| self.store.unlink(&p))
            .map_err(|e| store_err(path, &e))
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let p = self.path(path)?;
        py.allow_threads(|| self.store.rmdir(&p))
            .map_err(|e| store_err(path, &e))
    }

    fn mkdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let p = self.path(path)?;
        py.allow_threads(|| self.store.mkdir(&p, 0o700))
            .map_err(|e| store_err(path, &e))
    }

    fn makedirs(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let p = self.path(path)?;
        py.allow_threads(|| self.store.create_dir_all(&p, 0o700))
            .map_err(|e| store_err(path, &e))
    }

    fn rename(&self, py: Python<'_>, from: &str, to: &str) -> PyResult<()> {
        let f = self.path(from)?;
        let t = self.path(to)?;
        py.allow_threads(|| self.store.rename(&f, &t))
            .map_err(|e| store_err(from, &e))
    }

    /// (seq, flushed, agent_running)
    fn commit(&self, py: Python<'_>, path: &str) -> PyResult<(u64, bool, bool)> {
        let p = self.path(path)?;
        let done = py
            .allow_threads(|| cascade_lifecycle::commit(&self.store, &p))
            .map_err(lifecycle_err)?;
        Ok((done.seq, done.flushed, done.agent_running))
    }

    /// (level, files, seconds, only_durable); the GIL is released while waiting.
    #[pyo3(signature = (path, level, timeout=None))]
    fn wait(
        &self,
        py: Python<'_>,
        path: &str,
        level: &str,
        timeout: Option<f64>,
    ) -> PyResult<(&'static str, usize, f64, bool)> {
        let p = self.path(path)?;
        let level: Level = level.parse().map_err(lifecycle_err)?;
        let timeout = match timeout {
            None => Duration::MAX,
            Some(t) if t.is_finite() && t >= 0.0 => {
                Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX)
            }
            Some(_) => {
                return Err(failure(
                    libc::EINVAL,
                    "wait: timeout must be a number of seconds >= 0".to_string(),
                ))
            }
        };
        let done = py
            .allow_threads(|| {
                cascade_lifecycle::wait(&self.config, &self.store, &p, level, timeout)
            })
            .map_err(lifecycle_err)?;
        Ok((done.level, done.files, done.seconds, done.only_durable))
    }

    /// [(path, is_dir, level, size or None, state)]
    #[allow(clippy::type_complexity)]
    fn levels(
        &self,
        py: Python<'_>,
        path: &str,
    ) -> PyResult<Vec<(String, bool, &'static str, Option<u64>, String)>> {
        let p = self.path(path)?;
        let entries = py
            .allow_threads(|| cascade_lifecycle::levels(&self.config, &self.store, &p))
            .map_err(lifecycle_err)?;
        Ok(entries
            .into_iter()
            .map(|e| (e.path, e.is_dir, e.level, e.size, e.state))
            .collect())
    }

    /// `cascade status --json` as a JSON text.
    fn status_json(&self, py: Python<'_>) -> String {
        py.allow_threads(|| {
            let r = cascade_lifecycle::status_report(&self.store);
            cascade_lifecycle::status_json(&r.status, &r.others, r.agent.as_ref()).to_string()
        })
    }
}

/// An open file of the store with its own position (python/cascade wraps it in a RawIOBase).
#[pyclass(module = "cascade._native")]
struct NativeFile {
    /// None once closed.
    file: Option<cascade_store::File>,
    path: String,
    pos: u64,
    readable: bool,
    writable: bool,
    append: bool,
}

impl NativeFile {
    fn open_file(&self) -> PyResult<&cascade_store::File> {
        self.file
            .as_ref()
            .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("I/O operation on closed file."))
    }

    fn not_permitted(&self, what: &str) -> PyErr {
        failure(
            libc::EBADF,
            format!("{}: file not open for {what}", self.path),
        )
    }
}

#[pymethods]
impl NativeFile {
    /// Reads at the position straight into `buf` (a writable, C-contiguous buffer of bytes).
    fn readinto(&mut self, py: Python<'_>, buf: PyBuffer<u8>) -> PyResult<usize> {
        if !self.readable {
            return Err(self.not_permitted("reading"));
        }
        if buf.readonly() || !buf.is_c_contiguous() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "readinto() needs a writable, contiguous buffer",
            ));
        }
        let len = buf.len_bytes();
        // A pointer is not Send; the address crosses into the GIL-free closure as a number.
        let addr = buf.buf_ptr() as usize;
        let pos = self.pos;
        let file = self.open_file()?;
        let n = py
            .allow_threads(|| {
                // SAFETY: `buf` is a writable, C-contiguous export of `len` bytes that stays
                // alive (and so valid) until it is dropped after this call; like FileIO's
                // readinto, a Python thread writing the same buffer meanwhile only races on
                // its bytes, not on memory safety of this process's Rust state.
                let slice = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
                file.read_at(slice, pos)
            })
            .map_err(|e| store_err(&self.path, &e))?;
        self.pos += n as u64;
        Ok(n)
    }

    /// Writes all of `buf` at the position (or at the end in append mode).
    fn write(&mut self, py: Python<'_>, buf: PyBuffer<u8>) -> PyResult<usize> {
        if !self.writable {
            return Err(self.not_permitted("writing"));
        }
        if !buf.is_c_contiguous() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "write() needs a contiguous buffer",
            ));
        }
        let len = buf.len_bytes();
        let addr = buf.buf_ptr() as usize;
        let append = self.append;
        let pos = self.pos;
        let file = self.open_file()?;
        let end = py
            .allow_threads(|| {
                // SAFETY: `buf` is a C-contiguous export of `len` bytes, alive until it is
                // dropped after this call.
                let slice = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                if append {
                    file.append(slice).map(|at| at + len as u64)
                } else {
                    file.write_all_at(slice, pos).map(|()| pos + len as u64)
                }
            })
            .map_err(|e| store_err(&self.path, &e))?;
        self.pos = end;
        Ok(len)
    }

    #[pyo3(signature = (offset, whence=0))]
    fn seek(&mut self, offset: i64, whence: i32) -> PyResult<u64> {
        let base = match whence {
            0 => 0,
            1 => self.pos as i64,
            2 => self
                .open_file()?
                .len()
                .map_err(|e| store_err(&self.path, &e))? as i64,
            _ => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "invalid whence ({whence}, should be 0, 1 or 2)"
                )))
            }
        };
        let pos = base
            .checked_add(offset)
            .filter(|p| *p >= 0)
            .ok_or_else(|| {
                failure(
                    libc::EINVAL,
                    format!("{}: negative seek position", self.path),
                )
            })?;
        self.pos = pos as u64;
        Ok(self.pos)
    }

    fn tell(&self) -> PyResult<u64> {
        self.open_file()?;
        Ok(self.pos)
    }

    /// Sets the file's length to `size` (the position stays, as os.ftruncate leaves it).
    fn truncate(&mut self, size: u64) -> PyResult<u64> {
        if !self.writable {
            return Err(self.not_permitted("writing"));
        }
        self.open_file()?
            .set_len(size)
            .map_err(|e| store_err(&self.path, &e))?;
        Ok(size)
    }

    fn size(&self) -> PyResult<u64> {
        self.open_file()?
            .len()
            .map_err(|e| store_err(&self.path, &e))
    }

    /// Makes spilled data durable (fdatasync of the spill file); memory data needs nothing.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let file = self.open_file()?;
        py.allow_threads(|| file.sync())
            .map_err(|e| store_err(&self.path, &e))
    }

    /// Closes the handle (the writer count drops: the file can be committed).
    fn close(&mut self) {
        self.file = None;
    }

    #[getter]
    fn closed(&self) -> bool {
        self.file.is_none()
    }
}

/// `_native.store_path(prefix, path)`, for tests of the path rules.
#[pyfunction]
fn _store_path(py: Python<'_>, prefix: &str, path: &str) -> PyResult<String> {
    store_path(prefix, path).map_err(|m| raise(py, Kind::Outside, libc::EINVAL, m))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeStore>()?;
    m.add_class::<NativeFile>()?;
    m.add_function(wrap_pyfunction!(_set_error_factory, m)?)?;
    m.add_function(wrap_pyfunction!(_store_path, m)?)?;
    Ok(())
}
