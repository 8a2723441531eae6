//! Cascade's configuration: every setting comes from, in order of precedence, a command-line
//! flag, a `CASCADE_*` environment variable, the config files, or a default (some sized from
//! the machine), and remembers which one it came from so `cascade config` can say.
//!
//! The config files are layered, each overriding the keys it sets: the system file
//! (/etc/cascade/config.toml), then the user's (`$XDG_CONFIG_HOME/cascade/config.toml`, else
//! `~/.config/cascade/config.toml`), then the one named by `--config` or `CASCADE_CONFIG`.
//! The first two are skipped when absent; a named file must exist.
//!
//! Settings are rows of [`SETTINGS`]; adding one is adding a row (and reading it where it is
//! used). The config file mirrors the keys as TOML tables:
//!
//! ```toml
//! [store]
//! capacity = "8GiB"
//! chunk_size = "1MiB"
//! [spill]
//! path = "/local/ssd/cascade.spill"
//! [mount]
//! prefix = "/cascade"
//! ```
//!
//! The job a process runs in (Slurm, Open MPI, or `CASCADE_JOB`) and this node's place in it
//! are settings too (`job.*`), with the launcher's variables tried before the built-in
//! default: [`Config::job`], [`Config::namespace`], module [`job`].

pub mod job;
pub mod machine;
mod settings;
mod size;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub use job::{expand_hostlist, JobIdentity, NodeCount, Sourced};
pub use settings::{umask_for_file_mode, SettingDef, DEFAULT_MOUNT, SETTINGS};
pub use size::{format_rate, format_size, parse_size, SIZE_HINT};

pub use cascade_secret::Secret;
use cascade_store::{Prefault, SpillConfig, StoreConfig};

/// Environment variable naming the config file (like `--config`).
pub const CONFIG_ENV: &str = "CASCADE_CONFIG";
/// The system-wide config file, the bottom layer.
pub const SYSTEM_CONFIG: &str = "/etc/cascade/config.toml";
/// The per-user config file, relative to `$HOME` (when `XDG_CONFIG_HOME` is not set).
pub const USER_CONFIG: &str = ".config/cascade/config.toml";
/// The per-user config file, relative to `$XDG_CONFIG_HOME`.
pub const XDG_USER_CONFIG: &str = "cascade/config.toml";

/// A setting's parsed value. Debug, like Display, hides secrets (a URL's secret key too).
#[derive(Clone, PartialEq, Eq)]
pub enum Value {
    Text(String),
    /// Text never shown (`cascade config` prints `***`, Debug too).
    Secret(Secret),
    Bytes(u64),
    Count(u64),
    /// A duration given in seconds, kept in milliseconds; shown in seconds.
    Millis(u64),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Text(text) => write!(f, "{}", redacted(text)),
            Value::Secret(secret) => write!(f, "{secret}"),
            Value::Count(n) => write!(f, "{n}"),
            Value::Millis(ms) if ms % 1000 == 0 => write!(f, "{} s", ms / 1000),
            Value::Millis(ms) => write!(f, "{:.3} s", *ms as f64 / 1000.0),
            Value::Bytes(0) => write!(f, "0"),
            Value::Bytes(n) => write!(f, "{n} ({})", format_size(*n)),
        }
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Text(text) => f.debug_tuple("Text").field(&redacted(text)).finish(),
            Value::Secret(secret) => f.debug_tuple("Secret").field(secret).finish(),
            Value::Bytes(n) => f.debug_tuple("Bytes").field(n).finish(),
            Value::Count(n) => f.debug_tuple("Count").field(n).finish(),
            Value::Millis(ms) => f.debug_tuple("Millis").field(ms).finish(),
        }
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag, e.g. `--capacity`.
    Flag(&'static str),
    /// An environment variable, e.g. `CASCADE_CAPACITY`.
    Env(&'static str),
    /// A config file.
    File(PathBuf),
    /// The built-in default; the text says how it was derived (empty for constants).
    Default(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag(flag) => write!(f, "flag --{flag}"),
            Source::Env(var) => write!(f, "env {var}"),
            Source::File(path) => write!(f, "file {}", path.display()),
            Source::Default(how) if how.is_empty() => write!(f, "default"),
            Source::Default(how) => write!(f, "default: {how}"),
        }
    }
}

