//! Ranks 0 and 1 bounce a message and report the round-trip time (OSU latency style).
//!
//! Run with: `target/release/sucl run -n 2 -- target/release/examples/ping_pong`

use std::time::Instant;

fn main() -> sucl::Result<()> {
    let comm = sucl::init()?;
    if comm.size() < 2 {
        eprintln!("ping_pong needs at least 2 ranks");
        return Ok(());
    }
    let rank = comm.rank();
    for bytes in [8usize, 1024, 65536, 1 << 20] {
        let mut buf = vec![0u8; bytes];
        let iters = 200;
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..iters {
            match rank {
                0 => {
                    comm.send(&buf, 1, 7)?;
                    comm.recv(&mut buf, 1, 7)?;
                }
                1 => {
                    comm.recv(&mut buf, 0, 7)?;
                    comm.send(&buf, 0, 7)?;
                }
                _ => {}
            }
        }
        if rank == 0 {
            let half_rtt = t.elapsed().as_secs_f64() / iters as f64 / 2.0 * 1e6;
            println!("{bytes:>8} B  one-way {half_rtt:8.2} µs  via {}", comm.backend_name());
        }
    }
    Ok(())
}
