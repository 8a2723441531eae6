//! The job this process belongs to and this node's place in it, found in the launcher's
//! environment: `CASCADE_JOB`, `CASCADE_JOB_NAME`, `CASCADE_NODE`, `CASCADE_JOB_NODES` (rows of
//! [`crate::SETTINGS`], so they override everything), then Slurm, then Open MPI / PMIx. No job
//! id anywhere means no job: a single-node run, with the layout of keys unchanged.
//!
//! The settings `job.id`, `job.name`, `job.node`, `job.nodes` and `job.namespace` resolve like
//! every other setting (flag, `CASCADE_*` variable, config file), except that before the
//! built-in default a launcher's variable is tried ([`detected`]); its source then names that
//! variable (`env SLURM_JOB_ID`), or says how it was derived (`default: host name`).

use std::collections::BTreeMap;
use std::fmt;

use crate::{Config, ConfigError, Inputs, Resolved, Source, Value};

/// Variables of launchers read besides `CASCADE_*` ([`Inputs::from_process`] keeps them).
pub const LAUNCHER_ENV: &[&str] = &[
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURMD_NODENAME",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NODELIST",
    "PMIX_NAMESPACE",
    "PMIX_HOSTNAME",
    "OMPI_MCA_ess_base_jobid",
    "OMPI_MCA_orte_num_nodes",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
];

/// The most node names a node list may expand to.
const MAX_NODES: u64 = 1 << 20;

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced<T> {
    pub value: T,
    pub source: Source,
}

/// The job of a multi-node run and this node's place in it ([`Config::job`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobIdentity {
    /// The launcher's job id (`SLURM_JOB_ID`, `PMIX_NAMESPACE`, `CASCADE_JOB`), never empty.
    pub id: Sourced<String>,
    /// The job's name (`SLURM_JOB_NAME`, `CASCADE_JOB_NAME`), else the job id.
    pub name: Sourced<String>,
    /// This node's name (`SLURMD_NODENAME`, `PMIX_HOSTNAME`, `CASCADE_NODE`), else the host
    /// name. A valid node name: no `/`, `,`, white space or control characters.
    pub node: Sourced<String>,
    /// How many nodes the job has (at least 1); 1 when nothing says.
    pub nodes: Sourced<u32>,
    /// The nodes' names when known (`SLURM_JOB_NODELIST`, or `CASCADE_JOB_NODES` given as a
    /// list); then `nodes` is their number and `node` is one of them.
    pub node_names: Option<Sourced<Vec<String>>>,
}

impl fmt::Display for JobIdentity {
    /// One line: `job 1234 (name heat) on node n01 of 4 nodes`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "job {} (name {}) on node {} of {} nodes",
            self.id.value, self.name.value, self.node.value, self.nodes.value
        )
    }
}

impl Config {
    /// The job this process runs in, if one was detected (a job id was found); None for a
    /// single-node run outside any launcher.
    pub fn job(&self) -> Option<JobIdentity> {
        let sourced = |key: &str| {
            self.get(key).map(|e| Sourced {
                value: self.text(key).to_string(),
                source: e.source.clone(),
            })
        };
        let id = sourced("job.id").filter(|id| !id.value.is_empty())?;
        let name = sourced("job.name")?;
        let node = sourced("job.node")?;
        let nodes_entry = sourced("job.nodes")?;
        // Checked when loaded, so it parses.
        let (count, names) = match NodeCount::parse(&nodes_entry.value) {
            Ok(NodeCount::Count(n)) => (n, None),
            Ok(NodeCount::Names(names)) => {
                let count = u32::try_from(names.len()).unwrap_or(u32::MAX);
                let names = Sourced {
                    value: names,
                    source: nodes_entry.source.clone(),
                };
                (count, Some(names))
            }
            Err(_) => (1, None),
        };
        Some(JobIdentity {
            id,
            name,
            node,
            nodes: Sourced {
                value: count,
                source: nodes_entry.source,
            },
            node_names: names,
        })
    }

    /// The key prefix of this job's files in the staging servers and the durable store
    /// (`job.namespace`), "" for none. Defaults to `<user>/<job name>` when a job is detected,
    /// else none, so single-node runs keep today's layout.
    pub fn namespace(&self) -> &str {
        self.text("job.namespace")
    }

