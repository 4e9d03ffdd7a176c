//! A host executor: runs one rank's command graph as tasks are submitted, moving data with sucl
//! point-to-point transfers.
//!
//! Every rank holds a full-size host copy of each buffer (only the cells its commands produce or
//! receive are valid). Commands run in generation order, which respects every dependency. The
//! transfers of one task (its pushes and await-pushes, on every buffer) are posted together in
//! one nonblocking scope and waited for together; since every rank visits tasks in the same
//! order and each push of task t meets an await-push of task t, no rank can wait on a peer
//! that waits on it. A transfer is matched by a tag derived from its transfer id (task, buffer);
//! between one pair of ranks there is one message per transfer id, so concurrent transfers
//! never mix. A received message must be exactly the size its region says.

use crate::command::{Command, CommandKind, Scheduler};
use crate::geometry::{GridBox, Index, Region};
use crate::mapper::Chunk;
use crate::task::{BufferId, TaskId, TaskSpec};
use crate::GraphError;
use sucl_runtime::{Communicator, Element, MAX_TAG};

/// A host kernel: runs one chunk with mutable access to this rank's buffer copies.
pub type HostKernel<'k, T> = dyn FnMut(&Chunk, &mut [HostBuffer<T>]) + 'k;

/// One rank's host copy of a buffer (row-major over its 3D extent).
#[derive(Clone, Debug)]
pub struct HostBuffer<T> {
    /// The buffer's extent.
    pub extent: Index,
    /// Its cells.
    pub data: Vec<T>,
}

impl<T> HostBuffer<T> {
    /// The position of cell `p` in `data`.
    pub fn offset(&self, p: Index) -> usize {
        (p[0] * self.extent[1] + p[1]) * self.extent[2] + p[2]
    }
}

/// A distributed queue on host ranks: a scheduler for this rank plus an executor.
pub struct HostQueue<'c, T> {
    comm: &'c Communicator,
    scheduler: Scheduler,
    buffers: Vec<HostBuffer<T>>,
    executed: usize,
}

impl<'c, T: Element + Default> HostQueue<'c, T> {
    /// A queue over `comm`'s ranks with a horizon every `horizon_step` tasks.
    pub fn new(comm: &'c Communicator, horizon_step: usize) -> Result<Self, GraphError> {
        let scheduler = Scheduler::for_rank(comm.size(), comm.rank(), horizon_step)?;
        Ok(HostQueue { comm, scheduler, buffers: Vec::new(), executed: 0 })
    }

    /// Creates a buffer; with `init`, every rank starts from the same host data (row-major).
    pub fn create_buffer(&mut self, dims: &[usize], init: Option<Vec<T>>) -> Result<BufferId, GraphError> {
        let id = self.scheduler.create_buffer(dims, init.is_some())?;
        let extent = self.scheduler.graph().buffer(id).map(|b| b.extent).unwrap_or_default();
        let cells: usize = extent.iter().product();
        let data = match init {
            Some(d) if d.len() == cells => d,
            Some(d) => {
                return Err(GraphError::InvalidArgument(format!(
                    "buffer of extent {dims:?} has {cells} cells, initial data has {}",
                    d.len()
                )))
            }
            None => vec![T::default(); cells],
        };
        self.buffers.push(HostBuffer { extent, data });
        Ok(id)
    }

    /// Submits a task and runs this rank's commands for it; `kernel` runs on this rank's chunk.
    pub fn submit(&mut self, spec: TaskSpec, kernel: &mut HostKernel<'_, T>) -> Result<TaskId, GraphError> {
        let id = self.scheduler.submit(spec)?;
        self.run_pending(kernel)?;
        Ok(id)
    }

    /// Waits for every earlier task and returns this rank's copy of `region` of `buffer`
    /// (row-major within each box of the region, boxes in order).
    pub fn fence(&mut self, buffer: BufferId, region: GridBox) -> Result<Vec<T>, GraphError> {
        self.scheduler.submit(TaskSpec::fence("fence", buffer, region))?;
        self.run_pending(&mut |_, _| {})?;
        let b = self.buffers.get(buffer.0).ok_or_else(|| GraphError::InvalidArgument(format!("no buffer {}", buffer.0)))?;
        Ok(pack(b, &Region::from_box(region)))
    }

