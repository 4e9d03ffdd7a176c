//! The one error type users see, and the shared abort state that turns one rank's failure into an
//! error on every rank.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A sucl result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong. Every message names the rank that saw it.
///
/// `{}` and `{:?}` both print the sentence (so `fn main() -> sucl::Result<()>` reports a readable
/// error); `{:#?}` prints the structured form, field by field.
#[derive(thiserror::Error)]
pub enum Error {
    /// An argument was invalid; nothing was sent or received.
    #[error("rank {rank}: invalid argument `{arg}`: {why}")]
    InvalidArgument {
        /// The rank that saw it.
        rank: usize,
        /// The argument's name.
        arg: &'static str,
        /// Why it is invalid.
        why: String,
    },
    /// A peer process died or closed its connections.
    #[error("rank {rank}: lost peer rank {peer} during {during}")]
    LostPeer {
        /// The rank that saw it.
        rank: usize,
        /// The lost rank (in the world communicator).
        peer: usize,
        /// What was going on.
        during: String,
    },
    /// A bounded wait ran out. Exception: a collective on the mpi backend that times out (or
    /// fails otherwise after MPI started it) cannot be cancelled and would keep writing into the
    /// caller's buffers, so that backend prints this error and ends the job with `MPI_Abort`
    /// instead of returning it (see the `sucl-mpi` crate).
    #[error("rank {rank}: {op} timed out after {after:?}")]
    Timeout {
        /// The rank that saw it.
        rank: usize,
        /// The operation that waited.
        op: String,
        /// How long it waited.
        after: Duration,
    },
    /// Ranks called a collective with different arguments (operation, count, dtype, reduce op,
    /// root, or the order of their collectives). With `SUCL_CHECK_COLLECTIVES=1` every rank
    /// returns it from the call itself, before any of the call's data moves; without it, where
    /// the backend can tell (at the latest at the next call on tcp when the disagreement left
    /// messages behind). The communicator is then poisoned, the same on every backend: every
    /// later call on it returns [`Error::Unusable`] naming this error; a new communicator is
    /// needed.
    #[error("rank {rank}: ranks disagree on {what}")]
    Mismatch {
        /// The rank that saw it.
        rank: usize,
        /// What differs, and between whom.
        what: String,
    },
    /// A call on a communicator that an earlier failure left unusable (a disagreement between
    /// ranks: see [`Error::Mismatch`]). Nothing was sent or received: this call itself did
    /// nothing wrong. The communicator stays unusable; free it and create a new one.
    #[error(
        "rank {rank}: {op} refused: this communicator is unusable since its {failed_op} failed with \"{first}\"; \
         free it and create a new communicator"
    )]
    Unusable {
        /// The rank that saw it.
        rank: usize,
        /// The operation refused now.
        op: &'static str,
        /// The operation whose failure made the communicator unusable.
        failed_op: &'static str,
        /// That failure's message, as it was reported then (shared by every refusal).
        first: Arc<str>,
    },
    /// A backend cannot serve this communicator or call.
    #[error("rank {rank}: backend {backend} cannot serve: {why}")]
    BackendUnavailable {
        /// The rank that saw it.
        rank: usize,
        /// The backend's name.
        backend: String,
        /// Why not.
        why: String,
    },
    /// A configuration or launch-environment problem.
    #[error("config error: {0}")]
    Config(String),
    /// A peer sent bytes that do not follow the wire format.
    #[error("rank {rank}: protocol error from rank {peer}: {why}")]
    Protocol {
        /// The rank that saw it.
        rank: usize,
        /// The rank that sent the bytes.
        peer: usize,
        /// What was wrong.
        why: String,
    },
    /// The communicator was aborted because some rank failed; the reason says which and why.
    #[error("rank {rank}: communicator aborted: {reason}")]
    Aborted {
        /// The rank that saw it.
        rank: usize,
        /// The reason the failing rank gave.
        reason: String,
    },
    /// An operating-system error.
    #[error("rank {rank}: I/O error during {during}: {source}")]
    Io {
        /// The rank that saw it.
        rank: usize,
        /// What was going on.
        during: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// A copy of an error, so that one failure can be reported on every call or request it affects.
/// The `io::Error` source of [`Error::Io`] is not `Clone`: the copy keeps its kind and message.
impl Clone for Error {
    fn clone(&self) -> Error {
        match self {
            Error::InvalidArgument { rank, arg, why } => Error::InvalidArgument { rank: *rank, arg, why: why.clone() },
            Error::LostPeer { rank, peer, during } => Error::LostPeer { rank: *rank, peer: *peer, during: during.clone() },
            Error::Timeout { rank, op, after } => Error::Timeout { rank: *rank, op: op.clone(), after: *after },
            Error::Mismatch { rank, what } => Error::Mismatch { rank: *rank, what: what.clone() },
            Error::Unusable { rank, op, failed_op, first } => Error::Unusable { rank: *rank, op, failed_op, first: first.clone() },
            Error::BackendUnavailable { rank, backend, why } => {
                Error::BackendUnavailable { rank: *rank, backend: backend.clone(), why: why.clone() }
            }
            Error::Config(s) => Error::Config(s.clone()),
            Error::Protocol { rank, peer, why } => Error::Protocol { rank: *rank, peer: *peer, why: why.clone() },
            Error::Aborted { rank, reason } => Error::Aborted { rank: *rank, reason: reason.clone() },
            Error::Io { rank, during, source } => {
                Error::Io { rank: *rank, during: during.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
        }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !f.alternate() {
            // What Rust prints when `main` returns an error: the sentence, not the structure.
            return std::fmt::Display::fmt(self, f);
        }
        match self {
            Error::InvalidArgument { rank, arg, why } => {
                f.debug_struct("InvalidArgument").field("rank", rank).field("arg", arg).field("why", why).finish()
            }
            Error::LostPeer { rank, peer, during } => {
                f.debug_struct("LostPeer").field("rank", rank).field("peer", peer).field("during", during).finish()
            }
            Error::Timeout { rank, op, after } => {
                f.debug_struct("Timeout").field("rank", rank).field("op", op).field("after", after).finish()
            }
            Error::Mismatch { rank, what } => f.debug_struct("Mismatch").field("rank", rank).field("what", what).finish(),
            Error::Unusable { rank, op, failed_op, first } => {
                f.debug_struct("Unusable").field("rank", rank).field("op", op).field("failed_op", failed_op).field("first", first).finish()
            }
            Error::BackendUnavailable { rank, backend, why } => {
                f.debug_struct("BackendUnavailable").field("rank", rank).field("backend", backend).field("why", why).finish()
            }
            Error::Config(why) => f.debug_tuple("Config").field(why).finish(),
            Error::Protocol { rank, peer, why } => {
                f.debug_struct("Protocol").field("rank", rank).field("peer", peer).field("why", why).finish()
            }
            Error::Aborted { rank, reason } => f.debug_struct("Aborted").field("rank", rank).field("reason", reason).finish(),
            Error::Io { rank, during, source } => {
                f.debug_struct("Io").field("rank", rank).field("during", during).field("source", source).finish()
            }
        }
    }
}

impl Error {
    /// Builds an [`Error::InvalidArgument`].
    pub fn invalid(rank: usize, arg: &'static str, why: impl Into<String>) -> Self {
        Error::InvalidArgument { rank, arg, why: why.into() }
    }

    /// Builds an [`Error::Io`].
    pub fn io(rank: usize, during: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { rank, during: during.into(), source }
    }

    /// The information other ranks receive when this error aborts the communicator.
    pub fn abort_info(&self) -> AbortInfo {
        match self {
            Error::LostPeer { peer, during, .. } => {
                AbortInfo { lost_rank: Some(*peer), reason: format!("lost peer rank {peer} during {during}") }
            }
            Error::Aborted { reason, .. } => AbortInfo { lost_rank: None, reason: reason.clone() },
            other => AbortInfo { lost_rank: None, reason: other.to_string() },
        }
    }
}

/// Why a communicator was aborted, as passed between ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbortInfo {
    /// The world rank that was lost, if the abort is a lost peer.
    pub lost_rank: Option<usize>,
    /// Human-readable reason.
    pub reason: String,
}

impl AbortInfo {
    /// The error a rank returns for a wait interrupted by this abort.
    pub fn to_error(&self, rank: usize, during: &str) -> Error {
        match self.lost_rank {
            Some(peer) => Error::LostPeer { rank, peer, during: during.to_string() },
            None => Error::Aborted { rank, reason: self.reason.clone() },
        }
    }
}

type Notifier = Box<dyn Fn(&AbortInfo) + Send + Sync>;

/// Process-wide abort flag shared by all communicators and backends of one job.
///
/// Waits poll [`AbortState::is_set`] (one relaxed atomic load); the rendezvous store's watcher
/// raises it when any rank fails, and a rank that fails raises it and tells the store.
#[derive(Default)]
pub struct AbortState {
    flag: AtomicBool,
    info: Mutex<Option<AbortInfo>>,
    notifier: Mutex<Option<Notifier>>,
}

impl std::fmt::Debug for AbortState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortState").field("info", &self.info()).finish()
    }
}

