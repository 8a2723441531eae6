//! Parsing a durable-store spec: `file:///dir` (or a plain absolute path) and
//! `s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1`.

use std::path::PathBuf;

use cascade_secret::Secret;

use crate::error::{Error, Result};

/// Where the durable tier lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// A local directory (a parallel file system mount in production).
    Dir(PathBuf),
    /// An S3-compatible object store.
    S3(S3Spec),
}

/// An S3-compatible store: bucket, key prefix, endpoint and credentials (the secret parts
/// are [`Secret`]s, so `{:?}` never shows them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Spec {
    pub bucket: String,
    /// Key prefix inside the bucket, without leading or trailing '/'; may be empty.
    pub prefix: String,
    /// `http://host:port` or `https://...`; None means AWS itself.
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Secret>,
    pub session_token: Option<Secret>,
}

/// Environment variable naming a credentials file: AWS's shared-credentials format
/// (`aws_access_key_id = ...`, `aws_secret_access_key = ...`, optionally
/// `aws_session_token = ...`, in a `[default]` section or before any section), so no secret
/// need be in a URL, the command line or the environment.
pub const CREDENTIALS_FILE_ENV: &str = "CASCADE_S3_CREDENTIALS_FILE";

/// Access key id, secret key and session token from a credentials file. Errors never show
/// the file's contents.
type FileCredentials = (Option<String>, Option<Secret>, Option<Secret>);

fn read_credentials_file(path: &str) -> std::result::Result<FileCredentials, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let text = e.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text).to_string();
        format!("{CREDENTIALS_FILE_ENV} {path}: {text}")
    })?;
    let (mut id, mut secret, mut token) = (None, None, None);
    let mut in_default = true;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[') {
            in_default = section.trim_end_matches(']').trim() == "default";
            continue;
        }
        if !in_default {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!(
                "{CREDENTIALS_FILE_ENV} {path}:{}: expected key = value",
                n + 1
            ));
        };
        let value = value.trim().to_string();
        match key.trim() {
            "aws_access_key_id" => id = Some(value),
            "aws_secret_access_key" => secret = Some(Secret::new(value)),
            "aws_session_token" => token = Some(Secret::new(value)),
            _ => {}
        }
    }
    if id.is_none() || secret.is_none() {
        return Err(format!(
            "{CREDENTIALS_FILE_ENV} {path}: no aws_access_key_id and aws_secret_access_key in its [default] section"
        ));
    }
    Ok((id, secret, token))
}