    /// The key prefix to give staging servers: `staging.namespace` (where the servers drain
    /// to, relative to their drain target) followed by [`Config::namespace`], either may be
    /// empty. With it, a server drains key K to `<drain-to>/<staging.namespace>/<namespace>/K`
    /// and an agent writing straight to `durable.url` = `<drain-to>/<staging.namespace>`
    /// writes `<namespace>/K`: the same place.
    pub fn staging_namespace(&self) -> String {
        join_namespaces(self.text("staging.namespace"), self.namespace())
    }
}

/// A durable-store URL one namespace down: `/data` -> `/data/alice/heat`,
/// `s3://bucket/p?endpoint=URL` -> `s3://bucket/p/alice/heat?endpoint=URL`; unchanged for an
/// empty namespace.
pub fn namespaced_url(url: &str, namespace: &str) -> String {
    if namespace.is_empty() {
        return url.to_string();
    }
    let (base, query) = url.split_at(url.find('?').unwrap_or(url.len()));
    format!("{}/{namespace}{query}", base.trim_end_matches('/'))
}

/// `a/b`, or whichever of the two is not empty.
pub fn join_namespaces(outer: &str, inner: &str) -> String {
    match (outer.is_empty(), inner.is_empty()) {
        (true, _) => inner.to_string(),
        (false, true) => outer.to_string(),
        (false, false) => format!("{outer}/{inner}"),
    }
}

/// The value of a `job.*` setting a launcher gives, with its source, when no flag, `CASCADE_*`
/// variable or config file did; None to use the row's built-in default. `resolved` holds the
/// settings above it in the table (job.id comes first).
pub(crate) fn detected(key: &str, inputs: &Inputs, resolved: &Resolved) -> Option<(Value, Source)> {
    if !key.starts_with("job.") {
        return None;
    }
    let env = &inputs.env;
    if key == "job.id" {
        return first_valid(
            env,
            &["SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"],
            |v| check_job_id(v).is_ok(),
        )
        .map(|(var, v)| (Value::Text(v.to_string()), Source::Env(var)));
    }
    if key == "job.namespace" && env.contains_key("CASCADE_NAMESPACE") {
        // Set but empty (empty variables are otherwise unset): explicitly no namespace.
        return Some((Value::Text(String::new()), Source::Env("CASCADE_NAMESPACE")));
    }
    let job_id = resolved.text("job.id");
    if job_id.is_empty() {
        return None;
    }
    match key {
        "job.name" => Some(
            match first_valid(env, &["SLURM_JOB_NAME"], |v| check_job_name(v).is_ok()) {
                Some((var, name)) => (Value::Text(name.to_string()), Source::Env(var)),
                None => (
                    Value::Text(job_id.to_string()),
                    Source::Default("the job id".into()),
                ),
            },
        ),
        "job.node" => Some(
            match first_valid(env, &["SLURMD_NODENAME", "PMIX_HOSTNAME"], |v| {
                check_node_name(v).is_ok()
            }) {
                Some((var, node)) => (Value::Text(node.to_string()), Source::Env(var)),
                None => (
                    Value::Text(node_name_of_host(&inputs.host_name())),
                    Source::Default("host name".into()),
                ),
            },
        ),
        "job.nodes" => Some(detected_nodes(env)),
        "job.node_ranks" => {
            ranks_on_this_node(env).map(|(n, var)| (Value::Count(u64::from(n)), Source::Env(var)))
        }
        // A job known only by its id (a bare mpirun: a new id every run) gets no namespace:
        // its restart, a new job, must find the checkpoints. Name the job to get one.
        "job.namespace" if resolved.defaulted("job.name") => None,
        "job.namespace" => {
            let user = sanitized(&inputs.user_name());
            let name = sanitized(resolved.text("job.name"));
            Some((
                Value::Text(format!("{user}/{name}")),
                Source::Default("<user>/<job.name>".into()),
            ))
        }
        _ => None,
    }
}

