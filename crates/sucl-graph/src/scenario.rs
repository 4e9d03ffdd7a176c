//! Scenario files: a program's buffers and tasks in TOML, for `sucl graph`, which builds the
//! task graph and every rank's command graph from it without running kernels.
//!
//! ```toml
//! horizon_step = 0            # a horizon every N tasks (0, the default: never)
//!
//! [[buffer]]
//! name = "u"
//! extent = [64, 64]           # 1 to 3 dimensions
//! host_data = true            # starts from host data on every rank (default false)
//!
//! [[task]]
//! name = "jacobi"
//! kind = "kernel"             # kernel (default) | master | collective | fence | epoch
//! range = [64, 64]            # kernel and master tasks (master default [1])
//! split = "2d"                # 1d (default) | 2d
//! granularity = [8, 1]        # chunk boundaries on multiples (default 1)
//! repeat = 10                 # submit this task 10 times (default 1)
//! swap = ["u", "v"]           # after each submission, exchange these two buffer names
//! accessors = [
//!   { buffer = "u", mode = "read", mapper = { neighborhood = [1, 1] } },
//!   { buffer = "v", mode = "discard_write", mapper = "one_to_one" },
//! ]
//!
//! [[task]]
//! kind = "fence"
//! buffer = "u"                # a fence names a buffer and optionally
//! region = { min = [0, 0], max = [8, 8] }   # a box of it (default: all of it)
//! ```
//!
//! Modes: read, write, read_write, discard_write, discard_read_write. Mappers — every built-in
//! [`RangeMapper`], so the command graph of any program whose mappers are not closures can be
//! written down: `"one_to_one"`, `"all"`, `"reverse"`, `"even_split"` (granularity 1),
//! `{ neighborhood = [h0, h1, h2] }` (bounding box, with diagonals),
//! `{ neighborhood_axes = [h0, h1, h2] }` (a cross), `{ slice = d }`, `{ transposed = [a, b] }`,
//! `{ even_split = g }`, `{ fixed = { min = [...], max = [...] } }`. Missing dimensions of a box
//! are 0..1. [`mapper_to_toml`] writes a mapper in this form. A closure
//! ([`RangeMapper::Custom`]) has no file form.

use crate::command::Scheduler;
use crate::geometry::{GridBox, MAX_DIMS};
use crate::mapper::RangeMapper;
use crate::task::{AccessMode, BufferId, SplitHint, TaskSpec};
use crate::GraphError;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A parsed scenario.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A horizon every this many tasks (0: never).
    #[serde(default)]
    pub horizon_step: usize,
    /// The buffers, in order of creation.
    #[serde(default, rename = "buffer")]
    pub buffers: Vec<BufferDecl>,
    /// The tasks, in order of submission.
    #[serde(default, rename = "task")]
    pub tasks: Vec<TaskDecl>,
}

/// A buffer of a scenario.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferDecl {
    /// Its name (tasks refer to it).
    pub name: String,
    /// Its extent, 1–3 dimensions.
    pub extent: Vec<usize>,
    /// Starts from host data on every rank.
    #[serde(default)]
    pub host_data: bool,
}

/// A task of a scenario.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskDecl {
    /// Its name (default: `task<N>`).
    #[serde(default)]
    pub name: Option<String>,
    /// kernel, master, collective, fence or epoch.
    #[serde(default = "kernel")]
    pub kind: String,
    /// The kernel's range (kernel, master).
    #[serde(default)]
    pub range: Option<Vec<usize>>,
    /// 1d or 2d.
    #[serde(default)]
    pub split: Option<String>,
    /// Chunk boundaries on multiples of these.
    #[serde(default)]
    pub granularity: Option<Vec<usize>>,
    /// Submissions of this task.
    #[serde(default = "one")]
    pub repeat: usize,
    /// Two buffer names exchanged after each submission (ping-pong loops).
    #[serde(default)]
    pub swap: Option<[String; 2]>,
    /// The accessors.
    #[serde(default)]
    pub accessors: Vec<AccessorDecl>,
    /// A fence's buffer.
    #[serde(default)]
    pub buffer: Option<String>,
    /// A fence's region (default: the whole buffer).
    #[serde(default)]
    pub region: Option<BoxDecl>,
}