fn env_first(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

impl Spec {
    /// Parses a spec. S3 credentials come from the query (`access_key`, `secret_key`), else
    /// from the file `CASCADE_S3_CREDENTIALS_FILE` names, else from
    /// `CASCADE_S3_ACCESS_KEY_ID` / `CASCADE_S3_SECRET_ACCESS_KEY`, else from
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`; the endpoint and region likewise from
    /// `CASCADE_S3_ENDPOINT` / `AWS_ENDPOINT_URL` and `CASCADE_S3_REGION` / `AWS_REGION`.
    pub fn parse(spec: &str) -> Result<Spec> {
        // The spec may carry a secret key: errors show it with the credentials hidden.
        let bad = |reason: &str| Error::Config {
            spec: cascade_secret::redact_url(spec),
            reason: reason.to_string(),
        };
        if let Some(rest) = spec.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(bad("a file:// spec needs an absolute path (file:///dir)"));
            }
            return Ok(Spec::Dir(PathBuf::from(rest)));
        }
        if spec.starts_with('/') {
            return Ok(Spec::Dir(PathBuf::from(spec)));
        }
        let Some(rest) = spec.strip_prefix("s3://") else {
            return Err(bad("expected file:///dir, /dir or s3://bucket/prefix"));
        };
        let (location, query) = match rest.split_once('?') {
            Some((l, q)) => (l, q),
            None => (rest, ""),
        };
        let (bucket, prefix) = match location.split_once('/') {
            Some((b, p)) => (b, p.trim_matches('/')),
            None => (location, ""),
        };
        if bucket.is_empty() {
            return Err(bad("no bucket name after s3://"));
        }
        let mut s3 = S3Spec {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: None,
            region: String::new(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                // Not echoed: an option without '=' may be a pasted secret.
                return Err(bad(
                    "an option without '=' (known: endpoint, region, access_key, secret_key)",
                ));
            };
            let value = value.to_string();
            match key {
                "endpoint" => s3.endpoint = Some(value),
                "region" => s3.region = value,
                "access_key" | "access_key_id" => s3.access_key_id = Some(value),
                "secret_key" | "secret_access_key" => s3.secret_access_key = Some(value.into()),
                _ => {
                    return Err(bad(&format!(
                        "unknown option {key:?} (known: endpoint, region, access_key, secret_key)"
                    )))
                }
            }
        }
        if s3.endpoint.is_none() {
            s3.endpoint = env_first(&["CASCADE_S3_ENDPOINT", "AWS_ENDPOINT_URL"]);
        }
        if s3.region.is_empty() {
            s3.region = env_first(&["CASCADE_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"])
                .unwrap_or_else(|| "us-east-1".to_string());
        }
        if s3.access_key_id.is_none() && s3.secret_access_key.is_none() {
            if let Some(path) = env_first(&[CREDENTIALS_FILE_ENV]) {
                let (id, secret, token) = read_credentials_file(&path).map_err(|e| bad(&e))?;
                s3.access_key_id = id;
                s3.secret_access_key = secret;
                s3.session_token = token;
            }
        }
        if s3.access_key_id.is_none() {
            s3.access_key_id = env_first(&["CASCADE_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"]);
        }
        if s3.secret_access_key.is_none() {
            s3.secret_access_key =
                env_first(&["CASCADE_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"])
                    .map(Secret::new);
        }
        if s3.session_token.is_none() {
            s3.session_token =
                env_first(&["CASCADE_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"]).map(Secret::new);
        }
        if let Some(ep) = &s3.endpoint {
            if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                return Err(bad("endpoint must start with http:// or https://"));
            }
        }
        match (&s3.access_key_id, &s3.secret_access_key) {
            (Some(_), Some(_)) => {}
            _ => {
                return Err(bad(
                    "no S3 credentials: set CASCADE_S3_CREDENTIALS_FILE, or CASCADE_S3_ACCESS_KEY_ID and CASCADE_S3_SECRET_ACCESS_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
                ))
            }
        }
        Ok(Spec::S3(s3))
    }

    /// A short name for messages: `file:///dir` or `s3://bucket/prefix` (no credentials).
    pub fn describe(&self) -> String {
        match self {
            Spec::Dir(p) => format!("file://{}", p.display()),
            Spec::S3(s) if s.prefix.is_empty() => format!("s3://{}", s.bucket),
            Spec::S3(s) => format!("s3://{}/{}", s.bucket, s.prefix),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dir_specs() {
        assert_eq!(
            Spec::parse("file:///a/b").unwrap(),
            Spec::Dir(PathBuf::from("/a/b"))
        );
        assert_eq!(Spec::parse("/a").unwrap(), Spec::Dir(PathBuf::from("/a")));
        assert!(Spec::parse("file://a/b").is_err());
        assert!(Spec::parse("ftp://x").is_err());
    }

    #[test]
    fn parses_s3_specs() {
        let s = Spec::parse(
            "s3://bkt/some/prefix/?endpoint=http://127.0.0.1:7070&access_key=a&secret_key=b&region=r1",
        )
        .unwrap();
        let Spec::S3(s) = s else { panic!("not s3") };
        assert_eq!(s.bucket, "bkt");
        assert_eq!(s.prefix, "some/prefix");
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:7070"));
        assert_eq!(s.region, "r1");
        assert_eq!(s.access_key_id.as_deref(), Some("a"));
        assert_eq!(s.secret_access_key.as_ref().map(Secret::expose), Some("b"));
        let e = Spec::parse("s3://bkt?bogus=1&access_key=a&secret_key=b").unwrap_err();
        assert!(e.to_string().contains("unknown option"), "{e}");
        assert!(Spec::parse("s3://?access_key=a&secret_key=b").is_err());
    }

    #[test]
    fn secrets_never_show_in_errors_or_debug() {
        let s =
            Spec::parse("s3://bkt?endpoint=http://h:1&access_key=AK&secret_key=TOPSECRET").unwrap();
        assert!(!format!("{s:?}").contains("TOPSECRET"), "{s:?}");
        for bad in [
            "s3://bkt?region=r&access_key=AK&secret_key=TOPSECRET&bogus=1",
            "s3://bkt?secret_key=TOPSECRET&access_key=AK&endpoint=ftp://h",
            "s3://?access_key=AK&secret_key=TOPSECRET",
            "s3://bkt?access_key=AK&TOPSECRET",
        ] {
            let e = Spec::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("TOPSECRET"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
