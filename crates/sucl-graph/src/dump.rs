//! Dumps of the task graph and the command graphs: JSON (`sucl graph --json`,
//! `SUCL_GRAPH_DUMP=dir`), Graphviz dot (`--dot`) and text (the default of `sucl graph`).
//!
//! The JSON is one object:
//!
//! ```text
//! { "ranks": N,
//!   "buffers":  [ { "id", "extent": [x,y,z], "dims", "host_initialized" } ],
//!   "tasks":    [ { "id", "name", "kind", "target", "range", "granularity",
//!                   "accessors": [ { "buffer", "mode", "mapper" } ],
//!                   "dependencies": [ { "task", "kind" } ] } ],
//!   "warnings": [ { "task", "buffer", "region" } ],
//!   "command_graphs": [ { "rank", "commands": [
//!       { "id", "kind", "task", "buffer"?, "region"?, "targets"? | "sources"?, "chunk"?,
//!         "accesses"?, "collective"?, "root"?, "producer"?, "consumer"?, "parts"?, "sends"?,
//!         "recvs"?,
//!         "dependencies": [ { "command", "kind" } ] } ] } ] }
//! ```
//!
//! A region is a list of disjoint boxes `{ "min": [x,y,z], "max": [x,y,z] }` (half-open; unused
//! dimensions 0..1). `kind` of a command: execution, push, await_push, horizon, epoch. A push
//! lists its `targets`, an await-push its `sources`, each `{ "rank", "region" }`. An execution
//! has its `chunk` (a box) and `accesses` (`{ "buffer", "mode", "region" }`). A `collective`
//! command (collective pattern discovery) has `collective` (gather, all_gather, broadcast,
//! scatter, all_to_all), `root` (a rank or null), `producer` and `consumer` (what the command
//! itself carries: each side's `target`, `range`, `granularity` and `mapper`), and, expanded
//! from those when the dump is made, `parts` (per rank the cells it contributes — gather,
//! all-gather, all-to-all — or receives — broadcast, scatter) and this rank's `sends` and
//! `recvs` per peer; its `region` is what this rank receives. A task lists its `forwards`
//! (`{ "buffer", "producer", "region" }`). Dependency kinds:
//! true, anti, output, order. `tasks` holds every task made (also those a horizon dropped) when
//! the scheduler records them (simulations, `SUCL_GRAPH_DUMP`); `command_graphs` one entry per
//! generated rank (every rank in a simulation, the own rank in a running program).

use crate::command::{Command, CommandKind, Scheduler};
use crate::task::{SplitHint, Target, Task};
use serde_json::{json, Value};
use std::fmt::Write;

fn target_name(t: Target) -> &'static str {
    match t {
        Target::Distributed(SplitHint::Split1D) => "split_1d",
        Target::Distributed(SplitHint::Split2D) => "split_2d",
        Target::Master => "master",
        Target::Collective => "collective",
    }
}

fn task_json(t: &Task) -> Value {
    json!({
        "id": t.id,
        "name": t.name,
        "kind": t.kind,
        "target": target_name(t.target),
        "range": t.range,
        "granularity": t.granularity,
        "accessors": t.accessors.iter().map(|a| json!({
            "buffer": a.buffer, "mode": a.mode, "mapper": format!("{:?}", a.mapper),
        })).collect::<Vec<_>>(),
        "dependencies": t.deps,
        "forwards": t.forwards.iter().map(|f| json!({
            "buffer": f.buffer, "producer": f.producer, "region": f.region,
        })).collect::<Vec<_>>(),
    })
}

