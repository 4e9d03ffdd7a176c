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
//! The global view is kept in two forms. A task whose writes one built-in mapper describes
//! becomes a *layer*: the written cells plus the producer's split and mapper, from which the
//! owner of any cell follows; a collective that delivers those cells adds the consumer's split
//! to the layer. Layers cost nothing per rank. A point-to-point transfer needs the per-rank form
//! (owner of every cell, every rank's up-to-date cells), so it folds the buffer's layers into
//! it first (O(ranks) region operations, which the transfer itself costs anyway).
//!
//! Collective pattern discovery turns a forward of the task graph into [`Collective`] commands
//! (the same on every rank), decided from the chunk counts (closed forms of the split) and the
//! mappers' metadata refined by the splits. A command carries the pattern, the root and both
//! sides' split accesses, not per-rank regions, so with built-in mappers its generation does
//! no per-rank work; the executor (and dumps) compute who sends what to whom from it. A
//! consumer that reads the forwarded buffer through several accessors is handled as one merged
//! requirement where one constant accessor covers them all, per accessor otherwise.

use crate::geometry::{GridBox, Index, Region, RegionMap, MAX_DIMS};
use crate::mapper::{Chunk, DimMapping, MapperMeta, RangeMapper};
use crate::task::{AccessMode, Accessor, BufferId, DepKind, Forward, SplitHint, Target, Task, TaskGraph, TaskId, TaskKind};
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

/// One accessor of a task together with the task's split: enough to compute the cells any
/// rank's chunk accesses, without listing them for every rank.
#[derive(Clone, Debug)]
pub struct SplitAccess {
    /// Where the task runs.
    pub target: Target,
    /// The task's range.
    pub range: Index,
    /// The task's granularity.
    pub granularity: Index,
    /// The accessor's range mapper.
    pub mapper: RangeMapper,
}

impl SplitAccess {
    /// The chunk `rank` of `ranks` runs.
    pub fn chunk(&self, ranks: usize, rank: usize) -> Chunk {
        split_chunk(self.target, self.range, self.granularity, ranks, rank)
    }

    /// The cells of a buffer of extent `extent` that `rank`'s chunk accesses.
    pub fn region(&self, ranks: usize, rank: usize, extent: Index) -> Region {
        self.mapper.map(&self.chunk(ranks, rank), extent)
    }

    /// The union of every rank's cells, in constant time, where the mapper guarantees it is
    /// the whole range's cells (built-in mappers; a custom mapper gives None).
    fn union_of_chunks(&self, extent: Index) -> Option<Region> {
        match self.mapper {
            RangeMapper::Custom(..) => None,
            _ => Some(self.mapper.map(&Chunk::whole(self.range), extent)),
        }
    }
}

impl Serialize for SplitAccess {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("SplitAccess", 4)?;
        st.serialize_field("target", &self.target)?;
        st.serialize_field("range", &self.range)?;
        st.serialize_field("granularity", &self.granularity)?;
        st.serialize_field("mapper", &format!("{:?}", self.mapper))?;
        st.end()
    }
}

/// What a collective command moves, as the mapper metadata describes it: the pattern, the
/// root, the forwarded cells, and the producer's and consumer's split accesses. The command is
/// the same on every rank and costs the generator no per-rank work; who sends which cells to
/// whom ([`Collective::parts`], [`Collective::sends`], [`Collective::recvs`],
/// [`Collective::block`]) is computed from it when asked (by the executor, dumps and tests).
#[derive(Clone, Debug, Serialize)]
pub struct Collective {
    /// Which collective.
    pub op: CollectiveOp,
    /// The root rank (gather: the consumer; broadcast, scatter: the producer).
    pub root: Option<usize>,
    /// The number of ranks.
    pub ranks: usize,
    /// The buffer's extent.
    pub extent: Index,
    /// The forwarded cells (every cell the consumer task reads of them, all last written by
    /// the producer).
    pub region: Region,
    /// The producer task's split and its writing accessor: who holds each forwarded cell.
    pub producer: SplitAccess,
    /// The consumer task's split and its reading accessor: who needs which cells.
    pub consumer: SplitAccess,
}

impl PartialEq for Collective {
    fn eq(&self, other: &Self) -> bool {
        (self.op, self.root, self.ranks, self.extent, &self.region) == (other.op, other.root, other.ranks, other.extent, &other.region)
            && (0..self.ranks).all(|r| self.written(r) == other.written(r) && self.read(r) == other.read(r))
    }
}

impl Collective {
    /// The forwarded cells `rank` wrote (its producer chunk's writes).
    pub fn written(&self, rank: usize) -> Region {
        self.producer.region(self.ranks, rank, self.extent).intersection(&self.region)
    }

    /// The forwarded cells `rank`'s consumer chunk reads.
    pub fn read(&self, rank: usize) -> Region {
        self.consumer.region(self.ranks, rank, self.extent).intersection(&self.region)
    }

    /// The cells `from` sends `to` (none to itself): what `from` wrote of what `to` reads.
    /// Sender and receiver compute it with this one function, so both see the same boxes in
    /// the same order (the layout of the bytes on the wire).
    pub fn block(&self, from: usize, to: usize) -> Region {
        if from == to {
            return Region::empty();
        }
        self.written(from).intersection(&self.read(to))
    }

