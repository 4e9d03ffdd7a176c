//! Per-rank command graphs, generated on every rank without coordination.
//!
//! Every rank splits every task the same way and keeps the same global view of who wrote each
//! buffer cell last and which ranks hold an up-to-date copy. From that view alone it emits its
//! own commands: an execution command for its chunk, one push command per (task, buffer) for
//! the cells it owns that other ranks read (naming every target and region), and one await-push
//! command per (task, buffer) for the cells it reads that another rank wrote (the union, with
//! every source). Cells no task wrote never move; a rank that already received a version never
//! gets it again. Dependencies between a rank's commands come from a local map of the last
//! command that produced each cell and the commands that read it since.
//!
//! For collective discovery (a later pass): every transfer of one (task, buffer) is described
//! whole on both sides — a push lists all its targets, an await-push all its sources — so a pass
//! can match the pattern across ranks and replace the push cascade with a collective command.

use crate::geometry::{GridBox, Index, Region, RegionMap, MAX_DIMS};
use crate::mapper::Chunk;
use crate::task::{AccessMode, BufferId, DepKind, SplitHint, Target, Task, TaskGraph, TaskId, TaskKind};
use crate::GraphError;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Identifies a command within one rank's graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct CommandId(pub usize);

/// What a command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    /// Runs this rank's chunk of a kernel, host task or fence.
    Execution,
    /// Sends cells this rank owns to the ranks that read them.
    Push,
    /// Receives the cells this rank reads from the ranks that own them.
    AwaitPush,
    /// A horizon: waits for this rank's front.
    Horizon,
    /// An epoch: waits for this rank's front.
    Epoch,
}

/// A peer of a transfer and the cells exchanged with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeerRegion {
    /// The other rank.
    pub rank: usize,
    /// The cells.
    pub region: Region,
}

/// One buffer access of an execution command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CommandAccess {
    /// The buffer.
    pub buffer: BufferId,
    /// How.
    pub mode: AccessMode,
    /// Which cells this rank's chunk accesses.
    pub region: Region,
}

/// An edge of a rank's command graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CommandDep {
    /// The command depended on.
    pub command: CommandId,
    /// Why.
    pub kind: DepKind,
}

/// A command of one rank.
#[derive(Clone, Debug, Serialize)]
pub struct Command {
    /// Its id (unique on this rank).
    pub id: CommandId,
    /// What it does.
    pub kind: CommandKind,
    /// The task it belongs to.
    pub task: TaskId,
    /// The buffer moved (push, await-push).
    pub buffer: Option<BufferId>,
    /// Push: every cell sent; await-push: every cell received.
    pub region: Region,
    /// Push: targets; await-push: sources.
    pub peers: Vec<PeerRegion>,
    /// Execution: this rank's chunk of the task's range.
    pub chunk: Option<GridBox>,
    /// Execution: the chunk's buffer accesses.
    pub accesses: Vec<CommandAccess>,
    /// The commands of this rank it waits for.
    pub dependencies: Vec<CommandDep>,
}

/// How `rank` of `ranks` splits a task: the chunk it runs (empty range if none).
pub fn chunk_of(task: &Task, ranks: usize, rank: usize) -> Chunk {
    let global = task.range;
    let empty = Chunk { offset: [0; MAX_DIMS], range: [0; MAX_DIMS], global };
    match task.target {
        Target::Master if rank == 0 => Chunk::whole(global),
        Target::Master => empty,
        Target::Collective => Chunk { offset: [rank, 0, 0], range: [usize::from(rank < global[0]), 1, 1], global },
        Target::Distributed(hint) => {
            let (rows, cols) = grid(hint, global, ranks);
            let (i, j) = (rank / cols, rank % cols);
            let g = task.granularity;
            let (lo0, hi0) = slab(global[0], rows, i, g[0]);
            let (lo1, hi1) = slab(global[1], cols, j, g[1]);
            let mut offset = [0; MAX_DIMS];
            let mut range = global;
            offset[0] = lo0;
            range[0] = hi0 - lo0;
            offset[1] = lo1;
            range[1] = hi1 - lo1;
            Chunk { offset, range, global }
        }
    }
}

/// The tile grid (rows along dimension 0, columns along 1) for `ranks` ranks.
fn grid(hint: SplitHint, global: Index, ranks: usize) -> (usize, usize) {
    if hint == SplitHint::Split1D || global[1] == 1 {
        return (ranks, 1);
    }
    // The factorisation rows × cols = ranks closest to square, rows >= cols.
    let mut cols = (ranks as f64).sqrt() as usize;
    while cols > 1 && (ranks / cols) * cols != ranks {
        cols -= 1;
    }
    (ranks / cols.max(1), cols.max(1))
}