fn command_json(c: &Command, rank: usize) -> Value {
    let mut v = json!({ "id": c.id, "kind": c.kind, "task": c.task });
    let o = v.as_object_mut().expect("an object");
    if let Some(b) = c.buffer {
        o.insert("buffer".into(), json!(b));
        o.insert("region".into(), json!(c.region));
    }
    match c.kind {
        CommandKind::Push => {
            o.insert("targets".into(), json!(c.peers));
        }
        CommandKind::AwaitPush => {
            o.insert("sources".into(), json!(c.peers));
        }
        CommandKind::Collective => {
            if let Some(coll) = &c.collective {
                o.insert("collective".into(), json!(coll.op));
                o.insert("root".into(), json!(coll.root));
                o.insert("producer".into(), json!(coll.producer));
                o.insert("consumer".into(), json!(coll.consumer));
                // Expanded per rank here, at dump time: the command itself carries none.
                o.insert("parts".into(), json!(coll.parts()));
                o.insert("sends".into(), json!(coll.sends(rank)));
                o.insert("recvs".into(), json!(coll.recvs(rank)));
            }
        }
        _ => {}
    }
    if let Some(chunk) = c.chunk {
        o.insert("chunk".into(), json!(chunk));
        o.insert("accesses".into(), json!(c.accesses));
    }
    o.insert("dependencies".into(), json!(c.dependencies));
    v
}