    /// Per rank: the cells it contributes (gather, all-gather, all-to-all) or receives
    /// (broadcast, scatter): the per-rank counts of the v-forms.
    pub fn parts(&self) -> Vec<PeerRegion> {
        let part = |r: usize| match self.op {
            CollectiveOp::Broadcast | CollectiveOp::Scatter => self.read(r),
            _ => self.written(r),
        };
        (0..self.ranks).map(|r| PeerRegion { rank: r, region: part(r) }).collect()
    }

    /// What `me` sends, per peer (peers with nothing to get are left out).
    pub fn sends(&self, me: usize) -> Vec<PeerRegion> {
        (0..self.ranks).map(|s| PeerRegion { rank: s, region: self.block(me, s) }).filter(|p| !p.region.is_empty()).collect()
    }

    /// What `me` receives, per peer (peers with nothing to give are left out).
    pub fn recvs(&self, me: usize) -> Vec<PeerRegion> {
        (0..self.ranks).map(|s| PeerRegion { rank: s, region: self.block(s, me) }).filter(|p| !p.region.is_empty()).collect()
    }
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
    let at = |k: usize| crate::mapper::even_part_start(len, parts, k, granularity);
    (at(i), at(i + 1))
}

/// A buffer's cells last written by one task whose writes are described by its split, not
/// listed per rank: the owner of a cell is the rank whose chunk's writer region holds it, and
/// a rank holds an up-to-date copy if it owns the cell or one of `readers` gave it the cell
/// (a collective delivered what that rank's consumer chunk reads). Creating, replacing and
/// extending a layer costs no per-rank work; the per-rank view is built from it only when a
/// point-to-point transfer needs it ([`CommandGraphGenerator::flush`]).
struct Layer {
    /// The cells (disjoint from every other layer of the buffer).
    region: Region,
    /// The task that wrote them.
    producer: TaskId,
    /// Its writing accessor and split.
    writer: SplitAccess,
    /// Consumers that received copies through collectives.
    readers: Vec<SplitAccess>,
}

/// At most this many layers per buffer; older ones are folded into the per-rank view.
const MAX_LAYERS: usize = 8;
/// At most this many collective readers per layer.
const MAX_READERS: usize = 4;

struct BufferView {
    /// The rank that wrote each cell last (None: never written), outside the layers.
    owner: RegionMap<Option<usize>>,
    /// Per rank, the cells it holds an up-to-date copy of, outside the layers.
    fresh: Vec<Region>,
    /// Writes described symbolically, newest last; they shadow `owner` and `fresh`.
    layers: Vec<Layer>,
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
    /// The commands kept: ids `first..first + commands.len()`.
    commands: Vec<Command>,
    first: usize,
    /// Ids below this were handed out by [`CommandGraphGenerator::take_new`].
    taken: usize,
    /// Keep handed-out commands (for dumps) instead of dropping them.
    keep_taken: bool,
    front: BTreeSet<CommandId>,
    effective_epoch: Option<CommandId>,
    last_horizon: Option<CommandId>,
    discovery: bool,
}

/// Per buffer, per rank: the cells whose prior contents the chunk needs, and the cells it writes.
type ChunkRegions = BTreeMap<BufferId, Vec<(Region, Region)>>;
/// Per buffer: this rank's (reads, writes).
type OwnRegions = BTreeMap<BufferId, (Region, Region)>;

/// How many ranks of `ranks` get a non-empty chunk of a task of this geometry, and which one
/// if only one does, in constant time (the closed form of [`split_chunk`]).
fn population(target: Target, range: Index, granularity: Index, ranks: usize) -> (usize, Option<usize>) {
    match target {
        Target::Master => (1, Some(0)),
        Target::Collective => {
            let n = ranks.min(range[0]);
            (n, (n == 1).then_some(0))
        }
        Target::Distributed(hint) => {
            let (rows, cols) = grid(hint, range, ranks);
            // `slab` gives min(parts, granules) non-empty parts; the last part is never empty.
            let filled = |len: usize, parts: usize, g: usize| parts.min(len.div_ceil(g.max(1)));
            let n = filled(range[0], rows, granularity[0]) * filled(range[1], cols, granularity[1]);
            (n, (n == 1).then(|| (rows - 1) * cols + (cols - 1)))
        }
    }
}

/// True if the mapper maps every non-empty chunk of a task of range `range` to a non-empty
/// region of a buffer of extent `extent` (None: cannot tell without mapping every chunk).
fn maps_every_chunk(m: &RangeMapper, range: Index, extent: Index) -> Option<bool> {
    let fits = |perm: [usize; MAX_DIMS], whole: Option<usize>| (0..MAX_DIMS).all(|d| Some(d) == whole || range[perm[d]] <= extent[d]);
    match m {
        RangeMapper::All => Some(true),
        RangeMapper::Fixed(b) => Some(!b.intersection(&GridBox::full(extent)).is_empty()),
        RangeMapper::OneToOne | RangeMapper::Neighborhood(_) | RangeMapper::NeighborhoodAxes(_) => fits([0, 1, 2], None).then_some(true),
        RangeMapper::Slice(d) => fits([0, 1, 2], Some(*d)).then_some(true),
        RangeMapper::Transposed(a, b) => {
            let mut perm = [0, 1, 2];
            perm.swap(*a, *b);
            fits(perm, None).then_some(true)
        }
        // The mirrored chunk lies in the range, so in the buffer if the range fits.
        RangeMapper::Reverse => fits([0, 1, 2], None).then_some(true),
        // Every item of the range gets at least one granule if there are enough of them.
        RangeMapper::EvenSplit(g) => (extent[0].div_ceil((*g).max(1)) >= range[0]).then_some(true),
        RangeMapper::Custom(..) => None,
    }
}

