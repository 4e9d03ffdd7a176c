//! The task graph: buffers, tasks with accessors, and the dependencies between tasks.
//!
//! Every rank builds the same task graph from the same program, with no communication: the
//! graph depends only on the sequence of submissions. Dependencies are found per buffer region
//! from a map of last writers (true dependencies: read after write; output: write after write)
//! and the readers since the last write (anti: write after read). Horizons, inserted every
//! `horizon_step` tasks, bound the graph in long loops: when a new horizon is made, the previous
//! one becomes the effective epoch, every reference to an older task is redirected to it and
//! the older tasks are dropped.

use crate::geometry::{GridBox, Index, Region, RegionMap, MAX_DIMS};
use crate::mapper::RangeMapper;
use crate::GraphError;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Identifies a buffer (the order of creation, the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct BufferId(pub usize);

/// Identifies a task (the order of submission, the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TaskId(pub usize);

/// How an accessor uses the buffer cells its mapper names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessMode {
    /// Reads the current contents.
    Read,
    /// Writes some or all of the mapped cells; the cells it leaves alone keep their values. As
    /// in Celerity (and SYCL), this makes it a consumer as well as a producer: the prior
    /// contents of every mapped cell are brought in before the task runs, exactly as for
    /// `ReadWrite`. A task that overwrites every mapped cell should say `DiscardWrite`, which
    /// moves nothing.
    Write,
    /// Reads and writes.
    ReadWrite,
    /// Overwrites every mapped cell; prior contents are not needed.
    DiscardWrite,
    /// Reads and writes, but prior contents are not needed.
    DiscardReadWrite,
}

impl AccessMode {
    /// True if the task needs the contents the cells had before it ran (Celerity's consumer
    /// modes: every mode but the discarding ones).
    pub fn needs_prior_contents(self) -> bool {
        matches!(self, AccessMode::Read | AccessMode::Write | AccessMode::ReadWrite)
    }

    /// True if the task changes the cells.
    pub fn writes(self) -> bool {
        !matches!(self, AccessMode::Read)
    }
}

/// One declared access of a task to a buffer.
#[derive(Clone, Debug)]
pub struct Accessor {
    /// The buffer accessed.
    pub buffer: BufferId,
    /// Which cells a chunk accesses.
    pub mapper: RangeMapper,
    /// How they are accessed.
    pub mode: AccessMode,
}

/// How a distributed task's range is divided among the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitHint {
    /// Contiguous slabs along dimension 0.
    Split1D,
    /// A grid of tiles over dimensions 0 and 1 (1D if the range has one dimension).
    Split2D,
}

/// Where a task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The range is split across all ranks.
    Distributed(SplitHint),
    /// The whole range runs on rank 0.
    Master,
    /// Every rank runs once; rank `r` gets the chunk `[r, r+1)` of the range `[ranks]`.
    Collective,
}

/// What a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// A kernel over a range (`parallel_for`).
    Kernel,
    /// A host task (on the master rank or collective).
    HostTask,
    /// Hands buffer regions back to the host on every rank.
    Fence,
    /// Orders everything before it before everything after it, on every rank.
    Epoch,
    /// Like an epoch, inserted automatically to bound the graph.
    Horizon,
}

/// Why one task depends on another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DepKind {
    /// Reads what the other wrote.
    True,
    /// Writes what the other read.
    Anti,
    /// Writes what the other wrote.
    Output,
    /// Ordering only (epochs, horizons).
    Order,
}

/// An edge of the task graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct TaskDep {
    /// The task depended on.
    pub task: TaskId,
    /// Why.
    pub kind: DepKind,
}

/// A buffer of 1–3 dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BufferInfo {
    /// Its id.
    pub id: BufferId,
    /// Its extent (unused dimensions 1).
    pub extent: Index,
    /// How many dimensions it has.
    pub dims: usize,
    /// True if created from host data (present and identical on every rank).
    pub host_initialized: bool,
}

/// A task as submitted (before it gets an id and dependencies).
#[derive(Clone, Debug)]
pub struct TaskSpec {
    /// Kernel, host task or fence.
    pub kind: TaskKind,
    /// Where it runs.
    pub target: Target,
    /// Its global range (unused dimensions 1).
    pub range: Index,
    /// Its accessors.
    pub accessors: Vec<Accessor>,
    /// A name for dumps and errors.
    pub name: String,
    /// Chunk boundaries of a split fall on multiples of this, per dimension (1: anywhere).
    pub granularity: Index,
}

