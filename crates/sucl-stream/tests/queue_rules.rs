//! The rules of `start`, `wait` and lent buffers on host queues, on real processes: each start
//! releases its own batch, queues do not hold each other up, one buffer cannot serve two
//! operations of one batch where one of them writes it, and a received message must be a whole
//! number of elements.

mod common;

use common::{await_token, progress_threads, run, token, world};
use sucl_runtime::ReduceOp;
use sucl_stream::{CommQueue, HostQueue, SharedBuf};

/// Operations of a later start are posted while those of an earlier start are still in flight:
/// the receive of start 1 can only complete once the peer's send of *its* start 2 is posted.
#[test]
fn each_start_releases_its_batch_on_its_own() {
    run("each_start_releases_its_batch_on_its_own", 2, &[("SUCL_TIMEOUT", "5")], |rank| {
        let (comm, _ctl) = world();
        let peer = 1 - rank;
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let got = SharedBuf::<u32>::zeroed(3);
        let out = SharedBuf::new(vec![rank as u32 + 40; 3]);
        let r = cq.enqueue_recv(&got, peer, 1).unwrap();
        cq.start().unwrap();
        let s = cq.enqueue_send(&out, peer, 1).unwrap();
        cq.start().unwrap();
        cq.wait().unwrap();
        cq.synchronize().expect("the second start's send was held back behind the first start's receive");
        assert_eq!((r.wait().unwrap(), s.wait().unwrap()), (3, 3));
        assert_eq!(got.to_vec(), vec![peer as u32 + 40; 3]);
        cq.close().unwrap();
    });
}

/// Two queues on two communicators, their collectives started in opposite orders on the two
/// ranks and synchronized without a queue wait: each queue progresses on its own, so neither
/// collective waits behind the other.
#[test]
fn queues_on_two_communicators_do_not_block_each_other() {
    run("queues_on_two_communicators_do_not_block_each_other", 2, &[("SUCL_TIMEOUT", "5")], |rank| {
        let (a, b) = world();
        let (qa, qb) = (HostQueue::new(), HostQueue::new());
        let mut ca = CommQueue::on_host(a, &qa).unwrap();
        let mut cb = CommQueue::on_host(b, &qb).unwrap();
        let (xa, sa) = (SharedBuf::new(vec![rank as i64 + 1; 4]), SharedBuf::<i64>::zeroed(4));
        let (xb, sb) = (SharedBuf::new(vec![10 * (rank as i64 + 1); 4]), SharedBuf::<i64>::zeroed(4));
        ca.enqueue_all_reduce(&xa, &sa, ReduceOp::Sum).unwrap();
        cb.enqueue_all_reduce(&xb, &sb, ReduceOp::Sum).unwrap();
        // Rank 0 starts a then b, rank 1 b then a; the pause lets the first collective begin
        // before the second is started, so a shared progress thread would be stuck in it.
        let pause = || std::thread::sleep(std::time::Duration::from_millis(300));
        if rank == 0 {
            ca.start().unwrap();
            pause();
            cb.start().unwrap();
        } else {
            cb.start().unwrap();
            pause();
            ca.start().unwrap();
        }
        ca.synchronize().expect("queue a");
        cb.synchronize().expect("queue b");
        assert_eq!(sa.to_vec(), vec![3; 4]);
        assert_eq!(sb.to_vec(), vec![30; 4]);
        ca.close().unwrap();
        cb.close().unwrap();
    });
}

