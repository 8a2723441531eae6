//! Who may talk to a staging server, and about which keys (docs/security.md, "Staging
//! servers"; the messages are in docs/staging-protocol.md, "Hello and Auth").
//!
//! The servers of a cluster share one **cluster secret**. Nobody else needs it: each job
//! gets a **job credential**, a 32-byte key bound to the job's namespace,
//! `BLAKE3-keyed(derive_key(CLUSTER_CONTEXT, secret), namespace)`. A server derives the key
//! for whatever namespace a client claims, so a credential opens only its own namespace (and
//! the namespaces below it: keys are paths). Neither the secret nor the credential ever
//! crosses the wire: the client proves it holds the key by a keyed hash over both sides'
//! fresh nonces, and the server proves it back, so a recorded handshake is worth nothing on
//! another connection. Over TLS both proofs also cover the session's exported keying
//! material, so a handshake cannot be relayed into another TLS session either.

use std::fmt;

use cascade_secret::Secret;

/// Bytes of each side's nonce and of each proof.
pub const NONCE_LEN: usize = 32;
pub const PROOF_LEN: usize = 32;
/// Bytes of a version's tag.
pub const TAG_LEN: usize = 32;

/// BLAKE3 key-derivation context of the cluster key (the secret is never used directly).
const CLUSTER_CONTEXT: &str = "cascade staging 2026-11 cluster key from the shared secret";
/// Written at the start of every proof so the two directions can never be swapped.
const CLIENT_ROLE: &[u8] = b"cascade staging auth: client proof";
const SERVER_ROLE: &[u8] = b"cascade staging auth: server proof";
const VERSION_ROLE: &[u8] = b"cascade staging: version written by this job";

/// A job's key: what a staging client must hold to use its namespace. Debug shows `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey([u8; 32]);

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobKey(***)")
    }
}

impl JobKey {
    /// The key of `namespace` under the cluster `secret` (what the servers compute).
    pub fn derive(secret: &str, namespace: &str) -> JobKey {
        let cluster = blake3::derive_key(CLUSTER_CONTEXT, secret.as_bytes());
        JobKey(*blake3::keyed_hash(&cluster, namespace.as_bytes()).as_bytes())
    }

    /// The key from its text form (64 hex digits, as [`JobKey::credential`] prints it).
    pub fn from_credential(text: &str) -> Result<JobKey, String> {
        let text = text.trim();
        crate::unhex(text).map(JobKey).ok_or_else(|| {
            format!(
                "a staging credential is 64 hexadecimal digits (as `cascade credential` prints \
                 it); this one has {} characters",
                text.len()
            )
        })
    }

    /// The text form handed to a job (64 lowercase hex digits).
    pub fn credential(&self) -> String {
        crate::hex(&self.0)
    }

    /// The client's proof: it holds this key, on this connection.
    pub fn client_proof(&self, transcript: &Transcript) -> [u8; PROOF_LEN] {
        self.proof(CLIENT_ROLE, transcript)
    }

    /// The server's proof back: it too holds the key (it is a server of this cluster).
    pub fn server_proof(&self, transcript: &Transcript) -> [u8; PROOF_LEN] {
        self.proof(SERVER_ROLE, transcript)
    }

    /// The tag a writer seals a version of `key` (relative to the namespace) with: only a
    /// holder of this key can make it, so a reader holding it knows the staged copy is one
    /// its job wrote — not one forged on the way, on a server, or by another job — before
    /// letting it override the durable store's copy.
    pub fn version_tag(
        &self,
        key: &str,
        stamp: u64,
        size: u64,
        blake3: &[u8; 32],
    ) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(VERSION_ROLE);
        h.update(&(key.len() as u64).to_le_bytes());
        h.update(key.as_bytes());
        h.update(&stamp.to_le_bytes());
        h.update(&size.to_le_bytes());
        h.update(blake3);
        *h.finalize().as_bytes()
    }

    fn proof(&self, role: &[u8], t: &Transcript) -> [u8; PROOF_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(role);
        h.update(&(t.namespace.len() as u64).to_le_bytes());
        h.update(t.namespace.as_bytes());
        h.update(&t.client_nonce);
        h.update(&t.server_nonce);
        h.update(&t.binding.unwrap_or([0; 32]));
        *h.finalize().as_bytes()
    }
}