/// The kernel dimensions a task's split cuts (the others every chunk has whole).
fn cut_dims(target: Target, range: Index) -> [bool; MAX_DIMS] {
    match target {
        Target::Distributed(hint) => [true, hint == SplitHint::Split2D && range[1] > 1, false],
        Target::Collective => [true, false, false],
        Target::Master => [false; MAX_DIMS],
    }
}

/// What `m` guarantees for the chunks of a task of this geometry
/// ([`RangeMapper::meta_for_split`] with the dimensions the split cuts).
fn split_meta(m: &RangeMapper, target: Target, range: Index) -> MapperMeta {
    m.meta_for_split(cut_dims(target, range))
}

/// True if distinct chunks of this split can never write the same cell through `m` (from the
/// metadata, refined by the split: `slice(d)` when the split does not cut dimension `d`).
fn writes_disjoint(m: &RangeMapper, target: Target, range: Index) -> bool {
    split_meta(m, target, range).non_overlapping
}

/// One collective that command generation decided on for a forward: the pattern, its root,
/// the reading accessor whose chunks say who needs what, the forwarded cells it moves, and
/// the consumer count (and the one consumer, if only one).
struct Planned<'t> {
    op: CollectiveOp,
    root: Option<usize>,
    reader: &'t Accessor,
    region: Region,
    consumers: usize,
    single_consumer: Option<usize>,
}

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
            first: 0,
            taken: 0,
            keep_taken: true,
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

    /// The commands kept, in order (a valid execution order): every command generated so far
    /// while handed-out commands are kept (the default), else those not yet handed out.
    pub fn commands(&self) -> &[Command] {
        &self.commands
    }

    /// Keeps the commands [`CommandGraphGenerator::take_new`] hands out (on, the default: for
    /// dumps and tests) or drops them (off: a live rank, whose command graph must not grow
    /// with the length of the program).
    pub fn keep_taken(&mut self, on: bool) {
        self.keep_taken = on;
        if !on {
            let done = self.taken - self.first;
            self.commands.drain(..done);
            self.first = self.taken;
        }
    }

    /// The commands generated since the last call, in order.
    pub fn take_new(&mut self) -> Vec<Command> {
        let start = self.taken - self.first;
        self.taken = self.first + self.commands.len();
        if self.keep_taken {
            self.commands[start..].to_vec()
        } else {
            self.first = self.taken;
            std::mem::take(&mut self.commands)
        }
    }

    /// The id the next command will get.
    fn next_id(&self) -> CommandId {
        CommandId(self.first + self.commands.len())
    }

    /// A command generated for the current task (never handed out yet).
    fn command_mut(&mut self, id: CommandId) -> &mut Command {
        &mut self.commands[id.0 - self.first]
    }

    /// Reader entries kept over all buffers (bounded by horizons).
    pub fn reader_entries(&self) -> usize {
        self.buffers.iter().map(|b| b.local_readers.len()).sum()
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
                layers: Vec::new(),
                written: everywhere,
                local_writer: RegionMap::new(info.extent, None),
                local_readers: Vec::new(),
            });
        }
    }

    fn extent(&self, buffer: BufferId) -> Index {
        self.buffers[buffer.0].owner.extent()
    }

    /// Every rank's reads and writes of every buffer the task accesses: O(ranks) region
    /// operations, computed only where a point-to-point transfer or a check needs them.
    fn chunk_regions(&self, task: &Task) -> ChunkRegions {
        let chunks: Vec<Chunk> = (0..self.ranks).map(|r| chunk_of(task, self.ranks, r)).collect();
        let mut out: ChunkRegions = BTreeMap::new();
        for a in &task.accessors {
            let extent = self.extent(a.buffer);
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

    /// This rank's reads and writes of every buffer the task accesses.
    fn own_regions(&self, task: &Task, chunk: &Chunk) -> OwnRegions {
        let mut out = OwnRegions::new();
        for a in &task.accessors {
            let region = a.mapper.map(chunk, self.extent(a.buffer));
            let entry: &mut (Region, Region) = out.entry(a.buffer).or_default();
            if a.mode.needs_prior_contents() {
                entry.0 = entry.0.union(&region);
            }
            if a.mode.writes() {
                entry.1 = entry.1.union(&region);
            }
        }
        out
    }

    /// The task's only writing accessor of `buffer`, if it has exactly one.
    fn sole_writer(task: &Task, buffer: BufferId) -> Option<&crate::task::Accessor> {
        let mut writers = task.accessors.iter().filter(|a| a.buffer == buffer && a.mode.writes());
        match (writers.next(), writers.next()) {
            (Some(a), None) => Some(a),
            _ => None,
        }
    }

    fn process_work(&mut self, graph: &TaskGraph, task: &Task) -> Result<(), GraphError> {
        let chunk = chunk_of(task, self.ranks, self.rank);
        let own = self.own_regions(task, &chunk);
        let mut all: Option<ChunkRegions> = None;
        let (producers, _) = population(task.target, task.range, task.granularity, self.ranks);
        // Writes that the split and metadata prove disjoint need no per-rank check.
        for &buffer in own.keys() {
            let writers = task.accessors.iter().filter(|a| a.buffer == buffer && a.mode.writes()).count();
            let proven = writers == 0
                || producers <= 1
                || Self::sole_writer(task, buffer).is_some_and(|a| writes_disjoint(&a.mapper, task.target, task.range));
            if !proven {
                let regions = all.get_or_insert_with(|| self.chunk_regions(task));
                check_overlapping_writes(task, buffer, &regions[&buffer])?;
            }
        }
        for &buffer in own.keys() {
            if !task.accessors.iter().any(|a| a.buffer == buffer && a.mode.needs_prior_contents()) {
                continue;
            }
            if self.discovery {
                if let Some(f) = task.forwards.iter().find(|f| f.buffer == buffer) {
                    // The forward covers every cell the task reads of this buffer: once it is
                    // a collective, nothing is left for push / await-push.
                    if self.materialise(graph, task, f, &mut all) {
                        continue;
                    }
                }
            }
            if self.reads_own_copy(task, buffer) {
                continue;
            }
            self.flush(buffer);
            let regions = all.get_or_insert_with(|| self.chunk_regions(task));
            self.transfers(task.id, buffer, &regions[&buffer]);
        }
        self.execution(task, chunk, &own);
        for &buffer in own.keys() {
            if task.accessors.iter().any(|a| a.buffer == buffer && a.mode.writes()) {
                self.record_writes(task, buffer, &mut all);
            }
        }
        Ok(())
    }

    /// True if every rank already holds what the task's chunk reads of `buffer`, decided
    /// without per-rank work: one reading accessor whose cells lie in one layer, and the
    /// layer's writer or one of its collective readers had the same geometry and mapper (each
    /// rank reads what it wrote or was given).
    fn reads_own_copy(&self, task: &Task, buffer: BufferId) -> bool {
        let mut readers = task.accessors.iter().filter(|a| a.buffer == buffer && a.mode.needs_prior_contents());
        let (Some(reader), None) = (readers.next(), readers.next()) else { return false };
        if matches!(reader.mapper, RangeMapper::Custom(..)) {
            return false;
        }
        let reads = reader.mapper.map(&Chunk::whole(task.range), self.extent(buffer));
        let same = |a: &SplitAccess| {
            a.target == task.target && a.range == task.range && a.granularity == task.granularity && a.mapper.same_as(&reader.mapper)
        };
        self.buffers[buffer.0]
            .layers
            .iter()
            .any(|l| reads.difference(&l.region).is_empty() && (same(&l.writer) || l.readers.iter().any(same)))
    }

    /// Records the task's writes of `buffer` in the global view: a new layer when one
    /// accessor of a built-in mapper wrote (no per-rank work), else per rank.
    fn record_writes(&mut self, task: &Task, buffer: BufferId, all: &mut Option<ChunkRegions>) {
        let extent = self.extent(buffer);
        let writer = Self::sole_writer(task, buffer).map(|a| SplitAccess {
            target: task.target,
            range: task.range,
            granularity: task.granularity,
            mapper: a.mapper.clone(),
        });
        if let Some(writer) = writer {
            if let Some(region) = writer.union_of_chunks(extent) {
                let view = &mut self.buffers[buffer.0];
                if region.is_empty() {
                    return;
                }
                view.written = view.written.union(&region);
                for l in &mut view.layers {
                    if l.region.intersects(&region) {
                        l.region = l.region.difference(&region);
                    }
                }
                view.layers.retain(|l| !l.region.is_empty());
                view.layers.push(Layer { region, producer: task.id, writer, readers: Vec::new() });
                if view.layers.len() > MAX_LAYERS {
                    self.flush_oldest(buffer);
                }
                return;
            }
        }
        self.flush(buffer);
        let regions = all.get_or_insert_with(|| self.chunk_regions(task));
        let per_rank = &regions[&buffer];
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
            return;
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

    /// Folds every layer of `buffer` into the per-rank view (O(ranks) per layer): what a
    /// point-to-point transfer or a per-rank write needs first.
    fn flush(&mut self, buffer: BufferId) {
        while !self.buffers[buffer.0].layers.is_empty() {
            self.flush_oldest(buffer);
        }
    }

    fn flush_oldest(&mut self, buffer: BufferId) {
        let extent = self.extent(buffer);
        let ranks = self.ranks;
        let view = &mut self.buffers[buffer.0];
        let layer = view.layers.remove(0);
        let mut owners = Vec::new();
        for (s, fresh) in view.fresh.iter_mut().enumerate() {
            let mine = layer.writer.region(ranks, s, extent).intersection(&layer.region);
            let mut held = mine.clone();
            for reader in &layer.readers {
                held = held.union(&reader.region(ranks, s, extent).intersection(&layer.region));
            }
            if fresh.intersects(&layer.region) {
                *fresh = fresh.difference(&layer.region);
            }
            if !held.is_empty() {
                *fresh = fresh.union(&held);
            }
            if !mine.is_empty() {
                owners.push((mine, Some(s)));
            }
        }
        view.owner.update_many(&owners);
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

    /// Turns a forward into collective commands when the chunk counts and the mappers'
    /// metadata match a pattern (decided in constant time with built-in mappers); otherwise
    /// leaves the transfer to push / await-push. A task that reads the buffer through several
    /// accessors gets one collective per accessor that needs data (see
    /// [`CommandGraphGenerator::plan`]), or none at all. A command carries the producer's and
    /// consumer's split accesses, not per-rank regions; when the forwarded cells lie in one
    /// layer of the producer, the view records the delivery in that layer, so with built-in
    /// mappers a collective costs no per-rank work at all.
    fn materialise(&mut self, graph: &TaskGraph, task: &Task, f: &Forward, all: &mut Option<ChunkRegions>) -> bool {
        let Some(pmap) = &f.producer_mapper else { return false };
        let extent = graph.buffer(f.buffer).map_or([0; MAX_DIMS], |b| b.extent);
        let mut readers = task.accessors.iter().filter(|a| a.buffer == f.buffer && a.mode.needs_prior_contents());
        if let (Some(reader), None) = (readers.next(), readers.next()) {
            // The common case, without the bookkeeping of several accessors.
            let Some(p) = self.pattern(task, f, pmap, reader, f.region.clone(), extent) else { return false };
            self.emit_collective(task, f, pmap, extent, p, all);
            return true;
        }
        let Some(plan) = self.plan(task, f, pmap, extent) else { return false };
        for p in plan {
            self.emit_collective(task, f, pmap, extent, p, all);
        }
        true
    }

    /// The collectives that deliver everything `task` reads of the forwarded cells through
    /// several reading accessors, or None if some part fits no pattern (then the whole buffer
    /// goes point to point).
    ///
    /// If one accessor is constant for the consumer's split and covers every forwarded cell
    /// (a matrix product reading A with `slice(1)` and `slice(0)` along a 1D split), every
    /// rank reads all of them anyway, so that accessor's pattern moves everything (the merged
    /// requirement). Otherwise each accessor on its own: one that reads, on every rank, just
    /// what that rank wrote (the producer's geometry and mapper) needs nothing; the others get
    /// a pattern each over their own cells, provided no two of them read a common cell (else
    /// a cell could arrive twice).
    fn plan<'t>(&self, task: &'t Task, f: &Forward, pmap: &RangeMapper, extent: Index) -> Option<Vec<Planned<'t>>> {
        let readers: Vec<&Accessor> = task.accessors.iter().filter(|a| a.buffer == f.buffer && a.mode.needs_prior_contents()).collect();
        let whole = Chunk::whole(task.range);
        let covering = readers.iter().find(|a| {
            split_meta(&a.mapper, task.target, task.range).constant && f.region.difference(&a.mapper.map(&whole, extent)).is_empty()
        });
        if let Some(reader) = covering {
            return Some(vec![self.pattern(task, f, pmap, reader, f.region.clone(), extent)?]);
        }
        let same_geometry =
            f.producer_target == task.target && f.producer_range == task.range && f.producer_granularity == task.granularity;
        let mut plan: Vec<Planned<'t>> = Vec::new();
        for reader in readers {
            if same_geometry && pmap.same_as(&reader.mapper) {
                continue; // every rank reads what it wrote
            }
            let region = reader.mapper.map(&whole, extent).intersection(&f.region);
            if region.is_empty() {
                continue;
            }
            if plan.iter().any(|p| p.region.intersects(&region)) {
                return None;
            }
            plan.push(self.pattern(task, f, pmap, reader, region, extent)?);
        }
        Some(plan)
    }

    /// The collective that moves `region` (forwarded cells, all read through `reader`) from
    /// the producer's chunks to the ranks whose `reader` chunks read them, if the chunk counts
    /// and the mappers' metadata (refined by both splits) match a pattern.
    fn pattern<'t>(
        &self,
        task: &Task,
        f: &Forward,
        pmap: &RangeMapper,
        reader: &'t Accessor,
        region: Region,
        extent: Index,
    ) -> Option<Planned<'t>> {
        let pm = split_meta(pmap, f.producer_target, f.producer_range);
        let cm = split_meta(&reader.mapper, task.target, task.range);
        // Metadata alone rules most edges out (a halo read, a custom mapper) before any
        // O(ranks) work, so a stencil pays nothing for discovery.
        let identity_like = |m: &MapperMeta| m.dims.iter().all(|d| *d != DimMapping::Other);
        let p_disjoint = pm.non_overlapping;
        if pmap.meta() == MapperMeta::UNKNOWN
            || !(cm.constant || cm.non_overlapping || p_disjoint)
            || !(cm.constant || cm.non_overlapping || identity_like(&cm))
        {
            return None;
        }
        let ranks = self.ranks;
        // Producers: ranks with a non-empty producer chunk; consumers: ranks that read some of
        // the cells. Both in constant time where the geometry tells (every non-empty consumer
        // chunk reads something), by mapping every chunk otherwise.
        let (m, single_producer) = population(f.producer_target, f.producer_range, f.producer_granularity, ranks);
        let (c, single_consumer) = match maps_every_chunk(&reader.mapper, task.range, extent) {
            Some(true) => population(task.target, task.range, task.granularity, ranks),
            Some(false) => (0, None),
            None => {
                let reads = |r: usize| reader.mapper.map(&chunk_of(task, ranks, r), extent);
                let consumers: Vec<usize> = (0..ranks).filter(|&r| reads(r).intersects(&region)).collect();
                (consumers.len(), (consumers.len() == 1).then(|| consumers[0]))
            }
        };
        let full = m == ranks && c == ranks;
        let (op, root) = if m >= 2 && c == 1 && p_disjoint {
            (CollectiveOp::Gather, single_consumer)
        } else if full && m >= 2 && cm.constant && p_disjoint {
            (CollectiveOp::AllGather, None)
        } else if m == 1 && c >= 2 && cm.constant {
            (CollectiveOp::Broadcast, single_producer)
        } else if m == 1 && c >= 2 && cm.non_overlapping {
            (CollectiveOp::Scatter, single_producer)
        } else if full && m >= 2 && is_transposition(f, task, pmap, &reader.mapper) {
            (CollectiveOp::AllToAll, None)
        } else {
            return None;
        };
        Some(Planned { op, root, reader, region, consumers: c, single_consumer })
    }

    /// Emits this rank's command for one planned collective and records what it delivers.
    fn emit_collective(
        &mut self,
        task: &Task,
        f: &Forward,
        pmap: &RangeMapper,
        extent: Index,
        p: Planned<'_>,
        all: &mut Option<ChunkRegions>,
    ) {
        let coll = Collective {
            op: p.op,
            root: p.root,
            ranks: self.ranks,
            extent,
            region: p.region,
            producer: SplitAccess {
                target: f.producer_target,
                range: f.producer_range,
                granularity: f.producer_granularity,
                mapper: pmap.clone(),
            },
            consumer: SplitAccess {
                target: task.target,
                range: task.range,
                granularity: task.granularity,
                mapper: p.reader.mapper.clone(),
            },
        };
        let me = self.rank;
        // Cells forwarded are written by the producer alone and read by nobody since, so a
        // consumer lacks exactly the forwarded cells it reads that another rank wrote.
        let (mine, reads) = (coll.written(me), coll.read(me));
        let received = reads.difference(&mine);
        let sent = self.sent(&coll, p.consumers, p.single_consumer, &mine, &reads);
        let mut deps = self.true_deps(f.buffer, &sent);
        deps.extend(self.write_deps(f.buffer, &received));
        let consumer = coll.consumer.clone();
        let id = self.emit(CommandKind::Collective, task.id, Some(f.buffer), received.clone(), Vec::new(), deps);
        self.command_mut(id).collective = Some(coll);
        if !sent.is_empty() {
            self.buffers[f.buffer.0].local_readers.push((id, sent));
        }
        if !received.is_empty() {
            self.produced(f.buffer, &received, id);
        }
        self.delivered(f, consumer, all, task);
    }

    /// What this rank sends in a collective: the forwarded cells it wrote that another rank
    /// reads. In constant time for a constant consumer (everybody reads the same cells) and a
    /// built-in non-overlapping one (the others read what this rank does not); by peers
    /// otherwise.
    fn sent(&self, coll: &Collective, consumers: usize, single: Option<usize>, mine: &Region, reads: &Region) -> Region {
        if mine.is_empty() {
            return Region::empty();
        }
        let me = self.rank;
        let cmap = &coll.consumer.mapper;
        let meta = split_meta(cmap, coll.consumer.target, coll.consumer.range);
        if meta.constant {
            let another = consumers >= 2 || (consumers == 1 && single != Some(me));
            if !another {
                return Region::empty();
            }
            let everyone_reads = cmap.map(&Chunk::whole(coll.consumer.range), coll.extent).intersection(&coll.region);
            return mine.intersection(&everyone_reads);
        }
        if meta.non_overlapping && !matches!(cmap, RangeMapper::Custom(..)) {
            return mine.intersection(&coll.region.difference(reads));
        }
        (0..self.ranks).fold(Region::empty(), |acc, s| acc.union(&coll.block(me, s)))
    }

    /// Records in the global view that every consumer now holds the forwarded cells it reads:
    /// in the producer's layer when they all lie in it, else per rank.
    fn delivered(&mut self, f: &Forward, consumer: SplitAccess, all: &mut Option<ChunkRegions>, task: &Task) {
        let view = &mut self.buffers[f.buffer.0];
        let layer = view.layers.iter_mut().rev().find(|l| l.producer == f.producer && f.region.difference(&l.region).is_empty());
        if let Some(l) = layer {
            if l.readers.len() < MAX_READERS {
                l.readers.push(consumer);
                return;
            }
        }
        self.flush(f.buffer);
        let regions = all.get_or_insert_with(|| self.chunk_regions(task));
        let view = &mut self.buffers[f.buffer.0];
        for (s, (reads, _)) in regions[&f.buffer].iter().enumerate() {
            let got = reads.intersection(&f.region);
            if !got.is_empty() {
                view.fresh[s] = view.fresh[s].union(&got);
            }
        }
    }

    fn execution(&mut self, task: &Task, chunk: Chunk, own: &OwnRegions) {
        if chunk.as_box().is_empty() {
            return;
        }
        let mut deps = BTreeSet::new();
        let mut accesses = Vec::new();
        for a in &task.accessors {
            let extent = self.extent(a.buffer);
            accesses.push(CommandAccess { buffer: a.buffer, mode: a.mode, region: a.mapper.map(&chunk, extent) });
        }
        for (&buffer, (reads, writes)) in own {
            deps.extend(self.true_deps(buffer, reads));
            deps.extend(self.write_deps(buffer, writes));
        }
        let deps = strongest(deps);
        let id = self.next_id();
        for (&buffer, (reads, writes)) in own {
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
        let cmd = self.command_mut(id);
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
                crate::geometry::fold_old_readers(&mut view.local_readers, epoch);
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
        let id = self.next_id();
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

fn check_overlapping_writes(task: &Task, buffer: BufferId, per_rank: &[(Region, Region)]) -> Result<(), GraphError> {
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

/// What a [`Scheduler`] holds at one moment. In a live rank every count stays bounded in a
/// loop of any length (horizons drop old tasks and fold old readers; executed commands are
/// dropped); in a simulation that records for dumps, commands and recorded tasks grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Tasks in the task graph.
    pub tasks: usize,
    /// Reader entries in the task graph's per-buffer tracking.
    pub task_readers: usize,
    /// Commands kept, over all generated ranks.
    pub commands: usize,
    /// Reader entries in the command generators' per-buffer tracking.
    pub command_readers: usize,
    /// Tasks copied for dumps.
    pub recorded_tasks: usize,
}

/// Builds a task graph and the command graphs of chosen ranks as tasks are submitted.
pub struct Scheduler {
    graph: TaskGraph,
    generators: Vec<CommandGraphGenerator>,
    /// Every task made so far, kept for dumps (horizons drop old tasks from the graph).
    recorded: Option<Vec<Task>>,
    /// Warnings handed out by [`Scheduler::take_warnings`] while recording.
    warned: usize,
    program: ProgramPrint,
}

/// A fingerprint of the program submitted so far: its length and a hash of every buffer
/// creation, task structure (kind, target, range, granularity, accessors) and epoch, so that
/// ranks can check that they run the same program (names are left out: they only label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramPrint {
    /// Submissions so far (buffers, tasks and epochs).
    pub steps: u64,
    /// FNV-1a over their descriptions.
    pub hash: u64,
}

impl Default for ProgramPrint {
    fn default() -> Self {
        ProgramPrint { steps: 0, hash: 0xcbf2_9ce4_8422_2325 }
    }
}

impl std::fmt::Write for ProgramPrint {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for b in s.bytes() {
            self.hash = (self.hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Ok(())
    }
}

impl ProgramPrint {
    /// Adds one submission, described by its `Debug` forms (no allocation).
    fn add(&mut self, what: std::fmt::Arguments<'_>) {
        self.steps += 1;
        self.mix(what);
    }

    /// Adds more of the same submission's description.
    fn mix(&mut self, what: std::fmt::Arguments<'_>) {
        // Writing into the hasher cannot fail.
        let _ = std::fmt::Write::write_fmt(self, what);
    }
}

impl Scheduler {
    /// Generates the command graphs of all `ranks` ranks (a simulation, for tests and dumps).
    pub fn simulate(ranks: usize, horizon_step: usize) -> Result<Self, GraphError> {
        let generators = (0..ranks.max(1)).map(|r| CommandGraphGenerator::new(ranks, r)).collect::<Result<_, _>>()?;
        Ok(Scheduler {
            graph: TaskGraph::new(ranks, horizon_step),
            generators,
            recorded: Some(Vec::new()),
            warned: 0,
            program: ProgramPrint::default(),
        })
    }

    /// Generates only `rank`'s command graph (what a real rank does).
    pub fn for_rank(ranks: usize, rank: usize, horizon_step: usize) -> Result<Self, GraphError> {
        let mut generators = vec![CommandGraphGenerator::new(ranks, rank)?];
        generators[0].keep_taken(false);
        Ok(Scheduler {
            graph: TaskGraph::new(ranks, horizon_step),
            generators,
            recorded: None,
            warned: 0,
            program: ProgramPrint::default(),
        })
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
        let id = self.graph.create_buffer(dims, host_initialized)?;
        self.program.add(format_args!("buffer {dims:?} {host_initialized};"));
        Ok(id)
    }

    /// Submits a task and generates its commands (and a horizon's, if one follows).
    pub fn submit(&mut self, spec: crate::task::TaskSpec) -> Result<TaskId, GraphError> {
        let print = {
            let mut p = self.program;
            p.add(format_args!("{:?} {:?} {:?} {:?}", spec.kind, spec.target, spec.range, spec.granularity));
            for a in &spec.accessors {
                p.mix(format_args!(" {} {:?} {:?}", a.buffer.0, a.mode, a.mapper));
            }
            p
        };
        let id = self.graph.submit(spec)?;
        self.program = print;
        self.flush()?;
        Ok(id)
    }

    /// Submits an epoch.
    pub fn epoch(&mut self) -> Result<TaskId, GraphError> {
        let id = self.graph.epoch();
        self.program.add(format_args!("epoch;"));
        self.flush()?;
        Ok(id)
    }

    /// Keeps (or stops keeping) every task and every command for dumps; on by default in
    /// simulations, off for a single rank, where horizons drop old tasks and
    /// [`Scheduler::take_commands`] drops the commands it hands out, so that the scheduler's
    /// memory does not grow with the length of the program.
    pub fn record_tasks(&mut self, on: bool) {
        if on != self.recorded.is_some() {
            self.recorded = on.then(Vec::new);
        }
        for g in &mut self.generators {
            g.keep_taken(on);
        }
    }

    /// Warnings (reads of never-written cells) since the last call. While recording, the
    /// task graph keeps them for dumps; otherwise they are handed out once and forgotten.
    pub fn take_warnings(&mut self) -> Vec<crate::task::Warning> {
        if self.recorded.is_some() {
            let new = self.graph.warnings()[self.warned..].to_vec();
            self.warned += new.len();
            new
        } else {
            self.graph.take_warnings()
        }
    }

    /// Every task made while recording was on, in order (see [`Scheduler::record_tasks`]).
    pub fn recorded_tasks(&self) -> &[Task] {
        self.recorded.as_deref().unwrap_or(&[])
    }

    /// The fingerprint of the program submitted so far (what [`crate::DistrQueue::sync`]
    /// compares across ranks).
    pub fn program_print(&self) -> ProgramPrint {
        self.program
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

    /// The command graph of `rank` as far as it is kept (see [`Scheduler::record_tasks`]),
    /// if this scheduler generates it.
    pub fn commands(&self, rank: usize) -> Option<&[Command]> {
        self.generators.iter().find(|g| g.rank == rank).map(|g| g.commands())
    }

    /// The commands of `rank` generated since the last call (what an executor runs next), if
    /// this scheduler generates them.
    pub fn take_commands(&mut self, rank: usize) -> Option<Vec<Command>> {
        self.generators.iter_mut().find(|g| g.rank == rank).map(|g| g.take_new())
    }

    /// What the scheduler holds now: the measure of whether horizons bound it.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            tasks: self.graph.live_tasks(),
            task_readers: self.graph.reader_entries(),
            commands: self.generators.iter().map(|g| g.commands.len()).sum(),
            command_readers: self.generators.iter().map(|g| g.reader_entries()).sum(),
            recorded_tasks: self.recorded.as_ref().map_or(0, Vec::len),
        }
    }

    /// The generated command graphs, one per generated rank.
    pub fn rank_graphs(&self) -> Vec<RankGraph> {
        self.generators.iter().map(|g| RankGraph { rank: g.rank, commands: g.commands.clone() }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The closed forms and metadata that let discovery skip per-rank work (population,
    /// coverage, disjoint writes, constant reads) agree with mapping every chunk.
    #[test]
    fn population_and_coverage_match_every_chunk() {
        let targets =
            [Target::Distributed(SplitHint::Split1D), Target::Distributed(SplitHint::Split2D), Target::Master, Target::Collective];
        let mappers = [
            RangeMapper::OneToOne,
            RangeMapper::All,
            RangeMapper::Slice(0),
            RangeMapper::Slice(1),
            RangeMapper::Transposed(0, 1),
            RangeMapper::Neighborhood([1, 0, 0]),
            RangeMapper::Fixed(GridBox::new([2, 0, 0], [3, 1, 1])),
            RangeMapper::Reverse,
            RangeMapper::EvenSplit(1),
            RangeMapper::EvenSplit(4),
        ];
        for ranks in 1..=12 {
            for target in targets {
                // A collective task's range is one item per rank (the task graph sets it).
                let ranges = match target {
                    Target::Collective => vec![[ranks, 1, 1]],
                    _ => vec![[1, 1, 1], [3, 1, 1], [7, 5, 1], [40, 1, 1], [9, 9, 1], [2, 30, 1], [2, 3, 1]],
                };
                for range in ranges {
                    for granularity in [[1, 1, 1], [4, 1, 1], [2, 3, 1]] {
                        let chunks: Vec<Chunk> = (0..ranks).map(|r| split_chunk(target, range, granularity, ranks, r)).collect();
                        let filled: Vec<usize> = (0..ranks).filter(|&r| !chunks[r].as_box().is_empty()).collect();
                        let (n, single) = population(target, range, granularity, ranks);
                        let what = format!("{target:?} {range:?} g {granularity:?} on {ranks}");
                        assert_eq!(n, filled.len(), "{what}");
                        assert_eq!(single, (filled.len() == 1).then(|| filled[0]), "{what}");
                        for m in &mappers {
                            for extent in [[40, 30, 1], [5, 5, 1]] {
                                let reading: Vec<usize> =
                                    filled.iter().copied().filter(|&r| !m.map(&chunks[r], extent).is_empty()).collect();
                                if maps_every_chunk(m, range, extent) == Some(true) {
                                    assert_eq!(reading, filled, "{what}: {m:?} over {extent:?}");
                                }
                                if maps_every_chunk(m, range, extent) == Some(false) {
                                    assert!(reading.is_empty(), "{what}: {m:?} over {extent:?}");
                                }
                                let union = filled.iter().fold(Region::empty(), |acc, &r| acc.union(&m.map(&chunks[r], extent)));
                                let access = SplitAccess { target, range, granularity, mapper: m.clone() };
                                assert_eq!(access.union_of_chunks(extent), Some(union), "{what}: {m:?} over {extent:?}");
                                let disjoint = (0..filled.len()).all(|i| {
                                    (i + 1..filled.len())
                                        .all(|j| !m.map(&chunks[filled[i]], extent).intersects(&m.map(&chunks[filled[j]], extent)))
                                });
                                if writes_disjoint(m, target, range) {
                                    assert!(disjoint, "{what}: {m:?} over {extent:?} said disjoint");
                                }
                                if split_meta(m, target, range).constant {
                                    let first = filled.first().map(|&r| m.map(&chunks[r], extent));
                                    assert!(
                                        filled.iter().all(|&r| Some(m.map(&chunks[r], extent)) == first),
                                        "{what}: {m:?} over {extent:?} said constant"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