impl TaskSpec {
    /// `parallel_for(range, ...)` split along dimension 0.
    pub fn parallel_for(name: &str, range: &[usize]) -> Self {
        Self::new(TaskKind::Kernel, Target::Distributed(SplitHint::Split1D), range, name)
    }

    /// A host task that runs the whole `range` on rank 0.
    pub fn master_host_task(name: &str, range: &[usize]) -> Self {
        Self::new(TaskKind::HostTask, Target::Master, range, name)
    }

    /// A host task that runs once on every rank (chunk `[rank, rank+1)` of `[ranks]`; the task
    /// graph sets the range).
    pub fn collective_host_task(name: &str) -> Self {
        Self::new(TaskKind::HostTask, Target::Collective, &[1], name)
    }

    /// A fence handing `region` of `buffer` back to the host on every rank.
    pub fn fence(name: &str, buffer: BufferId, region: GridBox) -> Self {
        Self::new(TaskKind::Fence, Target::Collective, &[1], name).access(buffer, RangeMapper::Fixed(region), AccessMode::Read)
    }

    fn new(kind: TaskKind, target: Target, range: &[usize], name: &str) -> Self {
        let mut r = [1; MAX_DIMS];
        for (d, &x) in range.iter().take(MAX_DIMS).enumerate() {
            r[d] = x;
        }
        // A range of more than three dimensions is kept visible for validation.
        if range.len() > MAX_DIMS || range.is_empty() {
            r = [0; MAX_DIMS];
        }
        TaskSpec { kind, target, range: r, accessors: Vec::new(), name: name.to_string(), granularity: [1; MAX_DIMS] }
    }

    /// Sets the split hint of a distributed task.
    pub fn split(mut self, hint: SplitHint) -> Self {
        if let Target::Distributed(_) = self.target {
            self.target = Target::Distributed(hint);
        }
        self
    }

    /// Makes every chunk boundary of a split fall on a multiple of `g[d]` along dimension `d`
    /// (e.g. a kernel that works on tiles or vectors). Missing dimensions are 1.
    pub fn granularity(mut self, g: &[usize]) -> Self {
        let mut full = [1; MAX_DIMS];
        for (d, &x) in g.iter().take(MAX_DIMS).enumerate() {
            full[d] = x;
        }
        if g.len() > MAX_DIMS || g.is_empty() {
            full = [0; MAX_DIMS];
        }
        self.granularity = full;
        self
    }

    /// Declares an accessor.
    pub fn access(mut self, buffer: BufferId, mapper: RangeMapper, mode: AccessMode) -> Self {
        self.accessors.push(Accessor { buffer, mapper, mode });
        self
    }
}

/// A task of the graph.
#[derive(Clone, Debug)]
pub struct Task {
    /// Its id.
    pub id: TaskId,
    /// Kernel, host task, fence, epoch or horizon.
    pub kind: TaskKind,
    /// Where it runs.
    pub target: Target,
    /// Its global range.
    pub range: Index,
    /// Its accessors.
    pub accessors: Vec<Accessor>,
    /// The tasks it waits for.
    pub deps: Vec<TaskDep>,
    /// Its name.
    pub name: String,
    /// Chunk boundaries fall on multiples of this per dimension.
    pub granularity: Index,
    /// Forward nodes (collective pattern discovery): the reads of this task that create the
    /// first dependency on a producer's region, where the edge may need communication.
    pub forwards: Vec<Forward>,
}

/// A forward node of the task graph (the paper's Algorithm 1): the data a task reads that one
/// producer task wrote last and that no task has read since, with what command generation needs
/// to turn the transfer into a collective after work assignment. Built identically on every rank.
#[derive(Clone, Debug)]
pub struct Forward {
    /// The buffer.
    pub buffer: BufferId,
    /// The producer task.
    pub producer: TaskId,
    /// The cells forwarded (the consumer's reads, all last written by the producer).
    pub region: Region,
    /// The producer's only writing accessor on the buffer (None if it had several).
    pub producer_mapper: Option<RangeMapper>,
    /// Where the producer ran.
    pub producer_target: Target,
    /// The producer's range.
    pub producer_range: Index,
    /// The producer's granularity.
    pub producer_granularity: Index,
}

