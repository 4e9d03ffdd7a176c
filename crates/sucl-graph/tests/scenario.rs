//! Scenario files express every built-in range mapper: each one written in the file form and
//! read back maps every chunk alike, a program written in a file gets exactly the command
//! graphs of the same program built through the API, and the shipped scenarios simulate.

use sucl_graph::scenario::{mapper_to_toml, parse_mapper, Scenario};
use sucl_graph::{dump, AccessMode::*, Chunk, GridBox, MapperMeta, RangeMapper, Region, Scheduler, SplitHint, TaskSpec};

/// Every built-in mapper (one or more of each variant). The match below does not compile once
/// a variant is added, until the new one is listed here too.
fn built_ins() -> Vec<RangeMapper> {
    use RangeMapper::*;
    let all = vec![
        OneToOne,
        All,
        Reverse,
        EvenSplit(1),
        EvenSplit(3),
        Neighborhood([1, 2, 0]),
        NeighborhoodAxes([2, 1, 0]),
        Slice(0),
        Slice(1),
        Transposed(0, 1),
        Fixed(GridBox::new([1, 2, 0], [5, 7, 1])),
    ];
    for m in &all {
        match m {
            OneToOne | All | Reverse | EvenSplit(_) | Neighborhood(_) | NeighborhoodAxes(_) | Slice(_) | Transposed(..) | Fixed(_) => {}
            Custom(..) => unreachable!("closures are not built in"),
        }
    }
    all
}

#[test]
fn every_built_in_mapper_has_a_file_form_that_reads_back_alike() {
    let chunks = [
        Chunk { offset: [0, 0, 0], range: [3, 9, 1], global: [9, 9, 1] },
        Chunk { offset: [3, 2, 0], range: [3, 4, 1], global: [9, 9, 1] },
        Chunk { offset: [6, 0, 0], range: [3, 9, 1], global: [9, 9, 1] },
    ];
    for m in built_ins() {
        let text = mapper_to_toml(&m).unwrap_or_else(|| panic!("{m:?} has no file form"));
        let back = parse_mapper(&text).unwrap_or_else(|e| panic!("{m:?} written as {text}: {e}"));
        assert!(back.same_as(&m), "{m:?} written as {text} reads back as {back:?}");
        for c in &chunks {
            assert_eq!(back.map(c, [9, 9, 1]), m.map(c, [9, 9, 1]), "{text}");
        }
    }
    let closure = RangeMapper::custom(|c: &Chunk, _| Region::from_box(c.as_box()), MapperMeta::UNKNOWN);
    assert_eq!(mapper_to_toml(&closure), None, "a closure has no file form");
    assert!(parse_mapper("\"backwards\"").unwrap_err().to_string().contains("unknown mapper"));
    assert!(parse_mapper("{ even_split = 0 }").unwrap_err().to_string().contains("at least 1"));
}

/// For each built-in mapper: a producer writes a 9×9 buffer one to one (on a 2D split), a
/// consumer reads it through the mapper and a second accessor, written once with the API and
/// once as a scenario; both give the same task graph and command graphs on 1–4 ranks.
#[test]
fn a_program_in_a_file_gets_the_command_graphs_of_the_same_program_built_with_the_api() {
    for m in built_ins() {
        let text = mapper_to_toml(&m).unwrap();
        let file = format!(
            r#"
[[buffer]]
name = "a"
extent = [9, 9]
[[buffer]]
name = "b"
extent = [9, 9]
[[task]]
name = "init"
range = [9, 9]
split = "2d"
accessors = [{{ buffer = "a", mode = "discard_write", mapper = "one_to_one" }}]
[[task]]
name = "use"
range = [9, 9]
accessors = [
  {{ buffer = "a", mode = "read", mapper = {text} }},
  {{ buffer = "a", mode = "read", mapper = {{ fixed = {{ min = [0, 0], max = [1, 9] }} }} }},
  {{ buffer = "b", mode = "discard_write", mapper = "one_to_one" }},
]
"#
        );
        let scenario = Scenario::parse(&file).unwrap_or_else(|e| panic!("{text}: {e}"));
        for ranks in 1..=4 {
            let from_file = scenario.simulate(ranks).unwrap();
            let mut s = Scheduler::simulate(ranks, 0).unwrap();
            let (a, b) = (s.create_buffer(&[9, 9], false).unwrap(), s.create_buffer(&[9, 9], false).unwrap());
            s.submit(TaskSpec::parallel_for("init", &[9, 9]).split(SplitHint::Split2D).access(a, RangeMapper::OneToOne, DiscardWrite))
                .unwrap();
            s.submit(
                TaskSpec::parallel_for("use", &[9, 9])
                    .access(a, m.clone(), Read)
                    .access(a, RangeMapper::Fixed(GridBox::new([0, 0, 0], [1, 9, 1])), Read)
                    .access(b, RangeMapper::OneToOne, DiscardWrite),
            )
            .unwrap();
            assert_eq!(dump::to_value(&from_file), dump::to_value(&s), "{text} on {ranks} ranks");
        }
    }
}

#[test]
fn the_shipped_scenarios_simulate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let scenario = Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for ranks in 1..=5 {
            scenario.simulate(ranks).unwrap_or_else(|e| panic!("{} on {ranks} ranks: {e}", path.display()));
        }
        seen += 1;
    }
    assert!(seen >= 3, "the scenarios are found: {seen}");
}

/// The shipped matrix-product scenario does what its comment says: A moves by one all-gather
/// (its two accessors merged), nothing point to point, and the even_split save moves nothing.
#[test]
fn the_matmul_scenario_moves_a_by_one_all_gather() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/matmul.toml");
    let s = Scenario::parse(&std::fs::read_to_string(path).unwrap()).unwrap().simulate(4).unwrap();
    for g in s.rank_graphs() {
        let moves: Vec<_> = g.commands.iter().filter(|c| c.buffer.is_some()).collect();
        assert_eq!(moves.len(), 1, "rank {}: {moves:?}", g.rank);
        let coll = moves[0].collective.as_ref().expect("a collective");
        assert_eq!((moves[0].task.0, coll.op), (1, sucl_graph::CollectiveOp::AllGather), "rank {}", g.rank);
    }
}
