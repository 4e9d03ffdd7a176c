//! `sucl graph SCENARIO --nodes N [--json | --dot] [--no-cpd]`: the task graph and every rank's command
//! graph of a program described in a scenario file (format: `sucl::graph::scenario`), built
//! without running kernels or starting ranks.

use sucl::graph::{dump, scenario::Scenario};

/// How to print the graphs.
pub enum Format {
    /// One line per task and command.
    Text,
    /// The JSON of `sucl::graph::dump`.
    Json,
    /// Graphviz dot.
    Dot,
}

/// Prints the graphs of `path` on `nodes` simulated ranks, with collective pattern discovery
/// unless `no_cpd`; the exit code.
pub fn run(path: &str, nodes: usize, format: Format, no_cpd: bool) -> i32 {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return crate::fail(format!("{path}: {e}")),
    };
    let scheduler = match Scenario::parse(&text).and_then(|s| s.simulate_with(nodes, !no_cpd)) {
        Ok(s) => s,
        Err(e) => return crate::fail(format!("{path}: {e}")),
    };
    for w in scheduler.graph().warnings() {
        eprintln!("sucl graph: warning: task {} reads buffer {} cells {:?} that nothing wrote", w.task.0, w.buffer.0, w.region.boxes());
    }
    let out = match format {
        Format::Text => dump::to_text(&scheduler),
        Format::Json => dump::to_json(&scheduler) + "\n",
        Format::Dot => dump::to_dot(&scheduler),
    };
    // A reader that stops early (`| head`) is not an error.
    match std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => crate::fail(format!("writing the graph: {e}")),
        _ => 0,
    }
}