impl AbortState {
    /// A fresh, un-raised state.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether an abort was raised.
    #[inline(always)]
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }

    /// The abort's information, if raised.
    pub fn info(&self) -> Option<AbortInfo> {
        self.info.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Installs the function that tells the other ranks (normally: a message to the store).
    pub fn set_notifier(&self, f: Notifier) {
        *self.notifier.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    /// Whether other ranks can be told (a store connection installed a notifier).
    pub fn has_notifier(&self) -> bool {
        self.notifier.lock().map(|n| n.is_some()).unwrap_or(false)
    }

    /// Records an abort seen from outside (the store told us); does not notify anyone.
    pub fn set_remote(&self, info: AbortInfo) {
        let mut g = self.info.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(info);
        }
        self.flag.store(true, Ordering::Release);
    }

    /// Raises an abort that this rank decided, and tells the other ranks. The first abort wins.
    pub fn raise(&self, info: AbortInfo) {
        {
            let mut g = self.info.lock().unwrap_or_else(|e| e.into_inner());
            if g.is_some() {
                return;
            }
            *g = Some(info.clone());
        }
        self.flag.store(true, Ordering::Release);
        if let Some(n) = self.notifier.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            n(&info);
        }
    }

    /// The error to return if an abort was raised.
    #[inline]
    pub fn check(&self, rank: usize, during: &str) -> Result<()> {
        if self.is_set() {
            if let Some(info) = self.info() {
                return Err(info.to_error(rank, during));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_says_the_same_and_keeps_the_variant() {
        let io = Error::io(2, "reading a frame", std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer closed"));
        let lost = Error::LostPeer { rank: 1, peer: 3, during: "all_reduce".into() };
        for e in [io, lost, Error::Timeout { rank: 0, op: "barrier".into(), after: std::time::Duration::from_secs(5) }] {
            let c = e.clone();
            assert_eq!(c.to_string(), e.to_string());
            assert_eq!(std::mem::discriminant(&c), std::mem::discriminant(&e));
        }
        let Error::Io { source, .. } = Error::io(0, "x", std::io::Error::from(std::io::ErrorKind::AddrInUse)).clone() else {
            unreachable!()
        };
        assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
    }

    #[test]
    fn debug_is_the_sentence_and_alternate_debug_the_structure() {
        let e = Error::io(0, "starting the rendezvous store on 127.0.0.1:29500", std::io::Error::from(std::io::ErrorKind::AddrInUse));
        let plain = format!("{e:?}");
        assert_eq!(plain, e.to_string());
        assert!(plain.starts_with("rank 0: I/O error during starting the rendezvous store"), "{plain}");
        let structured = format!("{e:#?}");
        assert!(structured.starts_with("Io {"), "{structured}");
        assert!(structured.contains("during: \"starting the rendezvous store"), "{structured}");
        let c = Error::Config("MASTER_ADDR is not set".into());
        assert_eq!(format!("{c:?}"), "config error: MASTER_ADDR is not set");
        assert_eq!(format!("{c:#?}"), "Config(\n    \"MASTER_ADDR is not set\",\n)");
    }
}