fn kernel() -> String {
    "kernel".into()
}

fn one() -> usize {
    1
}

/// An accessor of a scenario task.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessorDecl {
    /// The buffer's name.
    pub buffer: String,
    /// read, write, read_write, discard_write or discard_read_write.
    pub mode: String,
    /// The range mapper.
    pub mapper: MapperDecl,
}

/// A range mapper of a scenario: a name or a table with one key.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MapperDecl {
    /// `"one_to_one"` or `"all"`.
    Name(String),
    /// `{ neighborhood = [..] }`, `{ slice = d }`, `{ transposed = [a, b] }`, `{ fixed = {..} }`.
    Table(MapperTable),
}

/// The table form of a mapper (exactly one key).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapperTable {
    /// Halo per dimension (bounding box: with diagonals).
    #[serde(default)]
    pub neighborhood: Option<Vec<usize>>,
    /// Halo per dimension, one axis at a time (a cross: no diagonals).
    #[serde(default)]
    pub neighborhood_axes: Option<Vec<usize>>,
    /// The dimension taken whole.
    #[serde(default)]
    pub slice: Option<usize>,
    /// The two dimensions swapped.
    #[serde(default)]
    pub transposed: Option<[usize; 2]>,
    /// Dimension 0 cut into one part per item, on multiples of this granularity.
    #[serde(default)]
    pub even_split: Option<usize>,
    /// A fixed box.
    #[serde(default)]
    pub fixed: Option<BoxDecl>,
}

/// A box `[min, max)` (missing dimensions 0..1).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxDecl {
    /// Inclusive lower corner.
    pub min: Vec<usize>,
    /// Exclusive upper corner.
    pub max: Vec<usize>,
}

fn bad(what: String) -> GraphError {
    GraphError::InvalidArgument(what)
}

fn dims(v: &[usize], what: &str) -> Result<(), GraphError> {
    if v.is_empty() || v.len() > MAX_DIMS {
        return Err(bad(format!("{what} has {} dimensions, want 1 to 3", v.len())));
    }
    Ok(())
}

impl BoxDecl {
    fn to_box(&self, what: &str) -> Result<GridBox, GraphError> {
        dims(&self.min, what)?;
        dims(&self.max, what)?;
        let mut lo = [0; MAX_DIMS];
        let mut hi = [1; MAX_DIMS];
        lo[..self.min.len()].copy_from_slice(&self.min);
        hi[..self.max.len()].copy_from_slice(&self.max);
        Ok(GridBox::new(lo, hi))
    }
}

impl MapperDecl {
    fn to_mapper(&self, what: &str) -> Result<RangeMapper, GraphError> {
        match self {
            MapperDecl::Name(n) if n == "one_to_one" => Ok(RangeMapper::OneToOne),
            MapperDecl::Name(n) if n == "all" => Ok(RangeMapper::All),
            MapperDecl::Name(n) if n == "reverse" => Ok(RangeMapper::Reverse),
            MapperDecl::Name(n) if n == "even_split" => Ok(RangeMapper::EvenSplit(1)),
            MapperDecl::Name(n) => Err(bad(format!("{what}: unknown mapper \"{n}\" (one_to_one, all, reverse, even_split, or a table)"))),
            MapperDecl::Table(t) => {
                let set = [
                    t.neighborhood.is_some(),
                    t.neighborhood_axes.is_some(),
                    t.slice.is_some(),
                    t.transposed.is_some(),
                    t.even_split.is_some(),
                    t.fixed.is_some(),
                ];
                if set.iter().filter(|&&x| x).count() != 1 {
                    return Err(bad(format!(
                        "{what}: a mapper table has exactly one of neighborhood, neighborhood_axes, slice, transposed, even_split, fixed"
                    )));
                }
                if let Some(g) = t.even_split {
                    if g == 0 {
                        return Err(bad(format!("{what}: even_split needs a granularity of at least 1")));
                    }
                    return Ok(RangeMapper::EvenSplit(g));
                }
                if let Some(h) = &t.neighborhood_axes {
                    dims(h, &format!("{what}: neighborhood_axes"))?;
                    let mut halo = [0; MAX_DIMS];
                    halo[..h.len()].copy_from_slice(h);
                    return Ok(RangeMapper::NeighborhoodAxes(halo));
                }
                if let Some(h) = &t.neighborhood {
                    dims(h, &format!("{what}: neighborhood"))?;
                    let mut halo = [0; MAX_DIMS];
                    halo[..h.len()].copy_from_slice(h);
                    return Ok(RangeMapper::Neighborhood(halo));
                }
                if let Some(d) = t.slice {
                    return Ok(RangeMapper::Slice(d));
                }
                if let Some([a, b]) = t.transposed {
                    return Ok(RangeMapper::Transposed(a, b));
                }
                let f = t.fixed.as_ref().expect("one key is set");
                Ok(RangeMapper::Fixed(f.to_box(&format!("{what}: fixed"))?))
            }
        }
    }
}

