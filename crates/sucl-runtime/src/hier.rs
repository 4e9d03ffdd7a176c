//! Hierarchical collectives: for a communicator whose ranks sit on several hosts, several per
//! host, one call runs shared memory inside each host and tcp between hosts.
//!
//! The ranks form a grid: host `h` (hosts numbered by their lowest rank) and local index `l`
//! (position among that host's ranks, by rank). Every host has a shared-memory communicator of
//! its `L` ranks; every local index has a tcp communicator of the `H` ranks that hold it, one
//! per host. So each byte crosses the network once per host, carried by `L` connections in
//! parallel, and all other traffic stays in shared memory:
//!
//! - all_reduce: intra-host reduce-scatter → inter-host all_reduce of each slice by the ranks
//!   that own it → intra-host all_gather (a tail shorter than `L` elements: all_reduce inside,
//!   then across);
//! - broadcast: the root's local index broadcasts across hosts, then every host inside;
//! - reduce: reduce inside every host to the root's local index, then across to the root;
//! - all_gather: across hosts (each rank's block), then inside (each host's share), reordered;
//! - reduce_scatter: inside (each local index's blocks of every host), then across;
//! - barrier: inside, across, inside.
//!
//! Gather, scatter and all_to_all have no hierarchical form here: [`Hier::supports`] declines
//! them, so the communicator's default backend carries them. `avg` reduces with `sum` on every
//! level and divides once at the end, so integer averages round as on one level. The layout
//! needs the same number (≥ 2) of ranks on every one of ≥ 2 hosts; otherwise
//! [`Layout::of`] declines and selection never offers `hier`.

use sucl_core::backend::{Backend, CollDesc, CollOp, ReqId};
use sucl_core::dtype::finish_reduce;
use sucl_core::{Error, ReduceOp, Result};

/// The grid of a communicator's ranks over hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `at[h][l]`: the communicator rank with local index `l` on host `h`.
    pub at: Vec<Vec<usize>>,
    /// Per communicator rank: its host and local index.
    pub pos: Vec<(usize, usize)>,
}

impl Layout {
    /// The grid of ranks whose hosts are `hosts` (by communicator rank), or `None` unless there
    /// are at least two hosts with the same number, at least two, of ranks each.
    pub fn of<S: AsRef<str>>(hosts: &[S]) -> Option<Layout> {
        let mut names: Vec<&str> = vec![];
        let mut at: Vec<Vec<usize>> = vec![];
        let mut pos = Vec::with_capacity(hosts.len());
        for (r, h) in hosts.iter().enumerate() {
            let h = h.as_ref();
            let i = names.iter().position(|&n| n == h).unwrap_or_else(|| {
                names.push(h);
                at.push(vec![]);
                names.len() - 1
            });
            pos.push((i, at[i].len()));
            at[i].push(r);
        }
        let per = at.first()?.len();
        (at.len() >= 2 && per >= 2 && at.iter().all(|g| g.len() == per)).then_some(Layout { at, pos })
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.at.len()
    }

    /// Ranks per host.
    pub fn per_host(&self) -> usize {
        self.at[0].len()
    }
}

/// The hierarchical backend of one communicator (see the module documentation).
pub(crate) struct Hier {
    rank: usize,
    world_rank: usize,
    layout: Layout,
    /// This host's ranks, over shared memory (rank = local index).
    local: Box<dyn Backend>,
    /// The ranks of this local index on every host, over tcp (rank = host index).
    cross: Box<dyn Backend>,
    scratch: Vec<u8>,
    scratch2: Vec<u8>,
}

impl Hier {
    /// Composes the two levels for communicator rank `rank` (world rank `world_rank`).
    pub fn new(rank: usize, world_rank: usize, layout: Layout, local: Box<dyn Backend>, cross: Box<dyn Backend>) -> Hier {
        Hier { rank, world_rank, layout, local, cross, scratch: vec![], scratch2: vec![] }
    }

    fn local_index(&self) -> usize {
        self.layout.pos[self.rank].1
    }

    fn not_p2p(&self) -> Error {
        Error::BackendUnavailable {
            rank: self.world_rank,
            backend: "hier".into(),
            why: "hier carries collectives only; point-to-point goes to another backend".into(),
        }
    }