/// One resolved setting.
#[derive(Debug, Clone)]
pub struct Entry {
    pub def: &'static SettingDef,
    pub value: Value,
    pub source: Source,
}

/// A configuration problem, as one line naming the setting and where its value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Everything configuration is resolved from. [`Inputs::from_process`] reads the real
/// environment; tests build one by hand so they need not touch the process environment.
/// Debug hides the values of secret settings and URLs' secret keys.
#[derive(Clone, Default)]
pub struct Inputs {
    /// Values given as flags, by setting key ("store.capacity"); the last one wins.
    pub flags: Vec<(&'static str, String)>,
    /// The `--config FILE` flag.
    pub config_flag: Option<PathBuf>,
    /// Environment variables (only `CASCADE_*`, `HOME`, `XDG_CONFIG_HOME` and the launchers'
    /// variables of [`job::LAUNCHER_ENV`] are looked at).
    pub env: BTreeMap<String, String>,
    /// The system-wide config file to fall back to.
    pub system_config: PathBuf,
    /// This machine's host name (a job's default node name); None = ask the system.
    pub host_name: Option<String>,
    /// The calling user's name (in a job's default namespace); None = ask the system.
    pub user_name: Option<String>,
}

impl fmt::Debug for Inputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |key: &str, value: &str| {
            if is_secret(key) {
                cascade_secret::REDACTED.to_string()
            } else {
                redacted(value)
            }
        };
        let secret_env: Vec<&str> = SETTINGS
            .iter()
            .filter(|d| is_secret(d.key))
            .map(|d| d.env)
            .collect();
        let flags: Vec<(&str, String)> = self
            .flags
            .iter()
            .map(|(key, value)| (*key, shown(key, value)))
            .collect();
        let env: BTreeMap<&str, String> = self
            .env
            .iter()
            .map(|(name, value)| {
                let value = if secret_env.contains(&name.as_str()) {
                    cascade_secret::REDACTED.to_string()
                } else {
                    redacted(value)
                };
                (name.as_str(), value)
            })
            .collect();
        f.debug_struct("Inputs")
            .field("flags", &flags)
            .field("config_flag", &self.config_flag)
            .field("env", &env)
            .field("system_config", &self.system_config)
            .field("host_name", &self.host_name)
            .field("user_name", &self.user_name)
            .finish()
    }
}

impl Inputs {
    /// The process's environment and the real system config path, with no flags yet.
    pub fn from_process() -> Inputs {
        let env = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| {
                k.starts_with("CASCADE_")
                    || k == "HOME"
                    || k == "XDG_CONFIG_HOME"
                    || job::LAUNCHER_ENV.contains(&k.as_str())
            })
            .collect();
        Inputs {
            flags: Vec::new(),
            config_flag: None,
            env,
            system_config: PathBuf::from(SYSTEM_CONFIG),
            host_name: None,
            user_name: None,
        }
    }

    /// The host name given, else this machine's.
    pub fn host_name(&self) -> String {
        self.host_name.clone().unwrap_or_else(machine::host_name)
    }

    /// The user name given, else the calling user's.
    pub fn user_name(&self) -> String {
        self.user_name.clone().unwrap_or_else(machine::user_name)
    }

    /// Adds a flag value for the setting `key`.
    pub fn flag(mut self, key: &'static str, value: impl Into<String>) -> Inputs {
        self.flags.push((key, value.into()));
        self
    }
}

/// The config files read, bottom layer first, and where the default ones were looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFiles {
    /// Each file read and how it was chosen ("system", "user", "--config",
    /// "CASCADE_CONFIG"); a later file's keys override an earlier one's.
    pub read: Vec<(PathBuf, String)>,
    /// The default locations, system then user, whether they exist or not.
    pub looked_in: Vec<PathBuf>,
}

impl fmt::Display for ConfigFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.read.is_empty() {
            let places: Vec<String> = self
                .looked_in
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            return write!(f, "none (looked for {})", places.join(", "));
        }
        let read: Vec<String> = self
            .read
            .iter()
            .map(|(path, chosen_by)| format!("{} ({chosen_by})", path.display()))
            .collect();
        write!(f, "{}", read.join(", then "))
    }
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    entries: Vec<Entry>,
    files: ConfigFiles,
    warnings: Vec<String>,
}