/// `m` in the scenario form (a TOML value: a string or an inline table), or None for a
/// closure, which has none. Parsing the result gives a mapper that maps every chunk alike.
pub fn mapper_to_toml(m: &RangeMapper) -> Option<String> {
    let list = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ");
    Some(match m {
        RangeMapper::OneToOne => "\"one_to_one\"".into(),
        RangeMapper::All => "\"all\"".into(),
        RangeMapper::Reverse => "\"reverse\"".into(),
        RangeMapper::EvenSplit(g) => format!("{{ even_split = {g} }}"),
        RangeMapper::Neighborhood(h) => format!("{{ neighborhood = [{}] }}", list(h)),
        RangeMapper::NeighborhoodAxes(h) => format!("{{ neighborhood_axes = [{}] }}", list(h)),
        RangeMapper::Slice(d) => format!("{{ slice = {d} }}"),
        RangeMapper::Transposed(a, b) => format!("{{ transposed = [{a}, {b}] }}"),
        RangeMapper::Fixed(b) => format!("{{ fixed = {{ min = [{}], max = [{}] }} }}", list(&b.min), list(&b.max)),
        RangeMapper::Custom(..) => return None,
    })
}

/// Parses one mapper in the scenario form (what [`mapper_to_toml`] writes).
pub fn parse_mapper(text: &str) -> Result<RangeMapper, GraphError> {
    #[derive(Deserialize)]
    struct One {
        mapper: MapperDecl,
    }
    let one: One = toml::from_str(&format!("mapper = {text}")).map_err(|e| bad(format!("mapper {text}: {e}")))?;
    one.mapper.to_mapper("mapper")
}

fn mode(m: &str, what: &str) -> Result<AccessMode, GraphError> {
    Ok(match m {
        "read" => AccessMode::Read,
        "write" => AccessMode::Write,
        "read_write" => AccessMode::ReadWrite,
        "discard_write" => AccessMode::DiscardWrite,
        "discard_read_write" => AccessMode::DiscardReadWrite,
        _ => return Err(bad(format!("{what}: unknown mode \"{m}\" (read, write, read_write, discard_write, discard_read_write)"))),
    })
}

impl Scenario {
    /// Parses a scenario (errors name the line and key, or the task and field).
    pub fn parse(text: &str) -> Result<Scenario, GraphError> {
        toml::from_str(text).map_err(|e| bad(format!("scenario: {e}")))
    }

    /// Builds the task graph and the command graphs of all `ranks` ranks (no kernel runs).
    pub fn simulate(&self, ranks: usize) -> Result<Scheduler, GraphError> {
        self.simulate_with(ranks, true)
    }

    /// [`Scenario::simulate`] with collective pattern discovery on or off (`--no-cpd`).
    pub fn simulate_with(&self, ranks: usize, discovery: bool) -> Result<Scheduler, GraphError> {
        if ranks == 0 {
            return Err(bad("--nodes must be at least 1".into()));
        }
        let mut s = Scheduler::simulate(ranks, self.horizon_step)?;
        s.set_discovery(discovery);
        let mut names: BTreeMap<String, BufferId> = BTreeMap::new();
        for b in &self.buffers {
            dims(&b.extent, &format!("buffer '{}': extent", b.name))?;
            let id = s.create_buffer(&b.extent, b.host_data).map_err(|e| bad(format!("buffer '{}': {e}", b.name)))?;
            if names.insert(b.name.clone(), id).is_some() {
                return Err(bad(format!("buffer '{}' is declared twice", b.name)));
            }
        }
        for (i, t) in self.tasks.iter().enumerate() {
            let name = t.name.clone().unwrap_or_else(|| format!("task{i}"));
            let what = format!("task {i} ('{name}')");
            for _ in 0..t.repeat {
                self.submit(&mut s, t, &name, &what, &names)?;
                if let Some([a, b]) = &t.swap {
                    let (x, y) = (lookup(&names, a, &what)?, lookup(&names, b, &what)?);
                    names.insert(a.clone(), y);
                    names.insert(b.clone(), x);
                }
            }
        }
        Ok(s)
    }

