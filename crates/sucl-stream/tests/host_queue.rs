//! The reference semantics of stream-triggered queues, on host queues and real processes.

mod common;

use common::{await_token, run, token, world};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sucl_stream::{CommQueue, HostQueue, SharedBuf, ANY_SOURCE, ANY_TAG, PROC_NULL};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn fifo_order_per_peer_and_tag() {
    // Each queue side meets plain calls, so an order bug on either side cannot cancel out.
    run("fifo_order_per_peer_and_tag", 2, &[], |rank| {
        let (comm, _ctl) = world();
        if rank == 0 {
            let q = HostQueue::new();
            let mut cq = CommQueue::on_host(comm, &q).unwrap();
            // Two tags interleaved; each tag's messages must arrive in enqueue order.
            for i in 0..6u64 {
                cq.enqueue_send(&SharedBuf::new(vec![i; 3]), 1, (i % 2) as u32).unwrap();
            }
            // Receives posted tag-1 first: matching is per (peer, tag), not global order.
            let mut got = vec![];
            let mut reqs = vec![];
            for tag in [1u32, 0] {
                for _ in 0..3 {
                    let b = SharedBuf::<u64>::zeroed(3);
                    reqs.push(cq.enqueue_recv(&b, 1, tag + 10).unwrap());
                    got.push((tag, b));
                }
            }
            cq.start().unwrap();
            cq.wait().unwrap();
            // A task after the wait sees every received value.
            let seen = Arc::new(Mutex::new(vec![]));
            let (s, g) = (seen.clone(), got.clone());
            q.submit(move || s.lock().unwrap().extend(g.iter().map(|(t, b)| (*t, b.read()[0]))));
            cq.synchronize().unwrap();
            for r in &reqs {
                assert_eq!(r.wait().unwrap(), 3);
            }
            assert_eq!(*seen.lock().unwrap(), vec![(1, 101), (1, 103), (1, 105), (0, 100), (0, 102), (0, 104)]);
            cq.close().unwrap();
        } else {
            let mut got = vec![];
            for tag in [1u32, 0] {
                for _ in 0..3 {
                    let mut b = [0u64; 3];
                    comm.recv(&mut b[..], 0, tag).unwrap();
                    got.push((tag, b[0]));
                }
            }
            assert_eq!(got, vec![(1, 1), (1, 3), (1, 5), (0, 0), (0, 2), (0, 4)]);
            for i in 0..6u64 {
                comm.send(&[100 + i; 3][..], 0, (i % 2) as u32 + 10).unwrap();
            }
        }
    });
}

