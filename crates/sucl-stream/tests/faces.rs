//! Faces on host ranks: both variants agree with the host reference (relative difference
//! < 1e-15) on a grid where ranks have faces, edges and corners to exchange.

mod common;

use std::time::Duration;
use sucl_stream::faces::{run_baseline, run_triggered, Grid, Input};

#[test]
fn faces_baseline_and_triggered_match_the_host_reference() {
    let name = "faces_baseline_and_triggered_match_the_host_reference";
    let Some(rank) = common::child_rank() else {
        common::all_passed(&common::launch(name, 8, &[], Duration::from_secs(120)));
        return;
    };
    let comm = sucl_runtime::init().unwrap();
    // 2×2×2 ranks: every rank has 3 faces, 3 edges and a corner to exchange; elements of
    // unequal counts per axis catch a swapped axis.
    let inp = Input::parse("2 2 2 2 3 1 3 1 1 3").unwrap();
    let g = Grid::new(inp, rank, comm.size()).unwrap();
    assert_eq!(g.peers.iter().filter(|&&p| p != sucl_stream::PROC_NULL).count(), 7);
    let base = run_baseline(&comm, &g, 1).unwrap();
    assert!(base.max_diff < 1e-15, "rank {rank}: baseline differs from the reference by {:e}", base.max_diff);
    let (st, comm) = run_triggered(comm, &g, 1).unwrap();
    assert!(st.max_diff < 1e-15, "rank {rank}: triggered differs from the reference by {:e}", st.max_diff);
    comm.barrier().unwrap();
}

#[test]
fn faces_input_is_checked() {
    if common::child_rank().is_some() {
        return;
    }
    assert!(Input::parse("2 2 2 1 1 1 4 1 1").unwrap_err().to_string().contains("10 numbers"));
    assert!(Input::parse("2 2 2 1 1 x 4 1 1 1").unwrap_err().to_string().contains("`x`"));
    assert!(Input::parse("2 2 2 1 1 1 1 1 1 1").unwrap_err().to_string().contains("n ≥ 2"));
    let inp = Input::parse("2 2 2 1 1 1 4 1 1 1").unwrap();
    assert!(Grid::new(inp, 0, 4).err().expect("8 ranks needed").to_string().contains("lx·ly·lz = 8"));
}
