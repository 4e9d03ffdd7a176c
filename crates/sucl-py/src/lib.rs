//! sucl-py: the Python binding of sucl, built by maturin (from `python/`) into the extension
//! module `sucl._sucl`. It only translates: Python buffers and tensors into typed slices,
//! arguments into calls of the `sucl` crate, sucl's errors into Python exceptions. Blocking
//! calls release the GIL; non-blocking ones run on a per-communicator worker thread (or, for
//! sends and receives, in the backend) and are waited on in slices that let Ctrl-C through.

mod call;
mod comm;
mod device;
mod dlpack;
mod errors;
mod exec;
mod interrupt;
mod region;
mod request;
mod stream;

use pyo3::prelude::*;

pub use comm::Communicator;
pub use request::Request;
pub use stream::StreamQueue;

/// A reduce operation.
#[pyclass(name = "ReduceOp", module = "sucl", eq, eq_int, frozen, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum PyReduceOp {
    /// Sum (integers wrap).
    SUM,
    /// Product (integers wrap).
    PROD,
    /// Minimum.
    MIN,
    /// Maximum.
    MAX,
    /// Sum divided by the number of ranks (integer division for integers).
    AVG,
}

impl PyReduceOp {
    fn to_sucl(self) -> sucl::ReduceOp {
        match self {
            PyReduceOp::SUM => sucl::ReduceOp::Sum,
            PyReduceOp::PROD => sucl::ReduceOp::Prod,
            PyReduceOp::MIN => sucl::ReduceOp::Min,
            PyReduceOp::MAX => sucl::ReduceOp::Max,
            PyReduceOp::AVG => sucl::ReduceOp::Avg,
        }
    }
}

/// Joins the job and returns the world communicator.
///
/// With no arguments, the launch environment says who we are: `sucl run`, torchrun, mpirun,
/// srun, or none (a world of one). With `rank`, `size` and `address` (`host:port`), rank 0
/// starts the rendezvous store at `address` and the others connect to it; `secret` (the same
/// on every rank) authenticates the connections, else one is derived from `address`.
#[pyfunction]
#[pyo3(signature = (rank=None, size=None, address=None, secret=None, local_rank=None))]
fn init(
    py: Python<'_>,
    rank: Option<usize>,
    size: Option<usize>,
    address: Option<String>,
    secret: Option<String>,
    local_rank: Option<usize>,
) -> PyResult<Communicator> {
    let explicit = match (rank, size, address) {
        (None, None, None) => None,
        (Some(rank), Some(size), Some(address)) => Some(explicit_env(rank, size, address, secret, local_rank)?),
        _ => return Err(errors::invalid("rank/size/address", "give all three or none")),
    };
    let comm = py.detach(|| match explicit {
        None => sucl::init(),
        Some(env) => sucl::Config::from_env().and_then(|cfg| sucl::init_with(env, cfg)),
    });
    comm.map(Communicator::wrap).map_err(errors::to_py)
}

/// A TCP port free now and below the kernel's ephemeral range, for a rendezvous address that
/// must be published before rank 0 binds it (an ephemeral port may be taken in between).
#[pyfunction]
fn unused_port() -> PyResult<u16> {
    sucl::unused_loopback_port().map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
}

fn explicit_env(rank: usize, size: usize, address: String, secret: Option<String>, local_rank: Option<usize>) -> PyResult<sucl::LaunchEnv> {
    if size == 0 || rank >= size {
        return Err(errors::invalid("rank", format!("{rank} is not in 0..{size}")));
    }
    if !address.contains(':') {
        return Err(errors::invalid("address", format!("{address:?} is not host:port")));
    }
    let job_secret = match secret {
        Some(s) => sucl::JobSecret::given(&s),
        None => sucl::JobSecret::derived(&address),
    };
    let job_id: String = address.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    Ok(sucl::LaunchEnv {
        launcher: sucl::Launcher::Sucl,
        rank,
        size,
        local_rank: local_rank.unwrap_or(rank),
        store_addr: Some(address),
        rank0_hosts_store: true,
        job_id: format!("py_{job_id}"),
        job_secret,
        agent_store: None,
    })
}

/// The Python module `sucl._sucl`.
#[pymodule]
fn _sucl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(unused_port, m)?)?;
    m.add_class::<Communicator>()?;
    m.add_class::<Request>()?;
    m.add_class::<StreamQueue>()?;
    m.add_class::<PyReduceOp>()?;
    m.add("MAX_TAG", sucl::MAX_TAG)?;
    errors::register(m)
}
