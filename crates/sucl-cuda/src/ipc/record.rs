//! What each rank publishes through the rendezvous store when a peer-memory communicator is set
//! up: a fixed-layout, versioned record (little-endian) holding its CUDA IPC handle and what a
//! peer must check before opening it. A record from the store is validated — length, magic,
//! version, rank, communicator size, node, buffer size, device, kernel settings — before
//! anything in it is used. The settings that shape the kernels (two-shot threshold, grid cap,
//! unroll) must be the same on every rank: [`settings_mismatch`] finds ranks that differ.

/// Bytes of an encoded [`PeerRecord`].
pub const RECORD_LEN: usize = 152;
const MAGIC: u32 = 0x5355_4950; // "SUIP"
const VERSION: u16 = 3;
/// Bytes of a CUDA IPC memory handle.
pub const HANDLE_LEN: usize = 64;
/// Bytes kept of a PCI bus id ("0000:18:00.0" and NUL padding).
pub const BUS_ID_LEN: usize = 32;

/// The settings that shape the kernels' algorithms and grids: every rank must launch the same
/// kernels with the same grids, so every rank must have the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSettings {
    /// all_reduce runs two-shot from this many bytes on (`SUCL_IPC_TWO_SHOT_BYTES`).
    pub two_shot_bytes: u64,
    /// The requested grid cap (`SUCL_IPC_BLOCKS`).
    pub blocks: u32,
    /// Slots per thread per loop iteration (`SUCL_IPC_UNROLL`).
    pub unroll: u32,
    /// Whether the kernels end with a barrier (`SUCL_IPC_END_BARRIER`).
    pub end_barrier: bool,
    /// Whether one-shot all_reduce pushes its input into the peers' data areas (`SUCL_IPC_PUSH`).
    pub push: bool,
}

impl KernelSettings {
    /// The settings' fields with their variables, for error messages.
    fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("SUCL_IPC_TWO_SHOT_BYTES", self.two_shot_bytes),
            ("SUCL_IPC_BLOCKS", self.blocks as u64),
            ("SUCL_IPC_UNROLL", self.unroll as u64),
            ("SUCL_IPC_END_BARRIER", self.end_barrier as u64),
            ("SUCL_IPC_PUSH", self.push as u64),
        ]
    }
}

/// One rank's peer buffer as its peers need to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRecord {
    /// Whether the rank could set its side up (buffer, handle, host-mapped words).
    pub ready: bool,
    /// The rank in the communicator.
    pub rank: u32,
    /// The communicator's size as the rank sees it.
    pub size: u32,
    /// Which machine (boot) the rank runs on: peers must share it.
    pub node: u64,
    /// The PCI bus id of the rank's GPU, which peers look up among their own devices.
    pub bus_id: String,
    /// Bytes of the rank's data area (every rank must use the same).
    pub capacity: u64,
    /// The CUDA IPC handle of the rank's peer buffer.
    pub handle: [u8; HANDLE_LEN],
    /// The rank's kernel settings.
    pub settings: KernelSettings,
    /// Multiprocessors of the rank's GPU (0 when not ready): the grid cap is at most the least.
    pub sms: u32,
}