    fn submit(
        &self,
        s: &mut Scheduler,
        t: &TaskDecl,
        name: &str,
        what: &str,
        names: &BTreeMap<String, BufferId>,
    ) -> Result<(), GraphError> {
        let range = |default: Option<&[usize]>| -> Result<Vec<usize>, GraphError> {
            let r = t.range.as_deref().or(default).ok_or_else(|| bad(format!("{what}: a {} task needs a range", t.kind)))?;
            dims(r, &format!("{what}: range"))?;
            Ok(r.to_vec())
        };
        let mut spec = match t.kind.as_str() {
            "kernel" => TaskSpec::parallel_for(name, &range(None)?),
            "master" => TaskSpec::master_host_task(name, &range(Some(&[1]))?),
            "collective" => TaskSpec::collective_host_task(name),
            "fence" => {
                let b = t.buffer.as_deref().ok_or_else(|| bad(format!("{what}: a fence names a buffer")))?;
                let id = lookup(names, b, what)?;
                let full = GridBox::full(s.graph().buffer(id).map(|i| i.extent).unwrap_or([1; MAX_DIMS]));
                let region = match &t.region {
                    Some(r) => r.to_box(&format!("{what}: region"))?,
                    None => full,
                };
                if region.intersection(&full) != region || region.is_empty() {
                    return Err(bad(format!("{what}: fence region {:?}..{:?} is empty or outside buffer '{b}'", region.min, region.max)));
                }
                s.submit(TaskSpec::fence(name, id, region)).map_err(|e| bad(format!("{what}: {e}")))?;
                return Ok(());
            }
            "epoch" => {
                s.epoch()?;
                return Ok(());
            }
            k => return Err(bad(format!("{what}: unknown kind \"{k}\" (kernel, master, collective, fence, epoch)"))),
        };
        match t.split.as_deref() {
            None | Some("1d") => {}
            Some("2d") => spec = spec.split(SplitHint::Split2D),
            Some(x) => return Err(bad(format!("{what}: unknown split \"{x}\" (1d, 2d)"))),
        }
        if let Some(g) = &t.granularity {
            dims(g, &format!("{what}: granularity"))?;
            spec = spec.granularity(g);
        }
        for (j, a) in t.accessors.iter().enumerate() {
            let w = format!("{what}: accessor {j}");
            spec = spec.access(lookup(names, &a.buffer, &w)?, a.mapper.to_mapper(&w)?, mode(&a.mode, &w)?);
        }
        s.submit(spec)?;
        Ok(())
    }
}

fn lookup(names: &BTreeMap<String, BufferId>, n: &str, what: &str) -> Result<BufferId, GraphError> {
    names.get(n).copied().ok_or_else(|| bad(format!("{what}: unknown buffer '{n}'")))
}

/// Entry point of the coverage-guided fuzz target `scenario_toml` (`fuzz/`) and of the tests
/// that replay its corpus: not part of the API.
#[doc(hidden)]
pub mod fuzz {
    use super::*;

    /// The first byte picks 1 to 3 ranks; the rest (if UTF-8) is parsed as a scenario and
    /// simulated on them: a scenario or a clear error, never a panic.
    pub fn scenario_toml(bytes: &[u8]) {
        let Some((&ranks, text)) = bytes.split_first() else { return };
        let Ok(text) = std::str::from_utf8(text) else { return };
        if let Ok(s) = Scenario::parse(text) {
            let _ = s.simulate(1 + ranks as usize % 3);
        }
    }
}