/// The task graph and command graphs of `s` as a JSON value (the format above).
pub fn to_value(s: &Scheduler) -> Value {
    let g = s.graph();
    json!({
        "ranks": g.ranks(),
        "buffers": g.buffers().collect::<Vec<_>>(),
        "tasks": s.recorded_tasks().iter().map(task_json).collect::<Vec<_>>(),
        "warnings": g.warnings(),
        "command_graphs": s.rank_graphs().iter().map(|rg| json!({
            "rank": rg.rank,
            "commands": rg.commands.iter().map(|c| command_json(c, rg.rank)).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// [`to_value`], pretty-printed.
pub fn to_json(s: &Scheduler) -> String {
    serde_json::to_string_pretty(&to_value(s)).expect("a JSON value prints")
}

impl Scheduler {
    /// The task graph and the generated command graphs as JSON (the format of
    /// `sucl graph --json`, described above). Defined here, not in [`crate::command`], so
    /// that the dump depends on the command graph and never the other way round.
    pub fn to_json(&self) -> String {
        to_json(self)
    }
}

fn boxes(r: &crate::geometry::Region, dims: usize) -> String {
    if r.is_empty() {
        return "{}".into();
    }
    let b: Vec<String> = r.boxes().iter().map(|b| gbox(b, dims)).collect();
    b.join(" ∪ ")
}

fn gbox(b: &crate::geometry::GridBox, dims: usize) -> String {
    let parts: Vec<String> = (0..dims.max(1)).map(|d| format!("{}..{}", b.min[d], b.max[d])).collect();
    format!("[{}]", parts.join(", "))
}

fn dims_of(s: &Scheduler, c: &Command) -> usize {
    c.buffer.and_then(|b| s.graph().buffer(b)).map_or(3, |b| b.dims)
}

fn task_dims(t: &Task) -> usize {
    (1..=3).rev().find(|&d| t.range[d - 1] > 1).unwrap_or(1)
}

fn command_line(s: &Scheduler, c: &Command) -> String {
    let mut line = format!("C{} {:?} T{}", c.id.0, c.kind, c.task.0);
    let dims = dims_of(s, c);
    if let Some(b) = c.buffer {
        let _ = write!(line, " B{} {}", b.0, boxes(&c.region, dims));
    }
    if let Some(coll) = &c.collective {
        let _ = write!(line, " {:?}", coll.op);
        if let Some(root) = coll.root {
            let _ = write!(line, " root r{root}");
        }
        let parts: Vec<String> =
            coll.parts().iter().filter(|p| !p.region.is_empty()).map(|p| format!("r{}: {}", p.rank, boxes(&p.region, dims))).collect();
        let _ = write!(line, " parts [{}]", parts.join("; "));
    }
    let arrow = if c.kind == CommandKind::Push { "->" } else { "<-" };
    for p in &c.peers {
        let _ = write!(line, " {arrow} r{}: {}", p.rank, boxes(&p.region, dims));
    }
    if let Some(chunk) = c.chunk {
        let _ = write!(line, " chunk {}", gbox(&chunk, 3));
    }
    if !c.dependencies.is_empty() {
        let deps: Vec<String> = c.dependencies.iter().map(|d| format!("C{}({:?})", d.command.0, d.kind)).collect();
        let _ = write!(line, " after {}", deps.join(" "));
    }
    line
}

/// The graphs as text: the tasks, then every rank's commands, one per line.
pub fn to_text(s: &Scheduler) -> String {
    let mut out = String::new();
    let g = s.graph();
    let _ = writeln!(out, "buffers:");
    for b in g.buffers() {
        let _ = writeln!(out, "  B{} extent {:?}{}", b.id.0, &b.extent[..b.dims], if b.host_initialized { " (host data)" } else { "" });
    }
    let _ = writeln!(out, "tasks:");
    for t in s.recorded_tasks() {
        let acc: Vec<String> = t.accessors.iter().map(|a| format!("B{} {:?} {:?}", a.buffer.0, a.mode, a.mapper)).collect();
        let deps: Vec<String> = t.deps.iter().map(|d| format!("T{}({:?})", d.task.0, d.kind)).collect();
        let _ = writeln!(
            out,
            "  T{} {:?} '{}' {} range {:?}{}{}",
            t.id.0,
            t.kind,
            t.name,
            target_name(t.target),
            &t.range[..task_dims(t)],
            if acc.is_empty() { String::new() } else { format!(" [{}]", acc.join(", ")) },
            if deps.is_empty() { String::new() } else { format!(" after {}", deps.join(" ")) },
        );
    }
    for w in g.warnings() {
        let _ = writeln!(out, "warning: T{} reads B{} {} that nothing wrote", w.task.0, w.buffer.0, boxes(&w.region, 3));
    }
    for rg in s.rank_graphs() {
        let _ = writeln!(out, "rank {}:", rg.rank);
        for c in &rg.commands {
            let _ = writeln!(out, "  {}", command_line(s, c));
        }
    }
    out
}

/// The graphs as Graphviz dot: a cluster for the task graph and one per rank.
pub fn to_dot(s: &Scheduler) -> String {
    let mut out = String::from("digraph sucl_graph {\n  compound=true; node [shape=box, fontname=monospace];\n");
    let _ = writeln!(out, "  subgraph cluster_tasks {{ label=\"task graph\";");
    for t in s.recorded_tasks() {
        let _ = writeln!(
            out,
            "    t{} [label=\"T{} {:?} '{}'\\n{}\"];",
            t.id.0,
            t.id.0,
            t.kind,
            t.name.replace('"', "'"),
            target_name(t.target)
        );
        for d in &t.deps {
            let _ = writeln!(out, "    t{} -> t{} [label=\"{:?}\"];", d.task.0, t.id.0, d.kind);
        }
    }
    let _ = writeln!(out, "  }}");
    for rg in s.rank_graphs() {
        let _ = writeln!(out, "  subgraph cluster_rank{} {{ label=\"rank {}\";", rg.rank, rg.rank);
        for c in &rg.commands {
            let color = match c.kind {
                CommandKind::Push => "blue",
                CommandKind::AwaitPush => "red",
                CommandKind::Collective => "darkgreen",
                CommandKind::Execution => "black",
                _ => "gray",
            };
            let label = command_line(s, c).replace('"', "'");
            let label = label.split(" after ").next().unwrap_or_default().to_string();
            let _ = writeln!(out, "    r{}c{} [color={color}, label=\"{label}\"];", rg.rank, c.id.0);
            for d in &c.dependencies {
                let _ = writeln!(out, "    r{}c{} -> r{}c{} [label=\"{:?}\"];", rg.rank, d.command.0, rg.rank, c.id.0, d.kind);
            }
        }
        let _ = writeln!(out, "  }}");
    }
    out.push_str("}\n");
    out
}
