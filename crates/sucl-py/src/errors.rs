//! sucl's errors as Python exceptions: one class per kind of failure, all under `SuclError`
//! (itself a `RuntimeError`), each carrying sucl's own message.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

create_exception!(sucl, SuclError, PyRuntimeError, "Base class of every error sucl raises.");
create_exception!(sucl, InvalidArgumentError, SuclError, "An argument was invalid; no data moved.");
create_exception!(sucl, LostPeerError, SuclError, "A peer process died or closed its connections.");
create_exception!(sucl, TimeoutError, SuclError, "A bounded wait ran out (SUCL_TIMEOUT).");
create_exception!(
    sucl,
    MismatchError,
    SuclError,
    "Ranks called a collective with different arguments; the communicator is now unusable (later calls raise UnusableError)."
);
create_exception!(
    sucl,
    UnusableError,
    SuclError,
    "The communicator is unusable since an earlier call on it failed (the message names it and quotes its error); nothing was done. Free it and create a new one."
);
create_exception!(sucl, AbortedError, SuclError, "The communicator was aborted because some rank failed.");
create_exception!(sucl, BackendUnavailableError, SuclError, "A backend cannot serve this communicator or call.");
create_exception!(sucl, ConfigError, SuclError, "A configuration or launch-environment problem.");
create_exception!(sucl, ProtocolError, SuclError, "A peer sent bytes that do not follow the wire format.");
create_exception!(sucl, IoError, SuclError, "An operating-system error.");

/// The Python exception for a sucl error, with sucl's message.
pub fn to_py(e: sucl::Error) -> PyErr {
    let msg = e.to_string();
    match e {
        sucl::Error::InvalidArgument { .. } => InvalidArgumentError::new_err(msg),
        sucl::Error::LostPeer { .. } => LostPeerError::new_err(msg),
        sucl::Error::Timeout { .. } => TimeoutError::new_err(msg),
        sucl::Error::Mismatch { .. } => MismatchError::new_err(msg),
        sucl::Error::Unusable { .. } => UnusableError::new_err(msg),
        sucl::Error::Aborted { .. } => AbortedError::new_err(msg),
        sucl::Error::BackendUnavailable { .. } => BackendUnavailableError::new_err(msg),
        sucl::Error::Config(_) => ConfigError::new_err(msg),
        sucl::Error::Protocol { .. } => ProtocolError::new_err(msg),
        sucl::Error::Io { .. } => IoError::new_err(msg),
    }
}

/// An `InvalidArgumentError` raised by the binding itself (before sucl is called).
pub fn invalid(arg: &str, why: impl std::fmt::Display) -> PyErr {
    InvalidArgumentError::new_err(format!("invalid argument `{arg}`: {why}"))
}

/// Adds every exception class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SuclError", py.get_type::<SuclError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("LostPeerError", py.get_type::<LostPeerError>())?;
    m.add("TimeoutError", py.get_type::<TimeoutError>())?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add("UnusableError", py.get_type::<UnusableError>())?;
    m.add("AbortedError", py.get_type::<AbortedError>())?;
    m.add("BackendUnavailableError", py.get_type::<BackendUnavailableError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    Ok(())
}
