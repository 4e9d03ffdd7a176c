//! Authentication: HMAC-SHA256 challenge-response over fresh nonces, inside TLS
//! ([`crate::transport`]; TLS authenticates the server by its pinned certificate, this the
//! client by its token).
//!
//! - The daemon and its clients share a **token** (32 random bytes, kept in a file).
//! - Every connection starts with two fresh 128-bit nonces, the client's (in the hello) and the
//!   server's (in the welcome), so no proof can be replayed on another connection.
//! - **Open**: the client proves it holds the token (`HMAC(token, "open" ‖ sn ‖ cn)`); the server
//!   answers with a random 128-bit session id and proves that it holds the token as well. Both
//!   sides then derive the session's 128-bit **secret** from the token, the id and the two nonces;
//!   the secret never travels.
//! - **Attach** (after a lost connection): the client proves it holds the session's secret
//!   (`HMAC(secret, "attach" ‖ id ‖ sn ‖ cn ‖ last reply)`); the connection is bound to that
//!   session from then on. Requests carry no session field at all.
//! - **Channel-bound attach** (TLS links of sessions that negotiated
//!   [`crate::wire::feature::CHANNEL_BOUND_ATTACH`]): the proof covers, instead of the server's
//!   nonce, a TLS exporter value of the connection (RFC 8446 §7.5: derived from both sides'
//!   handshake randomness and key exchange, known only to the two ends of this one TLS
//!   connection) — `HMAC(secret, "attach-tls" ‖ id ‖ exporter ‖ cn ‖ last reply)` — so the client
//!   sends it with its hello instead of waiting a round trip for the server's nonce, and it can
//!   no more be replayed on another connection than a nonce-bound one.
//! - **Peer links** (server to server, for one client's mesh): the client hands every member a
//!   random 32-byte [`MeshKey`]; a link opens with `HMAC(key, "peer-open" ‖ mesh ‖ from ‖ to ‖
//!   sn ‖ cn)` and the receiver proves it holds the key as well.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;

type HmacSha256 = Hmac<Sha256>;

/// A 32-byte MAC.
pub type Tag = [u8; 32];

/// The shared secret a daemon and its clients hold.
#[derive(Clone)]
pub struct Token([u8; 32]);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A fresh random token.
    pub fn generate() -> Token {
        Token(random())
    }

    /// The token written as 64 hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits (surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<Token, String> {
        let s = s.trim();
        if s.len() != 64 {
            return Err(format!("a token is 64 hex digits; this one has {} characters", s.len()));
        }
        let mut t = [0u8; 32];
        for (i, b) in t.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("a token is 64 hex digits; found {:?}", &s[2 * i..2 * i + 2]))?;
        }
        Ok(Token(t))
    }

    /// Reads a token file (64 hex digits).
    pub fn read(path: &Path) -> Result<Token, String> {
        let s = std::fs::read_to_string(path).map_err(|e| format!("reading the token file {}: {e}", path.display()))?;
        Token::from_hex(&s).map_err(|e| format!("token file {}: {e}", path.display()))
    }

    /// Writes a fresh token to `path`, readable by its owner only.
    pub fn write_new(path: &Path) -> Result<Token, String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let t = Token::generate();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("creating the token file {}: {e}", path.display()))?;
        writeln!(f, "{}", t.to_hex()).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(t)
    }
}

