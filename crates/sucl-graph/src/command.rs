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
use crate::task::{AccessMode, BufferId, DepKind, Forward, SplitHint, Target, Task, TaskGraph, TaskId, TaskKind};
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
    /// A collective transfer found by collective pattern discovery (see [`Collective`]).
    Collective,
}

/// The collective a forward became after work assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    /// Many producers, one consumer (the root).
    Gather,
    /// Every rank produces a part and reads the whole.
    AllGather,
    /// One producer (the root), every consumer reads the same cells.
    Broadcast,
    /// One producer (the root), consumers read disjoint parts.
    Scatter,
    /// A transposition: every rank sends a distinct part to every other.
    AllToAll,
}

/// What a collective command moves. Every rank gets the same collective commands in the same
/// order; `parts` is the same on every rank, `sends` / `recvs` are this rank's share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Collective {
    /// Which collective.
    pub op: CollectiveOp,
    /// The root rank (gather: the consumer; broadcast, scatter: the producer).
    pub root: Option<usize>,
    /// Per rank: the cells it contributes (gather, all-gather, all-to-all) or receives
    /// (broadcast, scatter); the per-rank counts of the v-forms.
    pub parts: Vec<PeerRegion>,
    /// What this rank sends, per peer.
    pub sends: Vec<PeerRegion>,
    /// What this rank receives, per peer.
    pub recvs: Vec<PeerRegion>,
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
    /// Collective: the pattern and the per-rank regions.
    pub collective: Option<Collective>,
}

/// How `rank` of `ranks` splits a task: the chunk it runs (empty range if none).
pub fn chunk_of(task: &Task, ranks: usize, rank: usize) -> Chunk {
    split_chunk(task.target, task.range, task.granularity, ranks, rank)
}