    fn run_pending(&mut self, kernel: &mut HostKernel<'_, T>) -> Result<(), GraphError> {
        let commands: Vec<Command> = self.scheduler.commands(self.comm.rank()).unwrap_or(&[])[self.executed..].to_vec();
        self.executed += commands.len();
        let mut i = 0;
        while i < commands.len() {
            let c = &commands[i];
            match c.kind {
                CommandKind::Push | CommandKind::AwaitPush => {
                    let end = commands[i..]
                        .iter()
                        .position(|c| !matches!(c.kind, CommandKind::Push | CommandKind::AwaitPush))
                        .map_or(commands.len(), |n| i + n);
                    self.transfer(&commands[i..end])?;
                    i = end;
                    continue;
                }
                CommandKind::Execution => {
                    if let Some(b) = c.chunk {
                        let chunk = Chunk { offset: b.min, range: b.range(), global: task_range(&self.scheduler, c.task, b) };
                        kernel(&chunk, &mut self.buffers);
                    }
                }
                CommandKind::Horizon | CommandKind::Epoch => {}
            }
            i += 1;
        }
        Ok(())
    }

    /// Posts every push and await-push of one task at once and waits for all of them.
    fn transfer(&mut self, commands: &[Command]) -> Result<(), GraphError> {
        let nbuf = self.buffers.len().max(1) as u64;
        let tag = |c: &Command| -> u32 {
            let id = c.task.0 as u64 * nbuf + c.buffer.map_or(0, |b| b.0 as u64);
            (id % (MAX_TAG as u64 + 1)) as u32
        };
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for c in commands {
            let buffer = c.buffer.ok_or_else(|| GraphError::InvalidArgument("a transfer names no buffer".into()))?;
            for p in &c.peers {
                match c.kind {
                    CommandKind::Push => sends.push((p.rank, tag(c), pack(&self.buffers[buffer.0], &p.region))),
                    _ => recvs.push((p.rank, tag(c), buffer, p.region.clone(), vec![T::default(); p.region.area()])),
                }
            }
        }
        let rank = self.comm.rank();
        self.comm.nonblocking(|scope| {
            let mut requests = Vec::new();
            for (peer, tag, data) in &sends {
                scope.isend(data, *peer, *tag)?;
            }
            for (peer, tag, _, region, data) in recvs.iter_mut() {
                requests.push((*peer, region.area(), scope.irecv(data, *peer, *tag)?));
            }
            for (peer, want, r) in requests {
                let got = r.wait()?;
                if got != want {
                    return Err(sucl_runtime::Error::Mismatch {
                        rank,
                        what: format!("transfer from rank {peer}: {got} elements, the region has {want}"),
                    });
                }
            }
            scope.wait_all()
        })?;
        for (_, _, buffer, region, data) in recvs {
            unpack(&mut self.buffers[buffer.0], &region, &data);
        }
        Ok(())
    }
}

fn task_range(s: &Scheduler, task: TaskId, chunk: GridBox) -> Index {
    s.graph().task(task).map_or(chunk.max, |t| t.range)
}

/// Visits the cells of `region` in a fixed order (boxes in order, row-major within a box).
fn for_cells(region: &Region, mut f: impl FnMut(Index)) {
    for b in region.boxes() {
        for x in b.min[0]..b.max[0] {
            for y in b.min[1]..b.max[1] {
                for z in b.min[2]..b.max[2] {
                    f([x, y, z]);
                }
            }
        }
    }
}

fn pack<T: Copy>(b: &HostBuffer<T>, region: &Region) -> Vec<T> {
    let mut out = Vec::with_capacity(region.area());
    for_cells(region, |p| out.push(b.data[b.offset(p)]));
    out
}

fn unpack<T: Copy>(b: &mut HostBuffer<T>, region: &Region, data: &[T]) {
    let mut i = 0;
    for_cells(region, |p| {
        let o = b.offset(p);
        b.data[o] = data[i];
        i += 1;
    });
}
