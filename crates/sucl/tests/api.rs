//! The API in a world of one (no launcher): argument validation happens before any data moves,
//! and every call works on a single rank.

use sucl::{Error, ReduceOp};

fn solo(job: &str) -> sucl::LaunchEnv {
    sucl::LaunchEnv {
        launcher: sucl::Launcher::None,
        rank: 0,
        size: 1,
        local_rank: 0,
        store_addr: None,
        rank0_hosts_store: false,
        job_id: job.into(),
        job_secret: sucl::JobSecret::derived(job),
        agent_store: None,
    }
}

fn world() -> sucl::Communicator {
    sucl::init_with(solo("api-test"), sucl::Config::default()).expect("a world of one")
}

fn invalid(e: Error, arg: &str) {
    match e {
        Error::InvalidArgument { arg: a, .. } => assert_eq!(a, arg, "wrong argument named"),
        other => panic!("expected InvalidArgument({arg}), got {other}"),
    }
}

#[test]
fn world_of_one_runs_everything() {
    let c = world();
    assert_eq!((c.rank(), c.size()), (0, 1));
    let mut v = [1.5f32, 2.5];
    c.all_reduce_in_place(&mut v, ReduceOp::Avg).unwrap();
    assert_eq!(v, [1.5, 2.5]);
    let mut g = [0i64; 3];
    c.all_gather(&[1i64, 2, 3], &mut g).unwrap();
    assert_eq!(g, [1, 2, 3]);
    let mut out = [0u8; 4];
    c.all_to_all(&[1u8, 2, 3, 4], &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4]);
    c.barrier().unwrap();
    let mut back = [0u32; 2];
    let st = c.sendrecv(&[7u32, 8], 0, &mut back, 0, 3).unwrap();
    assert_eq!((st.count, back), (2, [7, 8]));
    let sub = c.split(Some(5), 0).unwrap().unwrap();
    assert_eq!(sub.size(), 1);
    assert!(c.split(None, 0).unwrap().is_none());
}

#[test]
fn bad_arguments_are_errors_before_anything_moves() {
    let c = world();
    invalid(c.broadcast(&mut [0f32; 4], 1).unwrap_err(), "root");
    invalid(c.reduce(&[0f32; 4], &mut [0f32; 4], ReduceOp::Sum, 3).unwrap_err(), "root");
    invalid(c.send(&[1u8], 2, 0).unwrap_err(), "peer");
    invalid(c.recv(&mut [1u8], 9, 0).unwrap_err(), "peer");
    invalid(c.send(&[1u8], 0, u32::MAX).unwrap_err(), "tag");
    invalid(c.all_reduce(&[0f64; 4], &mut [0f64; 3], ReduceOp::Max).unwrap_err(), "recv");
    invalid(c.all_gather(&[0i32; 2], &mut [0i32; 3]).unwrap_err(), "recv");
    invalid(c.gather(&[0i32; 2], &mut [0i32; 1], 0).unwrap_err(), "recv");
    invalid(c.scatter(&[0i32; 3], &mut [0i32; 2], 0).unwrap_err(), "send");
    invalid(c.reduce_scatter(&[0i32; 3], &mut [0i32; 2], ReduceOp::Sum).unwrap_err(), "send");
    invalid(c.all_to_all(&[0i32; 3], &mut [0i32; 4]).unwrap_err(), "recv");
    // The communicator is still usable after rejected calls.
    let mut v = [3u64];
    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [3]);
}

#[test]
fn message_longer_than_the_receive_buffer_is_an_error() {
    let c = world();
    let mut small = [0u32; 2];
    let err = c
        .nonblocking(|s| {
            s.isend(&[1u32, 2, 3], 0, 1)?;
            s.irecv(&mut small, 0, 1)?.wait()
        })
        .unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}

#[test]
fn nonblocking_requests_complete_in_order_with_test_and_wait() {
    let c = world();
    let a = [1i32; 3];
    let b = [2i32; 3];
    let (mut x, mut y) = ([0i32; 3], [0i32; 3]);
    c.nonblocking(|s| {
        let mut rx = s.irecv(&mut x, 0, 4)?;
        let ry = s.irecv(&mut y, 0, 4)?;
        s.isend(&a, 0, 4)?;
        s.isend(&b, 0, 4)?;
        assert_eq!(ry.wait()?, 3);
        assert_eq!(rx.test()?, Some(3));
        Ok(())
    })
    .unwrap();
    assert_eq!((x, y), ([1; 3], [2; 3]));
}