/// A diagnostic that does not stop the program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The task that read.
    pub task: TaskId,
    /// The buffer read.
    pub buffer: BufferId,
    /// The cells read (or consumed by a `write` accessor) that no task and no host data ever
    /// wrote.
    pub region: Region,
}

struct BufferTrack {
    info: BufferInfo,
    last_writers: RegionMap<Option<TaskId>>,
    readers: Vec<(TaskId, Region)>,
}

/// The task graph, built from submissions; identical on every rank.
pub struct TaskGraph {
    ranks: usize,
    buffers: Vec<BufferTrack>,
    tasks: BTreeMap<TaskId, Task>,
    next_id: usize,
    front: BTreeSet<TaskId>,
    effective_epoch: Option<TaskId>,
    last_horizon: Option<TaskId>,
    horizon_step: usize,
    since_horizon: usize,
    new_tasks: Vec<TaskId>,
    warnings: Vec<Warning>,
}

impl TaskGraph {
    /// An empty graph for a program on `ranks` ranks that inserts a horizon every
    /// `horizon_step` tasks (0: never). The rank count only sizes collective tasks' ranges.
    pub fn new(ranks: usize, horizon_step: usize) -> Self {
        TaskGraph {
            ranks: ranks.max(1),
            buffers: Vec::new(),
            tasks: BTreeMap::new(),
            next_id: 0,
            front: BTreeSet::new(),
            effective_epoch: None,
            last_horizon: None,
            horizon_step,
            since_horizon: 0,
            new_tasks: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Creates a buffer of 1–3 dimensions; `host_initialized` if it starts from host data.
    pub fn create_buffer(&mut self, dims: &[usize], host_initialized: bool) -> Result<BufferId, GraphError> {
        if dims.is_empty() || dims.len() > MAX_DIMS || dims.contains(&0) {
            return Err(GraphError::InvalidArgument(format!("a buffer has 1 to 3 non-zero dimensions, got {dims:?}")));
        }
        let id = BufferId(self.buffers.len());
        let extent = crate::geometry::extent(dims);
        let info = BufferInfo { id, extent, dims: dims.len(), host_initialized };
        self.buffers.push(BufferTrack { info, last_writers: RegionMap::new(extent, None), readers: Vec::new() });
        Ok(id)
    }

    /// The buffer `id`, if it exists.
    pub fn buffer(&self, id: BufferId) -> Option<&BufferInfo> {
        self.buffers.get(id.0).map(|b| &b.info)
    }

    /// The live task `id` (tasks before the effective epoch are dropped).
    pub fn task(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id)
    }

    /// The live tasks, in submission order.
    pub fn tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks.values()
    }

    /// The id the next task will get.
    pub fn next_task_id(&self) -> TaskId {
        TaskId(self.next_id)
    }

    /// The number of ranks the graph is built for.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Every buffer, in order of creation.
    pub fn buffers(&self) -> impl Iterator<Item = &BufferInfo> {
        self.buffers.iter().map(|b| &b.info)
    }

    /// How many tasks the graph holds now.
    pub fn live_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Warnings so far (reads of never-written data), or since the last
    /// [`TaskGraph::take_warnings`].
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// Hands out the warnings so far and forgets them (a live queue logs them; keeping them
    /// would grow without bound in a loop that keeps reading unwritten cells).
    pub fn take_warnings(&mut self) -> Vec<Warning> {
        std::mem::take(&mut self.warnings)
    }

    /// Reader entries kept over all buffers (bounded by horizons, see `Scheduler::footprint`).
    pub fn reader_entries(&self) -> usize {
        self.buffers.iter().map(|b| b.readers.len()).sum()
    }

    /// Ids of the tasks made since the last call (submitted tasks and horizons), in order.
    pub fn take_new_tasks(&mut self) -> Vec<TaskId> {
        std::mem::take(&mut self.new_tasks)
    }

