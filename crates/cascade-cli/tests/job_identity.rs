//! `cascade config` finds the job and this node's place in it: from `CASCADE_JOB`,
//! `CASCADE_NODE` and `CASCADE_JOB_NODES`, from Slurm's and from Open MPI's variables, and
//! shows each value with where it came from, and the job's namespace. The real binary, with
//! nothing inherited from the environment but the variables each case sets.

use serde_json::{json, Value};

// Only the sandbox's commands are needed here, not its other helpers.
#[allow(dead_code)]
mod support;
use support::Sandbox;

/// `cascade config --json` with these variables set.
fn config_json(sb: &Sandbox, vars: &[(&str, &str)]) -> Value {
    let out = sb
        .command(&["config", "--json"])
        .envs(vars.iter().copied())
        .output()
        .expect("run cascade config");
    assert!(
        out.status.success(),
        "config with {vars:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("config --json is JSON")
}

fn setting<'a>(doc: &'a Value, key: &str) -> &'a Value {
    doc["settings"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["key"] == key))
        .unwrap_or_else(|| panic!("no {key} in {doc}"))
}

/// The user name a job's default namespace starts with.
fn user_name() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("run id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn sourced(value: Value, source: &str) -> Value {
    json!({ "value": value, "source": source })
}

#[test]
fn without_a_launcher_there_is_no_job_and_no_namespace() {
    let sb = Sandbox::new("job");
    let doc = config_json(&sb, &[]);
    assert_eq!(doc["job"], Value::Null);
    assert_eq!(doc["namespace"], sourced(json!(""), "default"));
    for key in [
        "job.id",
        "job.name",
        "job.node",
        "job.nodes",
        "job.namespace",
    ] {
        assert_eq!(setting(&doc, key)["value"], "", "{key}");
        assert_eq!(setting(&doc, key)["from"], "default", "{key}");
    }
    let text = sb.ok(&["config"]);
    assert!(text.contains("\njob: none (a single-node run)\n"), "{text}");
    assert!(text.contains("\nnamespace: none (default)\n"), "{text}");
}

#[test]
fn cascade_variables_give_the_job_and_override_the_launchers() {
    let sb = Sandbox::new("job");
    let simulated = [
        ("CASCADE_JOB", "sim-1"),
        ("CASCADE_NODE", "n2"),
        ("CASCADE_JOB_NODES", "n1,n2,n3,n4"),
    ];
    let doc = config_json(&sb, &simulated);
    let job = &doc["job"];
    assert_eq!(job["id"], sourced(json!("sim-1"), "env CASCADE_JOB"));
    assert_eq!(job["name"], sourced(json!("sim-1"), "default: the job id"));
    assert_eq!(job["node"], sourced(json!("n2"), "env CASCADE_NODE"));
    assert_eq!(job["nodes"], sourced(json!(4), "env CASCADE_JOB_NODES"));
    assert_eq!(
        job["node_names"],
        sourced(json!(["n1", "n2", "n3", "n4"]), "env CASCADE_JOB_NODES")
    );
    // Known only by its id: no namespace (a restart, with a new id, must find its files).
    assert_eq!(doc["namespace"], sourced(json!(""), "default"));
    let named = config_json(
        &sb,
        &[simulated.as_slice(), &[("CASCADE_JOB_NAME", "sim")]].concat(),
    );
    assert_eq!(
        named["namespace"],
        sourced(
            json!(format!("{}/sim", user_name())),
            "default: <user>/<job.name>"
        )
    );
    assert_eq!(setting(&doc, "job.node")["from"], "env");
    assert_eq!(setting(&doc, "job.node")["env"], "CASCADE_NODE");

    // The same over a Slurm and an Open MPI environment: CASCADE_* wins field by field.
    let mut vars = simulated.to_vec();
    vars.extend(SLURM);
    vars.extend(OMPI);
    let doc = config_json(&sb, &vars);
    let job = &doc["job"];
    assert_eq!(job["id"]["source"], "env CASCADE_JOB");
    assert_eq!(job["name"], sourced(json!("heat"), "env SLURM_JOB_NAME"));
    assert_eq!(job["node"]["value"], "n2");
    assert_eq!(job["nodes"]["value"], 4);

    // A count, a name and an explicit namespace; an empty CASCADE_NAMESPACE is none.
    let doc = config_json(
        &sb,
        &[
            ("CASCADE_JOB", "7"),
            ("CASCADE_JOB_NAME", "heat"),
            ("CASCADE_JOB_NODES", "2"),
            ("CASCADE_NAMESPACE", "proj/heat-1"),
        ],
    );
    assert_eq!(
        doc["job"]["nodes"],
        sourced(json!(2), "env CASCADE_JOB_NODES")
    );
    assert_eq!(doc["job"]["node_names"], Value::Null);
    assert_eq!(
        doc["namespace"],
        sourced(json!("proj/heat-1"), "env CASCADE_NAMESPACE")
    );
    let doc = config_json(&sb, &[("CASCADE_JOB", "7"), ("CASCADE_NAMESPACE", "")]);
    assert_eq!(
        doc["namespace"],
        sourced(json!(""), "env CASCADE_NAMESPACE")
    );
}

