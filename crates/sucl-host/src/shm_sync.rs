//! The shared-memory synchronization protocols, written once and generic over where their words
//! and bytes live: the backend runs them on a mapped segment shared between processes, and the
//! loom model checker (`RUSTFLAGS="--cfg loom"`, tests named `loom_*`) runs the very same code on
//! loom's atomics and cells, exploring every interleaving and every weak-memory outcome the
//! orderings allow.
//!
//! - [`Producer`] / [`Consumer`]: one single-producer/single-consumer byte ring. The producer
//!   copies bytes into free space and then publishes them by a release store of `head`; the
//!   consumer sees them by an acquire load of `head`, copies them out, and hands the space back by
//!   a release store of `tail`, which the producer acquires before writing there again.
//! - [`arrive`] / [`wait_until`]: the flag barrier. Each party raises its own word to the
//!   barrier's sequence number (release: what it wrote before is visible to whoever sees the
//!   value) and waits until every peer's word reached it (acquire).

use std::sync::atomic::Ordering;

/// A 64-bit word shared between the parties of a protocol.
pub(crate) trait Word {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u64;
    /// Atomic store.
    fn store(&self, value: u64, order: Ordering);
}

impl Word for std::sync::atomic::AtomicU64 {
    #[inline(always)]
    fn load(&self, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::load(self, order)
    }
    #[inline(always)]
    fn store(&self, value: u64, order: Ordering) {
        std::sync::atomic::AtomicU64::store(self, value, order)
    }
}

#[cfg(all(test, loom))]
impl Word for loom::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::load(self, order)
    }
    fn store(&self, value: u64, order: Ordering) {
        loom::sync::atomic::AtomicU64::store(self, value, order)
    }
}

/// The memory of one ring: two counters and `capacity()` data bytes.
pub(crate) trait RingMemory {
    /// The counters' type.
    type W: Word;
    /// Bytes published so far (written by the producer only).
    fn head(&self) -> &Self::W;
    /// Bytes consumed so far (written by the consumer only).
    fn tail(&self) -> &Self::W;
    /// Data bytes; a power of two.
    fn capacity(&self) -> usize;
    /// Copies `src` into data bytes `pos..pos + src.len()` (never past the end).
    ///
    /// # Safety
    /// Nobody else reads or writes that range meanwhile: the caller is the producer and the range
    /// is free space (consumed, per an acquire load of `tail`, and not yet published).
    unsafe fn put(&self, pos: usize, src: &[u8]);
    /// Copies data bytes `pos..pos + dst.len()` (never past the end) into `dst`.
    ///
    /// # Safety
    /// Nobody writes that range meanwhile: the caller is the consumer and the range is published
    /// (per an acquire load of `head`) and not yet handed back.
    unsafe fn get(&self, pos: usize, dst: &mut [u8]);
}

/// The writing end of a ring.
pub(crate) struct Producer<M> {
    mem: M,
    /// Bytes written (our own copy of `head`).
    head: u64,
    /// The consumer's `tail` as last loaded.
    peer_tail: u64,
}

impl<M: RingMemory> Producer<M> {
    /// The producer of an empty ring.
    pub(crate) fn new(mem: M) -> Self {
        Producer { mem, head: 0, peer_tail: 0 }
    }

    fn free(&self) -> usize {
        self.mem.capacity() - (self.head - self.peer_tail) as usize
    }

    /// Writes as much of the concatenation of `parts` as fits and publishes it; returns how many
    /// bytes were written (0 when the ring is full).
    pub(crate) fn try_write(&mut self, parts: &[&[u8]]) -> usize {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if self.free() < total.max(1) {
            // Acquire: the consumer's copies out of the space it hands back happen before ours into it.
            self.peer_tail = self.mem.tail().load(Ordering::Acquire);
        }
        let (free, cap) = (self.free(), self.mem.capacity());
        let mut written = 0;
        for p in parts {
            let k = p.len().min(free - written);
            let mut done = 0;
            while done < k {
                let pos = (self.head as usize + written + done) & (cap - 1);
                let run = (k - done).min(cap - pos);
                // SAFETY: pos..pos+run lies in the free space: at most `free` bytes past `head`,
                // all consumed per the acquire load of `tail` above and not yet published.
                unsafe { self.mem.put(pos, &p[done..done + run]) };
                done += run;
            }
            written += k;
            if written == free {
                break;
            }
        }
        if written > 0 {
            self.head += written as u64;
            // Release: the copies above happen before the consumer's acquire load sees `head`.
            self.mem.head().store(self.head, Ordering::Release);
        }
        written
    }
}

