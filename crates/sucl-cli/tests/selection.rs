//! Backend selection on real processes: heterogeneous configurations agree on a backend,
//! configuration errors name file, line and key, and a tuning table written by `sucl tune`
//! drives `--backend auto`.

mod common;
use common::*;
use std::time::Duration;

#[test]
fn ranks_with_different_allowed_backends_agree() {
    // Rank 1's configuration forbids shm: every rank must settle on tcp instead of failing.
    let port = free_port().to_string();
    let ranks: Vec<Reaped> = (0..3)
        .map(|r| {
            let mut cmd = sucl();
            cmd.args(["check", "--dtypes", "f32,i64", "--sizes", "0,5,70001"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "3")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("SUCL_TIMEOUT", "60");
            if r == 1 {
                cmd.env("SUCL_BACKENDS", "tcp");
            }
            spawn(cmd)
        })
        .collect();
    let mut summary = String::new();
    for (r, c) in ranks.into_iter().enumerate() {
        let out = finish(c, Duration::from_secs(120), &format!("rank {r}"));
        assert!(out.status.success(), "rank {r}: {}", out.stderr);
        summary += &out.stdout;
    }
    assert!(summary.contains("3 ranks, backend tcp:") && summary.contains(" 0 wrong"), "{summary}");
}

#[test]
fn config_errors_name_the_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("sucl-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("syntax.toml", "timeout = 5\n[platforms.host\n", "syntax.toml:2"),
        ("unknown-key.toml", "timeout = 5\n\n[shm]\narena = \"8M\"\n", "unknown-key.toml:4"),
        ("unknown-backend.toml", "[platforms.host]\nbackends = [\"shm\", \"pigeon\"]\npreferred = \"shm\"\n", "unknown-backend.toml:2"),
        ("threshold.toml", "[platforms.host]\nthreshold = \"64K\"\n", "threshold.toml:2"),
    ];
    for (name, text, want) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sucl")).args(["check", "--config"]).arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} should be rejected");
        assert!(err.contains(want), "{name}: expected `{want}` in: {err}");
    }
    let info =
        std::process::Command::new(env!("CARGO_BIN_EXE_sucl")).args(["info", "--config"]).arg(dir.join("syntax.toml")).output().unwrap();
    assert_eq!(info.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_named_backend_that_cannot_load_is_reported_at_init() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sucl")).args(["check"]).env("SUCL_BACKENDS", "shm,tcp,mpi").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("backend mpi cannot serve"), "{err}");
}

/// The all_reduce rules of a tuning table: (lowest byte, end byte (excluded), backend).
fn all_reduce_rules(table: &str) -> Vec<(u64, u64, String)> {
    let mut rules = vec![];
    for rule in table.split("[[tuning]]").skip(1) {
        let field =
            |k: &str| rule.lines().find_map(|l| l.strip_prefix(k).map(|v| v.trim_start_matches([' ', '=']).trim().to_string())).unwrap();
        if field("op") != "\"all_reduce\"" {
            continue;
        }
        let bytes = field("bytes");
        let (lo, hi) = bytes.trim_matches(['[', ']']).split_once(',').unwrap();
        rules.push((lo.trim().parse().unwrap(), hi.trim().parse().unwrap(), field("backend").trim_matches('"').to_string()));
    }
    rules
}

