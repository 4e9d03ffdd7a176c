//! Helpers shared by the multi-process tests of sucl-runtime.

use std::net::TcpListener;
use std::process::Child;

/// A free TCP port on loopback (for the rendezvous store of a test's ranks).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills and reaps the child when dropped, so a failing test leaves no process behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