/// A host name as a node name: without its domain (launchers' node lists name nodes by
/// their short names), characters a node name cannot have replaced by `_`.
fn node_name_of_host(host: &str) -> String {
    let short = host.split('.').next().unwrap_or(host);
    let name: String = short
        .chars()
        .map(|c| {
            let bad = "/,[]".contains(c) || c.is_whitespace() || c.is_control();
            if bad {
                '_'
            } else {
                c
            }
        })
        .collect();
    if check_node_name(&name).is_ok() {
        name
    } else {
        "localhost".to_string()
    }
}

/// The node count (or list) from Slurm, else Open MPI, else 1.
fn detected_nodes(env: &BTreeMap<String, String>) -> (Value, Source) {
    // Inside a job step (srun), the step's nodes write the checkpoints, not the allocation's.
    let in_step = ["SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST"]
        .iter()
        .any(|v| env.contains_key(*v));
    let (count_vars, list_var): (&[&'static str], &'static str) = if in_step {
        (&["SLURM_STEP_NUM_NODES"], "SLURM_STEP_NODELIST")
    } else {
        (
            &["SLURM_JOB_NUM_NODES", "SLURM_NNODES"],
            "SLURM_JOB_NODELIST",
        )
    };
    let slurm_count = first_valid(env, count_vars, |v| parse_count(v).is_ok());
    let slurm_names = env
        .get(list_var)
        .and_then(|list| match NodeCount::parse(list) {
            Ok(NodeCount::Names(names)) => Some((list.trim(), names.len())),
            _ => None,
        });
    match (slurm_count, slurm_names) {
        // A list that disagrees with the count is not trusted; the count is.
        (Some((_, count)), Some((_, names)))
            if parse_count(count).map(u64::from) != Ok(names as u64) => {}
        (_, Some((list, _))) => {
            return (Value::Text(list.to_string()), Source::Env(list_var));
        }
        _ => {}
    }
    if let Some((var, count)) = slurm_count {
        return (Value::Text(count.trim().to_string()), Source::Env(var));
    }
    if let Some((var, count)) = first_valid(env, &["OMPI_MCA_orte_num_nodes"], |v| {
        parse_count(v).is_ok()
    }) {
        return (Value::Text(count.trim().to_string()), Source::Env(var));
    }
    let size = |var: &str| env.get(var).and_then(|v| parse_count(v).ok());
    if let (Some(world), Some(local)) = (
        size("OMPI_COMM_WORLD_SIZE"),
        size("OMPI_COMM_WORLD_LOCAL_SIZE"),
    ) {
        // Ranks spread unevenly give no exact count; rounding up never completes a job's
        // checkpoint early (a count too high waits for a node that does not come instead).
        let nodes = world.div_ceil(local);
        let how = if world % local == 0 {
            "OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE"
        } else {
            "OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE, rounded up (ranks spread unevenly: set CASCADE_JOB_NODES)"
        };
        return (Value::Text(nodes.to_string()), Source::Default(how.into()));
    }
    (
        Value::Text("1".into()),
        Source::Default("no launcher gives the node count".into()),
    )
}

/// The first of `vars` that is set, not empty and `ok`, with its (trimmed) value.
fn first_valid<'e>(
    env: &'e BTreeMap<String, String>,
    vars: &[&'static str],
    ok: impl Fn(&str) -> bool,
) -> Option<(&'static str, &'e str)> {
    vars.iter().find_map(|&var| {
        let value = env.get(var)?.trim();
        (!value.is_empty() && ok(value)).then_some((var, value))
    })
}

/// Checks the job settings against each other once all are resolved: a job's node is one of
/// its node names, and job settings given by hand need a job id.
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    let explicit = |key: &str| {
        config
            .get(key)
            .filter(|e| !matches!(e.source, Source::Default(_)) && !config.text(key).is_empty())
    };
    if config.text("job.id").is_empty() {
        for key in ["job.name", "job.node", "job.nodes"] {
            if let Some(e) = explicit(key) {
                return Err(ConfigError(format!(
                    "{key} = {} ({}) but there is no job id: set CASCADE_JOB (job.id) too, or run under Slurm or mpirun",
                    e.value, e.source
                )));
            }
        }
        return Ok(());
    }
    if let Some(job) = config.job() {
        if let Some(names) = &job.node_names {
            if !names.value.contains(&job.node.value) {
                return Err(ConfigError(format!(
                    "job.node = {} ({}) is not one of job.nodes = {} ({}): set CASCADE_NODE to one of them, or CASCADE_JOB_NODES",
                    job.node.value,
                    job.node.source,
                    config.text("job.nodes"),
                    names.source
                )));
            }
        }
    }
    Ok(())
}