/// The reading end of a ring.
pub(crate) struct Consumer<M> {
    mem: M,
    /// Bytes consumed (our own copy of `tail`).
    tail: u64,
}

impl<M: RingMemory> Consumer<M> {
    /// The consumer of an empty ring.
    pub(crate) fn new(mem: M) -> Self {
        Consumer { mem, tail: 0 }
    }

    /// Copies up to `buf.len()` published bytes into `buf` and hands their space back; returns
    /// how many (0 when nothing is published).
    pub(crate) fn try_read(&mut self, buf: &mut [u8]) -> usize {
        if buf.is_empty() {
            return 0;
        }
        // Acquire: the producer's copies into the published bytes happen before ours out of them.
        let head = self.mem.head().load(Ordering::Acquire);
        let avail = (head - self.tail) as usize;
        let k = avail.min(buf.len());
        if k == 0 {
            return 0;
        }
        let cap = self.mem.capacity();
        let mut done = 0;
        while done < k {
            let pos = (self.tail as usize + done) & (cap - 1);
            let run = (k - done).min(cap - pos);
            // SAFETY: pos..pos+run lies in published bytes (before the `head` acquired above) that
            // we have not handed back yet, so the producer does not write them.
            unsafe { self.mem.get(pos, &mut buf[done..done + run]) };
            done += run;
        }
        self.tail += k as u64;
        // Release: our copies out happen before the producer's acquire load sees the space free.
        self.mem.tail().store(self.tail, Ordering::Release);
        k
    }
}

/// Flag barrier, arriving: raises our word to `seq`. Release: everything this party wrote before
/// happens before the reads of any party that sees `seq` (through [`wait_until`]).
#[inline(always)]
pub(crate) fn arrive<W: Word>(mine: &W, seq: u64) {
    mine.store(seq, Ordering::Release);
}

/// Whether a peer's word already reached `seq` (acquire, as [`wait_until`]).
#[inline(always)]
pub(crate) fn reached<W: Word>(theirs: &W, seq: u64) -> bool {
    theirs.load(Ordering::Acquire) >= seq
}