#[test]
fn start_releases_only_what_was_enqueued_before_it() {
    run("start_releases_only_what_was_enqueued_before_it", 2, &[], |rank| {
        let (comm, ctl) = world();
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        if rank == 0 {
            let a = SharedBuf::new(vec![10u32]);
            let b = SharedBuf::new(vec![11u32]);
            let c = SharedBuf::new(vec![12u32]);
            cq.enqueue_send(&a, 1, 0).unwrap();
            token(&ctl, 1); // "enqueued, not started"
            await_token(&ctl, 1); // rank 1 saw nothing arrive
            cq.enqueue_send(&b, 1, 0).unwrap();
            cq.start().unwrap(); // releases a and b together
            cq.enqueue_send(&c, 1, 0).unwrap(); // not covered by that start
            await_token(&ctl, 1); // rank 1 saw a and b, not c
                                  // The second start sits behind a task that holds the queue: the queue has not
                                  // reached it, so c must not move yet.
            let gate = Arc::new(AtomicBool::new(false));
            let g = gate.clone();
            q.submit(move || {
                while !g.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            cq.start().unwrap();
            token(&ctl, 1);
            await_token(&ctl, 1); // rank 1 saw c not arrived
            gate.store(true, Ordering::Release);
            cq.synchronize().unwrap();
        } else {
            let bufs: Vec<SharedBuf<u32>> = (0..3).map(|_| SharedBuf::zeroed(1)).collect();
            let reqs: Vec<_> = bufs.iter().map(|b| cq.enqueue_recv(b, 0, 0).unwrap()).collect();
            cq.start().unwrap();
            await_token(&ctl, 0);
            std::thread::sleep(Duration::from_millis(200));
            assert!(reqs[0].test().unwrap().is_none(), "a send moved before its start");
            token(&ctl, 0);
            assert_eq!(reqs[0].wait().unwrap(), 1);
            assert_eq!(reqs[1].wait().unwrap(), 1);
            std::thread::sleep(Duration::from_millis(200));
            assert!(reqs[2].test().unwrap().is_none(), "a send enqueued after a start was released by it");
            token(&ctl, 0);
            await_token(&ctl, 0);
            std::thread::sleep(Duration::from_millis(200));
            assert!(reqs[2].test().unwrap().is_none(), "a start released its operations before the queue reached it");
            token(&ctl, 0);
            assert_eq!(reqs[2].wait().unwrap(), 1);
            cq.synchronize().unwrap();
            assert_eq!(bufs.iter().map(|b| b.read()[0]).collect::<Vec<_>>(), vec![10, 11, 12]);
        }
        cq.close().unwrap();
    });
}

/// The queue's wait task drives its batch itself, so the progress thread leaves such batches
/// alone — but not when that task cannot run: here a task ahead of it holds the queue, and a
/// receive the host waits for must still complete (and a failed peer would still be reported).
#[test]
fn a_request_completes_while_its_queues_wait_task_is_held() {
    run("a_request_completes_while_its_queues_wait_task_is_held", 2, &[("SUCL_TIMEOUT", "6")], |rank| {
        let (comm, ctl) = world();
        if rank == 0 {
            await_token(&ctl, 1);
            comm.send(&[42u32][..], 1, 5).unwrap();
            await_token(&ctl, 1);
            return;
        }
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let b = SharedBuf::<u32>::zeroed(1);
        let r = cq.enqueue_recv(&b, 0, 5).unwrap();
        cq.start().unwrap();
        let gate = Arc::new(AtomicBool::new(false));
        let holding = Arc::new(AtomicBool::new(false));
        let (g, h) = (gate.clone(), holding.clone());
        q.submit(move || {
            h.store(true, Ordering::Release);
            let t0 = std::time::Instant::now();
            while !g.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        cq.wait().unwrap(); // behind the held task
                            // The start task ran (it posted the receive, before any message was sent) and the
                            // queue is held: only the progress thread can complete the receive now.
        while !holding.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        token(&ctl, 0);
        assert_eq!(r.wait().expect("the receive did not complete while the queue was held"), 1);
        assert!(!gate.load(Ordering::Acquire));
        gate.store(true, Ordering::Release);
        cq.synchronize().unwrap();
        assert_eq!(b.to_vec(), vec![42]);
        token(&ctl, 0);
        cq.close().unwrap();
    });
}

/// A wait covers the operations started before it; a wait while operations are enqueued and
/// not started is refused (it would cover nothing of them), naming how many, and puts nothing on
/// the queue.
#[test]
fn wait_covers_started_operations_and_refuses_unstarted_ones() {
    run("wait_covers_started_operations_and_refuses_unstarted_ones", 2, &[], |rank| {
        let (comm, ctl) = world();
        if rank == 0 {
            let q = HostQueue::new();
            let mut cq = CommQueue::on_host(comm, &q).unwrap();
            let first = SharedBuf::<i64>::zeroed(2);
            let second = SharedBuf::<i64>::zeroed(2);
            let third = SharedBuf::<i64>::zeroed(2);
            let r1 = cq.enqueue_recv(&first, 1, 5).unwrap();
            cq.start().unwrap();
            cq.wait().unwrap(); // covers r1
            let r2 = cq.enqueue_recv(&second, 1, 5).unwrap();
            let r3 = cq.enqueue_recv(&third, 1, 5).unwrap();
            let e = cq.wait().expect_err("a wait with operations enqueued and not started was accepted").to_string();
            assert!(e.contains("2 operations enqueued but never started"), "{e}");
            let seen = Arc::new(Mutex::new(None));
            let (s, f, r1c, r2c) = (seen.clone(), first.clone(), r1.clone(), r2.clone());
            q.submit(move || {
                *s.lock().unwrap() = Some((f.read().to_vec(), r1c.test().unwrap(), r2c.test().unwrap()));
            });
            // The task after the wait ran although the later receives are not even started (the
            // refused wait put nothing on the queue that could hold it).
            q.synchronize(Duration::from_secs(5)).unwrap();
            let got = seen.lock().unwrap().take().unwrap();
            assert_eq!(got, (vec![7, 8], Some(2), None));
            token(&ctl, 1);
            cq.start().unwrap();
            cq.wait().unwrap();
            cq.synchronize().unwrap();
            assert_eq!((r2.wait().unwrap(), r3.wait().unwrap()), (2, 2));
            assert_eq!((second.to_vec(), third.to_vec()), (vec![9, 10], vec![11, 12]));
            cq.close().unwrap();
        } else {
            // Plain sends: the later two only after rank 0's queue got past its wait.
            comm.send(&[7i64, 8][..], 0, 5).unwrap();
            await_token(&ctl, 0);
            comm.send(&[9i64, 10][..], 0, 5).unwrap();
            comm.send(&[11i64, 12][..], 0, 5).unwrap();
        }
    });
}

fn st_and_plain_match(rank: usize) {
    let (comm, _ctl) = world();
    if rank == 0 {
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let out = SharedBuf::new((0..1000).map(|i| i as f32).collect::<Vec<_>>());
        let back = SharedBuf::<f32>::zeroed(1000);
        cq.enqueue_send(&out, 1, 3).unwrap();
        let r = cq.enqueue_recv(&back, 1, 4).unwrap();
        cq.start().unwrap();
        cq.wait().unwrap();
        assert_eq!(r.wait().unwrap(), 1000);
        cq.synchronize().unwrap();
        assert!(back.read().iter().enumerate().all(|(i, &v)| v == -(i as f32)));
        cq.close().unwrap();
    } else {
        let mut got = vec![0f32; 1000];
        let st = comm.recv(&mut got[..], 0, 3).unwrap();
        assert_eq!(st.count, 1000);
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as f32));
        let neg: Vec<f32> = got.iter().map(|v| -v).collect();
        comm.send(&neg[..], 0, 4).unwrap();
    }
}

#[test]
fn st_send_matches_plain_recv_and_back_shm() {
    run("st_send_matches_plain_recv_and_back_shm", 2, &[("SUCL_BACKEND", "shm")], st_and_plain_match);
}

#[test]
fn st_send_matches_plain_recv_and_back_tcp() {
    run("st_send_matches_plain_recv_and_back_tcp", 2, &[("SUCL_BACKEND", "tcp")], st_and_plain_match);
}

#[test]
fn collectives_on_a_host_queue() {
    run("collectives_on_a_host_queue", 3, &[], |rank| {
        let (comm, _ctl) = world();
        let n = comm.size();
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let mine = SharedBuf::new(vec![rank as i64 + 1; n]);
        let sum = SharedBuf::<i64>::zeroed(n);
        let bc = SharedBuf::new(vec![if rank == 2 { 42i64 } else { 0 }; 2]);
        let gathered = SharedBuf::<i64>::zeroed(n * n);
        let scattered = SharedBuf::<i64>::zeroed(1);
        let a2a_in = SharedBuf::new((0..n).map(|j| (rank * 10 + j) as i64).collect::<Vec<_>>());
        let a2a_out = SharedBuf::<i64>::zeroed(n);
        let in_place = SharedBuf::new((0..2 * n).map(|i| if i / 2 == rank { (rank * 7 + i % 2) as i64 } else { -1 }).collect::<Vec<_>>());
        cq.enqueue_all_reduce(&mine, &sum, sucl_runtime::ReduceOp::Sum).unwrap();
        cq.enqueue_all_gather(&in_place, &in_place).unwrap();
        cq.enqueue_broadcast(&bc, 2).unwrap();
        cq.enqueue_all_gather(&mine, &gathered).unwrap();
        cq.enqueue_reduce_scatter(&mine, &scattered, sucl_runtime::ReduceOp::Max).unwrap();
        cq.enqueue_all_to_all(&a2a_in, &a2a_out).unwrap();
        // Bad arguments are refused before anything is enqueued.
        let e = cq.enqueue_all_gather(&mine, &sum).unwrap_err().to_string();
        assert!(e.contains("all_gather"), "{e}");
        let odd = SharedBuf::<i64>::zeroed(n + 1);
        let e = cq.enqueue_all_gather(&odd, &odd).unwrap_err().to_string();
        assert!(e.contains("not a multiple of the communicator size"), "{e}");
        let e = cq.enqueue_broadcast(&bc, n).unwrap_err().to_string();
        assert!(e.contains("root"), "{e}");
        cq.start().unwrap();
        cq.wait().unwrap();
        cq.synchronize().unwrap();
        let total: i64 = (1..=n as i64).sum();
        assert_eq!(sum.to_vec(), vec![total; n]);
        assert_eq!(bc.to_vec(), vec![42, 42]);
        assert_eq!(gathered.to_vec(), (0..n * n).map(|i| (i / n) as i64 + 1).collect::<Vec<_>>());
        assert_eq!(scattered.to_vec(), vec![n as i64]);
        assert_eq!(a2a_out.to_vec(), (0..n).map(|i| (i * 10 + rank) as i64).collect::<Vec<_>>());
        assert_eq!(in_place.to_vec(), (0..2 * n).map(|i| ((i / 2) * 7 + i % 2) as i64).collect::<Vec<_>>(), "all_gather in place");
        cq.close().unwrap();
    });
}

#[test]
fn proc_null_completes_at_once_and_wildcards_are_refused() {
    // A world of one: no launcher variables.
    if common::child_rank().is_some() {
        return;
    }
    let comm = sucl_runtime::init().unwrap();
    let other = comm.split(Some(0), 0).unwrap().expect("member");
    let q = HostQueue::new();
    let mut cq = CommQueue::on_host(comm, &q).unwrap();
    let b = SharedBuf::new(vec![5i32; 4]);
    let s = cq.enqueue_send(&b, PROC_NULL, 1).unwrap();
    let r = cq.enqueue_recv(&b, PROC_NULL, 1).unwrap();
    // Complete at once: before any start, and not counted among the operations waiting for one.
    assert_eq!(s.test().unwrap(), Some(0), "a PROC_NULL send waited for a start");
    assert_eq!(r.test().unwrap(), Some(0), "a PROC_NULL receive waited for a start");
    assert_eq!(cq.enqueued(), 0, "PROC_NULL operations were queued for a start");
    // A queue holding only PROC_NULL operations closes cleanly (nothing was in flight).
    let q2 = HostQueue::new();
    let mut cq2 = CommQueue::on_host(other, &q2).unwrap();
    cq2.enqueue_send(&b, PROC_NULL, 2).unwrap();
    cq2.enqueue_recv(&b, PROC_NULL, 3).unwrap();
    cq2.close().expect("closing a queue that holds only completed PROC_NULL operations");
    cq.start().unwrap();
    cq.wait().unwrap();
    assert_eq!(s.wait().unwrap(), 0);
    assert_eq!(r.wait().unwrap(), 0);
    assert_eq!(b.to_vec(), vec![5; 4], "a PROC_NULL receive wrote its buffer");
    let e = cq.enqueue_recv(&b, ANY_SOURCE, 1).unwrap_err().to_string();
    assert!(e.contains("explicit peer") && e.contains("ANY_SOURCE"), "{e}");
    let e = cq.enqueue_recv(&b, 0, ANY_TAG).unwrap_err().to_string();
    assert!(e.contains("explicit tag") && e.contains("ANY_TAG"), "{e}");
    let e = cq.enqueue_send(&b, 1, 0).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
    assert_eq!(cq.enqueued(), 0, "a refused operation was enqueued");
    cq.synchronize().unwrap();
    cq.close().unwrap();
}

#[test]
fn closing_or_dropping_with_operations_in_flight_is_an_error() {
    run("closing_or_dropping_with_operations_in_flight_is_an_error", 2, &[], |rank| {
        let (comm, ctl) = world();
        if rank == 0 {
            let q = HostQueue::new();
            let mut cq = CommQueue::on_host(comm, &q).unwrap();
            let got = SharedBuf::<u8>::zeroed(64);
            let out = SharedBuf::new(vec![1u8; 8]);
            let r = cq.enqueue_recv(&got, 1, 0).unwrap();
            cq.start().unwrap();
            let never = cq.enqueue_send(&out, 1, 0).unwrap();
            token(&ctl, 1);
            let e = cq.close().err().expect("close succeeded").to_string();
            assert!(e.contains("in flight") && e.contains("1 enqueued but never started") && e.contains("1 started"), "{e}");
            // The started receive was waited for, not torn down: its data is intact.
            assert_eq!(r.wait().unwrap(), 64);
            assert!(got.read().iter().all(|&v| v == 3));
            let e = never.wait().unwrap_err().to_string();
            assert!(e.contains("closed before"), "{e}");
            // Dropping without close: the same rules, logged.
            let q2 = HostQueue::new();
            let mut cq2 = CommQueue::on_host(ctl, &q2).unwrap();
            let late = cq2.enqueue_send(&out, 1, 0).unwrap();
            drop(cq2);
            let e = late.wait().unwrap_err().to_string();
            assert!(e.contains("closed before"), "{e}");
        } else {
            await_token(&ctl, 0);
            std::thread::sleep(Duration::from_millis(300));
            comm.send(&[3u8; 64][..], 0, 0).unwrap();
        }
    });
}

#[test]
fn a_lost_peer_releases_every_wait_with_an_error_naming_it() {
    let name = "a_lost_peer_releases_every_wait_with_an_error_naming_it";
    let Some(rank) = common::child_rank() else {
        let outs = common::launch(name, 2, &[("SUCL_TIMEOUT", "4")], LIMIT);
        assert_eq!(outs[1].status.code(), Some(9), "the victim did not die as planned:\n{}\n{}", outs[1].stdout, outs[1].stderr);
        assert!(outs[0].status.success(), "rank 0 failed:\n{}\n{}", outs[0].stdout, outs[0].stderr);
        assert!(outs[0].stdout.contains("rank 0 saw"), "rank 0 did not get through:\n{}", outs[0].stdout);
        println!("{}", outs[0].stdout);
        return;
    };
    {
        let (comm, ctl) = world();
        if rank == 0 {
            let q = HostQueue::new();
            let mut cq = CommQueue::on_host(comm, &q).unwrap();
            let a = SharedBuf::<u32>::zeroed(4);
            let b = SharedBuf::<u32>::zeroed(4);
            let big = SharedBuf::new(vec![0u8; 8 << 20]);
            let reqs = [cq.enqueue_recv(&a, 1, 1).unwrap(), cq.enqueue_recv(&b, 1, 2).unwrap(), cq.enqueue_send(&big, 1, 3).unwrap()];
            cq.start().unwrap();
            cq.wait().unwrap();
            let after = Arc::new(Mutex::new(false));
            let a2 = after.clone();
            q.submit(move || *a2.lock().unwrap() = true);
            token(&ctl, 1);
            for r in &reqs {
                let e = r.wait().unwrap_err().to_string();
                assert!(e.contains("rank 1"), "{} failed without naming rank 1: {e}", r.describe());
                assert!(!e.contains("waiting on the host"), "{} was not released by the engine: {e}", r.describe());
            }
            // The queue's wait was released by the failure (not by its own, longer bound).
            q.synchronize(Duration::from_secs(3)).unwrap();
            assert!(*after.lock().unwrap());
            let e = cq.synchronize().unwrap_err().to_string();
            assert!(e.contains("rank 1"), "{e}");
            assert!(cq.start().is_err(), "a failed queue accepted a start");
            println!("rank 0 saw: {e}");
            let _ = cq.close();
            std::process::exit(0);
        } else {
            await_token(&ctl, 0);
            // Die without a goodbye while rank 0's operations wait for this rank.
            std::process::exit(9);
        }
    }
}