    /// Adds a task, computing its dependencies; may add a horizon after it.
    pub fn submit(&mut self, mut spec: TaskSpec) -> Result<TaskId, GraphError> {
        if spec.target == Target::Collective {
            spec.range = [self.ranks, 1, 1];
        }
        self.validate(&spec)?;
        let id = self.allocate();
        let mut deps = BTreeSet::new();
        let mut forwards = Vec::new();
        for (buffer, reads, writes) in self.task_regions(&spec) {
            if let Some(f) = self.forward(&spec, buffer, &reads) {
                forwards.push(f);
            }
            self.record_accesses(id, buffer, &reads, &writes, &mut deps);
        }
        let deps = strongest(deps);
        self.insert(id, spec, deps);
        if let Some(t) = self.tasks.get_mut(&id) {
            t.forwards = forwards;
        }
        self.since_horizon += 1;
        if self.horizon_step > 0 && self.since_horizon >= self.horizon_step {
            self.horizon();
        }
        Ok(id)
    }

    /// Adds an epoch: it waits for every task so far and every later task waits for it.
    pub fn epoch(&mut self) -> TaskId {
        let id = self.barrier(TaskKind::Epoch, "epoch");
        self.apply_epoch(id);
        self.last_horizon = None;
        id
    }

    fn horizon(&mut self) {
        let id = self.barrier(TaskKind::Horizon, "horizon");
        self.since_horizon = 0;
        if let Some(previous) = self.last_horizon.replace(id) {
            self.apply_epoch(previous);
        }
    }

    fn barrier(&mut self, kind: TaskKind, name: &str) -> TaskId {
        let id = self.allocate();
        let deps = self.front.iter().map(|&t| TaskDep { task: t, kind: DepKind::Order }).collect();
        let spec = TaskSpec {
            kind,
            target: Target::Collective,
            range: [1; MAX_DIMS],
            accessors: Vec::new(),
            name: name.into(),
            granularity: [1; MAX_DIMS],
        };
        self.insert(id, spec, deps);
        id
    }

    /// Makes `epoch` the oldest task anything can depend on, and drops the tasks before it.
    fn apply_epoch(&mut self, epoch: TaskId) {
        let redirect = |t: TaskId| if t < epoch { epoch } else { t };
        for b in &mut self.buffers {
            b.last_writers.map_values(|w| w.map(redirect));
            crate::geometry::fold_old_readers(&mut b.readers, epoch);
        }
        self.effective_epoch = Some(epoch);
        self.tasks = self.tasks.split_off(&epoch);
    }

    fn allocate(&mut self) -> TaskId {
        let id = TaskId(self.next_id);
        self.next_id += 1;
        id
    }

    fn insert(&mut self, id: TaskId, spec: TaskSpec, mut deps: Vec<TaskDep>) {
        if deps.is_empty() {
            if let Some(e) = self.effective_epoch {
                deps.push(TaskDep { task: e, kind: DepKind::Order });
            }
        }
        for d in &deps {
            self.front.remove(&d.task);
        }
        self.front.insert(id);
        self.new_tasks.push(id);
        let task = Task {
            id,
            kind: spec.kind,
            target: spec.target,
            range: spec.range,
            accessors: spec.accessors,
            deps,
            name: spec.name,
            granularity: spec.granularity,
            forwards: Vec::new(),
        };
        self.tasks.insert(id, task);
    }

    /// The forward node for `spec` reading `reads` of `buffer`, if the read is the first
    /// dependency on one producer's region and the edge is not communication-free.
    fn forward(&self, spec: &TaskSpec, buffer: BufferId, reads: &Region) -> Option<Forward> {
        if reads.is_empty() {
            return None;
        }
        let track = &self.buffers[buffer.0];
        // The first dependency: nobody read these cells since they were written.
        if track.readers.iter().any(|(_, r)| r.intersects(reads)) {
            return None;
        }
        let mut producer = None;
        for (_, w) in track.last_writers.query(reads) {
            match (w, producer) {
                (None, _) => return None,
                (Some(t), None) => producer = Some(t),
                (Some(t), Some(p)) if t != p => return None,
                _ => {}
            }
        }
        let p = self.tasks.get(&producer?)?;
        let mut writers = p.accessors.iter().filter(|a| a.buffer == buffer && a.mode.writes());
        let producer_mapper = match (writers.next(), writers.next()) {
            (Some(a), None) => Some(a.mapper.clone()),
            _ => None,
        };
        let mut readers = spec.accessors.iter().filter(|a| a.buffer == buffer && a.mode.needs_prior_contents());
        let same_geometry = p.target == spec.target && p.range == spec.range && p.granularity == spec.granularity;
        if let (Some(pm), Some(r), None) = (&producer_mapper, readers.next(), readers.next()) {
            if same_geometry && pm.same_as(&r.mapper) {
                return None; // communication-free: every rank reads what it wrote
            }
        }
        Some(Forward {
            buffer,
            producer: p.id,
            region: reads.clone(),
            producer_mapper,
            producer_target: p.target,
            producer_range: p.range,
            producer_granularity: p.granularity,
        })
    }