/// A buffer that one operation of a batch writes cannot be lent to another operation of the same
/// batch: refused at enqueue, naming both operations, and nothing is enqueued. Across batches
/// it is allowed: the later operation waits for the earlier one to give the buffer back.
#[test]
fn one_buffer_in_two_operations_of_a_batch_is_refused() {
    run("one_buffer_in_two_operations_of_a_batch_is_refused", 2, &[("SUCL_TIMEOUT", "5")], |rank| {
        let (comm, ctl) = world();
        let peer = 1 - rank;
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        if rank == 0 {
            let b = SharedBuf::<u64>::zeroed(2);
            let other = SharedBuf::<u64>::zeroed(2);
            cq.enqueue_recv(&b, peer, 3).unwrap();
            let e = cq.enqueue_send(&b, peer, 4).expect_err("a buffer received into was also lent to a send of the batch").to_string();
            assert!(e.contains("receive from rank 1 (tag 3)") && e.contains("send to rank 1 (tag 4)"), "{e}");
            let e =
                cq.enqueue_all_reduce(&other, &b, ReduceOp::Sum).expect_err("a collective's result buffer was received into").to_string();
            assert!(e.contains("receive from rank 1 (tag 3)") && e.contains("all_reduce"), "{e}");
            assert_eq!(cq.enqueued(), 1, "a refused operation was enqueued");
            // Two reads of one buffer in one batch are fine.
            cq.enqueue_send(&other, peer, 5).unwrap();
            cq.enqueue_send(&other, peer, 6).unwrap();
            cq.start().unwrap();
            // In the next batch, b may be sent: the send waits for the receive into it.
            let echo = cq.enqueue_send(&b, peer, 4).unwrap();
            cq.start().unwrap();
            cq.wait().unwrap();
            cq.synchronize().unwrap();
            assert_eq!(echo.wait().unwrap(), 2);
            assert_eq!(b.to_vec(), vec![7, 8]);
            token(&ctl, peer);
        } else {
            let echo = SharedBuf::<u64>::zeroed(2);
            let (five, six) = (SharedBuf::<u64>::zeroed(2), SharedBuf::<u64>::zeroed(2));
            cq.enqueue_recv(&five, peer, 5).unwrap();
            cq.enqueue_recv(&six, peer, 6).unwrap();
            cq.enqueue_recv(&echo, peer, 4).unwrap();
            cq.enqueue_send(&SharedBuf::new(vec![7u64, 8]), peer, 3).unwrap();
            cq.start().unwrap();
            cq.wait().unwrap();
            cq.synchronize().unwrap();
            assert_eq!(echo.to_vec(), vec![7, 8], "the send of the second batch did not carry what the first received");
            await_token(&ctl, peer);
        }
        cq.close().unwrap();
    });
}

/// Five bytes into a buffer of 8-byte elements: an error naming the sizes, not 0 elements.
#[test]
fn a_message_of_a_partial_element_is_an_error() {
    run("a_message_of_a_partial_element_is_an_error", 2, &[("SUCL_TIMEOUT", "5")], |rank| {
        let (comm, _ctl) = world();
        if rank == 1 {
            comm.send(&[1u8, 2, 3, 4, 5][..], 0, 2).unwrap();
            comm.send(&[9u8; 16][..], 0, 3).unwrap();
            return;
        }
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let (odd, whole) = (SharedBuf::<u64>::zeroed(2), SharedBuf::<u64>::zeroed(2));
        let r = cq.enqueue_recv(&odd, 1, 2).unwrap();
        let ok = cq.enqueue_recv(&whole, 1, 3).unwrap();
        cq.start().unwrap();
        cq.wait().unwrap();
        let e = cq.synchronize().expect_err("a partial element was accepted").to_string();
        assert!(e.contains("5 bytes") && e.contains("8-byte"), "{e}");
        let e = r.wait().expect_err("the receive of a partial element succeeded").to_string();
        assert!(e.contains("receive from rank 1 (tag 2)") && e.contains("5 bytes"), "{e}");
        assert_eq!(ok.wait().unwrap(), 2);
        cq.close().unwrap();
    });
}

/// An operation whose buffer a host thread holds past the timeout fails the queue with an error
/// that names it and says it was never posted (the progress thread never blocks on the buffer).
#[test]
fn a_buffer_held_past_the_timeout_names_the_operation_never_posted() {
    run("a_buffer_held_past_the_timeout_names_the_operation_never_posted", 2, &[("SUCL_TIMEOUT", "2")], |rank| {
        let comm = sucl_runtime::init().expect("init");
        if rank == 1 {
            // Alive (no call of its own would outlast the short timeout) until rank 0 is done.
            std::thread::sleep(std::time::Duration::from_secs(6));
            return;
        }
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let b = SharedBuf::new(vec![1u32; 4]);
        let held = b.write();
        let r = cq.enqueue_send(&b, 1, 6).unwrap();
        cq.start().unwrap();
        let e = r.wait().expect_err("a send whose buffer was held completed").to_string();
        assert!(e.contains("send to rank 1 (tag 6)") && e.contains("never posted"), "{e}");
        drop(held);
        let e = cq.synchronize().expect_err("the failed queue synchronized").to_string();
        assert!(e.contains("never posted"), "{e}");
        let _ = cq.close();
    });
}

