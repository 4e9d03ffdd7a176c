//! A ring over a host queue: every rank sends to the next and receives from the previous, round
//! after round, with the host only enqueueing — tasks on the queue fill each message and check
//! what arrived. The complete example of docs/guide/stream-triggered.md.

use clap::Parser;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use sucl_runtime::{Error, ReduceOp, Result};
use sucl_stream::{CommQueue, HostQueue, SharedBuf};

/// A ring exchange over a stream-triggered host queue (2 or more ranks): per round, a task
/// fills the message, the queue sends it to the next rank and receives from the previous one,
/// and a task after the queue's wait checks it. Rank 0 prints the outcome; exits 2 if any value
/// was wrong.
#[derive(Parser)]
#[command(name = "ring", after_help = "Example:\n  sucl run -n 4 -- target/debug/examples/ring --rounds 100 --len 4096")]
struct Args {
    /// Rounds of the exchange.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Elements (f64) per message.
    #[arg(long, default_value_t = 1024)]
    len: usize,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("ring: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<()> {
    let comm = sucl_runtime::init()?;
    let (rank, size) = (comm.rank(), comm.size());
    if size < 2 {
        return Err(Error::Config("ring needs at least 2 ranks (sucl run -n N -- ring)".into()));
    }
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let q = HostQueue::new();
    let mut cq = CommQueue::on_host(comm, &q)?;
    let out = SharedBuf::<f64>::zeroed(a.len);
    let got = SharedBuf::<f64>::zeroed(a.len);
    let wrong = Arc::new(AtomicU64::new(0));
    let value = |from: usize, round: usize| (from * 1_000_000 + round) as f64;
    for round in 0..a.rounds {
        // Runs on the queue before this round's start: the send reads what it wrote.
        let o = out.clone();
        q.submit(move || o.write().fill(value(rank, round)));
        cq.enqueue_recv(&got, prev, 0)?; // nothing moves yet
        cq.enqueue_send(&out, next, 0)?;
        cq.start()?; // posted when the queue gets here
        cq.wait()?; // tasks after this see the message
        let (g, w, want) = (got.clone(), wrong.clone(), value(prev, round));
        q.submit(move || {
            let bad = g.read().iter().filter(|&&v| v != want).count();
            w.fetch_add(bad as u64, Ordering::Relaxed);
        });
    }
    cq.synchronize()?; // the host waits here, once
    let comm = cq.close()?;
    let mut bad = [wrong.load(Ordering::Relaxed)];
    comm.all_reduce_in_place(&mut bad, ReduceOp::Sum)?;
    if rank == 0 {
        println!("ring: {size} ranks, {} rounds of {} f64: {} wrong values", a.rounds, a.len, bad[0]);
    }
    if bad[0] > 0 {
        std::process::exit(2);
    }
    Ok(())
}