/// The chunk of `rank` of `ranks` for a task of this geometry.
fn split_chunk(target: Target, global: Index, granularity: Index, ranks: usize, rank: usize) -> Chunk {
    let empty = Chunk { offset: [0; MAX_DIMS], range: [0; MAX_DIMS], global };
    match target {
        Target::Master if rank == 0 => Chunk::whole(global),
        Target::Master => empty,
        Target::Collective => Chunk { offset: [rank, 0, 0], range: [usize::from(rank < global[0]), 1, 1], global },
        Target::Distributed(hint) => {
            let (rows, cols) = grid(hint, global, ranks);
            let (i, j) = (rank / cols, rank % cols);
            let g = granularity;
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
    discovery: bool,
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
            discovery: true,
        })
    }

    /// Turns collective pattern discovery on (the default) or off (every transfer is
    /// push / await-push).
    pub fn set_discovery(&mut self, on: bool) {
        self.discovery = on;
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
            if self.discovery {
                if let Some(f) = task.forwards.iter().find(|f| f.buffer == buffer) {
                    // The forward covers every cell the task reads of this buffer: once it is
                    // a collective, nothing is left for push / await-push.
                    if self.materialise(graph, task, f, per_rank) {
                        continue;
                    }
                }
            }
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

    /// Turns a forward into a collective command when the chunk counts and the mappers'
    /// metadata match one (the conditions of the issue, decided in constant time); otherwise
    /// leaves the transfer to push / await-push. On success every rank's view records the
    /// received cells, so the push / await-push pass that follows finds nothing left to move.
    fn materialise(&mut self, graph: &TaskGraph, task: &Task, f: &Forward, per_rank: &[(Region, Region)]) -> bool {
        let Some(pmap) = &f.producer_mapper else { return false };
        let mut readers = task.accessors.iter().filter(|a| a.buffer == f.buffer && a.mode.needs_prior_contents());
        let (Some(reader), None) = (readers.next(), readers.next()) else { return false };
        let (pm, cm) = (pmap.meta(), reader.mapper.meta());
        // Metadata alone rules most edges out (a halo read, a custom mapper) before any
        // O(ranks) work, so a stencil pays nothing for discovery.
        let identity_like = |m: &crate::mapper::MapperMeta| m.dims.iter().all(|d| *d != crate::mapper::DimMapping::Other);
        if pm == crate::mapper::MapperMeta::UNKNOWN
            || !(cm.constant || cm.non_overlapping || pm.non_overlapping)
            || !(cm.constant || cm.non_overlapping || identity_like(&cm))
        {
            return false;
        }
        let extent = graph.buffer(f.buffer).map_or([0; MAX_DIMS], |b| b.extent);
        let ranks = self.ranks;
        let pchunks: Vec<Chunk> =
            (0..ranks).map(|r| split_chunk(f.producer_target, f.producer_range, f.producer_granularity, ranks, r)).collect();
        let producers: Vec<usize> = (0..ranks).filter(|&r| !pchunks[r].as_box().is_empty()).collect();
        let consumers: Vec<usize> = (0..ranks).filter(|&r| !per_rank[r].0.is_empty()).collect();
        let (m, c) = (producers.len(), consumers.len());
        let full = m == ranks && c == ranks;
        let (op, root) = if m >= 2 && c == 1 && pm.non_overlapping {
            (CollectiveOp::Gather, Some(consumers[0]))
        } else if full && m >= 2 && cm.constant && pm.non_overlapping {
            (CollectiveOp::AllGather, None)
        } else if m == 1 && c >= 2 && cm.constant {
            (CollectiveOp::Broadcast, Some(producers[0]))
        } else if m == 1 && c >= 2 && cm.non_overlapping {
            (CollectiveOp::Scatter, Some(producers[0]))
        } else if full && m >= 2 && is_transposition(f, task, pmap, &reader.mapper) {
            (CollectiveOp::AllToAll, None)
        } else {
            return false;
        };
        // Cells forwarded are written by the producer alone and read by nobody since, so a
        // consumer lacks exactly the forwarded cells it reads that another rank wrote.
        let writes: Vec<Region> = pchunks.iter().map(|ch| pmap.map(ch, extent).intersection(&f.region)).collect();
        let me = self.rank;
        let parts: Vec<PeerRegion> = match op {
            CollectiveOp::Broadcast | CollectiveOp::Scatter => {
                (0..ranks).map(|r| PeerRegion { rank: r, region: per_rank[r].0.intersection(&f.region) }).collect()
            }
            _ => writes.iter().enumerate().map(|(r, w)| PeerRegion { rank: r, region: w.clone() }).collect(),
        };
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for s in 0..ranks {
            if s == me {
                continue;
            }
            let out = writes[me].intersection(&per_rank[s].0);
            if !out.is_empty() {
                sends.push(PeerRegion { rank: s, region: out });
            }
            let inc = writes[s].intersection(&per_rank[me].0);
            if !inc.is_empty() {
                recvs.push(PeerRegion { rank: s, region: inc });
            }
        }
        let view = &mut self.buffers[f.buffer.0];
        for (s, (reads, _)) in per_rank.iter().enumerate() {
            if !reads.is_empty() {
                let got = reads.intersection(&f.region);
                if !got.is_empty() {
                    view.fresh[s] = view.fresh[s].union(&got);
                }
            }
        }
        // The producer's writes partition the forwarded cells, so what this rank receives is
        // what it reads of them minus its own part; a constant consumer reads the same cells
        // everywhere, so what it sends is its part of them (no O(ranks) fold of regions).
        let received = per_rank[me].0.intersection(&f.region).difference(&writes[me]);
        let sent = match consumers.iter().find(|&&s| s != me) {
            Some(&other) if cm.constant => writes[me].intersection(&per_rank[other].0),
            _ => union_of(&sends),
        };
        let mut deps = self.true_deps(f.buffer, &sent);
        deps.extend(self.write_deps(f.buffer, &received));
        let id = self.emit(CommandKind::Collective, task.id, Some(f.buffer), received.clone(), Vec::new(), deps);
        self.commands[id.0].collective = Some(Collective { op, root, parts, sends, recvs });
        if !sent.is_empty() {
            self.buffers[f.buffer.0].local_readers.push((id, sent));
        }
        if !received.is_empty() {
            self.produced(f.buffer, &received, id);
        }
        true
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
        self.commands.push(Command {
            id,
            kind,
            task,
            buffer,
            region,
            peers,
            chunk: None,
            accesses: Vec::new(),
            dependencies,
            collective: None,
        });
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

/// A non-trivial transposition (all-to-all): one mapper on each side covering the forwarded
/// cells, every buffer dimension constant or following a kernel dimension, and after the split
/// one dimension goes from whole (producer) to split (consumer) and another the other way.
fn is_transposition(f: &Forward, consumer: &Task, pmap: &crate::mapper::RangeMapper, cmap: &crate::mapper::RangeMapper) -> bool {
    let split_dims = |target: Target, range: Index| -> [bool; MAX_DIMS] {
        match target {
            Target::Distributed(hint) => {
                let two = hint == SplitHint::Split2D && range[1] > 1;
                [true, two, false]
            }
            _ => [false; MAX_DIMS],
        }
    };
    // Per buffer dimension: Some(true) split, Some(false) whole, None unknown.
    let follow = |m: &crate::mapper::RangeMapper, split: [bool; MAX_DIMS]| -> Option<[bool; MAX_DIMS]> {
        let mut out = [false; MAX_DIMS];
        for (d, dm) in m.meta().dims.iter().enumerate() {
            out[d] = match dm {
                crate::mapper::DimMapping::Constant => false,
                crate::mapper::DimMapping::Identity(k) => split[*k],
                crate::mapper::DimMapping::Other => return None,
            };
        }
        Some(out)
    };
    let (Some(p), Some(c)) =
        (follow(pmap, split_dims(f.producer_target, f.producer_range)), follow(cmap, split_dims(consumer.target, consumer.range)))
    else {
        return false;
    };
    let whole_to_split = (0..MAX_DIMS).filter(|&d| !p[d] && c[d]).count();
    let split_to_whole = (0..MAX_DIMS).filter(|&d| p[d] && !c[d]).count();
    let split_both = (0..MAX_DIMS).filter(|&d| p[d] && c[d]).count();
    whole_to_split == 1 && split_to_whole == 1 && split_both == 0
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

    /// Turns collective pattern discovery on (the default) or off for the tasks submitted
    /// from now on.
    pub fn set_discovery(&mut self, on: bool) {
        for g in &mut self.generators {
            g.set_discovery(on);
        }
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