/// Part `i` of `parts` of `[0, len)`, boundaries on multiples of `granularity` (the last part
/// ends at `len`); parts differ by at most one granule.
fn slab(len: usize, parts: usize, i: usize, granularity: usize) -> (usize, usize) {
    let g = granularity.max(1);
    let units = len.div_ceil(g);
    let at = |k: usize| (k * units / parts * g).min(len);
    (at(i), at(i + 1))
}

struct BufferView {
    /// The rank that wrote each cell last (None: never written).
    owner: RegionMap<Option<usize>>,
    /// Per rank, the cells it holds an up-to-date copy of.
    fresh: Vec<Region>,
    /// The cells some task (or host data) wrote: the cells that have an owner.
    written: Region,
    /// On this rank: the last command that produced each cell.
    local_writer: RegionMap<Option<CommandId>>,
    /// On this rank: commands that read cells since they were last produced.
    local_readers: Vec<(CommandId, Region)>,
}

/// Generates one rank's command graph, task by task.
pub struct CommandGraphGenerator {
    ranks: usize,
    rank: usize,
    buffers: Vec<BufferView>,
    commands: Vec<Command>,
    front: BTreeSet<CommandId>,
    effective_epoch: Option<CommandId>,
    last_horizon: Option<CommandId>,
}

/// Per buffer, per rank: the cells whose prior contents the chunk needs, and the cells it writes.
type ChunkRegions = BTreeMap<BufferId, Vec<(Region, Region)>>;

impl CommandGraphGenerator {
    /// A generator for `rank` of `ranks`.
    pub fn new(ranks: usize, rank: usize) -> Result<Self, GraphError> {
        if ranks == 0 || rank >= ranks {
            return Err(GraphError::InvalidArgument(format!("rank {rank} of {ranks} ranks")));
        }
        Ok(CommandGraphGenerator {
            ranks,
            rank,
            buffers: Vec::new(),
            commands: Vec::new(),
            front: BTreeSet::new(),
            effective_epoch: None,
            last_horizon: None,
        })
    }

    /// This generator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The commands generated so far, in order (a valid execution order).
    pub fn commands(&self) -> &[Command] {
        &self.commands
    }

    /// Emits this rank's commands for task `id` of `graph` (tasks must come in submission order).
    pub fn process(&mut self, graph: &TaskGraph, id: TaskId) -> Result<(), GraphError> {
        let task = graph.task(id).ok_or_else(|| GraphError::InvalidArgument(format!("task {} is not in the graph", id.0)))?;
        self.add_buffers(graph);
        match task.kind {
            TaskKind::Epoch | TaskKind::Horizon => {
                self.barrier(task);
                Ok(())
            }
            _ => self.process_work(graph, task),
        }
    }

    fn add_buffers(&mut self, graph: &TaskGraph) {
        while let Some(info) = graph.buffer(BufferId(self.buffers.len())) {
            let everywhere = if info.host_initialized { Region::from_box(GridBox::full(info.extent)) } else { Region::empty() };
            let owner = if info.host_initialized { Some(0) } else { None };
            self.buffers.push(BufferView {
                owner: RegionMap::new(info.extent, owner),
                fresh: vec![everywhere.clone(); self.ranks],
                written: everywhere,
                local_writer: RegionMap::new(info.extent, None),
                local_readers: Vec::new(),
            });
        }
    }

    fn chunk_regions(&self, graph: &TaskGraph, task: &Task) -> ChunkRegions {
        let chunks: Vec<Chunk> = (0..self.ranks).map(|r| chunk_of(task, self.ranks, r)).collect();
        let mut out: ChunkRegions = BTreeMap::new();
        for a in &task.accessors {
            let extent = graph.buffer(a.buffer).map(|b| b.extent).unwrap_or([0; MAX_DIMS]);
            let per_rank = out.entry(a.buffer).or_insert_with(|| vec![Default::default(); self.ranks]);
            for (r, chunk) in chunks.iter().enumerate() {
                let region = a.mapper.map(chunk, extent);
                if a.mode.needs_prior_contents() {
                    per_rank[r].0 = per_rank[r].0.union(&region);
                }
                if a.mode.writes() {
                    per_rank[r].1 = per_rank[r].1.union(&region);
                }
            }
        }
        out
    }

