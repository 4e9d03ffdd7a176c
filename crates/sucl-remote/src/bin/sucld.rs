//! `sucld`: serves this machine's devices (host queues, CUDA GPUs with `--cuda`, OpenCL devices with `--opencl`) to sucl
//! clients over TCP. See `sucld --help`.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use sucl_remote::{Daemon, DaemonConfig, KernelRegistry, Limits, PeerPath, TlsIdentity, Token};

/// Serves this machine's devices to sucl clients (remote devices).
///
/// Connections are TLS (rustls) by default: sucld presents a certificate (self-signed, made
/// with rcgen at first start in --tls-dir, or given with --tls-cert/--tls-key) and clients
/// trust it by its SHA-256 pin, which sucld prints at start. Clients then authenticate with a
/// shared token (HMAC-SHA256 challenge-response). sucld listens on loopback unless told
/// otherwise.
#[derive(Parser, Debug)]
#[command(
    name = "sucld",
    version,
    after_help = "Example:\n  sucld --gen-token ~/.sucld-token\n  sucld --token-file ~/.sucld-token --listen 0.0.0.0:7787 --cuda\n\n\
                  Clients: SUCL_REMOTE=host:7787 SUCL_REMOTE_TOKEN_FILE=~/.sucld-token SUCL_REMOTE_TLS_PIN=<the printed pin>"
)]
struct Args {
    /// Address to listen on (port 0 picks a free port; see --print-address).
    #[arg(long, default_value = "127.0.0.1:7787")]
    listen: SocketAddr,
    /// File holding the token clients must prove they hold (64 hex digits). Without it the
    /// token comes from the SUCLD_TOKEN environment variable.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Write a fresh random token to this file (mode 0600, must not exist) and exit.
    #[arg(long, value_name = "FILE")]
    gen_token: Option<PathBuf>,
    /// Number of host devices to offer.
    #[arg(long, default_value_t = 1)]
    host_devices: u32,
    /// Also offer this machine's CUDA GPUs (fails if none can be opened).
    #[arg(long)]
    cuda: bool,
    /// Also serve the devices of this machine's OpenCL platforms (loaded at run time through
    /// libOpenCL.so.1; PoCL's CPU device, NVIDIA's OpenCL, ...).
    #[arg(long)]
    opencl: bool,
    /// Largest frame in bytes (writes and reads are split to fit).
    #[arg(long, default_value_t = sucl_remote::wire::DEFAULT_MAX_FRAME)]
    max_frame: u32,
    /// Device memory one session may hold, in bytes.
    #[arg(long, default_value_t = Limits::default().max_bytes)]
    max_session_bytes: u64,
    /// Buffers one session may hold.
    #[arg(long, default_value_t = Limits::default().max_buffers)]
    max_buffers: u32,
    /// Commands one session may have unanswered or unacknowledged.
    #[arg(long, default_value_t = Limits::default().max_inflight)]
    max_inflight: u32,
    /// Queues one session may hold.
    #[arg(long, default_value_t = Limits::default().max_queues)]
    max_queues: u32,
    /// Milliseconds a session whose connection was lost waits for its client to re-attach
    /// before its resources are freed.
    #[arg(long, default_value_t = 60_000)]
    reconnect_window_ms: u64,
    /// Print "listening on ADDRESS" and then "tls pin PIN" (or "tls off") on standard output
    /// once ready (for scripts and tests).
    #[arg(long)]
    print_address: bool,
    /// Directory holding the TLS certificate and key (cert.pem, key.pem), generated there at
    /// first start if neither exists [default: $XDG_CONFIG_HOME/sucld or ~/.config/sucld].
    #[arg(long, value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// The TLS certificate (PEM); with --tls-key, instead of --tls-dir.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The TLS private key (PEM); with --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Use a fresh certificate held in memory only (a new pin at every start; for tests).
    #[arg(long, conflicts_with_all = ["tls_dir", "tls_cert"])]
    tls_ephemeral: bool,
    /// Plain TCP: no TLS on client or peer connections (clients need SUCL_REMOTE_TLS=off).
    #[arg(long, conflicts_with_all = ["tls_dir", "tls_cert", "tls_ephemeral"])]
    no_tls: bool,
    /// Sessions the daemon holds at once; at the limit a new session frees the one detached
    /// longest, or is refused when every session is attached.
    #[arg(long, default_value_t = 256)]
    max_sessions: usize,
    /// Connections in their handshake at once; more are closed as they arrive.
    #[arg(long, default_value_t = 64)]
    max_handshakes: usize,
    /// Milliseconds a new connection has for its whole handshake (TLS, hello, open or attach).
    #[arg(long, default_value_t = 5_000)]
    handshake_timeout_ms: u64,
    /// Milliseconds a command waits for a peer server (a migration's bytes, a remote event).
    #[arg(long, default_value_t = 30_000)]
    peer_timeout_ms: u64,
    /// How migrations between GPU daemons of one host go: `auto` (GPU to GPU through peer
    /// memory, CUDA IPC, when both daemons run on one host and can open each other's buffers;
    /// over the peer link otherwise) or `network` (always over the peer link). Default: the
    /// SUCL_REMOTE_PEER_PATH environment variable, else `auto`.
    #[arg(long, value_name = "auto|network")]
    peer_path: Option<String>,
    /// Log filter (tracing's EnvFilter syntax, e.g. `info` or `sucl_remote=debug`); the
    /// SUCLD_LOG environment variable overrides it.
    #[arg(long, default_value = "info")]
    log: String,
}