impl Config {
    /// Resolves every setting in [`SETTINGS`] from `inputs`.
    pub fn load(inputs: &Inputs) -> Result<Config, ConfigError> {
        for (key, _) in &inputs.flags {
            if settings::find(key).is_none() {
                return Err(ConfigError(format!("internal: no setting named {key}")));
            }
        }
        let (files, file_values) = read_config_files(inputs)?;
        let mut entries: Vec<Entry> = Vec::with_capacity(SETTINGS.len());
        for def in SETTINGS {
            let flag = inputs.flags.iter().rev().find(|(key, _)| *key == def.key);
            let env = inputs.env.get(def.env).filter(|v| !v.trim().is_empty());
            let (raw, source, origin) = if let Some((_, raw)) = flag {
                let name = def.flag.unwrap_or(def.key);
                (raw, Source::Flag(name), format!("--{name}"))
            } else if let Some(raw) = env {
                (raw, Source::Env(def.env), def.env.to_string())
            } else if let Some((raw, path)) = file_values.get(def.key) {
                let origin = format!("{}: {}", path.display(), def.key);
                let path = path.clone();
                (raw, Source::File(path), origin)
            } else if let Some((value, source)) =
                job::detected(def.key, inputs, &Resolved(&entries))
            {
                entries.push(Entry { def, value, source });
                continue;
            } else {
                let (value, how) = (def.default)(&Resolved(&entries));
                entries.push(Entry {
                    def,
                    value,
                    source: Source::Default(how),
                });
                continue;
            };
            let value = (def.parse)(raw).map_err(|why| {
                // The value is echoed only with any secret in it hidden.
                let shown = if is_secret(def.key) {
                    cascade_secret::REDACTED.to_string()
                } else {
                    redacted(raw)
                };
                ConfigError(format!("{origin}={shown:?}: {why}"))
            })?;
            entries.push(Entry { def, value, source });
        }
        let mut warnings = Vec::new();
        secret_from_file(
            &mut entries,
            &mut warnings,
            "staging.secret",
            "staging.secret_file",
        )?;
        secret_from_file(
            &mut entries,
            &mut warnings,
            "staging.credential",
            "staging.credential_file",
        )?;
        check_tls_files(&entries, &mut warnings)?;
        for (path, _) in &files.read {
            if let Some(warning) = exposed_config_file(path, &entries) {
                warnings.push(warning);
            }
        }
        for (key, _) in &inputs.flags {
            if let Some(warning) = secret_on_command_line(key, &entries) {
                warnings.push(warning);
            }
        }
        let config = Config {
            entries,
            files,
            warnings,
        };
        job::check(&config)?;
        Ok(config)
    }

