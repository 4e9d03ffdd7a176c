//! Host time of a stream-triggered batch on a host queue, split into its enqueues, its start and
//! its wait: the queue's own host work (the front end that the CUDA paths share: argument and
//! buffer checks, requests, bookkeeping), measured without a GPU.

use clap::Parser;
use std::time::{Duration, Instant};
use sucl_runtime::{Error, Result};
use sucl_stream::{CommQueue, HostQueue, SharedBuf};

/// Host time per batch of `--pairs` send/recv pairs (Faces' 26 by default) through a
/// stream-triggered host queue on 2 ranks: the enqueues, the start and the wait, each timed on
/// the calling thread (the queue is synchronized between batches, untimed, so every batch finds
/// it idle). Median of `--rounds` rounds of `--batches` batches; every rank prints its line.
#[derive(Parser)]
#[command(name = "st_host_cost", after_help = "Example:\n  sucl run -n 2 -- target/release/examples/st_host_cost --rounds 7 --batches 500")]
struct Args {
    /// Send/recv pairs per batch.
    #[arg(long, default_value_t = 26)]
    pairs: usize,
    /// Timed rounds (the median counts).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Batches per round.
    #[arg(long, default_value_t = 500)]
    batches: usize,
    /// Elements (f64) per message.
    #[arg(long, default_value_t = 8)]
    len: usize,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("st_host_cost: {e}");
        std::process::exit(1);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run(a: &Args) -> Result<()> {
    let comm = sucl_runtime::init()?;
    let (rank, size) = (comm.rank(), comm.size());
    if size != 2 {
        return Err(Error::Config("st_host_cost runs on 2 ranks (sucl run -n 2 -- st_host_cost)".into()));
    }
    let peer = 1 - rank;
    let q = HostQueue::new();
    let mut cq = CommQueue::on_host(comm, &q)?;
    let sends: Vec<SharedBuf<f64>> = (0..a.pairs).map(|i| SharedBuf::new(vec![i as f64; a.len])).collect();
    let recvs: Vec<SharedBuf<f64>> = (0..a.pairs).map(|_| SharedBuf::zeroed(a.len)).collect();
    let (mut enq, mut start, mut wait) = (vec![], vec![], vec![]);
    for round in 0..=a.rounds.max(1) {
        let (mut e, mut s, mut w) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..a.batches.max(1) {
            let t0 = Instant::now();
            for (i, (snd, rcv)) in sends.iter().zip(&recvs).enumerate() {
                cq.enqueue_send(snd, peer, i as u32)?;
                cq.enqueue_recv(rcv, peer, i as u32)?;
            }
            let t1 = Instant::now();
            cq.start()?;
            let t2 = Instant::now();
            cq.wait()?;
            let t3 = Instant::now();
            cq.synchronize()?;
            (e, s, w) = (e + (t1 - t0), s + (t2 - t1), w + (t3 - t2));
        }
        // Round 0 warms up.
        if round > 0 {
            let us = |d: Duration| d.as_secs_f64() * 1e6 / a.batches.max(1) as f64;
            enq.push(us(e));
            start.push(us(s));
            wait.push(us(w));
        }
    }
    let (e, s, w) = (median(&mut enq), median(&mut start), median(&mut wait));
    println!(
        "st_host_cost rank {rank}: {} ops per batch: enqueues {e:.2} us ({:.3} us per op), start {s:.2} us, wait {w:.2} us, total {:.2} us (median of {} rounds of {})",
        2 * a.pairs,
        e / (2 * a.pairs) as f64,
        e + s + w,
        a.rounds,
        a.batches
    );
    cq.close()?;
    Ok(())
}