    fn process_work(&mut self, graph: &TaskGraph, task: &Task) -> Result<(), GraphError> {
        let regions = self.chunk_regions(graph, task);
        check_overlapping_writes(task, &regions)?;
        for (&buffer, per_rank) in &regions {
            self.transfers(task.id, buffer, per_rank);
        }
        self.execution(task, &regions);
        for (&buffer, per_rank) in &regions {
            let view = &mut self.buffers[buffer.0];
            // Writes of one task never overlap between ranks (checked), so every rank's copy
            // loses all the task's writes and gains its own: O(ranks) region operations.
            let mut written = Region::empty();
            let mut owners = Vec::new();
            for (s, (_, writes)) in per_rank.iter().enumerate() {
                if !writes.is_empty() {
                    owners.push((writes.clone(), Some(s)));
                    written = written.union(writes);
                }
            }
            view.owner.update_many(&owners);
            if written.is_empty() {
                continue;
            }
            view.written = view.written.union(&written);
            for (fresh, (_, writes)) in view.fresh.iter_mut().zip(per_rank) {
                if fresh.intersects(&written) {
                    *fresh = fresh.difference(&written);
                }
                if !writes.is_empty() {
                    *fresh = fresh.union(writes);
                }
            }
        }
        Ok(())
    }

    /// The push and await-push commands of this rank for one (task, buffer).
    fn transfers(&mut self, task: TaskId, buffer: BufferId, per_rank: &[(Region, Region)]) {
        let me = self.rank;
        let view = &mut self.buffers[buffer.0];
        // Every rank s receives the cells it reads, lacks and some rank wrote (the same on
        // every rank). This rank needs the full matrix only for its own row and column: what
        // it sends (cells it owns that others lack) and where its own cells come from, so a
        // task costs O(ranks) region operations, not O(ranks²).
        let mut targets = Vec::new();
        let mut sources: BTreeMap<usize, Region> = BTreeMap::new();
        for (s, (reads, _)) in per_rank.iter().enumerate() {
            if reads.is_empty() {
                continue;
            }
            let missing = reads.difference(&view.fresh[s]);
            if missing.is_empty() {
                continue;
            }
            if s == me {
                for (b, owner) in view.owner.query(&missing) {
                    if let Some(o) = owner {
                        let r = sources.entry(o).or_default();
                        *r = r.union(&Region::from_box(b));
                    }
                }
            } else {
                let mine = view.owner.region_where(&missing, |o| *o == Some(me));
                if !mine.is_empty() {
                    targets.push(PeerRegion { rank: s, region: mine });
                }
            }
            let received = missing.intersection(&view.written);
            view.fresh[s] = view.fresh[s].union(&received);
        }
        let sources: Vec<PeerRegion> = sources.into_iter().map(|(rank, region)| PeerRegion { rank, region }).collect();
        if !targets.is_empty() {
            let region = union_of(&targets);
            let deps = self.true_deps(buffer, &region);
            let id = self.emit(CommandKind::Push, task, Some(buffer), region.clone(), targets, deps);
            self.buffers[buffer.0].local_readers.push((id, region));
        }
        if !sources.is_empty() {
            let region = union_of(&sources);
            let deps = self.write_deps(buffer, &region);
            let id = self.emit(CommandKind::AwaitPush, task, Some(buffer), region.clone(), sources, deps);
            self.produced(buffer, &region, id);
        }
    }

    fn execution(&mut self, task: &Task, regions: &ChunkRegions) {
        let chunk = chunk_of(task, self.ranks, self.rank);
        if chunk.as_box().is_empty() {
            return;
        }
        let mut deps = BTreeSet::new();
        let mut accesses = Vec::new();
        for a in &task.accessors {
            let extent = self.buffers[a.buffer.0].owner.extent();
            accesses.push(CommandAccess { buffer: a.buffer, mode: a.mode, region: a.mapper.map(&chunk, extent) });
        }
        for (&buffer, per_rank) in regions {
            let (reads, writes) = &per_rank[self.rank];
            deps.extend(self.true_deps(buffer, reads));
            deps.extend(self.write_deps(buffer, writes));
        }
        let deps = strongest(deps);
        let id = CommandId(self.commands.len());
        for (&buffer, per_rank) in regions {
            let (reads, writes) = &per_rank[self.rank];
            if !writes.is_empty() {
                self.produced(buffer, writes, id);
            }
            let read_only = reads.difference(writes);
            if !read_only.is_empty() {
                self.buffers[buffer.0].local_readers.push((id, read_only));
            }
        }
        let emitted = self.emit_with(CommandKind::Execution, task.id, None, Region::empty(), Vec::new(), deps);
        debug_assert_eq!(emitted, id);
        let cmd = &mut self.commands[id.0];
        cmd.chunk = Some(chunk.as_box());
        cmd.accesses = accesses;
    }