    /// One-line warnings about how secrets were given (on the command line, in a config file
    /// others can read): the caller prints them.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Every setting, in table order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The setting `key`, if there is one by that name.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.def.key == key)
    }

    /// A text setting's value ("" if unknown).
    pub fn text(&self, key: &str) -> &str {
        match self.get(key).map(|e| &e.value) {
            Some(Value::Text(t)) => t,
            Some(Value::Secret(s)) => s.expose(),
            _ => "",
        }
    }

    /// A count or size setting's value (0 if unknown).
    pub fn number(&self, key: &str) -> u64 {
        match self.get(key).map(|e| &e.value) {
            Some(Value::Count(n) | Value::Bytes(n) | Value::Millis(n)) => *n,
            _ => 0,
        }
    }

    /// The durable store to drain to, if one is configured: `durable.url` with the job's
    /// namespace appended ([`Config::namespace`]), so two jobs never share keys.
    pub fn durable_url(&self) -> Option<String> {
        let url = Some(self.text("durable.url")).filter(|u| !u.is_empty())?;
        Some(job::namespaced_url(url, self.namespace()))
    }

    /// Which config files were read.
    pub fn files(&self) -> &ConfigFiles {
        &self.files
    }

    /// The shared-memory name of the store (`store.name`).
    pub fn store_name(&self) -> &str {
        Resolved(&self.entries).text("store.name")
    }

    /// The mount prefix (`mount.prefix`): absolute, normalised, never "/".
    pub fn mount_prefix(&self) -> &str {
        Resolved(&self.entries).text("mount.prefix")
    }

    /// A path as the store knows it: one under the mount prefix (`/cascade/run1/ckpt.42`,
    /// as the application and `cascade_commit()` see it) loses the prefix (`/run1/ckpt.42`);
    /// any other path is taken as a store path already.
    pub fn store_path<'a>(&self, path: &'a str) -> std::borrow::Cow<'a, str> {
        let prefix = self.mount_prefix();
        match path.strip_prefix(prefix) {
            Some("") => "/".into(),
            Some(rest) if rest.starts_with('/') => rest.into(),
            _ => path.into(),
        }
    }

    /// The parameters to create a store with, checked against each other.
    pub fn store_config(&self) -> Result<StoreConfig, ConfigError> {
        let resolved = Resolved(&self.entries);
        let chunk_size = resolved.bytes("store.chunk_size");
        let capacity = resolved.bytes("store.capacity");
        if capacity < chunk_size {
            return Err(self.conflict(
                "store.capacity",
                &format!("is less than one chunk ({})", format_size(chunk_size)),
            ));
        }
        let max_files = u32::try_from(resolved.count("store.max_files"))
            .map_err(|_| self.conflict("store.max_files", "does not fit in 32 bits"))?;
        let spill_size = resolved.bytes("spill.size");
        if spill_size != 0 && spill_size < chunk_size {
            return Err(self.conflict(
                "spill.size",
                &format!(
                    "is less than one chunk ({}); use 0 to disable spill-over",
                    format_size(chunk_size)
                ),
            ));
        }
        let spill = (spill_size > 0).then(|| SpillConfig {
            path: PathBuf::from(resolved.text("spill.path")),
            size: spill_size,
        });
        let prefault = match resolved.text("store.prefault") {
            "background" => Prefault::Background,
            "off" => Prefault::Off,
            _ => Prefault::Foreground,
        };
        Ok(StoreConfig {
            name: resolved.text("store.name").to_string(),
            capacity,
            chunk_size,
            max_files,
            spill,
            prefault,
        })
    }

    fn conflict(&self, key: &str, problem: &str) -> ConfigError {
        match self.get(key) {
            Some(entry) => ConfigError(format!(
                "{key} = {} ({}) {problem}",
                entry.value, entry.source
            )),
            None => ConfigError(format!("{key} {problem}")),
        }
    }
}

/// The settings resolved so far, as defaults of later settings see them.
pub struct Resolved<'a>(&'a [Entry]);

impl<'a> Resolved<'a> {
    fn value(&self, key: &str) -> &'a Value {
        match self.0.iter().find(|e| e.def.key == key) {
            Some(entry) => &entry.value,
            None => panic!("setting {key} used before it is resolved; reorder SETTINGS"),
        }
    }

    /// True if a setting resolved earlier in the table took its built-in default (no flag,
    /// variable, file or launcher gave it).
    pub fn defaulted(&self, key: &str) -> bool {
        self.0
            .iter()
            .find(|e| e.def.key == key)
            .is_some_and(|e| matches!(e.source, Source::Default(_)))
    }

    /// A size setting resolved earlier in the table.
    pub fn bytes(&self, key: &str) -> u64 {
        match self.value(key) {
            Value::Bytes(n) | Value::Count(n) => *n,
            Value::Text(_) | Value::Secret(_) | Value::Millis(_) => {
                panic!("setting {key} is not a size")
            }
        }
    }

    /// A count setting resolved earlier in the table.
    pub fn count(&self, key: &str) -> u64 {
        self.bytes(key)
    }

    /// A text setting resolved earlier in the table.
    pub fn text(&self, key: &str) -> &'a str {
        match self.value(key) {
            Value::Text(text) => text,
            Value::Secret(secret) => secret.expose(),
            _ => panic!("setting {key} is not text"),
        }
    }
}

/// A config file's raw values by dotted key, with the file each came from.
type FileValues = BTreeMap<String, (String, PathBuf)>;

