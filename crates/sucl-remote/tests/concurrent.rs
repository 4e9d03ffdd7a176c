//! One remote client shared by several threads at once (the daemon a real process on
//! loopback): each thread uploads its own data, runs kernels and reads results back, on queues
//! of its own and on one queue they all share; every result is checked against a reference
//! computed here. Nothing may be lost, mixed up between threads, or hang (every call of the
//! client is bounded by its timeout).

mod common;
use common::*;
use sucl_remote::{Arg, Remote};

const THREADS: usize = 6;
const ROUNDS: usize = 15;

/// The data thread `t` sends in round `round`: distinct for every (thread, round).
fn data(t: usize, round: usize) -> Vec<f32> {
    (0..1000).map(|i| (t * 100_000 + round * 1000 + i) as f32).collect()
}

#[test]
fn threads_sharing_one_client_get_their_own_results() {
    let d = Sucld::start(&["--host-devices", "2"]);
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    let devs = r.devices().unwrap();
    let shared = devs[0].queue().unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (devs, shared) = (&devs, &shared);
            s.spawn(move || {
                let own = devs[t % devs.len()].queue().unwrap();
                for round in 0..ROUNDS {
                    let x = data(t, round);
                    // On the thread's own queue: y = 10 + 2 x.
                    let bx = own.upload(&x).unwrap();
                    let mut y = own.alloc::<f32>(x.len()).unwrap();
                    y.fill(10.0).unwrap();
                    own.launch("axpy_f32", &[y.arg(), bx.arg(), Arg::F64(2.0)], 0).unwrap();
                    own.synchronize().unwrap();
                    let want: Vec<f32> = x.iter().map(|v| 10.0 + 2.0 * v).collect();
                    assert_eq!(y.to_vec().unwrap(), want, "thread {t} round {round}: own queue");
                    // On the queue every thread uses: a round trip and a partial read.
                    let b = shared.upload(&x).unwrap();
                    assert_eq!(b.to_vec().unwrap(), x, "thread {t} round {round}: shared queue");
                    assert_eq!(b.read(7, 3).unwrap(), x[7..10], "thread {t} round {round}: shared queue, read");
                }
            });
        }
    });
}
