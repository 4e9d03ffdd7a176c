//! GPU tests of device memory sucl did not allocate ([`DeviceBuf::foreign`]) on a CUDA-stream
//! queue, 2 real processes, over both transports: a ring and collectives mixing foreign and
//! sucl buffers in either role, an all_reduce between two foreign handles of one memory (in
//! place), the owner kept until the stream ran the operations and released after, and a
//! buffer of another stream refused before anything moves.
//!
//! Without a GPU (CI) they skip (see `gpu.rs`'s `gpu_tests_skipped_no_gpu`); with
//! `SUCL_REQUIRE_GPU=1` every skip is a failure.

#![cfg(feature = "cuda")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sucl_cuda::{DeviceMemory, ForeignBuffer};
use sucl_runtime::cuda::{Buffer, Queue};
use sucl_runtime::ReduceOp;
use sucl_stream::device::{DeviceBuf, Transport};
use sucl_stream::CommQueue;

const N: usize = 4099;

/// Sets its flag when dropped: an owner whose release the test can see.
struct Owner(Arc<AtomicBool>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `buf`'s memory as foreign memory on `q`, owned by a flag that tells when it was released.
fn foreign(q: &Queue, buf: &Buffer<f64>) -> (DeviceBuf<f64>, Arc<AtomicBool>) {
    let addr = DeviceMemory::read_ptr(buf, q.stream()).0;
    // SAFETY: `buf` is device memory of `q`'s GPU holding `buf.len()` doubles; the test keeps
    // it alive until the queue synchronized.
    let fb = unsafe { ForeignBuffer::new(q, "buf", addr, buf.len()) }.expect("a sucl buffer passes the driver's check");
    let dropped = Arc::new(AtomicBool::new(false));
    (DeviceBuf::foreign(fb, Box::new(Owner(dropped.clone()))), dropped)
}

fn mixed_kinds(rank: usize, transport: Transport) {
    let comm = sucl_runtime::init().expect("init");
    let dev = comm.cuda_device().expect("device");
    let q = dev.queue().expect("queue");
    let (left, right) = ((rank + 1) % 2, (rank + 1) % 2);
    let mut cq = CommQueue::on_stream(comm, &q, transport).expect("queue on the stream");
    assert_eq!(cq.transport(), Some(transport));

    // A buffer of another stream, foreign or not, is refused at enqueue.
    let other = dev.queue().expect("a second stream");
    let elsewhere = other.upload(&[0.0f64; 8]).unwrap();
    let (e, _) = foreign(&other, &elsewhere);
    let err = cq.enqueue_send(&e, right, 9).expect_err("a buffer of another stream was accepted");
    assert!(err.to_string().contains("belongs to another stream"), "{err}");
    assert_eq!(cq.enqueued(), 0);

    let mine = q.upload(&vec![rank as f64 + 1.0; N]).unwrap();
    let (out, out_dropped) = foreign(&q, &mine);
    let got = DeviceBuf::new(q.alloc::<f64>(N).unwrap());
    let sum = DeviceBuf::new(q.alloc::<f64>(N).unwrap());
    let into = q.alloc::<f64>(N).unwrap();
    let (fsum, _) = foreign(&q, &into);
    let own_in = DeviceBuf::new(q.upload(&vec![10.0 * (rank as f64 + 1.0); N]).unwrap());
    let same_mem = q.upload(&vec![100.0 * (rank as f64 + 1.0); N]).unwrap();
    let (a, _) = foreign(&q, &same_mem);
    // The same memory through a queue wrapping the same CUstream: the same stream.
    // SAFETY: `q`'s stream outlives this borrowed queue and its work (synchronized below).
    let alias_q = unsafe { dev.borrowed_queue(q.stream().cu_stream()) }.expect("borrowed");
    let (b, _) = foreign(&alias_q, &same_mem);

    let recv = cq.enqueue_recv(&got, left, 1).expect("sucl recv");
    cq.enqueue_send(&out, right, 1).expect("foreign send");
    cq.enqueue_all_reduce(&out, &sum, ReduceOp::Sum).expect("foreign send, sucl recv");
    cq.enqueue_all_reduce(&own_in, &fsum, ReduceOp::Sum).expect("sucl send, foreign recv");
    cq.enqueue_all_reduce(&a, &b, ReduceOp::Sum).expect("two handles of one memory: in place");
    drop(out);
    cq.start().expect("start");
    assert!(!out_dropped.load(Ordering::SeqCst), "rank {rank}: the owner was released before the stream ran the send");
    cq.wait().expect("wait");
    cq.synchronize().expect("synchronize");
    assert_eq!(recv.wait().expect("receive"), N);

    let check = |what: &str, v: Vec<f64>, want: f64| {
        assert!(v.iter().all(|&x| x == want), "rank {rank}: {what}: {} where {want} was due", v[0]);
    };
    check("ring", got.lock().to_vec().unwrap(), left as f64 + 1.0);
    check("foreign → sucl all_reduce", sum.lock().to_vec().unwrap(), 3.0);
    check("sucl → foreign all_reduce", into.to_vec().unwrap(), 30.0);
    check("in place over two handles", same_mem.to_vec().unwrap(), 300.0);
    // The queue let go of the send's owner once the stream ran it (at synchronize).
    assert!(out_dropped.load(Ordering::SeqCst), "rank {rank}: the owner of a completed operation's buffer was not released");
    drop((a, b, fsum, e));
    cq.close().expect("close");
    println!("rank {rank}: ok");
}

fn run(name: &str, body: fn(usize)) {
    match common::child_rank() {
        Some(rank) => body(rank),
        None => {
            let Some(gpus) = common::gpus_or_skip() else { return };
            assert!(gpus >= 2, "needs 2 GPUs (NCCL refuses two ranks on one), found {gpus}");
            common::all_passed(&common::launch(name, 2, &[], Duration::from_secs(180)));
        }
    }
}

#[test]
fn foreign_memory_mixes_with_sucl_buffers_over_nccl() {
    run("foreign_memory_mixes_with_sucl_buffers_over_nccl", |rank| mixed_kinds(rank, Transport::Nccl));
}

#[test]
fn foreign_memory_mixes_with_sucl_buffers_staged() {
    run("foreign_memory_mixes_with_sucl_buffers_staged", |rank| mixed_kinds(rank, Transport::Staged));
}
