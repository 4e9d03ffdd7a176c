//! A first remote-device program: opens a session on a `sucld` (or on a daemon it starts in
//! this process when none is named), runs a kernel there, and — with two servers — moves a
//! buffer from one to the other server to server. See `docs/guide/remote.md`.

use std::time::Duration;
use sucl_remote::{Arg, ClientOptions, Daemon, DaemonConfig, Mesh, Remote, RemoteError, Token};

const HELP: &str = "\
remote_hello: a first sucl remote-device program.

Opens a session on each server, uploads a vector, runs the host kernel `axpy_f32` there and
reads the result back; with two servers it also migrates the result from the first to the
second server to server. Without servers it starts two daemons in this process.

Usage: remote_hello [--servers HOST:PORT,HOST:PORT]

The token and TLS pins come from the environment (as for every sucl client):
  SUCL_REMOTE_TOKEN or SUCL_REMOTE_TOKEN_FILE, SUCL_REMOTE_TLS_PIN (or SUCL_REMOTE_TLS=off).

Example:
  sucld --gen-token tok && SUCLD_TOKEN=$(cat tok) sucld --listen 127.0.0.1:7787 &
  SUCL_REMOTE_TOKEN_FILE=tok SUCL_REMOTE_TLS_PIN=<pin sucld logged> \\
      cargo run -p sucl-remote --example remote_hello -- --servers 127.0.0.1:7787";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return;
    }
    if let Err(e) = run(&args) {
        eprintln!("remote_hello: {e}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> Result<(), RemoteError> {
    let named = match args {
        [] => None,
        [flag, list] if flag == "--servers" => Some(list.split(',').map(String::from).collect::<Vec<_>>()),
        _ => return Err(RemoteError::Invalid(format!("unexpected arguments {args:?} (see --help)"))),
    };
    // Without servers: two daemons here (the library `sucld` runs), each with its own
    // certificate, which the client pins.
    let mut local = Vec::new();
    let (servers, opts) = match named {
        Some(s) => (s, ClientOptions::from_env(None)?),
        None => {
            let token = Token::generate();
            let mut opts = ClientOptions::new(token.clone());
            for _ in 0..2 {
                let d = Daemon::start(DaemonConfig::new(token.clone())).map_err(|e| RemoteError::Invalid(e.to_string()))?;
                opts = opts.pin(d.tls_pin().expect("TLS is on by default"));
                local.push(d);
            }
            (local.iter().map(|d| d.local_addr().to_string()).collect(), opts)
        }
    };
    let mut opts = opts;
    opts.call_timeout = Duration::from_secs(30);

    let a = Remote::connect(&servers[0], opts.clone())?;
    let dev = &a.devices()?[0];
    println!("{}: device {} ({:?}, {} MiB)", a.server(), dev.name(), dev.kind(), dev.total_memory() >> 20);
    let q = dev.queue()?;
    let x = q.upload(&[1f32, 2., 3., 4.])?;
    let mut y = q.alloc::<f32>(4)?;
    y.fill(10.0)?; // posted: no round trip
    q.launch("axpy_f32", &[y.arg(), x.arg(), Arg::F64(2.0)], 0)?; // y = 2·x + y
    println!("axpy on {}: {:?}", a.server(), y.to_vec()?); // waits, and reports any earlier failure

    if let Some(second) = servers.get(1) {
        let b = Remote::connect(second, opts)?;
        let _mesh = Mesh::new(&[a.clone(), b.clone()])?;
        let qb = b.devices()?[0].queue()?;
        let mut z = qb.alloc::<f32>(4)?;
        z.migrate_from(&y)?; // a's server sends the bytes straight to b's
        println!("migrated to {}: {:?}", b.server(), z.to_vec()?);
    }
    Ok(())
}
