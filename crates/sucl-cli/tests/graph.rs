//! `sucl graph SCENARIO --nodes N`: command generation checked through the JSON it prints,
//! and clear errors for bad scenarios.

use serde_json::Value;
use std::process::Command;

/// Writes `toml` to a temporary scenario file and runs `sucl graph` on it; (exit code, stdout,
/// stderr).
fn graph(toml: &str, nodes: usize, flag: Option<&str>) -> (i32, String, String) {
    graph_args(toml, nodes, flag.as_slice())
}

/// [`graph`] with any flags.
fn graph_args(toml: &str, nodes: usize, flags: &[&str]) -> (i32, String, String) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!("sucl-graph-{}-{}.toml", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, toml).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sucl"));
    cmd.args(["graph", path.to_str().unwrap(), "--nodes", &nodes.to_string()]);
    cmd.args(flags);
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_file(&path);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn json(toml: &str, nodes: usize) -> Value {
    let (code, out, err) = graph(toml, nodes, Some("--json"));
    assert_eq!(code, 0, "sucl graph failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn commands(v: &Value, rank: usize) -> &Vec<Value> {
    let g = &v["command_graphs"][rank];
    assert_eq!(g["rank"], rank);
    g["commands"].as_array().unwrap()
}

/// A 1D box as JSON: `[{"min":[lo,0,0],"max":[hi,1,1]}]`, or for 2D rows `[lo..hi) x [0..cols)`.
fn rows(lo: usize, hi: usize, cols: usize) -> Value {
    serde_json::json!([{ "min": [lo, 0, 0], "max": [hi, cols, 1] }])
}

const STENCIL: &str = r#"
[[buffer]]
name = "u"
extent = [16, 8]
[[buffer]]
name = "v"
extent = [16, 8]
[[task]]
name = "init"
range = [16, 8]
accessors = [{ buffer = "u", mode = "discard_write", mapper = "one_to_one" }]
[[task]]
name = "step"
range = [16, 8]
repeat = 2
swap = ["u", "v"]
accessors = [
  { buffer = "u", mode = "read", mapper = { neighborhood = [1, 1] } },
  { buffer = "v", mode = "discard_write", mapper = "one_to_one" },
]
"#;

#[test]
fn a_stencil_exchanges_one_row_with_each_neighbour() {
    let v = json(STENCIL, 4);
    assert_eq!(v["ranks"], 4);
    let names: Vec<&str> = v["tasks"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["init", "step", "step"]);
    // The second step reads v (true on step 1) and overwrites u (output on init; its anti
    // dependency on step 1, which read u, is subsumed by the true one).
    assert_eq!(v["tasks"][2]["dependencies"], serde_json::json!([{ "task": 0, "kind": "output" }, { "task": 1, "kind": "true" }]));
    // Rank 1 owns rows 4..8: it sends row 4 up and row 7 down, and receives rows 3 and 8.
    let c = commands(&v, 1);
    let kinds: Vec<&str> = c.iter().map(|c| c["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["execution", "push", "await_push", "execution", "push", "await_push", "execution"]);
    assert_eq!(c[0]["chunk"], serde_json::json!({ "min": [4, 0, 0], "max": [8, 8, 1] }));
    assert_eq!(c[1]["task"], 1);
    assert_eq!(c[1]["buffer"], 0);
    assert_eq!(c[1]["targets"], serde_json::json!([{ "rank": 0, "region": rows(4, 5, 8) }, { "rank": 2, "region": rows(7, 8, 8) }]));
    assert_eq!(c[1]["dependencies"], serde_json::json!([{ "command": 0, "kind": "true" }]));
    assert_eq!(c[2]["sources"], serde_json::json!([{ "rank": 0, "region": rows(3, 4, 8) }, { "rank": 2, "region": rows(8, 9, 8) }]));
    assert_eq!(c[3]["dependencies"], serde_json::json!([{ "command": 0, "kind": "true" }, { "command": 2, "kind": "true" }]));
    // The second step reads v (buffer 1), written by the first.
    assert_eq!(c[4]["buffer"], 1);
    assert_eq!(c[4]["dependencies"], serde_json::json!([{ "command": 3, "kind": "true" }]));
    // Edge ranks talk to one neighbour only.
    assert_eq!(commands(&v, 0)[1]["targets"], serde_json::json!([{ "rank": 1, "region": rows(3, 4, 8) }]));
    assert_eq!(commands(&v, 3)[2]["sources"], serde_json::json!([{ "rank": 2, "region": rows(11, 12, 8) }]));
}

const NBODY: &str = r#"
[[buffer]]
name = "pos"
extent = [12, 3]
[[buffer]]
name = "vel"
extent = [12, 3]
host_data = true
[[task]]
name = "place"
range = [12]
accessors = [{ buffer = "pos", mode = "discard_write", mapper = { slice = 1 } }]
[[task]]
name = "forces"
range = [12]
repeat = 2
accessors = [
  { buffer = "pos", mode = "read", mapper = "all" },
  { buffer = "vel", mode = "read_write", mapper = { slice = 1 } },
]
[[task]]
name = "move"
range = [12]
accessors = [
  { buffer = "pos", mode = "read_write", mapper = { slice = 1 } },
  { buffer = "vel", mode = "read", mapper = { slice = 1 } },
]
[[task]]
name = "forces again"
range = [12]
accessors = [
  { buffer = "pos", mode = "read", mapper = "all" },
  { buffer = "vel", mode = "read_write", mapper = { slice = 1 } },
]
"#;

#[test]
fn nbody_all_gathers_positions_once_per_version() {
    // With discovery, positions (written by `slice(1)` over a 1D split: disjoint slabs) are
    // all-gathered by one collective command per version, and nothing is pushed.
    let with = json(NBODY, 3);
    for r in 0..3 {
        let c = commands(&with, r);
        assert!(!c.iter().any(|c| c["kind"] == "push" || c["kind"] == "await_push"), "rank {r}: no push with discovery");
        let colls: Vec<&Value> = c.iter().filter(|c| c["kind"] == "collective").collect();
        assert_eq!(colls.iter().map(|c| c["task"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 4], "rank {r}");
        for c in &colls {
            assert_eq!((&c["collective"], &c["buffer"]), (&Value::from("all_gather"), &Value::from(0)));
            for (p, part) in c["parts"].as_array().unwrap().iter().enumerate() {
                assert_eq!(part["region"], rows(4 * p, 4 * p + 4, 3), "rank {r}: part of rank {p}");
            }
        }
    }
    // Without it, the same versions move as pushes and await-pushes.
    let (code, out, err) = graph_args(NBODY, 3, &["--json", "--no-cpd"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    for r in 0..3 {
        let c = commands(&v, r);
        let pushes: Vec<&Value> = c.iter().filter(|c| c["kind"] == "push").collect();
        let awaits: Vec<&Value> = c.iter().filter(|c| c["kind"] == "await_push").collect();
        // Task 1 (first forces) and task 4 (after move) move positions; task 2 reads the same
        // version again and moves nothing; velocities (host data, slice) never move.
        assert_eq!(pushes.iter().map(|c| c["task"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 4], "rank {r}");
        assert_eq!(awaits.iter().map(|c| c["task"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 4], "rank {r}");
        let others: Vec<usize> = (0..3).filter(|&o| o != r).collect();
        for p in &pushes {
            assert_eq!(p["buffer"], 0);
            let targets: Vec<usize> = p["targets"].as_array().unwrap().iter().map(|t| t["rank"].as_u64().unwrap() as usize).collect();
            assert_eq!(targets, others, "rank {r} pushes its slab to every other rank");
            for t in p["targets"].as_array().unwrap() {
                assert_eq!(t["region"], rows(4 * r, 4 * r + 4, 3));
            }
        }
        for a in &awaits {
            let sources: Vec<(u64, Value)> =
                a["sources"].as_array().unwrap().iter().map(|s| (s["rank"].as_u64().unwrap(), s["region"].clone())).collect();
            let want: Vec<(u64, Value)> = others.iter().map(|&o| (o as u64, rows(4 * o, 4 * o + 4, 3))).collect();
            assert_eq!(sources, want, "rank {r} receives every other slab");
        }
    }
}

#[test]
fn text_and_dot_show_every_rank() {
    let (code, out, err) = graph(STENCIL, 3, None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("rank 2:") && out.contains("T1 Kernel 'step'"), "{out}");
    assert!(out.contains("Push T1 B0 [5..6, 0..8] ∪ [9..10, 0..8] -> r0: [5..6, 0..8] -> r2: [9..10, 0..8] after C0(True)"), "{out}");
    let (code, out, err) = graph(STENCIL, 2, Some("--dot"));
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("digraph") && out.contains("cluster_rank1") && out.contains("t0 -> t1"), "{out}");
}

#[test]
fn bad_scenarios_are_clear_errors() {
    let cases = [
        ("[[task]]\nrange = [4]\naccessors = [{ buffer = \"nope\", mode = \"read\", mapper = \"all\" }]", "task 0 ('task0'): accessor 0: unknown buffer 'nope'"),
        ("[[buffer]]\nname = \"a\"\nextent = [4]\n[[task]]\nrange = [4]\naccessors = [{ buffer = \"a\", mode = \"peek\", mapper = \"all\" }]", "unknown mode \"peek\""),
        ("[[buffer]]\nname = \"a\"\nextent = [4]\nsize = 3", "unknown field `size`"),
        ("[[buffer]]\nname = \"a\"\nextent = [4, 4, 4, 4]", "buffer 'a': extent has 4 dimensions"),
        (
            "[[buffer]]\nname = \"a\"\nextent = [8]\n[[task]]\nname = \"clash\"\nrange = [8]\naccessors = [{ buffer = \"a\", mode = \"discard_write\", mapper = \"all\" }]",
            "task 0 ('clash'): ranks (0, 1) both write buffer 0",
        ),
        ("[[task]]\nkind = \"fence\"", "a fence names a buffer"),
        ("[[task]]\nkind = \"dance\"\nrange = [1]", "unknown kind \"dance\""),
    ];
    for (toml, want) in cases {
        let (code, out, err) = graph(toml, 2, Some("--json"));
        assert_eq!(code, 2, "{toml}: want a failure, got {out}");
        assert!(err.contains(want), "{toml}: want {want:?} in: {err}");
    }
    let (code, _, err) = graph(STENCIL, 0, None);
    assert_eq!(code, 2);
    assert!(err.contains("--nodes must be at least 1"), "{err}");
}

const ALL_GATHER: &str = r#"
[[buffer]]
name = "a"
extent = [12]
[[buffer]]
name = "b"
extent = [12]
[[task]]
name = "init"
range = [12]
accessors = [{ buffer = "a", mode = "discard_write", mapper = "one_to_one" }]
[[task]]
name = "use"
range = [12]
accessors = [
  { buffer = "a", mode = "read", mapper = "all" },
  { buffer = "b", mode = "discard_write", mapper = "one_to_one" },
]
"#;

#[test]
fn collective_discovery_shows_an_all_gather_and_no_cpd_turns_it_off() {
    let with = json(ALL_GATHER, 3);
    assert_eq!(with["tasks"][1]["forwards"][0]["producer"], 0, "the task graph names the forward");
    for r in 0..3 {
        let c: Vec<&Value> = commands(&with, r).iter().filter(|c| c["task"] == 1 && c["buffer"] == 0).collect();
        assert_eq!(c.len(), 1, "rank {r}: one command moves a for task 1");
        assert_eq!(
            (&c[0]["kind"], &c[0]["collective"], &c[0]["root"]),
            (&Value::from("collective"), &Value::from("all_gather"), &Value::Null)
        );
        let parts = c[0]["parts"].as_array().unwrap();
        assert_eq!(parts.len(), 3);
        for (p, part) in parts.iter().enumerate() {
            assert_eq!(part["region"], rows(4 * p, 4 * p + 4, 1), "rank {r}: part of rank {p}");
        }
    }
    let (code, out, err) = graph_args(ALL_GATHER, 3, &["--json", "--no-cpd"]);
    assert_eq!(code, 0, "{err}");
    let without: Value = serde_json::from_str(&out).unwrap();
    for r in 0..3 {
        let kinds: Vec<&Value> = commands(&without, r).iter().filter(|c| c["task"] == 1 && c["buffer"] == 0).map(|c| &c["kind"]).collect();
        assert_eq!(kinds, [&Value::from("push"), &Value::from("await_push")], "rank {r} without discovery");
    }
    let (code, text, _) = graph_args(ALL_GATHER, 3, &[]);
    assert_eq!(code, 0);
    assert!(text.contains("Collective T1 B0") && text.contains("AllGather parts [r0: [0..4]; r1: [4..8]; r2: [8..12]]"), "{text}");
}