/// `N` bytes from the operating system's random source.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the operating system's random source failed");
    b
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Tag {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn verify(key: &[u8], parts: &[&[u8]], tag: &Tag) -> bool {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    m.verify_slice(tag).is_ok() // constant time
}

/// The nonces of one connection.
#[derive(Clone, Copy)]
pub struct Nonces {
    /// The client's.
    pub client: [u8; 16],
    /// The server's.
    pub server: [u8; 16],
}

/// A session's secret, derived on both sides and never sent.
#[derive(Clone)]
pub struct SessionSecret([u8; 16]);

impl Token {
    /// The client's proof for [`crate::wire::Frame::Open`].
    pub fn open_proof(&self, n: &Nonces) -> Tag {
        mac(&self.0, &[b"sucl-open", &n.server, &n.client])
    }
    /// Checks an open proof.
    pub fn check_open(&self, n: &Nonces, tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-open", &n.server, &n.client], tag)
    }
    /// The server's proof in [`crate::wire::Frame::Opened`].
    pub fn opened_proof(&self, n: &Nonces, session: &[u8; 16]) -> Tag {
        mac(&self.0, &[b"sucl-opened", &n.client, &n.server, session])
    }
    /// Checks the server's proof.
    pub fn check_opened(&self, n: &Nonces, session: &[u8; 16], tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-opened", &n.client, &n.server, session], tag)
    }
    /// The secret of the session opened on the connection with nonces `n`.
    pub fn session_secret(&self, n: &Nonces, session: &[u8; 16]) -> SessionSecret {
        let full = mac(&self.0, &[b"sucl-secret", session, &n.server, &n.client]);
        let mut s = [0u8; 16];
        s.copy_from_slice(&full[..16]);
        SessionSecret(s)
    }
}

impl SessionSecret {
    /// The client's proof for [`crate::wire::Frame::Attach`].
    pub fn attach_proof(&self, n: &Nonces, session: &[u8; 16], last_reply: u64) -> Tag {
        mac(&self.0, &[b"sucl-attach", session, &n.server, &n.client, &last_reply.to_le_bytes()])
    }
    /// Checks an attach proof.
    pub fn check_attach(&self, n: &Nonces, session: &[u8; 16], last_reply: u64, tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-attach", session, &n.server, &n.client, &last_reply.to_le_bytes()], tag)
    }
    /// The server's proof in [`crate::wire::Frame::Attached`].
    pub fn attached_proof(&self, n: &Nonces, last_received: u64) -> Tag {
        mac(&self.0, &[b"sucl-attached", &n.client, &n.server, &last_received.to_le_bytes()])
    }
    /// Checks the server's attach proof.
    pub fn check_attached(&self, n: &Nonces, last_received: u64, tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-attached", &n.client, &n.server, &last_received.to_le_bytes()], tag)
    }
}

impl SessionSecret {
    /// The client's proof for [`crate::wire::Frame::Attach`] on a TLS link, bound to the
    /// link's exporter value `channel` (see the module doc) and the client's nonce.
    pub fn attach_proof_channel(&self, channel: &[u8; 32], client: &[u8; 16], session: &[u8; 16], last_reply: u64) -> Tag {
        mac(&self.0, &[b"sucl-attach-tls", session, channel, client, &last_reply.to_le_bytes()])
    }
    /// Checks a channel-bound attach proof.
    pub fn check_attach_channel(&self, channel: &[u8; 32], client: &[u8; 16], session: &[u8; 16], last_reply: u64, tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-attach-tls", session, channel, client, &last_reply.to_le_bytes()], tag)
    }
    /// The server's channel-bound proof in [`crate::wire::Frame::Attached`].
    pub fn attached_proof_channel(&self, channel: &[u8; 32], client: &[u8; 16], last_received: u64) -> Tag {
        mac(&self.0, &[b"sucl-attached-tls", channel, client, &last_received.to_le_bytes()])
    }
    /// Checks the server's channel-bound attach proof.
    pub fn check_attached_channel(&self, channel: &[u8; 32], client: &[u8; 16], last_received: u64, tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-attached-tls", channel, client, &last_received.to_le_bytes()], tag)
    }
}

/// The credential a client hands every member of a peer mesh: a peer link proves it holds it.
#[derive(Clone)]
pub struct MeshKey(pub [u8; 32]);

impl MeshKey {
    /// The proof in [`crate::wire::Frame::PeerOpen`] (bound to the link's nonces).
    pub fn open_proof(&self, n: &Nonces, mesh: &[u8; 16], from: u32, to: u32) -> Tag {
        mac(&self.0, &[b"sucl-peer-open", mesh, &from.to_le_bytes(), &to.to_le_bytes(), &n.server, &n.client])
    }
    /// Checks an open proof.
    pub fn check_open(&self, n: &Nonces, mesh: &[u8; 16], from: u32, to: u32, tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-peer-open", mesh, &from.to_le_bytes(), &to.to_le_bytes(), &n.server, &n.client], tag)
    }
    /// The answer in [`crate::wire::Frame::PeerOpened`].
    pub fn opened_proof(&self, n: &Nonces, mesh: &[u8; 16]) -> Tag {
        mac(&self.0, &[b"sucl-peer-opened", mesh, &n.client, &n.server])
    }
    /// Checks the answer.
    pub fn check_opened(&self, n: &Nonces, mesh: &[u8; 16], tag: &Tag) -> bool {
        verify(&self.0, &[b"sucl-peer-opened", mesh, &n.client, &n.server], tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_the_nonces_and_the_key() {
        let t = Token::generate();
        let n = Nonces { client: random(), server: random() };
        let p = t.open_proof(&n);
        assert!(t.check_open(&n, &p));
        assert!(!Token::generate().check_open(&n, &p), "another token");
        let n2 = Nonces { client: n.client, server: random() };
        assert!(!t.check_open(&n2, &p), "another server nonce (a replay)");
        assert_eq!(Token::from_hex(&t.to_hex()).unwrap().0, t.0);
        assert!(Token::from_hex("zz").is_err());
    }

    #[test]
    fn channel_bound_attach_proofs_bind_the_channel_the_session_and_the_secret() {
        let t = Token::generate();
        let n = Nonces { client: random(), server: random() };
        let id: [u8; 16] = random();
        let secret = t.session_secret(&n, &id);
        let (channel, client): ([u8; 32], [u8; 16]) = (random(), random());
        let p = secret.attach_proof_channel(&channel, &client, &id, 5);
        assert!(secret.check_attach_channel(&channel, &client, &id, 5, &p));
        assert!(!secret.check_attach_channel(&random(), &client, &id, 5, &p), "another TLS connection (a replay)");
        assert!(!secret.check_attach_channel(&channel, &random(), &id, 5, &p), "another client nonce");
        assert!(!secret.check_attach_channel(&channel, &client, &random(), 5, &p), "another session");
        assert!(!secret.check_attach_channel(&channel, &client, &id, 6, &p), "another last reply");
        let other = Token::generate().session_secret(&n, &id);
        assert!(!other.check_attach_channel(&channel, &client, &id, 5, &p), "another secret");
        // The server's answer is not the client's proof read back.
        let a = secret.attached_proof_channel(&channel, &client, 5);
        assert!(secret.check_attached_channel(&channel, &client, 5, &a));
        assert!(!secret.check_attached_channel(&channel, &client, 4, &a));
        assert!(!secret.check_attached_channel(&random(), &client, 5, &a));
        assert_ne!(a, p);
    }
}