    fn all_reduce(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (l, es) = (self.layout.per_host(), d.dtype.size());
        let redop = inner_op(d.redop);
        let blk = d.count / l;
        let main = blk * l * es;
        if blk > 0 {
            let mut slice = std::mem::take(&mut self.scratch);
            slice.resize(blk * es, 0);
            let res = (|| -> Result<()> {
                let input = &send.unwrap_or(recv)[..main];
                self.local.collective(&coll(CollOp::ReduceScatter, d, blk, redop, 0), Some(input), &mut slice)?;
                self.cross.collective(&coll(CollOp::AllReduce, d, blk, redop, 0), None, &mut slice)?;
                self.local.collective(&coll(CollOp::AllGather, d, blk, redop, 0), Some(&slice), &mut recv[..main])
            })();
            self.scratch = slice;
            res?;
        }
        let tail = d.count - blk * l;
        if tail > 0 {
            if let Some(s) = send {
                recv[main..].copy_from_slice(&s[main..]);
            }
            self.local.collective(&coll(CollOp::AllReduce, d, tail, redop, 0), None, &mut recv[main..])?;
            self.cross.collective(&coll(CollOp::AllReduce, d, tail, redop, 0), None, &mut recv[main..])?;
        }
        finish_reduce(recv, d.dtype, d.redop, self.layout.pos.len());
        Ok(())
    }

    fn broadcast(&mut self, d: &CollDesc, buf: &mut [u8]) -> Result<()> {
        let (rh, rl) = self.layout.pos[d.root];
        if self.local_index() == rl {
            self.cross.collective(&coll(CollOp::Broadcast, d, d.count, d.redop, rh), None, buf)?;
        }
        self.local.collective(&coll(CollOp::Broadcast, d, d.count, d.redop, rl), None, buf)
    }

    fn reduce(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (rh, rl) = self.layout.pos[d.root];
        let redop = inner_op(d.redop);
        let len = d.count * d.dtype.size();
        let local_desc = coll(CollOp::Reduce, d, d.count, redop, rl);
        let cross_desc = coll(CollOp::Reduce, d, d.count, redop, rh);
        if self.rank == d.root {
            self.local.collective(&local_desc, send, recv)?;
            self.cross.collective(&cross_desc, None, recv)?;
            finish_reduce(recv, d.dtype, d.redop, self.layout.pos.len());
            return Ok(());
        }
        let input = send.expect("a non-root reduce has a send buffer");
        if self.local_index() != rl {
            return self.local.collective(&local_desc, Some(input), &mut []);
        }
        // This host's partial result, on its way to the root's host.
        let mut part = std::mem::take(&mut self.scratch);
        part.resize(len, 0);
        let res = self
            .local
            .collective(&local_desc, Some(input), &mut part[..len])
            .and_then(|_| self.cross.collective(&cross_desc, Some(&part[..len]), &mut []));
        self.scratch = part;
        res
    }

    fn all_gather(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (h, l) = (self.layout.hosts(), self.layout.per_host());
        let b = d.count * d.dtype.size();
        let (mut across, mut inside) = (std::mem::take(&mut self.scratch), std::mem::take(&mut self.scratch2));
        across.resize(h * b, 0);
        inside.resize(h * l * b, 0);
        let res = (|| -> Result<()> {
            let mine = match send {
                Some(s) => s,
                None => &recv[self.rank * b..(self.rank + 1) * b],
            };
            // across[h'] = the block of (h', my local index); then inside[l'][h'] = block (h', l').
            self.cross.collective(&coll(CollOp::AllGather, d, d.count, d.redop, 0), Some(mine), &mut across)?;
            self.local.collective(&coll(CollOp::AllGather, d, d.count * h, d.redop, 0), Some(&across), &mut inside)?;
            for (hi, ranks) in self.layout.at.iter().enumerate() {
                for (li, &r) in ranks.iter().enumerate() {
                    let from = (li * h + hi) * b;
                    recv[r * b..(r + 1) * b].copy_from_slice(&inside[from..from + b]);
                }
            }
            Ok(())
        })();
        (self.scratch, self.scratch2) = (across, inside);
        res
    }