/// Flag barrier, waiting: returns once a peer's word reached `seq`, calling `pause` between
/// looks (it bounds the wait: its error ends it). Acquire: everything the peer wrote before
/// arriving happens before what the caller does next.
#[inline]
pub(crate) fn wait_until<W: Word, E>(theirs: &W, seq: u64, mut pause: impl FnMut() -> Result<(), E>) -> Result<(), E> {
    while !reached(theirs, seq) {
        pause()?;
    }
    Ok(())
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Model checks. Run: `RUSTFLAGS="--cfg loom" cargo test -p sucl-host --release --lib loom_`.
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicU64;
    use loom::sync::Arc;
    use loom::thread;

    /// A ring in loom's memory: loom reports any data byte touched by both sides without a
    /// happens-before edge between the two accesses.
    struct LoomRing<W> {
        head: W,
        tail: W,
        data: Vec<UnsafeCell<u8>>,
    }

    impl<W: Word> RingMemory for Arc<LoomRing<W>> {
        type W = W;
        fn head(&self) -> &W {
            &self.head
        }
        fn tail(&self) -> &W {
            &self.tail
        }
        fn capacity(&self) -> usize {
            self.data.len()
        }
        unsafe fn put(&self, pos: usize, src: &[u8]) {
            for (i, &b) in src.iter().enumerate() {
                // SAFETY: the caller's contract (exclusive range); loom checks it.
                self.data[pos + i].with_mut(|p| unsafe { *p = b });
            }
        }
        unsafe fn get(&self, pos: usize, dst: &mut [u8]) {
            for (i, d) in dst.iter_mut().enumerate() {
                // SAFETY: the caller's contract (no writer); loom checks it.
                *d = self.data[pos + i].with(|p| unsafe { *p });
            }
        }
    }

    /// A deliberately broken word: every release store and acquire load is relaxed. The model
    /// must catch the protocol run over it (otherwise the checks below could not fail).
    struct Relaxed(AtomicU64);

    impl Word for Relaxed {
        fn load(&self, _: Ordering) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
        fn store(&self, value: u64, _: Ordering) {
            self.0.store(value, Ordering::Relaxed)
        }
    }

    fn ring<W: Word>(cap: usize, word: fn() -> W) -> Arc<LoomRing<W>> {
        Arc::new(LoomRing { head: word(), tail: word(), data: (0..cap).map(|_| UnsafeCell::new(0)).collect() })
    }

    /// Sends 0..len through a ring of `cap` bytes in writes of up to `burst` bytes; the consumer
    /// must get every byte, in order, and loom must see no race on the data.
    fn stream<W: Word + 'static>(cap: usize, len: u8, burst: usize, word: fn() -> W) {
        let r = ring(cap, word);
        let mut p = Producer::new(r.clone());
        let mut c = Consumer::new(r);
        let t = thread::spawn(move || {
            let msg: Vec<u8> = (0..len).collect();
            let mut sent = 0;
            while sent < msg.len() {
                let end = (sent + burst).min(msg.len());
                // Two parts, as the engine writes a header and a payload.
                let mid = (sent + end) / 2;
                let n = p.try_write(&[&msg[sent..mid], &msg[mid..end]]);
                if n == 0 {
                    thread::yield_now();
                }
                sent += n;
            }
        });
        let mut got = vec![];
        let mut buf = [0u8; 3];
        while got.len() < len as usize {
            let n = c.try_read(&mut buf);
            if n == 0 {
                thread::yield_now();
            }
            got.extend_from_slice(&buf[..n]);
        }
        t.join().unwrap();
        assert_eq!(got, (0..len).collect::<Vec<u8>>());
    }

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    #[test]
    fn loom_ring_streams_in_order_without_races() {
        // 7 bytes through 4: the ring fills, wraps and is reused.
        model(|| stream(4, 7, 3, || AtomicU64::new(0)));
    }

    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_ring_with_relaxed_publish_is_caught() {
        model(|| stream(4, 7, 3, || Relaxed(AtomicU64::new(0))));
    }

    /// Two parties run three steps of the collective protocol: write a value into half
    /// `step % 2` of their own arena (and a descriptor word, relaxed, into their mailbox), pass
    /// the flag barrier, read the peer's half and descriptor. The third step rewrites half 1
    /// while the peer may still be on its way out of step 1's barrier: the step-2 barrier must
    /// order the peer's reads of step 1 before that write.
    fn steps<W: Word + Send + Sync + 'static>(word: fn() -> W) {
        struct Party<W> {
            flag: W,
            desc: [W; 2],
            half: [UnsafeCell<u64>; 2],
        }
        let parties: Arc<Vec<Party<W>>> = Arc::new(
            (0..2).map(|_| Party { flag: word(), desc: [word(), word()], half: [UnsafeCell::new(0), UnsafeCell::new(0)] }).collect(),
        );
        let run = move |me: usize| {
            let (mine, peer) = (&parties[me], &parties[1 - me]);
            for step in 1..=3u64 {
                let h = (step % 2) as usize;
                let value = step * 10 + me as u64;
                mine.desc[h].store(step, Ordering::Relaxed);
                // SAFETY: our half `h` is ours to write in this step; loom checks it.
                mine.half[h].with_mut(|p| unsafe { *p = value });
                arrive(&mine.flag, step);
                wait_until(&peer.flag, step, || {
                    thread::yield_now();
                    Ok::<(), ()>(())
                })
                .unwrap();
                assert_eq!(peer.desc[h].load(Ordering::Relaxed), step, "stale descriptor");
                // SAFETY: the peer wrote its half before arriving; loom checks it.
                let got = peer.half[h].with(|p| unsafe { *p });
                assert_eq!(got, step * 10 + (1 - me) as u64, "stale data");
            }
        };
        let run2 = run.clone();
        let t = thread::spawn(move || run2(1));
        run(0);
        t.join().unwrap();
    }

    #[test]
    fn loom_barrier_steps_reuse_halves_safely() {
        model(|| steps(|| AtomicU64::new(0)));
    }

    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_barrier_with_relaxed_flags_is_caught() {
        model(|| steps(|| Relaxed(AtomicU64::new(0))));
    }
}