    fn validate(&self, spec: &TaskSpec) -> Result<(), GraphError> {
        if spec.range.contains(&0) {
            return Err(GraphError::InvalidArgument(format!("task '{}': a range has 1 to 3 non-zero dimensions", spec.name)));
        }
        if spec.granularity.contains(&0) {
            return Err(GraphError::InvalidArgument(format!("task '{}': a granularity has 1 to 3 non-zero dimensions", spec.name)));
        }
        for a in &spec.accessors {
            if self.buffer(a.buffer).is_none() {
                return Err(GraphError::InvalidArgument(format!("task '{}': no buffer {}", spec.name, a.buffer.0)));
            }
            let dims_ok = match a.mapper {
                RangeMapper::Slice(d) => d < MAX_DIMS,
                RangeMapper::Transposed(x, y) => x < MAX_DIMS && y < MAX_DIMS,
                _ => true,
            };
            if !dims_ok {
                return Err(GraphError::InvalidArgument(format!("task '{}': mapper {:?} names a dimension over 2", spec.name, a.mapper)));
            }
            if let RangeMapper::EvenSplit(0) = a.mapper {
                return Err(GraphError::InvalidArgument(format!("task '{}': even_split needs a granularity of at least 1", spec.name)));
            }
        }
        Ok(())
    }

    /// Per accessed buffer: the cells whose prior contents the task needs, and the cells it writes
    /// (over its whole range).
    fn task_regions(&self, spec: &TaskSpec) -> Vec<(BufferId, Region, Region)> {
        let chunk = crate::mapper::Chunk::whole(spec.range);
        let mut per_buffer: BTreeMap<BufferId, (Region, Region)> = BTreeMap::new();
        for a in &spec.accessors {
            let extent = self.buffers[a.buffer.0].info.extent;
            let region = a.mapper.map(&chunk, extent);
            let entry = per_buffer.entry(a.buffer).or_default();
            if a.mode.needs_prior_contents() {
                entry.0 = entry.0.union(&region);
            }
            if a.mode.writes() {
                entry.1 = entry.1.union(&region);
            }
        }
        per_buffer.into_iter().map(|(b, (r, w))| (b, r, w)).collect()
    }

    fn record_accesses(&mut self, id: TaskId, buffer: BufferId, reads: &Region, writes: &Region, deps: &mut BTreeSet<TaskDep>) {
        let track = &mut self.buffers[buffer.0];
        let mut unwritten = Region::empty();
        for (b, w) in track.last_writers.query(reads) {
            match w {
                Some(t) => {
                    deps.insert(TaskDep { task: t, kind: DepKind::True });
                }
                None if !track.info.host_initialized => unwritten = unwritten.union(&Region::from_box(b)),
                None => {}
            }
        }
        if !unwritten.is_empty() {
            self.warnings.push(Warning { task: id, buffer, region: unwritten });
        }
        if !writes.is_empty() {
            for (t, r) in &track.readers {
                if r.intersects(writes) {
                    deps.insert(TaskDep { task: *t, kind: DepKind::Anti });
                }
            }
            for (_, w) in track.last_writers.query(writes) {
                if let Some(t) = w {
                    deps.insert(TaskDep { task: t, kind: DepKind::Output });
                }
            }
            track.last_writers.update(writes, Some(id));
            for (_, r) in &mut track.readers {
                *r = r.difference(writes);
            }
            track.readers.retain(|(_, r)| !r.is_empty());
        }
        let read_only = reads.difference(writes);
        if !read_only.is_empty() {
            track.readers.push((id, read_only));
        }
    }
}

/// One edge per task: the strongest reason (true before anti before output).
fn strongest(deps: BTreeSet<TaskDep>) -> Vec<TaskDep> {
    let mut by_task: BTreeMap<TaskId, DepKind> = BTreeMap::new();
    for d in deps {
        by_task.entry(d.task).and_modify(|k| *k = (*k).min(d.kind)).or_insert(d.kind);
    }
    by_task.into_iter().map(|(task, kind)| TaskDep { task, kind }).collect()
}