/// `text` made one safe path component: `/`, white space and control characters become `_`;
/// "", "." and ".." get a leading `_`.
pub fn sanitized(text: &str) -> String {
    let clean: String = text
        .trim()
        .chars()
        .map(|c| {
            if c == '/' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    match clean.as_str() {
        "" | "." | ".." => format!("_{clean}"),
        _ => clean,
    }
}

/// `job.nodes`: a count or node names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCount {
    Count(u32),
    Names(Vec<String>),
}

impl NodeCount {
    /// "4" is a count; anything else is a host list of distinct valid node names, plain
    /// ("n1,n2,n3", or a single name that is not a number) or in Slurm's form ("n[1-3]").
    pub fn parse(text: &str) -> Result<NodeCount, String> {
        let text = text.trim();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return parse_count(text).map(NodeCount::Count);
        }
        let names = expand_hostlist(text).map_err(|why| {
            format!("expected a number of nodes or node names separated by commas ({why})")
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for name in &names {
            check_node_name(name).map_err(|why| format!("node {name:?}: {why}"))?;
            if !seen.insert(name.as_str()) {
                return Err(format!("node {name:?} is listed twice"));
            }
        }
        Ok(NodeCount::Names(names))
    }
}

fn parse_count(text: &str) -> Result<u32, String> {
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|_| "not a whole number".to_string())?;
    if !(1..=MAX_NODES).contains(&n) {
        return Err(format!("a number of nodes must be from 1 to {MAX_NODES}"));
    }
    Ok(n as u32)
}

/// Parses `job.nodes`, keeping it as text: a count, or the host list as given (short in
/// `cascade config` however many nodes it names).
pub(crate) fn parse_nodes(text: &str) -> Result<Value, String> {
    Ok(Value::Text(match NodeCount::parse(text)? {
        NodeCount::Count(n) => n.to_string(),
        NodeCount::Names(_) => text.trim().to_string(),
    }))
}

/// A job id: one line of text without `/`.
pub(crate) fn check_job_id(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("empty job id".into());
    }
    if text.contains('/') || text.chars().any(char::is_control) {
        return Err("a job id cannot contain / or control characters".into());
    }
    Ok(())
}

/// A job name: one line of text.
pub(crate) fn check_job_name(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("empty job name".into());
    }
    if text.chars().any(char::is_control) {
        return Err("a job name cannot contain control characters".into());
    }
    Ok(())
}

/// A node name: what a host name may be, and never a list or a path.
pub fn check_node_name(text: &str) -> Result<(), String> {
    if text.is_empty() || text == "." || text == ".." {
        return Err("not a node name".into());
    }
    if text.len() > 255 {
        return Err("a node name has at most 255 bytes".into());
    }
    if text
        .chars()
        .any(|c| "/,[]".contains(c) || c.is_whitespace() || c.is_control())
    {
        return Err(
            "a node name cannot contain /, commas, brackets, white space or control characters"
                .into(),
        );
    }
    Ok(())
}

/// Expands a Slurm host list (`node[01-04,07],gpu3`, `rack[1-2]-n[1-2]`) into host names, in
/// order. A bracket holds numbers and ranges `LO-HI`, separated by commas; the width of `LO`
/// (with its leading zeros) is the least width of every number of the range. Several
/// brackets in one name give every combination, the last one varying fastest.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_outside_brackets(list)? {
        let item = item.trim();
        if !item.is_empty() {
            expand_host_pattern(item, &mut hosts)?;
        }
    }
    if hosts.is_empty() {
        return Err("an empty host list".into());
    }
    Ok(hosts)
}

