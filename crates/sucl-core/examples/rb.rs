fn main() {
    use sucl_core::dtype::reduce_bytes;
    let n = 16384usize;
    let mut a = vec![1u8; n];
    let b = vec![2u8; n];
    for dt in [sucl_core::DType::F32, sucl_core::DType::F64, sucl_core::DType::I32] {
        let t = std::time::Instant::now();
        for _ in 0..10000 { reduce_bytes(&mut a, &b, dt, sucl_core::ReduceOp::Sum); }
        println!("{dt}: {:.2} GB/s", (n * 10000) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let t = std::time::Instant::now();
    for _ in 0..10000 { a.copy_from_slice(&b); }
    println!("memcpy: {:.2} GB/s", (n * 10000) as f64 / t.elapsed().as_secs_f64() / 1e9);
}