/// Reads the config file layers (module docs), later ones overriding earlier ones' keys.
fn read_config_files(inputs: &Inputs) -> Result<(ConfigFiles, FileValues), ConfigError> {
    let env = |name: &str| inputs.env.get(name).filter(|v| !v.is_empty());
    let mut looked_in = vec![inputs.system_config.clone()];
    // XDG_CONFIG_HOME counts only when absolute (the Base Directory specification).
    match env("XDG_CONFIG_HOME").filter(|d| d.starts_with('/')) {
        Some(xdg) => looked_in.push(Path::new(xdg).join(XDG_USER_CONFIG)),
        None => {
            if let Some(home) = env("HOME") {
                looked_in.push(Path::new(home).join(USER_CONFIG));
            }
        }
    }
    let mut layers: Vec<(PathBuf, String)> = looked_in
        .iter()
        .zip(["system", "user"])
        .filter(|(path, _)| path.exists())
        .map(|(path, chosen_by)| (path.clone(), chosen_by.to_string()))
        .collect();
    match (&inputs.config_flag, env(CONFIG_ENV)) {
        (Some(path), _) => layers.push((path.clone(), "--config".into())),
        (None, Some(path)) => layers.push((PathBuf::from(path), CONFIG_ENV.into())),
        _ => {}
    }
    let mut values = FileValues::new();
    for (path, chosen_by) in &layers {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError(format!(
                "config file {} (from {chosen_by}): {}",
                path.display(),
                io_text(&e)
            ))
        })?;
        let file_values = parse_config_text(&text)
            .map_err(|why| ConfigError(format!("{}{why}", path.display())))?;
        for (key, raw) in file_values {
            values.insert(key, (raw, path.clone()));
        }
    }
    let files = ConfigFiles {
        read: layers,
        looked_in,
    };
    Ok((files, values))
}

/// Parses config file text into raw values by dotted key. Errors start with ":LINE: " or
/// ": " so the caller can put the file name in front.
fn parse_config_text(text: &str) -> Result<BTreeMap<String, String>, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let message = e.message().trim().replace('\n', "; ");
        match line {
            Some(line) => format!(":{line}: {message}"),
            None => format!(": {message}"),
        }
    })?;
    let mut values = BTreeMap::new();
    flatten("", &table, &mut values)?;
    Ok(values)
}

fn flatten(
    prefix: &str,
    table: &toml::Table,
    out: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    for (name, value) in table {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let raw = match value {
            toml::Value::Table(inner) if settings::find(&key).is_none() => {
                flatten(&key, inner, out)?;
                continue;
            }
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(n) => n.to_string(),
            _ => return Err(format!(": {key}: expected a string or a whole number")),
        };
        if settings::find(&key).is_none() {
            let known: Vec<&str> = SETTINGS.iter().map(|d| d.key).collect();
            return Err(format!(
                ": unknown setting {key:?} (known: {})",
                known.join(", ")
            ));
        }
        out.insert(key, raw);
    }
    Ok(())
}

/// An I/O error's text without Rust's " (os error N)" suffix.
pub fn io_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(errno) => cascade_store::errno_text(errno),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests;

/// `text` with the credentials of a URL in it (`s3://...?secret_key=...`) replaced by `***`
/// ([`cascade_secret::redact_url`]), for showing settings such as durable.url; text that is
/// not a URL is unchanged.
pub fn redacted(text: &str) -> String {
    if text.contains("://") {
        cascade_secret::redact_url(text)
    } else {
        text.to_string()
    }
}

/// Settings whose value is a secret through and through (never echoed, even in an error).
fn is_secret(key: &str) -> bool {
    key == "staging.secret" || key == "staging.credential"
}

/// Whether a setting's value carries a secret: the shared secret, or a store URL with a
/// secret key in it.
fn holds_secret(entry: &Entry) -> bool {
    match &entry.value {
        Value::Secret(secret) => !secret.is_empty(),
        Value::Text(text) => {
            text.contains("://") && cascade_secret::redact_url(text) != text.as_str()
        }
        _ => false,
    }
}

/// A secret given as a flag is in every process listing (`ps`, /proc/PID/cmdline): one line
/// saying so and what to use instead.
fn secret_on_command_line(key: &str, entries: &[Entry]) -> Option<String> {
    let entry = entries.iter().find(|e| e.def.key == key)?;
    if !matches!(entry.source, Source::Flag(_)) || !holds_secret(entry) {
        return None;
    }
    let instead = if key == "staging.secret" {
        "staging.secret_file (CASCADE_STAGING_SECRET_FILE)"
    } else if key == "staging.credential" {
        "staging.credential_file (CASCADE_STAGING_CREDENTIAL_FILE)"
    } else {
        "CASCADE_S3_CREDENTIALS_FILE or CASCADE_S3_ACCESS_KEY_ID/CASCADE_S3_SECRET_ACCESS_KEY"
    };
    Some(format!(
        "warning: {source} puts a secret on the command line, where ps shows it to every user of the machine; use {instead} instead",
        source = entry.source
    ))
}