impl PeerRecord {
    /// The fixed-layout bytes: magic u32, version u16, flags u16 (bit 0: ready), rank u32,
    /// size u32, node u64, bus id (32 bytes, NUL padded), capacity u64, handle (64 bytes),
    /// two-shot bytes u64, blocks u32, unroll u32, multiprocessors u32, kernel flags u32 (bit 0:
    /// end barrier, bit 1: push).
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.ready as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.rank.to_le_bytes());
        b[12..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.node.to_le_bytes());
        let id = self.bus_id.as_bytes();
        let n = id.len().min(BUS_ID_LEN - 1);
        b[24..24 + n].copy_from_slice(&id[..n]);
        b[56..64].copy_from_slice(&self.capacity.to_le_bytes());
        b[64..128].copy_from_slice(&self.handle);
        b[128..136].copy_from_slice(&self.settings.two_shot_bytes.to_le_bytes());
        b[136..140].copy_from_slice(&self.settings.blocks.to_le_bytes());
        b[140..144].copy_from_slice(&self.settings.unroll.to_le_bytes());
        b[144..148].copy_from_slice(&self.sms.to_le_bytes());
        let kernel_flags = self.settings.end_barrier as u32 | (self.settings.push as u32) << 1;
        b[148..152].copy_from_slice(&kernel_flags.to_le_bytes());
        b
    }

    /// Decodes and validates the record rank `rank` of a communicator of `size` ranks
    /// published, for a reader on node `node` whose data area is `capacity` bytes. Says what
    /// is wrong otherwise; nothing in a rejected record is used.
    pub fn decode(b: &[u8], rank: usize, size: usize, node: u64, capacity: u64) -> Result<PeerRecord, String> {
        if b.len() != RECORD_LEN {
            return Err(format!("rank {rank}'s peer-memory record is {} bytes (want {RECORD_LEN})", b.len()));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            return Err(format!("rank {rank}'s peer-memory record has a bad magic {:#x}", u32_at(0)));
        }
        if u16_at(4) != VERSION {
            return Err(format!("rank {rank}'s peer-memory record has version {} (this build speaks {VERSION})", u16_at(4)));
        }
        let flags = u16_at(6);
        if flags > 1 {
            return Err(format!("rank {rank}'s peer-memory record has unknown flags {flags:#x}"));
        }
        let (r, s) = (u32_at(8), u32_at(12));
        if r as usize != rank || s as usize != size {
            return Err(format!("the record under rank {rank} says rank {r} of {s} (want rank {rank} of {size})"));
        }
        if u64_at(16) != node {
            return Err(format!("rank {rank} runs on another machine"));
        }
        let id = &b[24..56];
        let end = id.iter().position(|&c| c == 0).ok_or_else(|| format!("rank {rank}'s GPU bus id is not terminated"))?;
        if id[end..].iter().any(|&c| c != 0) || !id[..end].iter().all(|c| c.is_ascii_hexdigit() || matches!(c, b':' | b'.')) {
            return Err(format!("rank {rank}'s GPU bus id is malformed"));
        }
        let ready = flags & 1 == 1;
        if ready && end == 0 {
            return Err(format!("rank {rank}'s GPU bus id is empty"));
        }
        let cap = u64_at(56);
        if ready && cap != capacity {
            return Err(format!(
                "rank {rank}'s peer buffer holds {cap} bytes, this rank's {capacity}: set the same SUCL_IPC_BUFFER_BYTES on every rank"
            ));
        }
        let settings = settings_at(b);
        let sms = u32_at(144);
        if u32_at(148) > 3 {
            return Err(format!("rank {rank}'s peer-memory record has unknown kernel flags {:#x}", u32_at(148)));
        }
        if ready && (sms == 0 || settings.blocks == 0 || !super::plan::UNROLLS.contains(&(settings.unroll as usize))) {
            return Err(format!("rank {rank}'s peer-memory record has bad kernel settings {settings:?} ({sms} multiprocessors)"));
        }
        let mut handle = [0u8; HANDLE_LEN];
        handle.copy_from_slice(&b[64..128]);
        let bus_id = String::from_utf8(id[..end].to_vec()).expect("ascii");
        Ok(PeerRecord { ready, rank: r, size: s, node: u64_at(16), bus_id, capacity: cap, handle, settings, sms })
    }
}

/// The kernel settings in an encoded record (`b` is [`RECORD_LEN`] bytes).
fn settings_at(b: &[u8]) -> KernelSettings {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    KernelSettings {
        two_shot_bytes: u64::from_le_bytes(b[128..136].try_into().expect("8 bytes")),
        blocks: u32_at(136),
        unroll: u32_at(140),
        end_barrier: u32_at(148) & 1 == 1,
        push: u32_at(148) & 2 == 2,
    }
}