/// What a client holds: the cluster secret itself (servers' operators, trusted node agents)
/// or one job's credential. Debug shows neither.
#[derive(Clone, Debug)]
pub enum Credential {
    ClusterSecret(Secret),
    Job(JobKey),
}

impl Credential {
    /// The key the client proves with for `namespace`. A job credential is its own key
    /// whatever the namespace: the server, deriving the namespace's key, tells a mismatch.
    pub fn key_for(&self, namespace: &str) -> JobKey {
        match self {
            Credential::ClusterSecret(secret) => JobKey::derive(secret.expose(), namespace),
            Credential::Job(key) => key.clone(),
        }
    }

    /// Nothing to prove with (no secret given).
    pub fn is_empty(&self) -> bool {
        matches!(self, Credential::ClusterSecret(s) if s.is_empty())
    }
}

/// What both proofs of one handshake cover.
pub struct Transcript<'a> {
    pub namespace: &'a str,
    pub client_nonce: [u8; NONCE_LEN],
    pub server_nonce: [u8; NONCE_LEN],
    /// The TLS session's exported keying material, None on plain TCP.
    pub binding: Option<[u8; 32]>,
}

/// Compares two proofs in constant time (blake3::Hash equality is constant-time).
pub fn proofs_match(a: &[u8; PROOF_LEN], b: &[u8; PROOF_LEN]) -> bool {
    blake3::Hash::from_bytes(*a) == blake3::Hash::from_bytes(*b)
}

/// A fresh nonce from the kernel's random number generator.
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut n).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(namespace: &str) -> Transcript<'_> {
        Transcript {
            namespace,
            client_nonce: [1; 32],
            server_nonce: [2; 32],
            binding: None,
        }
    }

    #[test]
    fn a_credential_opens_only_its_own_namespace() {
        let a = JobKey::derive("cluster", "teamA/job1");
        assert_eq!(a, JobKey::derive("cluster", "teamA/job1"));
        assert_ne!(a, JobKey::derive("cluster", "teamA/job2"));
        assert_ne!(a, JobKey::derive("other cluster", "teamA/job1"));
        let t = transcript("teamA/job2");
        let server_side = JobKey::derive("cluster", "teamA/job2");
        assert!(!proofs_match(
            &a.client_proof(&t),
            &server_side.client_proof(&t)
        ));
        assert!(proofs_match(
            &server_side.client_proof(&t),
            &JobKey::derive("cluster", "teamA/job2").client_proof(&t)
        ));
    }

    #[test]
    fn proofs_differ_by_direction_nonce_and_binding() {
        let k = JobKey::derive("cluster", "ns");
        let t = transcript("ns");
        assert_ne!(k.client_proof(&t), k.server_proof(&t));
        let mut other = transcript("ns");
        other.server_nonce = [3; 32];
        assert_ne!(k.client_proof(&t), k.client_proof(&other));
        let mut bound = transcript("ns");
        bound.binding = Some([9; 32]);
        assert_ne!(k.client_proof(&t), k.client_proof(&bound));
    }

    #[test]
    fn credential_text_round_trips_and_bad_text_is_one_line() {
        let k = JobKey::derive("cluster", "ns");
        let text = k.credential();
        assert_eq!(text.len(), 64);
        assert_eq!(JobKey::from_credential(&format!(" {text}\n")), Ok(k));
        let err = JobKey::from_credential("nothex").unwrap_err();
        assert!(err.contains("64 hexadecimal digits") && !err.contains('\n'));
        assert!(!format!("{:?}", JobKey::derive("cluster", "ns")).contains(&text[..8]));
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