const SLURM: [(&str, &str); 6] = [
    ("SLURM_JOB_ID", "4711"),
    ("SLURM_JOB_NAME", "heat"),
    ("SLURMD_NODENAME", "node02"),
    ("SLURM_JOB_NUM_NODES", "5"),
    ("SLURM_NNODES", "5"),
    ("SLURM_JOB_NODELIST", "node[01-04],gpu3"),
];

const OMPI: [(&str, &str); 7] = [
    ("PMIX_NAMESPACE", "1298989057"),
    ("PMIX_RANK", "3"),
    ("OMPI_MCA_ess_base_jobid", "1298989057"),
    ("OMPI_COMM_WORLD_SIZE", "8"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
    ("OMPI_COMM_WORLD_NODE_RANK", "1"),
];

#[test]
fn slurm_gives_the_job_and_its_expanded_node_list() {
    let sb = Sandbox::new("job");
    let doc = config_json(&sb, &SLURM);
    let job = &doc["job"];
    assert_eq!(job["id"], sourced(json!("4711"), "env SLURM_JOB_ID"));
    assert_eq!(job["name"], sourced(json!("heat"), "env SLURM_JOB_NAME"));
    assert_eq!(job["node"], sourced(json!("node02"), "env SLURMD_NODENAME"));
    assert_eq!(job["nodes"], sourced(json!(5), "env SLURM_JOB_NODELIST"));
    assert_eq!(
        job["node_names"]["value"],
        json!(["node01", "node02", "node03", "node04", "gpu3"])
    );
    assert_eq!(
        doc["namespace"]["value"],
        json!(format!("{}/heat", user_name()))
    );
    // The table keeps the list as Slurm wrote it.
    assert_eq!(setting(&doc, "job.nodes")["value"], "node[01-04],gpu3");

    let out = sb
        .command(&["config"])
        .envs(SLURM)
        .output()
        .expect("run cascade config");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for expected in [
        "env SLURM_JOB_ID",
        "env SLURMD_NODENAME",
        "node[01-04],gpu3",
        "\njob: 4711 (name heat), node node02 of 5 nodes\n",
        &format!(
            "\nnamespace: {}/heat (default: <user>/<job.name>)\n",
            user_name()
        ),
    ] {
        assert!(text.contains(expected), "{expected:?} not in {text}");
    }
}

#[test]
fn open_mpi_gives_the_job_and_the_node_count_from_world_and_local_sizes() {
    let sb = Sandbox::new("job");
    let doc = config_json(&sb, &OMPI);
    let job = &doc["job"];
    assert_eq!(
        job["id"],
        sourced(json!("1298989057"), "env PMIX_NAMESPACE")
    );
    assert_eq!(job["node"]["source"], "default: host name");
    assert!(
        !job["node"]["value"].as_str().unwrap_or("").is_empty(),
        "{job}"
    );
    assert_eq!(
        job["nodes"],
        sourced(
            json!(4),
            "default: OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE"
        )
    );
    assert_eq!(job["node_names"], Value::Null);

    // Open MPI 4's own count and PMIx's host name come before that.
    let mut vars = OMPI.to_vec();
    vars.extend([("OMPI_MCA_orte_num_nodes", "3"), ("PMIX_HOSTNAME", "vm7")]);
    let doc = config_json(&sb, &vars);
    assert_eq!(
        doc["job"]["nodes"],
        sourced(json!(3), "env OMPI_MCA_orte_num_nodes")
    );
    assert_eq!(
        doc["job"]["node"],
        sourced(json!("vm7"), "env PMIX_HOSTNAME")
    );
}

#[test]
fn inconsistent_job_settings_are_one_line_errors() {
    let sb = Sandbox::new("job");
    let out = sb
        .command(&["config"])
        .env("CASCADE_NODE", "n1")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "cascade: job.node = n1 (env CASCADE_NODE) but there is no job id: set CASCADE_JOB \
         (job.id) too, or run under Slurm or mpirun"
    );
    let out = sb
        .command(&["config"])
        .envs([
            ("CASCADE_JOB", "j"),
            ("CASCADE_NODE", "n9"),
            ("CASCADE_JOB_NODES", "n[1-4]"),
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "cascade: job.node = n9 (env CASCADE_NODE) is not one of job.nodes = n[1-4] (env \
         CASCADE_JOB_NODES): set CASCADE_NODE to one of them, or CASCADE_JOB_NODES"
    );
}