    fn true_deps(&self, buffer: BufferId, region: &Region) -> BTreeSet<CommandDep> {
        let view = &self.buffers[buffer.0];
        view.local_writer
            .query(region)
            .into_iter()
            .filter_map(|(_, w)| w.map(|command| CommandDep { command, kind: DepKind::True }))
            .collect()
    }

    /// Anti dependencies on local readers and output dependencies on the last local producer.
    fn write_deps(&self, buffer: BufferId, region: &Region) -> BTreeSet<CommandDep> {
        let mut deps = BTreeSet::new();
        if region.is_empty() {
            return deps;
        }
        let view = &self.buffers[buffer.0];
        for (c, r) in &view.local_readers {
            if r.intersects(region) {
                deps.insert(CommandDep { command: *c, kind: DepKind::Anti });
            }
        }
        for (_, w) in view.local_writer.query(region) {
            if let Some(command) = w {
                deps.insert(CommandDep { command, kind: DepKind::Output });
            }
        }
        deps
    }

    /// Records that command `id` produced `region` on this rank.
    fn produced(&mut self, buffer: BufferId, region: &Region, id: CommandId) {
        let view = &mut self.buffers[buffer.0];
        view.local_writer.update(region, Some(id));
        for (_, r) in &mut view.local_readers {
            *r = r.difference(region);
        }
        view.local_readers.retain(|(_, r)| !r.is_empty());
    }

    fn barrier(&mut self, task: &Task) {
        let kind = if task.kind == TaskKind::Epoch { CommandKind::Epoch } else { CommandKind::Horizon };
        let deps = self.front.iter().map(|&command| CommandDep { command, kind: DepKind::Order }).collect();
        let id = self.emit_with(kind, task.id, None, Region::empty(), Vec::new(), deps);
        let new_epoch = if kind == CommandKind::Epoch {
            self.last_horizon = None;
            Some(id)
        } else {
            self.last_horizon.replace(id)
        };
        if let Some(epoch) = new_epoch {
            let redirect = |c: CommandId| if c < epoch { epoch } else { c };
            for view in &mut self.buffers {
                view.local_writer.map_values(|w| w.map(redirect));
                for (c, _) in &mut view.local_readers {
                    *c = redirect(*c);
                }
            }
            self.effective_epoch = Some(epoch);
        }
    }

    fn emit(
        &mut self,
        kind: CommandKind,
        task: TaskId,
        buffer: Option<BufferId>,
        region: Region,
        peers: Vec<PeerRegion>,
        deps: BTreeSet<CommandDep>,
    ) -> CommandId {
        self.emit_with(kind, task, buffer, region, peers, strongest(deps))
    }

    fn emit_with(
        &mut self,
        kind: CommandKind,
        task: TaskId,
        buffer: Option<BufferId>,
        region: Region,
        peers: Vec<PeerRegion>,
        mut dependencies: Vec<CommandDep>,
    ) -> CommandId {
        let id = CommandId(self.commands.len());
        if dependencies.is_empty() {
            if let Some(e) = self.effective_epoch {
                dependencies.push(CommandDep { command: e, kind: DepKind::Order });
            }
        }
        for d in &dependencies {
            self.front.remove(&d.command);
        }
        self.front.insert(id);
        self.commands.push(Command { id, kind, task, buffer, region, peers, chunk: None, accesses: Vec::new(), dependencies });
        id
    }
}

fn check_overlapping_writes(task: &Task, regions: &ChunkRegions) -> Result<(), GraphError> {
    for (&buffer, per_rank) in regions {
        // One sweep against the union so far (O(ranks)); the pairwise search runs only to name
        // the two ranks once a clash is known.
        let mut so_far = Region::empty();
        for (t, (_, writes)) in per_rank.iter().enumerate() {
            if writes.is_empty() {
                continue;
            }
            if so_far.intersects(writes) {
                let s = (0..t).find(|&s| per_rank[s].1.intersects(writes)).expect("an earlier rank writes the clash");
                let both = per_rank[s].1.intersection(writes);
                return Err(GraphError::OverlappingWrites {
                    task: task.id.0,
                    name: task.name.clone(),
                    buffer: buffer.0,
                    ranks: (s, t),
                    region: both.boxes().to_vec(),
                });
            }
            so_far = so_far.union(writes);
        }
    }
    Ok(())
}