fn main() {
    let args = Args::parse();
    let filter = std::env::var("SUCLD_LOG").unwrap_or_else(|_| args.log.clone());
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(filter)).with_writer(std::io::stderr).init();
    if let Err(e) = run(args) {
        eprintln!("sucld: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    // If the sucl OpenCL ICD is installed, the loader this daemon opens would offer it too;
    // it must not serve itself (the ICD offers no platform while this is set).
    std::env::set_var("SUCL_OPENCL_DISABLE", "1");
    if let Some(path) = &args.gen_token {
        Token::write_new(path)?;
        println!("wrote a new token to {}", path.display());
        return Ok(());
    }
    let token = match (&args.token_file, std::env::var("SUCLD_TOKEN")) {
        (Some(p), _) => Token::read(p)?,
        (None, Ok(hex)) => Token::from_hex(&hex).map_err(|e| format!("SUCLD_TOKEN: {e}"))?,
        (None, Err(_)) => return Err("no token: pass --token-file FILE or set SUCLD_TOKEN (make one with `sucld --gen-token FILE`)".into()),
    };
    let mut cfg = DaemonConfig::new(token);
    cfg.listen = args.listen;
    cfg.host_devices = args.host_devices;
    cfg.cuda = args.cuda;
    cfg.opencl = args.opencl;
    cfg.max_frame = args.max_frame;
    cfg.reconnect_window = Duration::from_millis(args.reconnect_window_ms);
    cfg.limits = Limits {
        max_bytes: args.max_session_bytes,
        max_buffers: args.max_buffers,
        max_inflight: args.max_inflight.max(1),
        max_queues: args.max_queues,
        ..Limits::default()
    };
    cfg.kernels = KernelRegistry::with_builtins();
    cfg.peer_timeout = Duration::from_millis(args.peer_timeout_ms);
    cfg.peer_path = match &args.peer_path {
        Some(p) => PeerPath::parse(p).map_err(|e| format!("--peer-path: {e}"))?,
        None => PeerPath::from_env()?,
    };
    cfg.max_sessions = args.max_sessions.max(1);
    cfg.max_handshakes = args.max_handshakes.max(1);
    cfg.handshake_timeout = Duration::from_millis(args.handshake_timeout_ms.max(1));
    cfg.tls = if args.no_tls {
        None
    } else if let (Some(c), Some(k)) = (&args.tls_cert, &args.tls_key) {
        Some(TlsIdentity::load(c, k)?)
    } else if args.tls_ephemeral {
        Some(TlsIdentity::generate()?)
    } else {
        let dir = match &args.tls_dir {
            Some(d) => d.clone(),
            None => match (std::env::var_os("XDG_CONFIG_HOME"), std::env::var_os("HOME")) {
                (Some(x), _) => PathBuf::from(x).join("sucld"),
                (None, Some(h)) => PathBuf::from(h).join(".config/sucld"),
                (None, None) => return Err("no --tls-dir and neither XDG_CONFIG_HOME nor HOME is set".into()),
            },
        };
        Some(TlsIdentity::load_or_generate(&dir)?)
    };
    let daemon = Daemon::start(cfg).map_err(|e| format!("starting on {}: {e}", args.listen))?;
    match daemon.tls_pin() {
        Some(p) => tracing::info!("TLS certificate pin (SHA-256): {}", sucl_remote::transport::pin_hex(&p)),
        None => tracing::warn!("TLS is off (--no-tls): traffic is not encrypted"),
    }
    if args.print_address {
        println!("listening on {}", daemon.local_addr());
        match daemon.tls_pin() {
            Some(p) => println!("tls pin {}", sucl_remote::transport::pin_hex(&p)),
            None => println!("tls off"),
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    daemon.wait();
    Ok(())
}