    fn reduce_scatter(&mut self, d: &CollDesc, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (h, l) = (self.layout.hosts(), self.layout.per_host());
        let b = d.count * d.dtype.size();
        let redop = inner_op(d.redop);
        let (mut order, mut part) = (std::mem::take(&mut self.scratch), std::mem::take(&mut self.scratch2));
        order.resize(h * l * b, 0);
        part.resize(h * b, 0);
        let res = (|| -> Result<()> {
            // order[l'][h'] = the input block of rank (h', l'): local index l' reduces, over this
            // host, the blocks of its own index on every host; then the hosts reduce across.
            for (hi, ranks) in self.layout.at.iter().enumerate() {
                for (li, &r) in ranks.iter().enumerate() {
                    let to = (li * h + hi) * b;
                    order[to..to + b].copy_from_slice(&send[r * b..(r + 1) * b]);
                }
            }
            self.local.collective(&coll(CollOp::ReduceScatter, d, d.count * h, redop, 0), Some(&order), &mut part)?;
            self.cross.collective(&coll(CollOp::ReduceScatter, d, d.count, redop, 0), Some(&part), recv)
        })();
        (self.scratch, self.scratch2) = (order, part);
        res?;
        finish_reduce(recv, d.dtype, d.redop, self.layout.pos.len());
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.local.collective(&CollDesc::BARRIER, None, &mut [])?;
        self.cross.collective(&CollDesc::BARRIER, None, &mut [])?;
        self.local.collective(&CollDesc::BARRIER, None, &mut [])
    }
}

/// The op every level reduces with: `avg` sums, and the caller divides once at the end.
fn inner_op(op: ReduceOp) -> ReduceOp {
    if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    }
}

/// A descriptor of one level's call.
fn coll(op: CollOp, d: &CollDesc, count: usize, redop: ReduceOp, root: usize) -> CollDesc {
    CollDesc { op, dtype: d.dtype, redop, root, count }
}

impl Backend for Hier {
    fn name(&self) -> &'static str {
        "hier"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.layout.pos.len()
    }

    unsafe fn post_send(&mut self, _peer: usize, _tag: u64, _ptr: *const u8, _len: usize) -> Result<ReqId> {
        Err(self.not_p2p())
    }
    unsafe fn post_recv(&mut self, _peer: usize, _tag: u64, _ptr: *mut u8, _cap: usize) -> Result<ReqId> {
        Err(self.not_p2p())
    }
    fn test(&mut self, _req: ReqId) -> Result<Option<usize>> {
        Err(self.not_p2p())
    }
    fn wait(&mut self, _req: ReqId) -> Result<usize> {
        Err(self.not_p2p())
    }
    fn cancel(&mut self, _req: ReqId) {}

    fn supports(&self, desc: &CollDesc) -> bool {
        !matches!(desc.op, CollOp::Gather | CollOp::Scatter | CollOp::AllToAll) && self.local.supports(desc) && self.cross.supports(desc)
    }

    fn collective(&mut self, desc: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        match desc.op {
            CollOp::Barrier => self.barrier(),
            CollOp::Broadcast => self.broadcast(desc, recv),
            CollOp::AllReduce => self.all_reduce(desc, send, recv),
            CollOp::Reduce => self.reduce(desc, send, recv),
            CollOp::AllGather => self.all_gather(desc, send, recv),
            CollOp::ReduceScatter => self.reduce_scatter(desc, send.expect("reduce_scatter has a send buffer"), recv),
            CollOp::Gather | CollOp::Scatter | CollOp::AllToAll => Err(Error::BackendUnavailable {
                rank: self.world_rank,
                backend: "hier".into(),
                why: format!("{} has no hierarchical form (the default backend carries it)", desc.op.name()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_groups_ranks_by_host_in_rank_order() {
        let l = Layout::of(&["a", "b", "a", "b", "a", "b"]).unwrap();
        assert_eq!(l.at, vec![vec![0, 2, 4], vec![1, 3, 5]]);
        assert_eq!(l.pos[3], (1, 1));
        assert_eq!((l.hosts(), l.per_host()), (2, 3));
    }

    #[test]
    fn layout_declines_one_host_one_rank_per_host_and_uneven_hosts() {
        assert!(Layout::of(&["a", "a", "a"]).is_none(), "one host");
        assert!(Layout::of(&["a", "b", "c"]).is_none(), "one rank per host");
        assert!(Layout::of(&["a", "a", "b", "b", "b"]).is_none(), "2 + 3 ranks");
        assert!(Layout::of::<&str>(&[]).is_none());
    }
}