/// Splits at the commas that are not inside brackets; checks the brackets pair up.
fn split_outside_brackets(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut start = 0;
    let mut open = false;
    for (i, c) in list.char_indices() {
        match c {
            '[' if open => return Err("nested [".into()),
            '[' => open = true,
            ']' if !open => return Err("] without [".into()),
            ']' => open = false,
            ',' if !open => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if open {
        return Err("[ without ]".into());
    }
    items.push(&list[start..]);
    Ok(items)
}

/// Appends the hosts of one pattern (`prefix[ranges]suffix...`) to `hosts`.
fn expand_host_pattern(pattern: &str, hosts: &mut Vec<String>) -> Result<(), String> {
    let mut names = vec![String::new()];
    let mut rest = pattern;
    while !rest.is_empty() {
        let (literal, after) = match rest.find('[') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        for name in &mut names {
            name.push_str(literal);
        }
        if after.is_empty() {
            break;
        }
        let close = after.find(']').ok_or("[ without ]")?;
        let numbers = expand_ranges(&after[1..close])?;
        if (names.len() as u64).saturating_mul(numbers.len() as u64) + hosts.len() as u64
            > MAX_NODES
        {
            return Err(format!("more than {MAX_NODES} hosts"));
        }
        names = names
            .iter()
            .flat_map(|name| numbers.iter().map(move |n| format!("{name}{n}")))
            .collect();
        rest = &after[close + 1..];
    }
    hosts.extend(names);
    Ok(())
}

/// `01-03,7` -> ["01", "02", "03", "7"].
fn expand_ranges(ranges: &str) -> Result<Vec<String>, String> {
    let mut numbers = Vec::new();
    for range in ranges.split(',') {
        let range = range.trim();
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!(
                "[{ranges}]: {range:?} is not a number or LO-HI range"
            ));
        }
        let number = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| format!("[{ranges}]: {s} is too large"))
        };
        let (first, last) = (number(lo)?, number(hi)?);
        if first > last {
            return Err(format!("[{ranges}]: {range} runs backwards"));
        }
        if last - first + numbers.len() as u64 >= MAX_NODES {
            return Err(format!("more than {MAX_NODES} hosts"));
        }
        let width = lo.len();
        numbers.extend((first..=last).map(|n| format!("{n:0width$}")));
    }
    Ok(numbers)
}