/// Whether the ranks that can serve (ready records of this format) differ in their kernel
/// settings: the first setting that differs from the first such rank's, naming the variable and
/// both ranks' values. Reads only what every rank reads alike (the records' bytes), so every
/// rank reaches the same verdict. Records that are malformed are left to [`PeerRecord::decode`].
pub fn settings_mismatch(all: &[Vec<u8>]) -> Option<String> {
    let ready = all
        .iter()
        .enumerate()
        .filter(|(_, b)| b.len() == RECORD_LEN && b[0..4] == MAGIC.to_le_bytes() && b[4..6] == VERSION.to_le_bytes() && b[6] & 1 == 1);
    let mut first: Option<(usize, KernelSettings)> = None;
    for (r, b) in ready {
        let s = settings_at(b);
        match first {
            None => first = Some((r, s)),
            Some((r0, s0)) => {
                if let Some(((key, theirs), (_, ours))) = s0.named().into_iter().zip(s.named()).find(|(a, b)| a.1 != b.1) {
                    return Some(format!(
                        "peer-memory setting {key}: rank {r0} has {theirs}, rank {r} has {ours} (set the same on every rank)"
                    ));
                }
            }
        }
    }
    None
}

/// A 64-bit FNV-1a hash (names this machine's boot in records; not for security).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// This machine's identity for records: the kernel's boot id (one per boot of one machine;
/// ranks in containers of one host share it), else the host name.
pub fn this_node() -> u64 {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let host = sucl_core::bootstrap::hostname();
    fnv1a(if id.trim().is_empty() { host.as_bytes() } else { id.trim().as_bytes() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PeerRecord {
        let mut handle = [0u8; HANDLE_LEN];
        for (i, h) in handle.iter_mut().enumerate() {
            *h = (i * 7 + 1) as u8;
        }
        let settings = KernelSettings { two_shot_bytes: 256 << 10, blocks: 64, unroll: 4, end_barrier: false, push: true };
        PeerRecord {
            ready: true,
            rank: 1,
            size: 2,
            node: 42,
            bus_id: "00000000:18:00.0".into(),
            capacity: 1 << 20,
            handle,
            settings,
            sms: 132,
        }
    }

    #[test]
    fn a_record_round_trips() {
        let r = sample();
        assert_eq!(PeerRecord::decode(&r.encode(), 1, 2, 42, 1 << 20), Ok(r));
        let not_ready = PeerRecord { ready: false, bus_id: String::new(), capacity: 0, sms: 0, ..sample() };
        assert_eq!(PeerRecord::decode(&not_ready.encode(), 1, 2, 42, 1 << 20), Ok(not_ready));
    }

    #[test]
    fn bad_records_are_refused_with_the_reason() {
        let good = sample().encode();
        let err = |b: &[u8], rank, size, node, cap| PeerRecord::decode(b, rank, size, node, cap).unwrap_err();
        assert!(err(&good[..RECORD_LEN - 1], 1, 2, 42, 1 << 20).contains("151 bytes"));
        let mut long = good.to_vec();
        long.push(0);
        assert!(err(&long, 1, 2, 42, 1 << 20).contains("153 bytes"));
        assert!(err(&good, 0, 2, 42, 1 << 20).contains("says rank 1 of 2"), "a record filed under another rank");
        assert!(err(&good, 1, 4, 42, 1 << 20).contains("says rank 1 of 2"), "another communicator size");
        assert!(err(&good, 1, 2, 43, 1 << 20).contains("another machine"));
        assert!(err(&good, 1, 2, 42, 1 << 21).contains("SUCL_IPC_BUFFER_BYTES"));
        let mut b = good;
        b[0] ^= 1;
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("magic"));
        let mut b = good;
        b[4] = 9;
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("version 9"));
        let mut b = good;
        b[6] = 2;
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("flags"));
        let mut b = good;
        b[24..56].fill(b'0');
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("not terminated"));
        let mut b = good;
        b[25] = b'/';
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("malformed"));
        let mut b = good;
        b[24..56].fill(0);
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("empty"));
        for (field, value) in [(140usize, 3u32), (140, 0), (136, 0), (144, 0)] {
            let mut b = good;
            b[field..field + 4].copy_from_slice(&value.to_le_bytes());
            assert!(err(&b, 1, 2, 42, 1 << 20).contains("bad kernel settings"), "byte {field} = {value}");
        }
        let mut b = good;
        b[150] = 1;
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("unknown kernel flags"));
        let mut b = good;
        b[148] = 4;
        assert!(err(&b, 1, 2, 42, 1 << 20).contains("unknown kernel flags"), "bit 2 means nothing");
        for (end_barrier, push) in [(true, false), (false, false), (true, true), (false, true)] {
            let rec = PeerRecord { settings: KernelSettings { end_barrier, push, ..sample().settings }, ..sample() };
            assert_eq!(PeerRecord::decode(&rec.encode(), 1, 2, 42, 1 << 20), Ok(rec));
        }
    }

    #[test]
    fn ranks_whose_kernel_settings_differ_are_named() {
        let rec = |rank: u32, ready: bool, settings: KernelSettings| PeerRecord { rank, ready, settings, ..sample() }.encode().to_vec();
        let s = sample().settings;
        let same = vec![rec(0, true, s), rec(1, true, s), rec(2, true, s)];
        assert_eq!(settings_mismatch(&same), None);
        let two_shot = KernelSettings { two_shot_bytes: 1 << 20, ..s };
        let m = settings_mismatch(&[rec(0, true, s), rec(1, true, s), rec(2, true, two_shot)]).expect("a mismatch");
        assert!(m.contains("SUCL_IPC_TWO_SHOT_BYTES") && m.contains("rank 0 has 262144") && m.contains("rank 2 has 1048576"), "{m}");
        let m = settings_mismatch(&[rec(0, true, s), rec(1, true, KernelSettings { blocks: 32, ..s })]).expect("a mismatch");
        assert!(m.contains("SUCL_IPC_BLOCKS") && m.contains("rank 1 has 32"), "{m}");
        let m = settings_mismatch(&[rec(0, true, s), rec(1, true, KernelSettings { unroll: 1, ..s })]).expect("a mismatch");
        assert!(m.contains("SUCL_IPC_UNROLL"), "{m}");
        let m = settings_mismatch(&[rec(0, true, s), rec(1, true, KernelSettings { end_barrier: true, ..s })]).expect("a mismatch");
        assert!(m.contains("SUCL_IPC_END_BARRIER") && m.contains("rank 1 has 1"), "{m}");
        let m = settings_mismatch(&[rec(0, true, s), rec(1, true, KernelSettings { push: !s.push, ..s })]).expect("a mismatch");
        assert!(m.contains("SUCL_IPC_PUSH"), "{m}");
        // A rank that does not serve (not ready) cannot disagree: it is compared with no one.
        assert_eq!(settings_mismatch(&[rec(0, false, two_shot), rec(1, true, s), rec(2, true, s)]), None);
        // Malformed records are left to decode.
        assert_eq!(settings_mismatch(&[vec![1, 2, 3], rec(1, true, s)]), None);
    }

    #[test]
    fn every_truncation_and_single_byte_flip_is_handled() {
        // Nothing panics on any prefix or any corrupted byte; flips in checked fields are caught.
        let good = sample().encode();
        for len in 0..RECORD_LEN {
            assert!(PeerRecord::decode(&good[..len], 1, 2, 42, 1 << 20).is_err());
        }
        for i in 0..64 {
            for bit in 0..8 {
                let mut b = good;
                b[i] ^= 1 << bit;
                let r = PeerRecord::decode(&b, 1, 2, 42, 1 << 20);
                // Bytes 24..56 (bus id) may still decode to another well-formed id, and the
                // ready bit may turn off (the rank then counts as unable to serve).
                if !(24..56).contains(&i) && (i, bit) != (6, 0) {
                    assert!(r.is_err(), "flip of bit {bit} in byte {i} accepted");
                }
            }
        }
    }
}
