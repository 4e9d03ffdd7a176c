//! The one platform, "sucl": the OpenCL devices of the daemons named by `SUCL_REMOTE` (or the
//! `[[remote]]` tables of the file `SUCL_CONFIG` names), each reached through one
//! sucl-remote session per daemon, opened when the platform is first asked for.

use crate::cl::{self, Int};
use crate::object::{Data, Kind, Ref};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use sucl_remote::client::{servers, ClientOptions, Mesh, Remote};
use sucl_remote::wire::{cl_query, Command, DeviceKind, Outcome};

/// The platform object's data (it has none of its own: see [`Platform`]).
pub(crate) struct PlatformData;
impl Data for PlatformData {
    const KIND: Kind = Kind::Platform;
}

/// One daemon of the platform.
pub(crate) struct Server {
    pub(crate) remote: Remote,
}

/// A device: one OpenCL device of one daemon.
pub(crate) struct Device {
    /// Index into [`Platform::servers`].
    pub(crate) server: usize,
    /// The device's index in its daemon's list.
    pub(crate) index: u32,
    /// Answers of the daemon's platform, by parameter (device facts do not change).
    cache: Mutex<HashMap<u32, Vec<u8>>>,
}
impl Data for Device {
    const KIND: Kind = Kind::Device;
}

/// The platform: its daemons and their devices.
pub(crate) struct Platform {
    pub(crate) handle: Ref<PlatformData>,
    pub(crate) servers: Vec<Server>,
    pub(crate) devices: Vec<Ref<Device>>,
    /// The mesh of all daemons, made when a context first spans two of them.
    mesh: OnceLock<Result<Mesh, String>>,
}

/// How long a call to a daemon may take, and how long a lost daemon is waited for
/// (`SUCL_OPENCL_TIMEOUT`, seconds, default 30).
pub(crate) fn timeout() -> Duration {
    // A value no Duration holds (or inf) is ignored as an unparsable one is.
    let s = std::env::var("SUCL_OPENCL_TIMEOUT").ok().and_then(|v| v.parse::<f64>().ok()).filter(|v| *v > 0.0 && *v <= 1e11);
    Duration::from_secs_f64(s.unwrap_or(30.0))
}

static PLATFORM: OnceLock<Option<Platform>> = OnceLock::new();

/// The platform, opened on first use; `None` when no daemon offers an OpenCL device (or
/// `SUCL_OPENCL_DISABLE` is set, as `sucld` sets it for itself).
pub(crate) fn get() -> Option<&'static Platform> {
    PLATFORM.get_or_init(open).as_ref()
}

fn open() -> Option<Platform> {
    if std::env::var_os("SUCL_OPENCL_DISABLE").is_some() {
        return None;
    }
    let config = std::env::var_os("SUCL_CONFIG").map(PathBuf::from);
    let addresses = match servers(None, config.as_deref()) {
        Ok(a) => a,
        Err(e) => {
            warn(&format!("no daemons: {e}"));
            return None;
        }
    };
    if addresses.is_empty() {
        return None;
    }
    let mut opts = match ClientOptions::from_env(config.as_deref()) {
        Ok(o) => o,
        Err(e) => {
            warn(&e.to_string());
            return None;
        }
    };
    opts.call_timeout = timeout();
    opts.reconnect_window = timeout();
    let handle = Ref::new(PlatformData);
    let mut servers = Vec::new();
    let mut devices = Vec::new();
    for a in addresses {
        let remote = match Remote::connect(&a, opts.clone()) {
            Ok(r) => r,
            Err(e) => {
                warn(&e.to_string());
                continue;
            }
        };
        let list = match remote.devices() {
            Ok(l) => l,
            Err(e) => {
                warn(&e.to_string());
                continue;
            }
        };
        let server = servers.len();
        for d in list.into_iter().filter(|d| d.kind() == DeviceKind::OpenCl) {
            devices.push(Ref::new(Device { server, index: d.index(), cache: Mutex::new(HashMap::new()) }));
        }
        servers.push(Server { remote });
    }
    if devices.is_empty() {
        return None;
    }
    Some(Platform { handle, servers, devices, mesh: OnceLock::new() })
}

fn warn(msg: &str) {
    if std::env::var_os("SUCL_OPENCL_QUIET").is_none() {
        eprintln!("sucl OpenCL: {msg}");
    }
}

impl Platform {
    /// The daemon of `d`.
    pub(crate) fn remote(&self, d: &Device) -> &Remote {
        &self.servers[d.server].remote
    }

    /// Makes every daemon a member of one mesh (once), so that buffers move and events are
    /// waited for server to server.
    pub(crate) fn ensure_mesh(&self) -> Result<(), Int> {
        let r = self.mesh.get_or_init(|| {
            let members: Vec<Remote> = self.servers.iter().map(|s| s.remote.clone()).collect();
            Mesh::new(&members).map_err(|e| e.to_string())
        });
        r.as_ref().map(|_| ()).map_err(|e| {
            warn(&format!("the daemons could not form a mesh: {e}"));
            cl::OUT_OF_RESOURCES
        })
    }
}

impl Device {
    /// The daemon platform's answer to `clGetDeviceInfo(param)` (cached).
    pub(crate) fn info(&self, p: &Platform, param: u32) -> Result<Vec<u8>, Int> {
        if let Some(v) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&param) {
            return Ok(v.clone());
        }
        let cmd = Command::ClQuery { what: cl_query::DEVICE, object: 0, device: self.index, param };
        let v = match p.remote(self).call_raw(cmd) {
            Ok(Outcome::Data(v)) => v,
            Ok(_) => return Err(cl::INVALID_VALUE),
            Err(e) => return Err(crate::error::code(&e, cl::INVALID_VALUE)),
        };
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(param, v.clone());
        Ok(v)
    }

    /// A `size_t` or `cl_ulong`/`cl_uint` answer as a number.
    pub(crate) fn info_num(&self, p: &Platform, param: u32) -> Result<u64, Int> {
        let v = self.info(p, param)?;
        let mut b = [0u8; 8];
        let n = v.len().min(8);
        b[..n].copy_from_slice(&v[..n]);
        Ok(u64::from_le_bytes(b))
    }

    /// `CL_DEVICE_MAX_WORK_ITEM_SIZES`.
    pub(crate) fn max_item_sizes(&self, p: &Platform) -> Result<Vec<u64>, Int> {
        let v = self.info(p, cl::DEVICE_MAX_WORK_ITEM_SIZES)?;
        Ok(v.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }
}
