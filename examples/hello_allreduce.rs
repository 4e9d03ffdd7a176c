//! Every rank contributes its rank number; all_reduce sums them everywhere.
//!
//! Run with: `cargo run --release -p sucl-cli -- run -n 4 -- target/release/examples/hello_allreduce`
//! (build it first with `cargo build --release --examples`).

fn main() -> sucl::Result<()> {
    let comm = sucl::init()?;
    let (rank, size) = (comm.rank(), comm.size());
    let mine = vec![rank as f64; 8];
    let mut sum = vec![0.0; 8];
    comm.all_reduce(&mine, &mut sum, sucl::ReduceOp::Sum)?;
    let expected = (size * (size - 1) / 2) as f64;
    assert!(sum.iter().all(|&x| x == expected), "rank {rank}: got {sum:?}");

    // Halves of the world: even and odd ranks, each with its own sub-communicator.
    let half = comm.split(Some((rank % 2) as u32), rank as i64)?.expect("every rank has a color");
    let mut v = [1u32];
    half.all_reduce_in_place(&mut v, sucl::ReduceOp::Sum)?;
    println!("rank {rank}/{size} via {}: sum {} (my half has {} ranks)", comm.backend_name(), sum[0], v[0]);
    Ok(())
}
