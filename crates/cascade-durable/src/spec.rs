//! Parsing a durable-store spec: `file:///dir` (or a plain absolute path) and
//! `s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1` (credentials: [`Credentials`]).

use std::path::{Path, PathBuf};

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
    /// Static credentials; both None when [`S3Spec::credentials`] is a provider.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Secret>,
    pub session_token: Option<Secret>,
    /// Where the credentials come from.
    pub credentials: Credentials,
    /// Sign each request's body (SHA-256 in the signature; `sign_payload=`): the default
    /// over `http://`, where nothing else protects it; off over HTTPS, whose TLS does, as
    /// the AWS CLI does. Hashing costs about 0.5 s per GiB before the first byte is sent.
    /// Only multipart parts (and bodiless requests) follow it: single PUTs
    /// (backend/signed_puts.rs) and streaming uploads (backend/stream.rs) sign either way.
    pub sign_payload: bool,
}

/// Where an S3 store's credentials come from, first found wins (the order of the variants):
/// Cascade's own places, then the AWS chain as the AWS CLI and SDKs search it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `access_key=` and `secret_key=` in the URL.
    Url,
    /// The file `CASCADE_S3_CREDENTIALS_FILE` names (shared-credentials format).
    CascadeFile(PathBuf),
    /// `CASCADE_S3_ACCESS_KEY_ID` and `CASCADE_S3_SECRET_ACCESS_KEY`.
    CascadeEnv,
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    AwsEnv,
    /// A profile of the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
    /// ~/.aws/credentials) or config file (`AWS_CONFIG_FILE`, else ~/.aws/config): the URL's
    /// `profile=`, else `AWS_PROFILE`, else `default`.
    Profile { file: PathBuf, profile: String },
    /// No static credentials: the object store client asks a provider when it needs them:
    /// web identity (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`), the container's
    /// credentials endpoint (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`, or `..._FULL_URI` with
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`), else the instance metadata service
    /// (`AWS_EC2_METADATA_SERVICE_ENDPOINT` or `AWS_METADATA_ENDPOINT` to move it).
    Provider(&'static str),
}

impl std::fmt::Display for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Url => write!(f, "the URL"),
            Credentials::CascadeFile(path) => {
                write!(f, "{CREDENTIALS_FILE_ENV} {}", path.display())
            }
            Credentials::CascadeEnv => write!(f, "CASCADE_S3_ACCESS_KEY_ID"),
            Credentials::AwsEnv => write!(f, "AWS_ACCESS_KEY_ID"),
            Credentials::Profile { file, profile } => {
                write!(f, "profile {profile} of {}", file.display())
            }
            Credentials::Provider(what) => write!(f, "{what}"),
        }
    }
}

/// Environment variable naming a credentials file: AWS's shared-credentials format
/// (`aws_access_key_id = ...`, `aws_secret_access_key = ...`, optionally
/// `aws_session_token = ...`, in a `[default]` section or before any section), so no secret
/// need be in a URL, the command line or the environment.
pub const CREDENTIALS_FILE_ENV: &str = "CASCADE_S3_CREDENTIALS_FILE";

/// Static credentials found somewhere: access key id, secret key, session token.
type Found = (String, Secret, Option<Secret>);

/// The `key = value` lines of one section of an INI file (AWS's shared files). `section` is
/// matched exactly; lines before any section count as `[default]`. None when the file has no
/// such section. Errors never show the file's contents.
fn ini_section(
    text: &str,
    section: &str,
    what: &str,
) -> std::result::Result<Option<Vec<(String, String)>>, String> {
    let mut current = Some("default".to_string());
    let mut found = false;
    let mut pairs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            current = Some(name.trim_end_matches(']').trim().to_string());
            continue;
        }
        if current.as_deref() != Some(section) {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("{what}:{}: expected key = value", n + 1));
        };
        found = true;
        pairs.push((key.trim().to_string(), value.trim().to_string()));
    }
    // A section header alone counts as present (its keys may be in the other file).
    let header = text.lines().any(|l| {
        l.trim()
            .strip_prefix('[')
            .map(|n| n.trim_end_matches(']').trim())
            == Some(section)
    });
    Ok((found || header).then_some(pairs))
}

/// Credentials among `pairs`: None without an access key id and a secret key.
fn credentials_in(pairs: &[(String, String)]) -> Option<Found> {
    let get = |k: &str| {
        pairs
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let id = get("aws_access_key_id")?;
    let secret = get("aws_secret_access_key")?;
    Some((
        id,
        Secret::new(secret),
        get("aws_session_token").map(Secret::new),
    ))
}

fn read_text(path: &Path, what: &str) -> std::result::Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| {
        let text = e.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text).to_string();
        format!("{what}: {text}")
    })
}

/// Looks up environment variables: the process's, or a test's.
type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn env_first(env: Env, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| env(n).filter(|v| !v.is_empty()))
}

/// A profile's credentials and region from the shared credentials and config files.
/// `required`: the profile was asked for by name, so its absence is an error.
struct Profile {
    name: String,
    credentials: Option<(Found, PathBuf)>,
    region: Option<String>,
}

fn read_profile(env: Env, name: &str, required: bool) -> std::result::Result<Profile, String> {
    let home = env_first(env, &["HOME"]).unwrap_or_default();
    let in_home = |rel: &str| (!home.is_empty()).then(|| Path::new(&home).join(rel));
    let credentials_file = env_first(env, &["AWS_SHARED_CREDENTIALS_FILE"])
        .map(PathBuf::from)
        .or_else(|| in_home(".aws/credentials"));
    let config_file = env_first(env, &["AWS_CONFIG_FILE"])
        .map(PathBuf::from)
        .or_else(|| in_home(".aws/config"));
    let mut profile = Profile {
        name: name.to_string(),
        credentials: None,
        region: None,
    };
    let mut seen = false;
    // The credentials file names sections after the profile; the config file as
    // "profile NAME", except "default".
    let config_section = if name == "default" {
        name.to_string()
    } else {
        format!("profile {name}")
    };
    for (file, section) in [
        (credentials_file, name.to_string()),
        (config_file, config_section),
    ] {
        let Some(file) = file.filter(|f| f.exists()) else {
            continue;
        };
        let what = file.display().to_string();
        let text = read_text(&file, &what)?;
        let Some(pairs) = ini_section(&text, &section, &what)? else {
            continue;
        };
        seen = true;
        if profile.credentials.is_none() {
            profile.credentials = credentials_in(&pairs).map(|c| (c, file.clone()));
        }
        if profile.region.is_none() {
            profile.region = pairs
                .iter()
                .find(|(k, _)| k == "region")
                .map(|(_, v)| v.clone());
        }
    }
    if required && !seen {
        return Err(format!(
            "no profile {name:?} in the shared credentials or config file (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, ~/.aws/credentials, ~/.aws/config)"
        ));
    }
    Ok(profile)
}

/// Which provider the object store client will ask, given no static credentials.
fn provider(env: Env) -> &'static str {
    if env_first(env, &["AWS_WEB_IDENTITY_TOKEN_FILE"]).is_some()
        && env_first(env, &["AWS_ROLE_ARN"]).is_some()
    {
        "web identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN)"
    } else if env_first(env, &["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"]).is_some() {
        "the container's credentials endpoint (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI)"
    } else if env_first(env, &["AWS_CONTAINER_CREDENTIALS_FULL_URI"]).is_some()
        && env_first(env, &["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"]).is_some()
    {
        "the container's credentials endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI)"
    } else {
        "the instance metadata service (no credentials in the URL, CASCADE_S3_CREDENTIALS_FILE, CASCADE_S3_* or AWS_* variables or a shared credentials file)"
    }
}

const KNOWN_OPTIONS: &str =
    "endpoint, region, profile, access_key, secret_key, session_token, sign_payload";

impl Spec {
    /// Parses a spec (module docs) with the process's environment. An S3 store's
    /// credentials come from the first of [`Credentials`]' places that has them; its
    /// endpoint from the URL, else `CASCADE_S3_ENDPOINT` / `AWS_ENDPOINT_URL`; its region
    /// from the URL, else `CASCADE_S3_REGION` / `AWS_REGION` / `AWS_DEFAULT_REGION`, else the
    /// profile's, else us-east-1.
    pub fn parse(spec: &str) -> Result<Spec> {
        Spec::parse_with_env(spec, &|name| std::env::var(name).ok())
    }

    /// [`Spec::parse`] with environment variables looked up through `env`.
    pub fn parse_with_env(spec: &str, env: Env) -> Result<Spec> {
        // The spec may carry a secret key: errors show it with the credentials hidden.
        let bad = |reason: &str| Error::Config {
            spec: cascade_secret::redact_url(spec),
            reason: reason.to_string(),
        };
        if let Some(rest) = spec.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(bad("a file:// spec needs an absolute path (file:///dir)"));
            }
            return Ok(Spec::Dir(PathBuf::from(decode(rest))));
        }
        if spec.starts_with('/') {
            return Ok(Spec::Dir(PathBuf::from(spec)));
        }
        if !spec.starts_with("s3://") {
            return Err(bad("expected file:///dir, /dir or s3://bucket/prefix"));
        }
        // Not echoed: the parser's message may quote a pasted secret.
        let url = url::Url::parse(spec).map_err(|e| bad(&format!("not a URL ({e})")))?;
        let bucket = url.host_str().map(decode).unwrap_or_default();
        if bucket.is_empty() {
            return Err(bad("no bucket name after s3://"));
        }
        let mut s3 = S3Spec {
            bucket,
            prefix: decode(url.path()).trim_matches('/').to_string(),
            endpoint: None,
            region: String::new(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            credentials: Credentials::Url,
            sign_payload: true,
        };
        let mut profile_option = None;
        let mut sign_payload = None;
        // Values are percent-decoded, but '+' stays '+' (not a space, as in HTML forms):
        // AWS secret keys contain '+' and are often pasted unencoded.
        for pair in url
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let Some((key, value)) = pair.split_once('=') else {
                // Not echoed: an option without '=' may be a pasted secret.
                return Err(bad(&format!(
                    "an option without '=' (known: {KNOWN_OPTIONS})"
                )));
            };
            let value = decode(value);
            match decode(key).as_str() {
                "endpoint" => s3.endpoint = Some(value),
                "region" => s3.region = value,
                "profile" => profile_option = Some(value),
                "access_key" | "access_key_id" => s3.access_key_id = Some(value),
                "secret_key" | "secret_access_key" => s3.secret_access_key = Some(value.into()),
                "session_token" => s3.session_token = Some(value.into()),
                "sign_payload" => {
                    sign_payload = Some(match value.as_str() {
                        "yes" | "true" | "1" => true,
                        "no" | "false" | "0" => false,
                        _ => return Err(bad("sign_payload must be yes or no")),
                    })
                }
                other => {
                    return Err(bad(&format!(
                        "unknown option {other:?} (known: {KNOWN_OPTIONS})"
                    )))
                }
            }
        }
        if s3.endpoint.is_none() {
            s3.endpoint = env_first(env, &["CASCADE_S3_ENDPOINT", "AWS_ENDPOINT_URL"]);
        }
        if let Some(ep) = &s3.endpoint {
            if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                return Err(bad("endpoint must start with http:// or https://"));
            }
        }
        // No endpoint: AWS itself, over HTTPS.
        let over_http = s3
            .endpoint
            .as_deref()
            .is_some_and(|ep| ep.starts_with("http://"));
        s3.sign_payload = sign_payload.unwrap_or(over_http);
        let profile_name = profile_option
            .clone()
            .or_else(|| env_first(env, &["AWS_PROFILE"]))
            .unwrap_or_else(|| "default".to_string());
        let profile =
            read_profile(env, &profile_name, profile_option.is_some()).map_err(|e| bad(&e))?;
        let in_url = match (s3.access_key_id.take(), s3.secret_access_key.take()) {
            (Some(id), Some(secret)) => Some((id, secret, s3.session_token.take())),
            (None, None) => None,
            _ => return Err(bad("access_key and secret_key go together in the URL")),
        };
        let (found, source) = choose_credentials(in_url, env, &profile, profile_option.is_some())
            .map_err(|e| bad(&e))?;
        if let Some((id, secret, token)) = found {
            s3.access_key_id = Some(id);
            s3.secret_access_key = Some(secret);
            s3.session_token = token;
        }
        s3.credentials = source;
        if s3.region.is_empty() {
            s3.region = env_first(
                env,
                &["CASCADE_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"],
            )
            .or(profile.region)
            .unwrap_or_else(|| "us-east-1".to_string());
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

/// Percent-decodes a URL component ('+' stays '+'); invalid UTF-8 is replaced.
fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// The first place of [`Credentials`] with static credentials, else the provider the client
/// will ask. `profile_named`: the URL named the profile, which then comes right after the URL.
fn choose_credentials(
    in_url: Option<Found>,
    env: Env,
    profile: &Profile,
    profile_named: bool,
) -> std::result::Result<(Option<Found>, Credentials), String> {
    if let Some(found) = in_url {
        return Ok((Some(found), Credentials::Url));
    }
    let from_profile = || {
        profile.credentials.clone().map(|(found, file)| {
            let name = profile.name.clone();
            (
                Some(found),
                Credentials::Profile {
                    file,
                    profile: name,
                },
            )
        })
    };
    if profile_named {
        return from_profile().ok_or_else(|| {
            format!(
                "profile {:?} has no aws_access_key_id and aws_secret_access_key",
                profile.name
            )
        });
    }
    if let Some(path) = env_first(env, &[CREDENTIALS_FILE_ENV]) {
        let what = format!("{CREDENTIALS_FILE_ENV} {path}");
        let text = read_text(Path::new(&path), &what)?;
        let found = ini_section(&text, "default", &what)?
            .and_then(|pairs| credentials_in(&pairs))
            .ok_or_else(|| {
                format!("{what}: no aws_access_key_id and aws_secret_access_key in its [default] section")
            })?;
        return Ok((Some(found), Credentials::CascadeFile(PathBuf::from(path))));
    }
    let pair = |id: &str, secret: &str, token: &str| {
        let id = env_first(env, &[id])?;
        let secret = env_first(env, &[secret])?;
        Some((
            id,
            Secret::new(secret),
            env_first(env, &[token]).map(Secret::new),
        ))
    };
    if let Some(found) = pair(
        "CASCADE_S3_ACCESS_KEY_ID",
        "CASCADE_S3_SECRET_ACCESS_KEY",
        "CASCADE_S3_SESSION_TOKEN",
    ) {
        return Ok((Some(found), Credentials::CascadeEnv));
    }
    if let Some(found) = pair(
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ) {
        return Ok((Some(found), Credentials::AwsEnv));
    }
    if let Some(found) = from_profile() {
        return Ok(found);
    }
    Ok((None, Credentials::Provider(provider(env))))
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Parses with exactly these environment variables.
    fn parse_in(spec: &str, vars: &[(&str, String)]) -> Result<Spec> {
        let env: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        Spec::parse_with_env(spec, &|name| env.get(name).cloned())
    }

    fn s3_in(spec: &str, vars: &[(&str, String)]) -> S3Spec {
        match parse_in(spec, vars) {
            Ok(Spec::S3(s3)) => s3,
            other => panic!("{spec}: {other:?}"),
        }
    }

    #[test]
    fn parses_dir_specs() {
        assert_eq!(
            parse_in("file:///a/b", &[]).unwrap(),
            Spec::Dir(PathBuf::from("/a/b"))
        );
        assert_eq!(
            parse_in("file:///a%20b", &[]).unwrap(),
            Spec::Dir(PathBuf::from("/a b"))
        );
        assert_eq!(parse_in("/a", &[]).unwrap(), Spec::Dir(PathBuf::from("/a")));
        assert!(parse_in("file://a/b", &[]).is_err());
        assert!(parse_in("ftp://x", &[]).is_err());
    }

    #[test]
    fn payloads_are_signed_over_http_only_unless_told() {
        let http = "s3://b?endpoint=http://127.0.0.1:7070&access_key=a&secret_key=s";
        let https = "s3://b?endpoint=https://s3.example.org&access_key=a&secret_key=s";
        assert!(s3_in(http, &[]).sign_payload);
        assert!(!s3_in(https, &[]).sign_payload);
        assert!(!s3_in("s3://b?access_key=a&secret_key=s", &[]).sign_payload);
        assert!(!s3_in(&format!("{http}&sign_payload=no"), &[]).sign_payload);
        assert!(s3_in(&format!("{https}&sign_payload=yes"), &[]).sign_payload);
        let e = parse_in(&format!("{http}&sign_payload=maybe"), &[]).unwrap_err();
        assert!(
            e.to_string().contains("sign_payload must be yes or no"),
            "{e}"
        );
    }

    #[test]
    fn parses_s3_specs() {
        let s = s3_in(
            "s3://bkt/some/prefix/?endpoint=http://127.0.0.1:7070&access_key=a&secret_key=b&region=r1",
            &[],
        );
        assert_eq!(s.bucket, "bkt");
        assert_eq!(s.prefix, "some/prefix");
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:7070"));
        assert_eq!(s.region, "r1");
        assert_eq!(s.access_key_id.as_deref(), Some("a"));
        assert_eq!(s.secret_access_key.as_ref().map(Secret::expose), Some("b"));
        assert_eq!(s.credentials, Credentials::Url);
        let e = parse_in("s3://bkt?bogus=1&access_key=a&secret_key=b", &[]).unwrap_err();
        assert!(e.to_string().contains("unknown option"), "{e}");
        assert!(parse_in("s3://?access_key=a&secret_key=b", &[]).is_err());
        let e = parse_in("s3://bkt?access_key=a", &[]).unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
    }

    #[test]
    fn url_values_are_percent_decoded_and_plus_stays_plus() {
        let s = s3_in(
            "s3://bkt/run%201/x?endpoint=http%3A%2F%2F127.0.0.1%3A7070&access_key=AK&secret_key=a%2Fb%3Dc+d&region=eu%2Dwest%2D1",
            &[],
        );
        assert_eq!(s.prefix, "run 1/x");
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:7070"));
        assert_eq!(s.region, "eu-west-1");
        assert_eq!(
            s.secret_access_key.as_ref().map(Secret::expose),
            Some("a/b=c+d")
        );
    }

    #[test]
    fn credentials_follow_the_chain_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = dir.path().display().to_string();
        std::fs::create_dir_all(dir.path().join(".aws")).expect(".aws");
        std::fs::write(
            dir.path().join(".aws/credentials"),
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n[ci]\naws_access_key_id = CI\naws_secret_access_key = cisecret\naws_session_token = citoken\n",
        )
        .expect("credentials");
        std::fs::write(
            dir.path().join(".aws/config"),
            "[default]\nregion = eu-north-1\n[profile ci]\nregion = ap-south-1\n[profile onlyconfig]\naws_access_key_id = OC\naws_secret_access_key = ocsecret\n",
        )
        .expect("config");
        let url = "s3://bkt?endpoint=http://h:1";
        let home_var = ("HOME", home.clone());

        // The default profile, with the config file's region.
        let s = s3_in(url, std::slice::from_ref(&home_var));
        assert_eq!(s.access_key_id.as_deref(), Some("DEF"));
        assert_eq!(s.region, "eu-north-1");
        assert!(
            matches!(&s.credentials, Credentials::Profile { profile, .. } if profile == "default")
        );
        // AWS_PROFILE picks another; its session token and region come along.
        let s = s3_in(url, &[home_var.clone(), ("AWS_PROFILE", "ci".into())]);
        assert_eq!(s.access_key_id.as_deref(), Some("CI"));
        assert_eq!(
            s.session_token.as_ref().map(Secret::expose),
            Some("citoken")
        );
        assert_eq!(s.region, "ap-south-1");
        // Keys in the config file's profile section count too.
        let s = s3_in(
            &format!("{url}&profile=onlyconfig"),
            std::slice::from_ref(&home_var),
        );
        assert_eq!(s.access_key_id.as_deref(), Some("OC"));
        // AWS_* variables beat the profile file, CASCADE_S3_* beat them, the URL beats all.
        let aws = [
            ("AWS_ACCESS_KEY_ID", "ENV".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "envsecret".to_string()),
        ];
        let s = s3_in(url, &[home_var.clone(), aws[0].clone(), aws[1].clone()]);
        assert_eq!(
            (s.access_key_id.as_deref(), &s.credentials),
            (Some("ENV"), &Credentials::AwsEnv)
        );
        let cascade = [
            ("CASCADE_S3_ACCESS_KEY_ID", "CAS".to_string()),
            ("CASCADE_S3_SECRET_ACCESS_KEY", "cassecret".to_string()),
        ];
        let all = [
            home_var.clone(),
            aws[0].clone(),
            aws[1].clone(),
            cascade[0].clone(),
            cascade[1].clone(),
        ];
        let s = s3_in(url, &all);
        assert_eq!(s.credentials, Credentials::CascadeEnv);
        let s = s3_in(&format!("{url}&access_key=U&secret_key=u"), &all);
        assert_eq!(
            (s.access_key_id.as_deref(), &s.credentials),
            (Some("U"), &Credentials::Url)
        );
        // A profile named in the URL beats the variables; a missing one is an error.
        let s = s3_in(&format!("{url}&profile=ci"), &all);
        assert_eq!(s.access_key_id.as_deref(), Some("CI"));
        let e = parse_in(&format!("{url}&profile=nope"), &all)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no profile \"nope\""), "{e}");
        // Nothing static: the providers, web identity first.
        let s = s3_in(url, &[("HOME", "/nonexistent".into())]);
        assert!(
            matches!(s.credentials, Credentials::Provider(p) if p.contains("instance metadata"))
        );
        assert_eq!(s.access_key_id, None);
        let s = s3_in(
            url,
            &[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t".into()),
                ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r".into()),
            ],
        );
        assert!(matches!(s.credentials, Credentials::Provider(p) if p.contains("web identity")));
    }

    #[test]
    fn secrets_never_show_in_errors_or_debug() {
        let s = s3_in(
            "s3://bkt?endpoint=http://h:1&access_key=AK&secret_key=TOPSECRET",
            &[],
        );
        assert!(!format!("{s:?}").contains("TOPSECRET"), "{s:?}");
        for bad in [
            "s3://bkt?region=r&access_key=AK&secret_key=TOPSECRET&bogus=1",
            "s3://bkt?secret_key=TOPSECRET&access_key=AK&endpoint=ftp://h",
            "s3://?access_key=AK&secret_key=TOPSECRET",
            "s3://bkt?access_key=AK&TOPSECRET",
            "s3://bkt?secret_key=TOPSECRET",
            "s3://b[kt?secret_key=TOPSECRET&access_key=AK",
        ] {
            let e = parse_in(bad, &[]).unwrap_err().to_string();
            assert!(!e.contains("TOPSECRET"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
