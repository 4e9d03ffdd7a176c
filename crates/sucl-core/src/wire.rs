//! The versioned, fixed-layout frame header every byte across a process boundary starts with.
//!
//! Layout (little-endian, 40 bytes): magic `u32` ("SUCL"), version `u16`, kind `u16`, tag `u64`,
//! payload length `u64`, two `u64` meta words (collective descriptor, or request fields).
//! [`Header::decode`] validates magic, version, kind and length before anything trusts the rest.

use std::fmt;

/// Magic number at the start of every frame: the bytes `S U C L`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SUCL");
/// The wire-format version this build speaks.
pub const VERSION: u16 = 2;
/// Size of an encoded header in bytes.
pub const HEADER_LEN: usize = 40;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// Point-to-point or collective payload.
    Data = 1,
    /// Connection handshake: meta0 = sender rank, meta1 = communicator id; on the tcp mesh the
    /// payload is the sender's 32-byte nonce and its 32-byte proof of the job secret.
    Hello = 2,
    /// The sender aborts; the payload is the reason (UTF-8).
    Abort = 3,
    /// Mesh handshake: the accepting rank's challenge; meta0 = its rank, meta1 = communicator
    /// id, payload = 32-byte nonce.
    MeshChallenge = 4,
    /// Mesh handshake: the accepting rank's proof that it knows the job secret; meta as the
    /// challenge, payload = 32-byte HMAC-SHA256.
    MeshWelcome = 5,
    /// Store: set key (tag = key length) to value.
    StoreSet = 16,
    /// Store: wait for a key and return its value; meta0 = timeout in ms.
    StoreGet = 17,
    /// Store: add meta0 (as i64) to a counter key and return the new value.
    StoreAdd = 18,
    /// Store: reply; meta0 = status (0 ok, 1 timeout), payload = value.
    StoreReply = 19,
    /// Store: a client answers the challenge; meta0 = world rank, payload = its 32-byte nonce and
    /// the 32-byte HMAC-SHA256 proof that it knows the job secret.
    StoreHello = 20,
    /// Store: the client leaves cleanly.
    StoreBye = 21,
    /// Store: the client reports an abort; meta0 = lost rank + 1 (0 = none), payload = reason.
    StoreAbort = 22,
    /// Store: the server's challenge to a new connection; payload = 32-byte nonce.
    StoreChallenge = 23,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Hello,
            3 => Kind::Abort,
            4 => Kind::MeshChallenge,
            5 => Kind::MeshWelcome,
            16 => Kind::StoreSet,
            17 => Kind::StoreGet,
            18 => Kind::StoreAdd,
            19 => Kind::StoreReply,
            20 => Kind::StoreHello,
            21 => Kind::StoreBye,
            22 => Kind::StoreAbort,
            23 => Kind::StoreChallenge,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: Kind,
    /// Matching tag (point-to-point) or key length (store).
    pub tag: u64,
    /// Payload length in bytes.
    pub len: u64,
    /// Kind-specific words (for data: the collective descriptor).
    pub meta: [u64; 2],
}

/// Why a header was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The magic number is wrong: not a sucl peer, or the stream lost sync.
    BadMagic(u32),
    /// A version this build does not speak.
    BadVersion(u16),
    /// An unknown frame kind.
    BadKind(u16),
    /// The announced payload exceeds the negotiated limit.
    TooLong {
        /// Announced length.
        len: u64,
        /// The limit.
        limit: u64,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic(m) => write!(f, "bad magic {m:#010x} (not a sucl frame, or the stream lost sync)"),
            WireError::BadVersion(v) => write!(f, "unsupported wire version {v} (this build speaks {VERSION})"),
            WireError::BadKind(k) => write!(f, "unknown frame kind {k}"),
            WireError::TooLong { len, limit } => write!(f, "frame length {len} exceeds the limit {limit}"),
        }
    }
}

impl Header {
    /// A data frame header.
    pub fn data(tag: u64, len: usize, meta: [u64; 2]) -> Self {
        Header { kind: Kind::Data, tag, len: len as u64, meta }
    }

    /// Encodes into 40 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.meta[0].to_le_bytes());
        b[32..40].copy_from_slice(&self.meta[1].to_le_bytes());
        b
    }

    /// Decodes and validates; `max_len` bounds the payload length a peer may announce.
    pub fn decode(b: &[u8; HEADER_LEN], max_len: u64) -> Result<Header, WireError> {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let magic = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        let k = u16::from_le_bytes([b[6], b[7]]);
        let kind = Kind::from_u16(k).ok_or(WireError::BadKind(k))?;
        let len = u64_at(16);
        if len > max_len {
            return Err(WireError::TooLong { len, limit: max_len });
        }
        Ok(Header { kind, tag: u64_at(8), len, meta: [u64_at(24), u64_at(32)] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let b: [u8; HEADER_LEN] = bytes.try_into().unwrap();
            let _ = Header::decode(&b, 1 << 20);
        }

        #[test]
        fn round_trip(tag in any::<u64>(), len in 0u64..1000, m0 in any::<u64>(), m1 in any::<u64>()) {
            let h = Header { kind: Kind::Data, tag, len, meta: [m0, m1] };
            prop_assert_eq!(Header::decode(&h.encode(), 1000).unwrap(), h);
        }

        #[test]
        fn corrupt_fields_rejected(byte in 0usize..6, flip in 1u8..=255) {
            let h = Header::data(7, 3, [0, 0]);
            let mut b = h.encode();
            b[byte] ^= flip;
            prop_assert!(Header::decode(&b, 1 << 20).is_err());
        }
    }

    #[test]
    fn too_long_rejected() {
        let h = Header::data(1, 4096, [0, 0]);
        assert_eq!(Header::decode(&h.encode(), 4095), Err(WireError::TooLong { len: 4096, limit: 4095 }));
    }
}