/// The backend that served each f32 all_reduce of `sucl bench all_reduce` under `config`:
/// (bytes, backend), from the runtime's debug log of every collective.
fn served_by(config: &std::path::Path) -> Vec<(u64, String)> {
    let mut cmd = sucl();
    cmd.args(["bench", "all_reduce", "--ranks", "2", "--max-bytes", "64K", "--factor", "8", "--iters", "3", "--json", "--config"])
        .arg(config)
        .env("RUST_LOG", "sucl_runtime=debug")
        .env("NO_COLOR", "1");
    let out = finish(spawn(cmd), Duration::from_secs(120), "bench with the table");
    assert!(out.status.success(), "{}", out.stderr);
    let rows: Vec<serde_json::Value> =
        out.stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 5);
    assert!(rows.iter().all(|r| r["backend"] == "auto" && r["wrong"] == 0), "{rows:?}");
    let field = |l: &str, k: &str| l.split(k).nth(1).map(|v| v.split([' ', ',']).next().unwrap().trim_matches('"').to_string());
    let mut served: Vec<(u64, String)> = out
        .stderr
        .lines()
        .filter(|l| l.contains(" collective ") && l.contains("op=\"all_reduce\"") && l.contains("dtype=\"f32\""))
        .map(|l| (field(l, "count=").unwrap().parse::<u64>().unwrap() * 4, field(l, "backend=").unwrap()))
        .collect();
    served.sort();
    served.dedup();
    served
}

#[test]
fn tune_writes_a_table_that_auto_follows() {
    let path = std::env::temp_dir().join(format!("sucl-tune-{}.toml", std::process::id()));
    let swapped = std::env::temp_dir().join(format!("sucl-tune-swapped-{}.toml", std::process::id()));
    let mut cmd = sucl();
    cmd.args([
        "tune",
        "--ranks",
        "2",
        "--ops",
        "all_reduce,all_to_all",
        "--max-bytes",
        "64K",
        "--factor",
        "8",
        "--iters",
        "5",
        "--rounds",
        "1",
        "--out",
    ])
    .arg(&path);
    let out = finish(spawn(cmd), Duration::from_secs(120), "tune");
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let table = std::fs::read_to_string(&path).unwrap();
    assert!(table.contains("[[tuning]]") && table.contains("op = \"all_to_all\""), "{table}");
    // The table covers every size, from 0 up, without gaps.
    let rules = all_reduce_rules(&table);
    assert!(!rules.is_empty() && rules[0].0 == 0 && rules.windows(2).all(|w| w[0].1 == w[1].0), "{table}");
    // Every all_reduce of a bench under the table goes where the table says; and where the
    // table says the opposite (shm and tcp swapped), there: auto follows the table, whatever
    // the backends' defaults.
    let opposite = table.replace("\"shm\"", "\"SWAP\"").replace("\"tcp\"", "\"shm\"").replace("\"SWAP\"", "\"tcp\"");
    std::fs::write(&swapped, &opposite).unwrap();
    for (file, text) in [(&path, &table), (&swapped, &opposite)] {
        let rules = all_reduce_rules(text);
        let served = served_by(file);
        assert_eq!(served.iter().map(|s| s.0).collect::<std::collections::BTreeSet<_>>().len(), 5, "{served:?}");
        for (bytes, backend) in &served {
            let rule = rules.iter().find(|r| r.0 <= *bytes && *bytes < r.1).unwrap();
            assert_eq!(&rule.2, backend, "{bytes} B went to {backend}, the table says {}:\n{text}", rule.2);
        }
    }
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&swapped).unwrap();
}

#[test]
fn info_lists_backends_config_sources_and_launch() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sucl")).arg("info").env("SUCL_TIMEOUT", "7").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for want in
        ["shm   available", "tcp   available", "timeout              = 7", "(env SUCL_TIMEOUT)", "launcher none, rank 0, world size 1"]
    {
        assert!(text.contains(want), "missing `{want}` in:\n{text}");
    }
    // The mpi line says why this process cannot use MPI: no MPI in this build, or (with it) no
    // MPI launcher around this process.
    let mpi = text.lines().find(|l| l.trim_start().starts_with("mpi ")).unwrap_or_else(|| panic!("no mpi line in:\n{text}"));
    let why = if cfg!(feature = "mpi") {
        "unavailable: the job was not started by an MPI launcher"
    } else {
        "unavailable: built without the `mpi` feature"
    };
    assert!(mpi.contains(why), "`{mpi}` should say `{why}`");
}
