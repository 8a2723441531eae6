//! Secrets that must never reach a log, an error message or `{:?}`: the staging servers'
//! shared secret, S3 secret keys and session tokens. [`Secret`] holds one and shows as `***`;
//! [`redact_url`] hides the credentials in a durable-store URL
//! (`s3://bucket?endpoint=...&secret_key=...`) so the URL itself can be shown.

use std::fmt;

/// What a secret shows as.
pub const REDACTED: &str = "***";

/// A secret string. Debug and Display show `***` (an empty secret shows as nothing, so
/// "not set" stays visible); [`Secret::expose`] is the only way to the text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself, for the one place that needs it (a handshake, a signing key).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Secret {
        Secret(text.to_string())
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("Secret(\"\")")
        } else {
            write!(f, "Secret({REDACTED})")
        }
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            f.write_str(REDACTED)
        }
    }
}

/// Query options of a store URL whose values are not secret and stay visible.
const PUBLIC_OPTIONS: &[&str] = &["endpoint", "region", "access_key", "access_key_id"];

/// `url` with every query option's value replaced by `***` except the public ones
/// (endpoint, region, access key id), and any `user:password@` in the authority hidden. An
/// option without `=` is hidden whole: a mistyped option may well be a pasted secret.
pub fn redact_url(url: &str) -> String {
    let (location, query) = match url.split_once('?') {
        Some((l, q)) => (l, Some(q)),
        None => (url, None),
    };
    let mut out = redact_userinfo(location);
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if PUBLIC_OPTIONS.contains(&key) => pair.to_string(),
                Some((key, "")) => format!("{key}="),
                Some((key, _)) => format!("{key}={REDACTED}"),
                None if pair.is_empty() || PUBLIC_OPTIONS.contains(&pair) => pair.to_string(),
                None => REDACTED.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
}

/// `scheme://user:password@host/...` with the password hidden.
fn redact_userinfo(location: &str) -> String {
    let Some((scheme, rest)) = location.split_once("://") else {
        return location.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:{REDACTED}@{}", &rest[at + 1..])
        }
        None => location.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(format!("{:?}", Some(&s)), "Some(Secret(***))");
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{}", Secret::default()), "");
    }

    #[test]
    fn urls_keep_only_public_options() {
        assert_eq!(
            redact_url("s3://b/p?endpoint=http://h:1&access_key=AK&secret_key=SK&region=r"),
            "s3://b/p?endpoint=http://h:1&access_key=AK&secret_key=***&region=r"
        );
        assert_eq!(
            redact_url("s3://b?secret_access_key=x&session_token=t"),
            "s3://b?secret_access_key=***&session_token=***"
        );
        assert_eq!(redact_url("s3://b?secretkey=SK"), "s3://b?secretkey=***");
        assert_eq!(redact_url("s3://b?SKPASTED"), "s3://b?***");
        assert_eq!(redact_url("/plain/dir"), "/plain/dir");
        assert_eq!(
            redact_url("s3://u:pw@b/p?region=r"),
            "s3://u:***@b/p?region=r"
        );
    }
}