/// A config file that holds a secret and that the group or others may read: one line.
fn exposed_config_file(path: &Path, entries: &[Entry]) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let from_file: Vec<&str> = entries
        .iter()
        .filter(|e| matches!(&e.source, Source::File(p) if p == path) && holds_secret(e))
        .map(|e| e.def.key)
        .collect();
    if from_file.is_empty() {
        return None;
    }
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o077 != 0).then(|| {
        format!(
            "warning: config file {} holds a secret ({}) but is readable by others (mode {:o}); chmod 600 it",
            path.display(),
            from_file.join(", "),
            mode & 0o777
        )
    })
}

/// A secret setting (`secret_key`: staging.secret, staging.credential) from its file setting
/// (`file_key`): the file's first line, the file readable by its owner only (else a
/// warning). Both given is an error: which one is meant is unclear.
fn secret_from_file(
    entries: &mut [Entry],
    warnings: &mut Vec<String>,
    secret_key: &str,
    file_key: &str,
) -> Result<(), ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(file_entry) = entries.iter().find(|e| e.def.key == file_key) else {
        return Ok(());
    };
    let path = match &file_entry.value {
        Value::Text(path) if !path.is_empty() => PathBuf::from(path),
        _ => return Ok(()),
    };
    let file_source = file_entry.source.clone();
    let Some(secret) = entries.iter_mut().find(|e| e.def.key == secret_key) else {
        return Ok(());
    };
    if !matches!(secret.source, Source::Default(_)) {
        return Err(ConfigError(format!(
            "{secret_key} ({}) and {file_key} ({file_source}) are both given; give one",
            secret.source
        )));
    }
    let failed = |why: String| {
        ConfigError(format!(
            "{file_key} {} ({file_source}): {why}",
            path.display()
        ))
    };
    let text = std::fs::read_to_string(&path).map_err(|e| failed(io_text(&e)))?;
    let line = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if line.is_empty() {
        return Err(failed("the first line is empty".to_string()));
    }
    if let Ok(meta) = std::fs::metadata(&path) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            warnings.push(format!(
                "warning: {file_key} {} is readable by others (mode {:o}); chmod 600 it",
                path.display(),
                mode & 0o777
            ));
        }
    }
    secret.value = Value::Secret(Secret::new(line));
    secret.source = Source::File(path);
    Ok(())
}

/// stage_server.tls_cert and stage_server.tls_key come together (one without the other is
/// unclear: TLS meant but not possible); a key file the group or others may read gets a
/// warning, as staging.secret_file does.
fn check_tls_files(entries: &[Entry], warnings: &mut Vec<String>) -> Result<(), ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    let given = |key: &str| {
        entries
            .iter()
            .find(|e| e.def.key == key)
            .and_then(|e| match &e.value {
                Value::Text(path) if !path.is_empty() => Some((PathBuf::from(path), &e.source)),
                _ => None,
            })
    };
    let (cert, key) = (
        given("stage_server.tls_cert"),
        given("stage_server.tls_key"),
    );
    let key = match (cert, key) {
        (None, None) => return Ok(()),
        (Some(_), Some(key)) => key,
        (Some((_, source)), None) => {
            return Err(ConfigError(format!(
                "stage_server.tls_cert ({source}) is given without stage_server.tls_key; give both or neither"
            )))
        }
        (None, Some((_, source))) => {
            return Err(ConfigError(format!(
                "stage_server.tls_key ({source}) is given without stage_server.tls_cert; give both or neither"
            )))
        }
    };
    if let Ok(meta) = std::fs::metadata(&key.0) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            warnings.push(format!(
                "warning: stage_server.tls_key {} is readable by others (mode {:o}); chmod 600 it",
                key.0.display(),
                mode & 0o777
            ));
        }
    }
    Ok(())
}