fn union_of(peers: &[PeerRegion]) -> Region {
    peers.iter().fold(Region::empty(), |acc, p| acc.union(&p.region))
}

/// One edge per command: the strongest reason (true before anti before output before order).
fn strongest(deps: BTreeSet<CommandDep>) -> Vec<CommandDep> {
    let mut by_command: BTreeMap<CommandId, DepKind> = BTreeMap::new();
    for d in deps {
        by_command.entry(d.command).and_modify(|k| *k = (*k).min(d.kind)).or_insert(d.kind);
    }
    by_command.into_iter().map(|(command, kind)| CommandDep { command, kind }).collect()
}

/// One rank's command graph, as dumped.
#[derive(Clone, Debug, Serialize)]
pub struct RankGraph {
    /// The rank.
    pub rank: usize,
    /// Its commands in order.
    pub commands: Vec<Command>,
}

/// Builds a task graph and the command graphs of chosen ranks as tasks are submitted.
pub struct Scheduler {
    graph: TaskGraph,
    generators: Vec<CommandGraphGenerator>,
    /// Every task made so far, kept for dumps (horizons drop old tasks from the graph).
    recorded: Option<Vec<Task>>,
}

impl Scheduler {
    /// Generates the command graphs of all `ranks` ranks (a simulation, for tests and dumps).
    pub fn simulate(ranks: usize, horizon_step: usize) -> Result<Self, GraphError> {
        let generators = (0..ranks.max(1)).map(|r| CommandGraphGenerator::new(ranks, r)).collect::<Result<_, _>>()?;
        Ok(Scheduler { graph: TaskGraph::new(ranks, horizon_step), generators, recorded: Some(Vec::new()) })
    }

    /// Generates only `rank`'s command graph (what a real rank does).
    pub fn for_rank(ranks: usize, rank: usize, horizon_step: usize) -> Result<Self, GraphError> {
        let generators = vec![CommandGraphGenerator::new(ranks, rank)?];
        Ok(Scheduler { graph: TaskGraph::new(ranks, horizon_step), generators, recorded: None })
    }

    /// The task graph.
    pub fn graph(&self) -> &TaskGraph {
        &self.graph
    }

    /// Creates a buffer (see [`TaskGraph::create_buffer`]).
    pub fn create_buffer(&mut self, dims: &[usize], host_initialized: bool) -> Result<BufferId, GraphError> {
        self.graph.create_buffer(dims, host_initialized)
    }

    /// Submits a task and generates its commands (and a horizon's, if one follows).
    pub fn submit(&mut self, spec: crate::task::TaskSpec) -> Result<TaskId, GraphError> {
        let id = self.graph.submit(spec)?;
        self.flush()?;
        Ok(id)
    }

    /// Submits an epoch.
    pub fn epoch(&mut self) -> Result<TaskId, GraphError> {
        let id = self.graph.epoch();
        self.flush()?;
        Ok(id)
    }

    /// Keeps (or stops keeping) a copy of every task for dumps; on by default in simulations,
    /// off for a single rank (where it costs memory in long loops).
    pub fn record_tasks(&mut self, on: bool) {
        if on != self.recorded.is_some() {
            self.recorded = on.then(Vec::new);
        }
    }

    /// Every task made while recording was on, in order (see [`Scheduler::record_tasks`]).
    pub fn recorded_tasks(&self) -> &[Task] {
        self.recorded.as_deref().unwrap_or(&[])
    }

    /// The number of simulated ranks.
    pub fn ranks(&self) -> usize {
        self.generators.first().map_or(1, |g| g.ranks)
    }

    fn flush(&mut self) -> Result<(), GraphError> {
        for id in self.graph.take_new_tasks() {
            if let (Some(rec), Some(t)) = (self.recorded.as_mut(), self.graph.task(id)) {
                rec.push(t.clone());
            }
            for g in &mut self.generators {
                g.process(&self.graph, id)?;
            }
        }
        Ok(())
    }

    /// The command graph of `rank`, if this scheduler generates it.
    pub fn commands(&self, rank: usize) -> Option<&[Command]> {
        self.generators.iter().find(|g| g.rank == rank).map(|g| g.commands())
    }

    /// The generated command graphs, one per generated rank.
    pub fn rank_graphs(&self) -> Vec<RankGraph> {
        self.generators.iter().map(|g| RankGraph { rank: g.rank, commands: g.commands.clone() }).collect()
    }

    /// The task graph and the generated command graphs as JSON (the format of
    /// `sucl graph --json`, described in [`crate::dump`]).
    pub fn to_json(&self) -> String {
        crate::dump::to_json(self)
    }
}