#[test]
fn backend_for_follows_the_threshold() {
    let env = solo("api-threshold");
    let cfg = sucl::Config::from_lookup(&|k| (k == "SUCL_THRESHOLD").then(|| "1024".to_string())).unwrap();
    let c = sucl::init_with(env, cfg).unwrap();
    assert_eq!(c.backends(), vec!["shm", "tcp"]);
    assert_eq!(c.backend_for(sucl::CollOp::AllReduce, 100), "tcp");
    assert_eq!(c.backend_for(sucl::CollOp::AllReduce, 4096), "shm");
    assert_eq!(c.backend_label(), "auto");
    c.pin_backend(Some("tcp")).unwrap();
    assert_eq!(c.backend_for(sucl::CollOp::AllReduce, 4096), "tcp");
    assert!(c.pin_backend(Some("mpi")).is_err());
    let mut v = [2.0f64];
    c.all_reduce_in_place(&mut v, ReduceOp::Prod).unwrap();
    assert_eq!(v, [2.0]);
}

#[test]
fn bad_environment_is_a_config_error() {
    let e = sucl::Config::from_lookup(&|k| (k == "SUCL_TIMEOUT").then(|| "soon".to_string())).unwrap_err();
    assert!(matches!(e, Error::Config(_)) && e.to_string().contains("SUCL_TIMEOUT"), "{e}");
}

#[test]
fn one_call_takes_slices_vectors_and_arrays() {
    let c = world();
    let send: Vec<i32> = vec![4, 5, 6];
    let mut recv = [0i32; 3];
    c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    assert_eq!(recv, [4, 5, 6]);
    let mut out = vec![0i32; 3];
    c.all_reduce(&recv[..], &mut out[..], ReduceOp::Max).unwrap();
    assert_eq!(out, send);
    // Non-root ranks may pass an empty receive buffer; on one rank root is everyone.
    let mut r = vec![0u32; 2];
    c.reduce(&[1u32, 2], &mut r, ReduceOp::Prod, 0).unwrap();
    assert_eq!(r, [1, 2]);
}

#[test]
fn device_backends_are_named_and_pinned_before_any_device_call() {
    let c = world();
    // Nothing on the device side until a call on device buffers or attach_device.
    assert!(c.device_backends().is_empty());
    c.pin_backend(Some("staged")).unwrap();
    assert_eq!(c.device_backend_for(sucl::CollOp::AllReduce, 1 << 20), "staged");
    c.pin_backend(None).unwrap();
    match c.pin_backend(Some("infiniband")).unwrap_err() {
        Error::BackendUnavailable { backend, .. } => assert_eq!(backend, "infiniband"),
        other => panic!("expected BackendUnavailable, got {other}"),
    }
    // Host calls are unaffected by a device pin.
    c.pin_backend(Some("nccl")).unwrap();
    let mut v = [2u8];
    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [2]);
    match (sucl::cuda::probe(), c.cuda_device()) {
        (Ok(_), Ok(d)) => eprintln!("GPU present: {}", d.name()),
        (Err(why), Err(e)) => {
            assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here: {why}");
            assert!(e.to_string().contains(&why), "{e}");
        }
        (p, d) => panic!("probe and cuda_device disagree: {p:?} / {:?}", d.err()),
    }
}

fn gpu_required() -> bool {
    std::env::var("SUCL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Marks a run without a GPU in the test list: passes only where the GPU part of
/// `device_backends_are_named_and_pinned_before_any_device_call` was skipped (no GPU, and
/// SUCL_REQUIRE_GPU not set).
#[test]
fn gpu_tests_skipped_no_gpu() {
    match sucl::cuda::probe() {
        Ok(n) => panic!("{n} GPUs are present, so the GPU part ran: this test passes only where it was skipped"),
        Err(why) => assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here: {why}"),
    }
}

#[test]
fn oob_all_gather_returns_every_ranks_bytes_through_the_store() {
    let c = world();
    assert_eq!(c.oob_all_gather("totals", b"\x01\x02").unwrap(), vec![vec![1u8, 2]]);
    assert_eq!(c.oob_all_gather("empty", b"").unwrap(), vec![Vec::<u8>::new()]);
}
