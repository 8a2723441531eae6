use super::*;
use crate::settings::{capacity_from, spill_size_from};
use cascade_store::Prefault;
use tempfile::TempDir;

/// Inputs isolated from this machine's real config files: HOME and the system config
/// point into a fresh temp dir that has neither file.
fn isolated() -> (TempDir, Inputs) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut env = BTreeMap::new();
    env.insert("HOME".to_string(), dir.path().display().to_string());
    let inputs = Inputs {
        flags: Vec::new(),
        config_flag: None,
        env,
        system_config: dir.path().join("etc-cascade.toml"),
        host_name: Some("thishost".to_string()),
        user_name: Some("alice".to_string()),
    };
    (dir, inputs)
}

fn write_file(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create parent");
    }
    std::fs::write(&path, text).expect("write config file");
    path
}

fn entry<'a>(config: &'a Config, key: &str) -> &'a Entry {
    config
        .get(key)
        .unwrap_or_else(|| panic!("no setting {key}"))
}

fn load_err(inputs: &Inputs) -> String {
    match Config::load(inputs) {
        Ok(config) => panic!("expected an error, got {:?}", config.entries()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn nothing_configured_gives_defaults() {
    let (dir, inputs) = isolated();
    let config = Config::load(&inputs).expect("defaults load");
    for e in config.entries() {
        assert!(
            matches!(e.source, Source::Default(_)),
            "{} from {}",
            e.def.key,
            e.source
        );
    }
    assert_eq!(config.store_name(), cascade_store::default_store_name());
    assert_eq!(
        entry(&config, "store.chunk_size").value,
        Value::Bytes(1 << 20)
    );
    assert_eq!(entry(&config, "store.max_files").value, Value::Count(65536));
    assert_eq!(
        entry(&config, "store.prefault").value,
        Value::Text("foreground".into())
    );
    let uid = machine::uid();
    assert_eq!(
        entry(&config, "spill.path").value,
        Value::Text(format!("/var/tmp/cascade-{uid}.spill"))
    );
    let Value::Bytes(capacity) = entry(&config, "store.capacity").value else {
        panic!("capacity is not a size");
    };
    let mem_total = machine::mem_total().expect("MemTotal");
    assert!(
        capacity > 0 && capacity <= mem_total / 4,
        "capacity {capacity}"
    );
    assert_eq!(capacity % (1 << 20), 0, "capacity is whole chunks");
    let Value::Bytes(spill) = entry(&config, "spill.size").value else {
        panic!("spill.size is not a size");
    };
    assert!(spill <= capacity && spill % (1 << 20) == 0, "spill {spill}");
    assert_eq!(
        config.files(),
        &ConfigFiles {
            read: vec![],
            looked_in: vec![
                dir.path().join("etc-cascade.toml"),
                dir.path().join(USER_CONFIG),
            ]
        }
    );
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let (dir, mut inputs) = isolated();
    let file = write_file(
        &dir,
        "explicit.toml",
        "[store]\ncapacity = \"32MiB\"\nchunk_size = \"128KiB\"\nmax_files = 100\n",
    );
    inputs.config_flag = Some(file.clone());
    inputs.env.insert("CASCADE_CAPACITY".into(), "48MiB".into());
    inputs.env.insert("CASCADE_MAX_FILES".into(), "200".into());
    let inputs = inputs.flag("store.max_files", "300");
    let config = Config::load(&inputs).expect("loads");

    let max_files = entry(&config, "store.max_files");
    assert_eq!(max_files.value, Value::Count(300));
    assert_eq!(max_files.source, Source::Flag("max-files"));
    let capacity = entry(&config, "store.capacity");
    assert_eq!(capacity.value, Value::Bytes(48 << 20));
    assert_eq!(capacity.source, Source::Env("CASCADE_CAPACITY"));
    let chunk = entry(&config, "store.chunk_size");
    assert_eq!(chunk.value, Value::Bytes(128 << 10));
    assert_eq!(chunk.source, Source::File(file.clone()));
    assert!(matches!(
        entry(&config, "store.prefault").source,
        Source::Default(_)
    ));
    assert_eq!(config.files().read, vec![(file, "--config".to_string())]);
}

#[test]
fn last_flag_wins_and_empty_env_is_unset() {
    let (_dir, mut inputs) = isolated();
    inputs.env.insert("CASCADE_PREFAULT".into(), "".into());
    let inputs = inputs
        .flag("store.capacity", "1GiB")
        .flag("store.capacity", "2GiB");
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(
        entry(&config, "store.capacity").value,
        Value::Bytes(2 << 30)
    );
    assert!(matches!(
        entry(&config, "store.prefault").source,
        Source::Default(_)
    ));
}

#[test]
fn config_files_are_layered_key_by_key() {
    let (dir, mut inputs) = isolated();
    let system = write_file(
        &dir,
        "etc-cascade.toml",
        "[store]\nmax_files = 1000\nchunk_size = \"256KiB\"\n[mount]\nprefix = \"/ckpt\"\n",
    );
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(
        entry(&config, "store.max_files").source,
        Source::File(system.clone())
    );

    // The user's file overrides the keys it sets and nothing else.
    let user = write_file(&dir, USER_CONFIG, "[store]\nmax_files = 2000\n");
    let config = Config::load(&inputs).expect("loads");
    let max_files = entry(&config, "store.max_files");
    assert_eq!(max_files.value, Value::Count(2000));
    assert_eq!(max_files.source, Source::File(user.clone()));
    let chunk = entry(&config, "store.chunk_size");
    assert_eq!(chunk.value, Value::Bytes(256 << 10));
    assert_eq!(chunk.source, Source::File(system.clone()));
    assert_eq!(config.mount_prefix(), "/ckpt");

    // A named file goes on top of both.
    let named = write_file(&dir, "job.toml", "[store]\nchunk_size = \"512KiB\"\n");
    inputs.config_flag = Some(named.clone());
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(
        entry(&config, "store.chunk_size").value,
        Value::Bytes(512 << 10)
    );
    assert_eq!(entry(&config, "store.max_files").value, Value::Count(2000));
    assert_eq!(config.mount_prefix(), "/ckpt");
    assert_eq!(
        config.files().read,
        vec![
            (system.clone(), "system".to_string()),
            (user.clone(), "user".to_string()),
            (named.clone(), "--config".to_string()),
        ]
    );
    assert_eq!(
        config.files().to_string(),
        format!(
            "{} (system), then {} (user), then {} (--config)",
            system.display(),
            user.display(),
            named.display()
        )
    );
}

#[test]
fn xdg_config_home_places_the_user_file() {
    let (dir, mut inputs) = isolated();
    let home_file = write_file(&dir, USER_CONFIG, "store.max_files = 10\n");
    let xdg = dir.path().join("xdg");
    let xdg_file = write_file(&dir, "xdg/cascade/config.toml", "store.max_files = 20\n");
    inputs
        .env
        .insert("XDG_CONFIG_HOME".into(), xdg.display().to_string());
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(entry(&config, "store.max_files").value, Value::Count(20));
    assert_eq!(config.files().read, vec![(xdg_file, "user".to_string())]);
    // A relative XDG_CONFIG_HOME is ignored, as the Base Directory specification says.
    inputs.env.insert("XDG_CONFIG_HOME".into(), "xdg".into());
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(config.files().read, vec![(home_file, "user".to_string())]);
}

#[test]
fn config_flag_beats_config_env() {
    let (dir, mut inputs) = isolated();
    let from_env = write_file(&dir, "env.toml", "store.max_files = 10\n");
    let from_flag = write_file(&dir, "flag.toml", "store.max_files = 20\n");
    inputs
        .env
        .insert(CONFIG_ENV.into(), from_env.display().to_string());
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(entry(&config, "store.max_files").value, Value::Count(10));
    inputs.config_flag = Some(from_flag);
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(entry(&config, "store.max_files").value, Value::Count(20));
}

#[test]
fn explicitly_named_missing_file_is_an_error() {
    let (dir, mut inputs) = isolated();
    let missing = dir.path().join("nope.toml");
    inputs
        .env
        .insert(CONFIG_ENV.into(), missing.display().to_string());
    assert_eq!(
        load_err(&inputs),
        format!(
            "config file {} (from CASCADE_CONFIG): No such file or directory",
            missing.display()
        )
    );
    inputs.config_flag = Some(missing.clone());
    assert!(load_err(&inputs).contains("(from --config)"));
}

#[test]
fn bad_env_size_names_variable_and_value() {
    let (_dir, mut inputs) = isolated();
    inputs.env.insert("CASCADE_CHUNK_SIZE".into(), "12x".into());
    assert_eq!(
        load_err(&inputs),
        "CASCADE_CHUNK_SIZE=\"12x\": not a size (expected e.g. 4KiB, 1MiB, 8GiB)"
    );
}

#[test]
fn bad_flag_value_names_the_flag() {
    let (_dir, inputs) = isolated();
    let inputs = inputs.flag("store.prefault", "sometimes");
    assert_eq!(
        load_err(&inputs),
        "--prefault=\"sometimes\": expected foreground, background or off"
    );
    let (_dir, inputs) = isolated();
    let inputs = inputs.flag("store.chunk_size", "96KiB");
    assert_eq!(
        load_err(&inputs),
        "--chunk-size=\"96KiB\": chunk size must be a power of two from 4KiB to 64MiB"
    );
    let (_dir, inputs) = isolated();
    let inputs = inputs.flag("store.max_files", "1");
    assert!(load_err(&inputs).starts_with("--max-files=\"1\": must be from 2 to"));
}

#[test]
fn bad_file_value_names_file_and_key() {
    let (dir, mut inputs) = isolated();
    let file = write_file(&dir, "c.toml", "[spill]\nsize = \"lots\"\n");
    inputs.config_flag = Some(file.clone());
    assert_eq!(
        load_err(&inputs),
        format!(
            "{}: spill.size=\"lots\": not a size (expected e.g. 4KiB, 1MiB, 8GiB)",
            file.display()
        )
    );
}

#[test]
fn unknown_key_in_file_is_an_error() {
    let (dir, mut inputs) = isolated();
    let file = write_file(&dir, "c.toml", "[store]\ncapasity = \"1GiB\"\n");
    inputs.config_flag = Some(file.clone());
    let err = load_err(&inputs);
    assert!(
        err.starts_with(&format!(
            "{}: unknown setting \"store.capasity\"",
            file.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("store.capacity"),
        "lists known settings: {err}"
    );
}

#[test]
fn wrong_toml_type_is_an_error() {
    let (dir, mut inputs) = isolated();
    let file = write_file(&dir, "c.toml", "[store]\nchunk_size = 1.5\n");
    inputs.config_flag = Some(file.clone());
    assert_eq!(
        load_err(&inputs),
        format!(
            "{}: store.chunk_size: expected a string or a whole number",
            file.display()
        )
    );
}

#[test]
fn toml_syntax_error_is_one_line_with_line_number() {
    let (dir, mut inputs) = isolated();
    let file = write_file(&dir, "c.toml", "[store]\nname = \"/x\"\ncapacity = = 3\n");
    inputs.config_flag = Some(file.clone());
    let err = load_err(&inputs);
    assert!(err.starts_with(&format!("{}:3: ", file.display())), "{err}");
    assert!(!err.contains('\n'), "one line: {err:?}");
}

#[test]
fn store_config_carries_every_setting() {
    let (dir, inputs) = isolated();
    let spill = dir.path().join("s.spill");
    let inputs = inputs
        .flag("store.name", "cascade-unit")
        .flag("store.capacity", "64MiB")
        .flag("store.chunk_size", "64k")
        .flag("store.max_files", "128")
        .flag("store.prefault", "Background")
        .flag("spill.path", spill.display().to_string())
        .flag("spill.size", "16MiB");
    let config = Config::load(&inputs).expect("loads");
    let store = config.store_config().expect("consistent");
    assert_eq!(store.name, "/cascade-unit");
    assert_eq!(store.capacity, 64 << 20);
    assert_eq!(store.chunk_size, 64 << 10);
    assert_eq!(store.max_files, 128);
    assert_eq!(store.prefault, Prefault::Background);
    assert_eq!(
        store.spill,
        Some(SpillConfig {
            path: spill,
            size: 16 << 20
        })
    );
}

#[test]
fn zero_spill_size_disables_spill() {
    let (_dir, inputs) = isolated();
    let inputs = inputs.flag("spill.size", "0");
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(config.store_config().expect("consistent").spill, None);
}

#[test]
fn capacity_below_one_chunk_is_rejected_with_its_source() {
    let (_dir, mut inputs) = isolated();
    inputs.env.insert("CASCADE_CAPACITY".into(), "4k".into());
    let config = Config::load(&inputs).expect("each value is fine alone");
    let err = config
        .store_config()
        .expect_err("4 KiB < 1 MiB chunk")
        .to_string();
    assert_eq!(
        err,
        "store.capacity = 4096 (4 KiB) (env CASCADE_CAPACITY) is less than one chunk (1 MiB)"
    );
}

#[test]
fn spill_path_follows_store_name_and_is_made_absolute() {
    let (_dir, inputs) = isolated();
    let config = Config::load(&inputs.flag("store.name", "/ckpt-a")).expect("loads");
    assert_eq!(
        entry(&config, "spill.path").value,
        Value::Text("/var/tmp/ckpt-a.spill".into())
    );
    let (_dir, inputs) = isolated();
    let config = Config::load(&inputs.flag("spill.path", "rel/x.spill")).expect("loads");
    let Value::Text(path) = &entry(&config, "spill.path").value else {
        panic!("spill.path is not text");
    };
    assert!(
        Path::new(path).is_absolute() && path.ends_with("rel/x.spill"),
        "{path}"
    );
}

#[test]
fn bad_store_names_are_rejected() {
    for bad in ["/a/b", "/", "", ".."] {
        let (_dir, inputs) = isolated();
        let err = load_err(&inputs.flag("store.name", bad));
        assert!(err.starts_with(&format!("--store={bad:?}: ")), "{err}");
    }
}

#[test]
fn default_capacity_is_quarter_ram_capped_by_half_free_shm() {
    assert_eq!(capacity_from(Some(16 << 30), Some(100 << 30)).0, 4 << 30);
    assert_eq!(capacity_from(Some(16 << 30), Some(6 << 30)).0, 3 << 30);
    assert_eq!(capacity_from(None, Some(6 << 30)).0, 0);
    assert_eq!(capacity_from(Some(16 << 30), None).0, 0);
    assert!(capacity_from(Some(16 << 30), Some(6 << 30))
        .1
        .contains("/dev/shm"));
}

#[test]
fn default_spill_is_capacity_capped_by_quarter_free_disk() {
    let path = Path::new("/var/tmp/x.spill");
    assert_eq!(spill_size_from(4 << 30, Some(100 << 30), path).0, 4 << 30);
    assert_eq!(spill_size_from(4 << 30, Some(8 << 30), path).0, 2 << 30);
    assert_eq!(spill_size_from(4 << 30, None, path).0, 0);
}

#[test]
fn every_setting_has_a_unique_key_env_and_flag() {
    let mut keys: Vec<&str> = SETTINGS.iter().map(|d| d.key).collect();
    let mut envs: Vec<&str> = SETTINGS.iter().map(|d| d.env).collect();
    // One flag name per concept: the durable store is `--durable` and the metrics address
    // `--metrics` for agents (durable.url, agent.metrics) and staging servers
    // (stage_server.drain_to, stage_server.metrics), which never share a command line.
    let shared = ["stage_server.drain_to", "stage_server.metrics"];
    let mut flags: Vec<&str> = SETTINGS
        .iter()
        .filter(|d| !shared.contains(&d.key))
        .flat_map(|d| d.flag.into_iter().chain(d.aliases.iter().copied()))
        .collect();
    for list in [&mut keys, &mut envs, &mut flags] {
        let before = list.len();
        list.sort_unstable();
        list.dedup();
        assert_eq!(list.len(), before, "duplicates in {list:?}");
    }
    assert!(envs.iter().all(|e| e.starts_with("CASCADE_")));
    let drain_to = SETTINGS
        .iter()
        .find(|d| d.key == "stage_server.drain_to")
        .expect("stage_server.drain_to");
    assert_eq!(drain_to.flag, Some("durable"));
    for def in SETTINGS {
        assert!(def.aliases.is_empty() || def.flag.is_some(), "{}", def.key);
    }
}

#[test]
fn mount_prefix_defaults_to_cascade_and_is_normalised() {
    let (_dir, inputs) = isolated();
    let config = Config::load(&inputs).expect("defaults load");
    assert_eq!(config.mount_prefix(), "/cascade");
    assert_eq!(
        entry(&config, "mount.prefix").source,
        Source::Default(String::new())
    );

    for (given, normalised) in [
        ("/scratch/ckpt", "/scratch/ckpt"),
        ("/scratch//ckpt/", "/scratch/ckpt"),
        ("/a/./b/../c", "/a/c"),
        ("/../x", "/x"),
    ] {
        let config = Config::load(&inputs.clone().flag("mount.prefix", given)).expect("loads");
        assert_eq!(config.mount_prefix(), normalised, "from {given:?}");
    }

    let mut env_inputs = inputs.clone();
    env_inputs
        .env
        .insert("CASCADE_MOUNT".to_string(), "/from/env/".to_string());
    let config = Config::load(&env_inputs).expect("loads");
    assert_eq!(config.mount_prefix(), "/from/env");
    assert_eq!(
        entry(&config, "mount.prefix").source,
        Source::Env("CASCADE_MOUNT")
    );
}

#[test]
fn mount_prefix_must_be_absolute_and_not_the_root() {
    let (_dir, inputs) = isolated();
    for bad in ["cascade", "./cascade", "/", "//", "/a/..", "/.."] {
        let err = load_err(&inputs.clone().flag("mount.prefix", bad));
        assert!(err.starts_with(&format!("--mount={bad:?}: ")), "{err}");
    }
    let err = load_err(&inputs.clone().flag("mount.prefix", "relative/path"));
    assert!(err.contains("absolute path"), "{err}");
    let err = load_err(&inputs.flag("mount.prefix", "/"));
    assert!(err.contains("cannot be /"), "{err}");
}

#[test]
fn mount_prefix_comes_from_the_mount_table_of_the_file() {
    let (dir, mut inputs) = isolated();
    let file = write_file(&dir, "c.toml", "[mount]\nprefix = \"/ckpt/\"\n");
    inputs.config_flag = Some(file.clone());
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(config.mount_prefix(), "/ckpt");
    assert_eq!(entry(&config, "mount.prefix").source, Source::File(file));
}

#[test]
fn secrets_in_urls_are_never_shown() {
    assert_eq!(
        crate::redacted("s3://b?endpoint=http://h&secret_key=abc&region=r"),
        "s3://b?endpoint=http://h&secret_key=***&region=r"
    );
    assert_eq!(
        crate::redacted("s3://b?secret_access_key=x"),
        "s3://b?secret_access_key=***"
    );
    assert_eq!(crate::redacted("/plain/dir"), "/plain/dir");
    // Glob patterns with '?' are not URLs.
    assert_eq!(crate::redacted("ckpt.?/"), "ckpt.?/");
}

#[test]
fn debug_of_inputs_and_config_never_shows_a_secret() {
    let url = "s3://b?endpoint=http://h:1&access_key=a&secret_key=TOPSECRET";
    let (_dir, mut inputs) = with_env(&[
        ("CASCADE_STAGING_SECRET", "TOPSECRET"),
        ("CASCADE_DURABLE", url),
    ]);
    inputs = inputs
        .flag("staging.secret", "TOPSECRET")
        .flag("stage_server.drain_to", url);
    let shown = format!("{inputs:?}");
    assert!(!shown.contains("TOPSECRET"), "{shown}");
    let config = Config::load(&inputs).expect("loads");
    let shown = format!("{config:?}");
    assert!(!shown.contains("TOPSECRET"), "{shown}");
    assert_eq!(config.text("staging.secret"), "TOPSECRET");
    assert_eq!(config.text("durable.url"), url);
    // Both flags put a secret on the command line: one warning each, without it.
    assert_eq!(config.warnings().len(), 2, "{:?}", config.warnings());
    assert!(config.warnings().iter().all(|w| !w.contains("TOPSECRET")));
}

#[test]
fn a_parse_error_never_echoes_a_secret() {
    let url = "s3://b?endpoint=ftp://h&access_key=a&secret_key=TOPSECRET";
    let (_dir, inputs) = with_env(&[("CASCADE_DURABLE", url)]);
    let err = load_err(&inputs);
    assert!(err.starts_with("CASCADE_DURABLE=\"s3://b?"), "{err}");
    assert!(!err.contains("TOPSECRET"), "{err}");
}

/// Inputs with these environment variables and nothing else of this machine's.
fn with_env(vars: &[(&str, &str)]) -> (TempDir, Inputs) {
    let (dir, mut inputs) = isolated();
    for (k, v) in vars {
        inputs.env.insert(k.to_string(), v.to_string());
    }
    (dir, inputs)
}

fn job_of(vars: &[(&str, &str)]) -> (Config, Option<JobIdentity>) {
    let (_dir, inputs) = with_env(vars);
    let config = Config::load(&inputs).unwrap_or_else(|e| panic!("{vars:?}: {e}"));
    let job = config.job();
    (config, job)
}

fn sourced<T>(value: T, source: Source) -> Sourced<T> {
    Sourced { value, source }
}

fn env(var: &'static str) -> Source {
    Source::Env(var)
}

const SLURM: &[(&str, &str)] = &[
    ("SLURM_JOB_ID", "4711"),
    ("SLURM_JOB_NAME", "heat"),
    ("SLURMD_NODENAME", "node02"),
    ("SLURM_JOB_NUM_NODES", "5"),
    ("SLURM_NNODES", "5"),
    ("SLURM_JOB_NODELIST", "node[01-04],gpu3"),
];

const OMPI: &[(&str, &str)] = &[
    ("PMIX_NAMESPACE", "1298989057"),
    ("OMPI_MCA_ess_base_jobid", "1298989057"),
    ("OMPI_COMM_WORLD_SIZE", "8"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ("OMPI_COMM_WORLD_NODE_RANK", "1"),
];

#[test]
fn no_launcher_means_no_job_and_no_namespace() {
    let (config, job) = job_of(&[]);
    assert_eq!(job, None);
    assert_eq!(config.namespace(), "");
    assert_eq!(config.staging_namespace(), "");
    for key in [
        "job.id",
        "job.name",
        "job.node",
        "job.nodes",
        "job.namespace",
    ] {
        assert_eq!(config.text(key), "", "{key}");
        assert_eq!(
            entry(&config, key).source,
            Source::Default(String::new()),
            "{key}"
        );
    }
}

#[test]
fn slurm_gives_the_job_the_node_and_the_expanded_node_list() {
    let (config, job) = job_of(SLURM);
    let job = job.expect("a Slurm job");
    assert_eq!(job.id, sourced("4711".into(), env("SLURM_JOB_ID")));
    assert_eq!(job.name, sourced("heat".into(), env("SLURM_JOB_NAME")));
    assert_eq!(job.node, sourced("node02".into(), env("SLURMD_NODENAME")));
    assert_eq!(job.nodes, sourced(5, env("SLURM_JOB_NODELIST")));
    let names: Vec<String> = ["node01", "node02", "node03", "node04", "gpu3"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        job.node_names,
        Some(sourced(names, env("SLURM_JOB_NODELIST")))
    );
    assert_eq!(config.namespace(), "alice/heat");
    assert_eq!(
        entry(&config, "job.namespace").source,
        Source::Default("<user>/<job.name>".into())
    );
    assert_eq!(
        job.to_string(),
        "job 4711 (name heat) on node node02 of 5 nodes"
    );

    // Without a node list, the count; SLURM_NNODES when that is all there is.
    let (_, job) = job_of(&[("SLURM_JOB_ID", "1"), ("SLURM_NNODES", "3")]);
    let job = job.expect("a job");
    assert_eq!(job.nodes, sourced(3, env("SLURM_NNODES")));
    assert_eq!(job.node_names, None);
    // No SLURMD_NODENAME or job name: the host name, the job id.
    assert_eq!(
        job.node,
        sourced("thishost".into(), Source::Default("host name".into()))
    );
    assert_eq!(
        job.name,
        sourced("1".into(), Source::Default("the job id".into()))
    );

    // A node list that disagrees with the count is dropped; one that does not parse too.
    for list in ["n[1-3]", "n[1-"] {
        let (_, job) = job_of(&[
            ("SLURM_JOB_ID", "1"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_JOB_NODELIST", list),
        ]);
        let job = job.expect("a job");
        assert_eq!(job.nodes, sourced(2, env("SLURM_JOB_NUM_NODES")), "{list}");
        assert_eq!(job.node_names, None, "{list}");
    }
}

/// Inside a job step (`srun -N2` in a 4-node allocation) the step's nodes are the job's.
#[test]
fn a_slurm_job_step_gives_its_own_nodes() {
    let (_, job) = job_of(&[
        ("SLURM_JOB_ID", "7"),
        ("SLURMD_NODENAME", "n02"),
        ("SLURM_JOB_NUM_NODES", "4"),
        ("SLURM_JOB_NODELIST", "n[01-04]"),
        ("SLURM_STEP_NUM_NODES", "2"),
        ("SLURM_STEP_NODELIST", "n[02-03]"),
    ]);
    let job = job.expect("a job");
    assert_eq!(job.nodes, sourced(2, env("SLURM_STEP_NODELIST")));
    let names = vec!["n02".to_string(), "n03".to_string()];
    assert_eq!(
        job.node_names,
        Some(sourced(names, env("SLURM_STEP_NODELIST")))
    );
    let (_, job) = job_of(&[("SLURM_JOB_ID", "7"), ("SLURM_STEP_NUM_NODES", "3")]);
    assert_eq!(
        job.expect("a job").nodes,
        sourced(3, env("SLURM_STEP_NUM_NODES"))
    );
}

#[test]
fn open_mpi_gives_the_job_and_the_node_count_from_world_and_local_sizes() {
    let (config, job) = job_of(OMPI);
    let job = job.expect("an Open MPI job");
    assert_eq!(job.id, sourced("1298989057".into(), env("PMIX_NAMESPACE")));
    assert_eq!(
        job.name,
        sourced("1298989057".into(), Source::Default("the job id".into()))
    );
    assert_eq!(
        job.node,
        sourced("thishost".into(), Source::Default("host name".into()))
    );
    assert_eq!(
        job.nodes,
        sourced(
            4,
            Source::Default("OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE".into())
        )
    );
    assert_eq!(config.namespace(), "", "a bare mpirun names no job");

    // Open MPI 4's own count and PMIx's host name come first; uneven ranks round up.
    let mut vars = OMPI.to_vec();
    vars.extend([("OMPI_MCA_orte_num_nodes", "3"), ("PMIX_HOSTNAME", "vm7")]);
    let (_, job) = job_of(&vars);
    let job = job.expect("a job");
    assert_eq!(job.nodes, sourced(3, env("OMPI_MCA_orte_num_nodes")));
    assert_eq!(job.node, sourced("vm7".into(), env("PMIX_HOSTNAME")));
    let (_, job) = job_of(&[
        ("OMPI_MCA_ess_base_jobid", "77"),
        ("OMPI_COMM_WORLD_SIZE", "5"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ]);
    let job = job.expect("a job");
    assert_eq!(job.id, sourced("77".into(), env("OMPI_MCA_ess_base_jobid")));
    assert_eq!(job.nodes.value, 3);
    assert!(
        job.nodes.source.to_string().contains("rounded up"),
        "{}",
        job.nodes.source
    );
}

#[test]
fn cascade_variables_override_slurm_which_overrides_open_mpi() {
    // Slurm and Open MPI both: Slurm's values.
    let mut both = SLURM.to_vec();
    both.extend_from_slice(OMPI);
    let (_, job) = job_of(&both);
    let job = job.expect("a job");
    assert_eq!(job.id.source, env("SLURM_JOB_ID"));
    assert_eq!(job.nodes.value, 5);

    // CASCADE_* over both, field by field.
    let mut all = both.clone();
    all.extend([
        ("CASCADE_JOB", "sim-7"),
        ("CASCADE_NODE", "n2"),
        ("CASCADE_JOB_NODES", "n1,n2,n3,n4"),
    ]);
    let (config, job) = job_of(&all);
    let job = job.expect("a job");
    assert_eq!(job.id, sourced("sim-7".into(), env("CASCADE_JOB")));
    assert_eq!(job.name, sourced("heat".into(), env("SLURM_JOB_NAME")));
    assert_eq!(job.node, sourced("n2".into(), env("CASCADE_NODE")));
    assert_eq!(job.nodes, sourced(4, env("CASCADE_JOB_NODES")));
    assert_eq!(
        job.node_names.map(|n| n.value.len()),
        Some(4),
        "names from CASCADE_JOB_NODES"
    );
    assert_eq!(config.namespace(), "alice/heat");

    // Only CASCADE_*: a count, the host name, the id as name.
    let (config, job) = job_of(&[("CASCADE_JOB", "j1"), ("CASCADE_JOB_NODES", "2")]);
    let job = job.expect("a job");
    assert_eq!(job.nodes, sourced(2, env("CASCADE_JOB_NODES")));
    assert_eq!(job.node_names, None);
    assert_eq!(job.node.value, "thishost");
    // Known only by its id (a new one every run): no namespace, so a restart finds it.
    assert_eq!(config.namespace(), "");

    // CASCADE_JOB_NAME names the namespace, sanitised into one component.
    let (config, _) = job_of(&[("CASCADE_JOB", "j1"), ("CASCADE_JOB_NAME", "my run/2")]);
    assert_eq!(config.namespace(), "alice/my_run_2");

    // A config file's [job] table sits between CASCADE_* and the launchers.
    let (dir, mut inputs) = with_env(SLURM);
    let file = write_file(&dir, "job.toml", "[job]\nnode = \"node04\"\n");
    inputs.config_flag = Some(file.clone());
    let config = Config::load(&inputs).expect("loads");
    let job = config.job().expect("a job");
    assert_eq!(job.node, sourced("node04".into(), Source::File(file)));
    assert_eq!(job.id.source, env("SLURM_JOB_ID"));
}

#[test]
fn the_namespace_can_be_set_or_turned_off_and_composes_with_the_staging_one() {
    let mut vars = SLURM.to_vec();
    vars.push(("CASCADE_NAMESPACE", "proj/run1"));
    let (config, _) = job_of(&vars);
    assert_eq!(config.namespace(), "proj/run1");
    assert_eq!(
        entry(&config, "job.namespace").source,
        env("CASCADE_NAMESPACE")
    );

    // Set but empty: none, even in a job.
    let mut vars = SLURM.to_vec();
    vars.push(("CASCADE_NAMESPACE", ""));
    let (config, job) = job_of(&vars);
    assert!(job.is_some());
    assert_eq!(config.namespace(), "");
    assert_eq!(
        entry(&config, "job.namespace").source,
        env("CASCADE_NAMESPACE")
    );

    // Without a job, an explicit namespace still applies.
    let (config, job) = job_of(&[("CASCADE_NAMESPACE", "mine")]);
    assert_eq!(job, None);
    assert_eq!(config.namespace(), "mine");

    // staging.namespace is unchanged and goes in front for the servers.
    let mut vars = SLURM.to_vec();
    vars.push(("CASCADE_STAGING_NAMESPACE", "site"));
    let (config, _) = job_of(&vars);
    assert_eq!(config.text("staging.namespace"), "site");
    assert_eq!(config.namespace(), "alice/heat");
    assert_eq!(config.staging_namespace(), "site/alice/heat");

    let (_dir, inputs) = with_env(&[("CASCADE_NAMESPACE", "a/../b")]);
    assert!(load_err(&inputs).starts_with("CASCADE_NAMESPACE=\"a/../b\": "));
}

#[test]
fn inconsistent_or_malformed_job_settings_are_errors() {
    // Job settings by hand need a job id.
    let (_dir, inputs) = with_env(&[("CASCADE_NODE", "n1")]);
    let err = load_err(&inputs);
    assert!(
        err.starts_with("job.node = n1 (env CASCADE_NODE) but there is no job id"),
        "{err}"
    );
    // A node that is not in the job's node list.
    let (_dir, inputs) = with_env(&[
        ("CASCADE_JOB", "j"),
        ("CASCADE_NODE", "n9"),
        ("CASCADE_JOB_NODES", "n1,n2"),
    ]);
    let err = load_err(&inputs);
    assert!(err.contains("is not one of job.nodes = n1,n2"), "{err}");
    // Malformed values name their variable.
    for (var, value) in [
        ("CASCADE_JOB_NODES", "0"),
        ("CASCADE_JOB_NODES", "a,a"),
        ("CASCADE_NODE", "a/b"),
        ("CASCADE_NODE", "a,b"),
        ("CASCADE_JOB", "x/y"),
    ] {
        let (_dir, inputs) = with_env(&[("CASCADE_JOB", "j"), (var, value)]);
        let err = load_err(&inputs);
        assert!(err.starts_with(&format!("{var}={value:?}: ")), "{err}");
    }
    // A launcher's unusable value is passed over, not an error.
    let (_, job) = job_of(&[("SLURM_JOB_ID", "9"), ("SLURMD_NODENAME", "bad name")]);
    assert_eq!(job.expect("a job").node.value, "thishost");
}

#[test]
fn files_mode_defaults_to_0600_and_gives_the_umask_of_its_files_and_directories() {
    let (_dir, inputs) = isolated();
    let config = Config::load(&inputs).expect("load");
    assert_eq!(config.text("files.mode"), "0600");
    assert_eq!(umask_for_file_mode("0600"), Some(0o077));
    assert_eq!(umask_for_file_mode("640"), Some(0o027));
    assert_eq!(umask_for_file_mode("0644"), Some(0o022));

    let (_dir, mut inputs) = isolated();
    inputs.env.insert("CASCADE_FILE_MODE".into(), "640".into());
    assert_eq!(
        Config::load(&inputs).expect("load").text("files.mode"),
        "0640"
    );
    for bad in ["0755", "0400", "rw", "01600"] {
        let (_dir, mut inputs) = isolated();
        inputs.env.insert("CASCADE_FILE_MODE".into(), bad.into());
        let err = load_err(&inputs);
        assert!(err.contains("CASCADE_FILE_MODE"), "{bad}: {err}");
    }
}

#[test]
fn tls_cert_and_key_come_together_and_a_readable_key_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, inputs) = isolated();
    let cert = write_file(&dir, "server.pem", "cert");
    let key = write_file(&dir, "server.key", "key");
    let cert_text = cert.display().to_string();
    let key_text = key.display().to_string();

    let err = load_err(&inputs.clone().flag("stage_server.tls_cert", &cert_text));
    assert!(
        err.contains("stage_server.tls_cert (flag --tls-cert)") && err.contains("both or neither"),
        "{err}"
    );
    let mut only_key = inputs.clone();
    only_key
        .env
        .insert("CASCADE_STAGE_TLS_KEY".into(), key_text.clone());
    let err = load_err(&only_key);
    assert!(
        err.contains("stage_server.tls_key (env CASCADE_STAGE_TLS_KEY)"),
        "{err}"
    );

    let both = inputs
        .clone()
        .flag("stage_server.tls_cert", &cert_text)
        .flag("stage_server.tls_key", &key_text);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let config = Config::load(&both).expect("loads");
    assert_eq!(config.warnings().len(), 1, "{:?}", config.warnings());
    assert!(
        config.warnings()[0].contains("stage_server.tls_key")
            && config.warnings()[0].contains("readable by others"),
        "{:?}",
        config.warnings()
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let config = Config::load(&both).expect("loads");
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    assert_eq!(config.text("stage_server.tls_key"), key_text);

    // The client's CA file is a plain path setting, off by default.
    let config = Config::load(&inputs).expect("loads");
    assert_eq!(config.text("staging.tls_ca"), "");
    let config = Config::load(&inputs.flag("staging.tls_ca", &cert_text)).expect("loads");
    assert_eq!(config.text("staging.tls_ca"), cert_text);
}

#[test]
fn mount_prefixed_paths_are_store_paths() {
    let (_dir, inputs) = isolated();
    let config = Config::load(&inputs.flag("mount.prefix", "/ckpt")).expect("loads");
    assert_eq!(config.store_path("/ckpt/run1/ckpt.42"), "/run1/ckpt.42");
    assert_eq!(config.store_path("/ckpt"), "/");
    assert_eq!(config.store_path("/ckpt/"), "/");
    assert_eq!(config.store_path("/run1/ckpt.42"), "/run1/ckpt.42");
    // Only whole components: /ckpts is not under /ckpt.
    assert_eq!(config.store_path("/ckpts/a"), "/ckpts/a");
    assert_eq!(config.store_path("ckpt.42"), "ckpt.42");
}

/// Durations are given in seconds (decimals and a trailing `s` allowed), used in
/// milliseconds, and shown in seconds, as they were given.
#[test]
fn durations_are_given_and_shown_in_seconds() {
    let (_dir, inputs) = isolated();
    let config = Config::load(&inputs).expect("loads");
    let give_up = entry(&config, "staging.give_up_after");
    assert_eq!(give_up.value, Value::Millis(600_000));
    assert_eq!(give_up.value.to_string(), "600 s");
    let config = Config::load(
        &inputs
            .clone()
            .flag("staging.give_up_after", "1.5")
            .flag("dedup.session_lease", "8 s"),
    )
    .expect("loads");
    assert_eq!(config.number("staging.give_up_after"), 1_500);
    assert_eq!(
        entry(&config, "staging.give_up_after").value.to_string(),
        "1.500 s"
    );
    assert_eq!(config.number("dedup.session_lease"), 8_000);
    let refused = Config::load(&inputs.flag("dedup.session_lease", "2"))
        .expect_err("a lease shorter than 4 s");
    assert!(
        refused.to_string().contains("at least 4 seconds"),
        "{refused}"
    );
}