/// Each queue's progress thread has ended by the time `close` returns (it is joined, not left
/// to end some time later): closing queue after queue leaves no thread behind.
#[test]
fn closing_a_queue_ends_its_progress_thread() {
    run("closing_a_queue_ends_its_progress_thread", 2, &[("SUCL_TIMEOUT", "5")], |rank| {
        let (mut comm, _ctl) = world();
        let peer = 1 - rank;
        let q = HostQueue::new();
        for round in 0..8u32 {
            let mut cq = CommQueue::on_host(comm, &q).unwrap();
            // (A new thread names itself once it runs: allow it that long.)
            let named = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while progress_threads() == 0 && std::time::Instant::now() < named {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(progress_threads(), 1, "round {round}: one queue, one progress thread");
            let (out, got) = (SharedBuf::new(vec![round; 2]), SharedBuf::<u32>::zeroed(2));
            cq.enqueue_recv(&got, peer, round).unwrap();
            cq.enqueue_send(&out, peer, round).unwrap();
            cq.start().unwrap();
            cq.wait().unwrap();
            cq.synchronize().unwrap();
            assert_eq!(got.to_vec(), vec![round; 2]);
            comm = cq.close().unwrap();
            assert_eq!(progress_threads(), 0, "round {round}: the closed queue's progress thread still runs");
        }
    });
}

/// A batch whose trigger never comes (the queue is stuck behind a task) does not outlive the
/// queue: `close` fails it after its bound — the request gets the error, the buffer is free,
/// the progress thread is gone — and when the queue reaches the trigger after all, nothing is
/// posted.
#[test]
fn closing_a_stuck_queue_withdraws_its_batches() {
    run("closing_a_stuck_queue_withdraws_its_batches", 2, &[("SUCL_TIMEOUT", "1")], |rank| {
        let comm = sucl_runtime::init().expect("init");
        if rank == 1 {
            // Alive (no call of its own would outlast the short timeout) until rank 0 is done.
            std::thread::sleep(std::time::Duration::from_secs(10));
            return;
        }
        let q = HostQueue::new();
        let (open, gate) = std::sync::mpsc::channel::<()>();
        q.submit(move || {
            let _ = gate.recv_timeout(std::time::Duration::from_secs(30));
        });
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let b = SharedBuf::new(vec![5u32; 2]);
        let r = cq.enqueue_send(&b, 1, 5).unwrap();
        cq.start().unwrap();
        let Err(e) = cq.close() else { panic!("a queue with a batch never triggered closed cleanly") };
        let e = e.to_string();
        assert!(e.contains("1 started and not complete"), "{e}");
        let e = r.test().expect_err("the withdrawn send still looks in flight or completed").to_string();
        assert!(e.contains("closing a stream-triggered queue"), "{e}");
        assert_eq!(progress_threads(), 0, "the closed queue's progress thread still runs");
        // The queue reaches the trigger now: nothing may move any more.
        open.send(()).unwrap();
        q.synchronize(std::time::Duration::from_secs(10)).unwrap();
        b.write()[0] = 6;
    });
}

/// Batches posted at once still match per (peer, tag) in enqueue order: three starts each send
/// on one (peer, tag) while the first send's buffer is held by the host, so only the later
/// batches could be posted at first; the peer must still receive them in start order.
#[test]
fn batches_posted_at_once_keep_enqueue_order_per_peer_and_tag() {
    run("batches_posted_at_once_keep_enqueue_order_per_peer_and_tag", 2, &[("SUCL_TIMEOUT", "5")], |rank| {
        let (comm, _ctl) = world();
        if rank == 1 {
            let mut got = vec![];
            for _ in 0..3 {
                let mut b = [0u64; 2];
                comm.recv(&mut b[..], 0, 4).unwrap();
                got.push(b[0]);
            }
            assert_eq!(got, vec![1, 2, 3], "messages of one (peer, tag) overtook each other across batches");
            return;
        }
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let bufs: Vec<SharedBuf<u64>> = (1..=3).map(|v| SharedBuf::new(vec![v; 2])).collect();
        let held = bufs[0].write();
        for b in &bufs {
            cq.enqueue_send(b, 1, 4).unwrap();
            cq.start().unwrap();
        }
        // Every trigger is reached while the first buffer is held.
        q.synchronize(std::time::Duration::from_secs(5)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(held);
        cq.wait().unwrap();
        cq.synchronize().unwrap();
        cq.close().unwrap();
    });
}

/// A peer lost while several batches are posted at once fails every one of them: each request
/// gets an error naming the peer (from the progress thread, not a host-side timeout), the
/// queue's wait is released and `synchronize` reports it.
#[test]
fn a_lost_peer_fails_every_batch_in_flight() {
    let name = "a_lost_peer_fails_every_batch_in_flight";
    let Some(rank) = common::child_rank() else {
        let outs = common::launch(name, 2, &[("SUCL_TIMEOUT", "4")], std::time::Duration::from_secs(60));
        assert_eq!(outs[1].status.code(), Some(9), "the victim did not die as planned:\n{}\n{}", outs[1].stdout, outs[1].stderr);
        assert!(outs[0].status.success(), "rank 0 failed:\n{}\n{}", outs[0].stdout, outs[0].stderr);
        return;
    };
    let (comm, ctl) = world();
    if rank == 1 {
        await_token(&ctl, 0);
        // Die without a goodbye while rank 0's batches wait for this rank.
        std::process::exit(9);
    }
    let q = HostQueue::new();
    let mut cq = CommQueue::on_host(comm, &q).unwrap();
    let bufs: Vec<SharedBuf<u32>> = (0..3).map(|_| SharedBuf::zeroed(4)).collect();
    let mut reqs = vec![];
    for (tag, b) in bufs.iter().enumerate() {
        reqs.push(cq.enqueue_recv(b, 1, tag as u32).unwrap());
        cq.start().unwrap();
    }
    cq.wait().unwrap();
    token(&ctl, 1);
    for r in &reqs {
        let e = r.wait().expect_err("a receive from the lost peer completed").to_string();
        assert!(e.contains("rank 1"), "{} failed without naming rank 1: {e}", r.describe());
        assert!(!e.contains("waiting on the host"), "{} was not released by the progress thread: {e}", r.describe());
    }
    q.synchronize(std::time::Duration::from_secs(3)).expect("the queue's wait was not released by the failure");
    let e = cq.synchronize().expect_err("a queue that lost its peer synchronized").to_string();
    assert!(e.contains("rank 1"), "{e}");
    let _ = cq.close();
    assert_eq!(progress_threads(), 0, "the failed queue's progress thread still runs after close");
    std::process::exit(0);
}

/// Batches that complete out of order do not release a queue's wait early: the second start's
/// receive completes first, and the task after the wait must still find the first start's
/// receive complete.
#[test]
fn a_wait_covers_every_batch_when_they_complete_out_of_order() {
    run("a_wait_covers_every_batch_when_they_complete_out_of_order", 2, &[("SUCL_TIMEOUT", "5")], |rank| {
        let (comm, ctl) = world();
        if rank == 1 {
            comm.send(&[2u32; 2][..], 0, 2).unwrap();
            // Rank 0 saw the second batch complete (its wait still holds) before this send.
            await_token(&ctl, 0);
            std::thread::sleep(std::time::Duration::from_millis(100));
            comm.send(&[1u32; 2][..], 0, 1).unwrap();
            return;
        }
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let (first, second) = (SharedBuf::<u32>::zeroed(2), SharedBuf::<u32>::zeroed(2));
        let r1 = cq.enqueue_recv(&first, 1, 1).unwrap();
        cq.start().unwrap();
        let r2 = cq.enqueue_recv(&second, 1, 2).unwrap();
        cq.start().unwrap();
        cq.wait().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let (s, r) = (seen.clone(), r1.clone());
        q.submit(move || *s.lock().unwrap() = Some(r.test().map(|n| n.is_some()).unwrap_or(false)));
        assert_eq!(r2.wait().unwrap(), 2);
        token(&ctl, 1);
        cq.synchronize().unwrap();
        assert_eq!(*seen.lock().unwrap(), Some(true), "the task after the wait ran before the first batch completed");
        assert_eq!((r1.wait().unwrap(), first.to_vec()), (2, vec![1, 1]));
        cq.close().unwrap();
    });
}

/// Batches that completed behind one that has not leave the count of operations in flight:
/// with one receive outstanding from the first start, 400 later starts of one send each (800
/// operations and triggers, beyond `MAX_IN_FLIGHT`) neither block nor fail, and the receive's
/// message, sent only once the peer got all 400, arrives.
#[test]
fn completed_batches_behind_an_outstanding_one_leave_the_cap_on_operations_in_flight() {
    run("completed_batches_behind_an_outstanding_one_leave_the_cap_on_operations_in_flight", 2, &[("SUCL_TIMEOUT", "3")], |rank| {
        const SENDS: u32 = 400;
        let (comm, _ctl) = world();
        if rank == 1 {
            for i in 0..SENDS {
                let mut b = [0u32];
                comm.recv(&mut b[..], 0, 1).unwrap();
                assert_eq!(b[0], i);
            }
            comm.send(&[99u32][..], 0, 99).unwrap();
            return;
        }
        let q = HostQueue::new();
        let mut cq = CommQueue::on_host(comm, &q).unwrap();
        let late = SharedBuf::<u32>::zeroed(1);
        let r = cq.enqueue_recv(&late, 1, 99).unwrap();
        cq.start().unwrap();
        for i in 0..SENDS {
            cq.enqueue_send(&SharedBuf::new(vec![i]), 1, 1).unwrap();
            cq.start().unwrap_or_else(|e| panic!("start {} of the sends: {e}", i + 1));
        }
        cq.wait().unwrap();
        cq.synchronize().unwrap();
        assert_eq!((r.wait().unwrap(), late.to_vec()), (1, vec![99]));
        cq.close().unwrap();
    });
}
