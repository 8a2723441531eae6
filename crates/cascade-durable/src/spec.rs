//! Parsing a durable-store spec: `file:///dir` (or a plain absolute path) and
//! `s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1`.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Where the durable tier lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// A local directory (a parallel file system mount in production).
    Dir(PathBuf),
    /// An S3-compatible object store.
    S3(S3Spec),
}

/// An S3-compatible store: bucket, key prefix, endpoint and credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Spec {
    pub bucket: String,
    /// Key prefix inside the bucket, without leading or trailing '/'; may be empty.
    pub prefix: String,
    /// `http://host:port` or `https://...`; None means AWS itself.
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("S3Spec")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

fn env_first(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

impl Spec {
    /// Parses a spec. S3 credentials come from the query (`access_key`, `secret_key`), else
    /// from `CASCADE_S3_ACCESS_KEY_ID` / `CASCADE_S3_SECRET_ACCESS_KEY`, else from
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`; the endpoint and region likewise from
    /// `CASCADE_S3_ENDPOINT` / `AWS_ENDPOINT_URL` and `CASCADE_S3_REGION` / `AWS_REGION`.
    pub fn parse(spec: &str) -> Result<Spec> {
        let bad = |reason: &str| Error::Config {
            spec: spec.to_string(),
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
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = value.to_string();
            match key {
                "endpoint" => s3.endpoint = Some(value),
                "region" => s3.region = value,
                "access_key" | "access_key_id" => s3.access_key_id = Some(value),
                "secret_key" | "secret_access_key" => s3.secret_access_key = Some(value),
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
        if s3.access_key_id.is_none() {
            s3.access_key_id = env_first(&["CASCADE_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"]);
        }
        if s3.secret_access_key.is_none() {
            s3.secret_access_key =
                env_first(&["CASCADE_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"]);
        }
        s3.session_token = env_first(&["CASCADE_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"]);
        if let Some(ep) = &s3.endpoint {
            if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                return Err(bad("endpoint must start with http:// or https://"));
            }
        }
        match (&s3.access_key_id, &s3.secret_access_key) {
            (Some(_), Some(_)) => {}
            _ => {
                return Err(bad(
                    "no S3 credentials: set CASCADE_S3_ACCESS_KEY_ID and CASCADE_S3_SECRET_ACCESS_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
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
        assert!(!format!("{s:?}").contains("secret_access_key"));
        let e = Spec::parse("s3://bkt?bogus=1&access_key=a&secret_key=b").unwrap_err();
        assert!(e.to_string().contains("unknown option"), "{e}");
        assert!(Spec::parse("s3://?access_key=a&secret_key=b").is_err());
    }
}