/// How many ranks of the job run on this node, as the launcher says (`job.node_ranks`):
/// Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, else Slurm's `SLURM_STEP_TASKS_PER_NODE`
/// (`2(x3),1`) at `SLURM_NODEID`; None when neither does. The end of a job on a node waits for
/// that many ranks to have started (a rank that ends before its neighbour starts is not the
/// last).
fn ranks_on_this_node(env: &BTreeMap<String, String>) -> Option<(u32, &'static str)> {
    let count = |v: &str| v.trim().parse::<u32>().ok().filter(|n| *n > 0);
    if let Some(n) = env.get("OMPI_COMM_WORLD_LOCAL_SIZE").and_then(|v| count(v)) {
        return Some((n, "OMPI_COMM_WORLD_LOCAL_SIZE"));
    }
    let node: usize = env.get("SLURM_NODEID")?.trim().parse().ok()?;
    let per_node = env.get("SLURM_STEP_TASKS_PER_NODE")?;
    let mut first = 0usize;
    for group in per_node.split(',') {
        let (tasks, repeat) = match group.trim().split_once("(x") {
            Some((tasks, rest)) => (tasks, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (group.trim(), 1),
        };
        if node < first + repeat {
            return count(tasks).map(|n| (n, "SLURM_STEP_TASKS_PER_NODE"));
        }
        first += repeat;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand_hostlist(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn expands_slurm_host_lists() {
        assert_eq!(hosts("node07"), ["node07"]);
        assert_eq!(
            hosts("node[01-04,07],gpu3"),
            ["node01", "node02", "node03", "node04", "node07", "gpu3"]
        );
        assert_eq!(hosts("n[9-11]"), ["n9", "n10", "n11"]);
        assert_eq!(hosts("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(hosts("a,b , c,"), ["a", "b", "c"]);
        assert_eq!(hosts("cn[1-2]-ib"), ["cn1-ib", "cn2-ib"]);
        assert_eq!(hosts("r[1-2]n[1,3]"), ["r1n1", "r1n3", "r2n1", "r2n3"]);
        assert_eq!(hosts("[1-3]"), ["1", "2", "3"]);
        assert_eq!(hosts("x[5]"), ["x5"]);
    }

    #[test]
    fn rejects_malformed_host_lists() {
        for bad in [
            "",
            ",",
            "n[1-2",
            "n1-2]",
            "n[[1]]",
            "n[a-b]",
            "n[3-1]",
            "n[]",
            "n[1-]",
            "n[-1]",
            "n[0-99999999]",
        ] {
            assert!(expand_hostlist(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn node_counts_are_numbers_or_distinct_names() {
        assert_eq!(NodeCount::parse("4"), Ok(NodeCount::Count(4)));
        assert_eq!(
            NodeCount::parse("n1, n2,n3"),
            Ok(NodeCount::Names(vec![
                "n1".into(),
                "n2".into(),
                "n3".into()
            ]))
        );
        assert_eq!(
            NodeCount::parse("solo"),
            Ok(NodeCount::Names(vec!["solo".into()]))
        );
        assert_eq!(
            NodeCount::parse("n[1-2],x"),
            Ok(NodeCount::Names(vec!["n1".into(), "n2".into(), "x".into()]))
        );
        for bad in [
            "0",
            "",
            " , ",
            "a,a",
            "n[1-2],n2",
            "a/b",
            "a b,c",
            "99999999999",
        ] {
            assert!(NodeCount::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn host_names_become_short_node_names() {
        assert_eq!(node_name_of_host("node01.cluster.example"), "node01");
        assert_eq!(node_name_of_host("vm"), "vm");
        assert_eq!(node_name_of_host("a b,c"), "a_b_c");
        assert_eq!(node_name_of_host(".hidden"), "localhost");
    }

    #[test]
    fn sanitized_is_one_path_component() {
        assert_eq!(sanitized("heat solver/v2"), "heat_solver_v2");
        assert_eq!(sanitized(".."), "_..");
        assert_eq!(sanitized(""), "_");
        assert_eq!(sanitized("prterun-vm-12@1"), "prterun-vm-12@1");
    }

    #[test]
    fn durable_urls_go_one_namespace_down() {
        assert_eq!(namespaced_url("/data", ""), "/data");
        assert_eq!(namespaced_url("/data/", "u/j"), "/data/u/j");
        assert_eq!(namespaced_url("file:///data", "u/j"), "file:///data/u/j");
        assert_eq!(
            namespaced_url("s3://b/p?endpoint=http://h:9000", "u/j"),
            "s3://b/p/u/j?endpoint=http://h:9000"
        );
        assert_eq!(
            namespaced_url("s3://b?endpoint=http://h", "u/j"),
            "s3://b/u/j?endpoint=http://h"
        );
    }

    #[test]
    fn ranks_on_this_node_come_from_open_mpi_or_slurm() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            ranks_on_this_node(&env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "4")])),
            Some((4, "OMPI_COMM_WORLD_LOCAL_SIZE"))
        );
        let slurm = |node: &str| {
            ranks_on_this_node(&env(&[
                ("SLURM_NODEID", node),
                ("SLURM_STEP_TASKS_PER_NODE", "2(x3),1"),
            ]))
            .map(|(n, _)| n)
        };
        assert_eq!(slurm("0"), Some(2));
        assert_eq!(slurm("2"), Some(2));
        assert_eq!(slurm("3"), Some(1));
        assert_eq!(slurm("4"), None);
        assert_eq!(ranks_on_this_node(&env(&[])), None);
        assert_eq!(
            ranks_on_this_node(&env(&[
                ("SLURM_NODEID", "0"),
                ("SLURM_STEP_TASKS_PER_NODE", "2(x")
            ])),
            None
        );
    }

    #[test]
    fn namespaces_join_without_empty_components() {
        assert_eq!(join_namespaces("", ""), "");
        assert_eq!(join_namespaces("site", ""), "site");
        assert_eq!(join_namespaces("", "u/j"), "u/j");
        assert_eq!(join_namespaces("site", "u/j"), "site/u/j");
    }
}
