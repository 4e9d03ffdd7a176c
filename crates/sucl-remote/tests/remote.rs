//! The daemon as a real process on loopback, used through the client API.

mod common;
use common::*;
use sucl_remote::wire::code;
use sucl_remote::{Arg, Remote, RemoteError};

#[test]
fn buffers_kernels_and_events_work_through_a_remote_host_device() {
    let d = Sucld::start(&["--host-devices", "2"]);
    let r = Remote::connect(&d.addr, d.options()).unwrap();
    let devs = r.devices().unwrap();
    assert_eq!(devs.iter().map(|d| d.name().to_string()).collect::<Vec<_>>(), ["host0", "host1"]);
    let q = devs[1].queue().unwrap();
    let x = q.upload(&[1f32, 2., 3., 4., 5.]).unwrap();
    let mut y = q.alloc::<f32>(5).unwrap();
    y.fill(10.0).unwrap();
    q.launch("axpy_f32", &[y.arg(), x.arg(), Arg::F64(2.0)], 0).unwrap();
    let ev = q.record().unwrap();
    let q2 = devs[1].queue().unwrap();
    q2.wait_for(&ev).unwrap();
    let mut z = q2.alloc::<f32>(5).unwrap();
    z.copy_from(&y).unwrap();
    ev.synchronize().unwrap();
    assert_eq!(z.to_vec().unwrap(), [12., 14., 16., 18., 20.]);
    let mut w = q2.alloc::<f32>(5).unwrap();
    q2.launch("stencil3_f32", &[w.arg(), z.arg()], 0).unwrap();
    q2.synchronize().unwrap();
    assert_eq!(w.to_vec().unwrap(), [12., 14., 16., 18., 20.]);
    w.write(1, &[0.5, 0.25]).unwrap();
    assert_eq!(w.read(0, 3).unwrap(), [12., 0.5, 0.25]);
    // A launch's failure is reported by the next call that waits, naming the server.
    q.launch("no_such_kernel", &[], 0).unwrap();
    match q.synchronize() {
        Err(RemoteError::Failed { server, code: c, message, .. }) => {
            assert_eq!((server.as_str(), c), (d.addr.as_str(), code::KERNEL));
            assert!(message.contains("no host kernel named `no_such_kernel`"), "{message}");
        }
        other => panic!("expected the kernel failure, got {other:?}"),
    }
    // Large transfers are split into frames.
    let big: Vec<u64> = (0..3_000_000u64).collect();
    let b = q.upload(&big).unwrap();
    assert_eq!(b.to_vec().unwrap(), big);
}
