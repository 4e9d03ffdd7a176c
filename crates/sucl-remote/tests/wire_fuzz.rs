//! The frame decoders under proptest: 1 100 000 cases in all (300k + 250k + 250k + 200k, and
//! 100k through the peer link's reader), each a few dozen bytes so the whole file runs in
//! seconds. Arbitrary bytes, valid frames, truncations and single-byte mutations must each
//! decode to a frame or an error — never a panic, never an allocation of what a length field
//! claims.

use proptest::prelude::*;
use sucl_remote::wire::{self, Arg, ClArg, Command, DeviceInfo, DeviceKind, Frame, Outcome, SessionStats, WireError};

fn cfg(cases: u32) -> ProptestConfig {
    // SUCL_WIRE_FUZZ_SCALE multiplies the case counts (e.g. 10 for a longer local run).
    let scale: f64 = std::env::var("SUCL_WIRE_FUZZ_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    ProptestConfig {
        cases: ((cases as f64) * scale).max(1.0) as u32,
        failure_persistence: None,
        max_shrink_iters: 1000,
        ..ProptestConfig::default()
    }
}

/// Short strings of any characters (cheaper than a regex strategy).
fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..max).prop_map(String::from_iter)
}

/// Short names of ASCII letters, digits and `_`.
fn name(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(prop::sample::select(&b"abcdefghijklmnopqrstuvwxyz_0123456789"[..]), 0..max)
        .prop_map(|v| v.into_iter().map(char::from).collect())
}

fn arg() -> impl Strategy<Value = Arg> {
    prop_oneof![
        any::<u64>().prop_map(Arg::Buffer),
        any::<u64>().prop_map(Arg::U64),
        any::<i64>().prop_map(Arg::I64),
        any::<u64>().prop_map(|b| Arg::F64(f64::from_bits(b))),
        any::<u32>().prop_map(|b| Arg::F32(f32::from_bits(b))),
    ]
}

fn cl_arg() -> impl Strategy<Value = ClArg> {
    prop_oneof![
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(buffer, offset, len)| ClArg::Mem { buffer, offset, len }),
        Just(ClArg::NullMem),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(ClArg::Value),
        any::<u64>().prop_map(ClArg::Local),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let small = proptest::collection::vec(any::<u8>(), 0..24);
    prop_oneof![
        Just(Command::Nop),
        Just(Command::Devices),
        Just(Command::Stats),
        (any::<u64>(), any::<u32>()).prop_map(|(queue, device)| Command::CreateQueue { queue, device }),
        (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(buffer, device, bytes)| Command::Alloc { buffer, device, bytes }),
        any::<u64>().prop_map(|buffer| Command::Free { buffer }),
        (any::<u64>(), any::<u64>(), small.clone()).prop_map(|(buffer, offset, data)| Command::Write { buffer, offset, data }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(buffer, offset, len)| Command::Read { buffer, offset, len }),
        (any::<[u64; 5]>()).prop_map(|v| Command::Copy { src: v[0], src_offset: v[1], dst: v[2], dst_offset: v[3], len: v[4] }),
        (any::<u64>(), any::<u64>(), any::<u64>(), small.clone()).prop_map(|(buffer, offset, len, pattern)| Command::Fill {
            buffer,
            offset,
            len,
            pattern
        }),
        (any::<u64>(), name(12), proptest::collection::vec(arg(), 0..4), any::<u64>())
            .prop_map(|(queue, kernel, args, range)| Command::Launch { queue, kernel, args, range }),
        (any::<u32>(), name(6), text(12)).prop_map(|(device, name, source)| Command::CompileCuda { device, name, source }),
        (any::<u64>(), any::<u64>()).prop_map(|(queue, event)| Command::Record { queue, event }),
        (any::<u64>(), any::<u64>()).prop_map(|(queue, event)| Command::WaitEvent { queue, event }),
        any::<u64>().prop_map(|event| Command::SyncEvent { event }),
        any::<u64>().prop_map(|queue| Command::Finish { queue }),
        (any::<u64>(), any::<u32>(), text(12), text(6)).prop_map(|(program, device, source, options)| Command::ClBuild {
            program,
            device,
            source,
            options
        }),
        (any::<u64>(), any::<u64>(), name(8)).prop_map(|(kernel, program, name)| Command::ClKernel { kernel, program, name }),
        (any::<u64>(), any::<u64>(), 1..=3u8, any::<[u64; 9]>(), proptest::collection::vec(cl_arg(), 0..4)).prop_map(
            |(queue, kernel, dims, v, args)| Command::ClLaunch {
                queue,
                kernel,
                dims,
                offset: [v[0], v[1], v[2]],
                global: [v[3], v[4], v[5]],
                local: [v[6], v[7], v[8]],
                args
            }
        ),
        (0..=wire::cl_query::LAST, any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(what, object, device, param)| Command::ClQuery {
            what,
            object,
            device,
            param
        }),
        (0..=1u8, any::<u64>()).prop_map(|(what, id)| Command::ClRelease { what, id }),
        (any::<u64>(), any::<u32>(), text(12), text(6), proptest::collection::vec((name(6), text(8)), 0..3))
            .prop_map(|(program, device, source, options, headers)| Command::ClCompile { program, device, source, options, headers }),
        (any::<u64>(), any::<u32>(), text(6), proptest::collection::vec(any::<u64>(), 0..4))
            .prop_map(|(program, device, options, inputs)| Command::ClLink { program, device, options, inputs }),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Done),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(Outcome::Data),
        proptest::collection::vec((name(8), any::<u64>(), 0..3u8), 0..3).prop_map(|v| Outcome::Devices(
            v.into_iter()
                .map(|(name, memory, k)| DeviceInfo {
                    kind: [DeviceKind::Host, DeviceKind::Cuda, DeviceKind::OpenCl][k as usize],
                    name,
                    memory
                })
                .collect()
        )),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(executed, launches, bytes_in_use, buffers)| Outcome::Stats(
            SessionStats {
                executed,
                launches,
                bytes_in_use,
                buffers,
                peer_frames: executed ^ launches,
                migrations_peer_memory: launches / 3,
                migrations_network: executed / 5,
                migrated_bytes: bytes_in_use ^ 7,
                peer_wait_ns: executed.wrapping_mul(3),
            }
        )),
        (any::<u16>(), text(12)).prop_map(|(code, message)| Outcome::Failed { code, message }),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u16>(), any::<u16>(), any::<u64>(), any::<u32>(), any::<[u8; 16]>()).prop_map(
            |(min_version, max_version, features, max_frame, nonce)| Frame::Hello { min_version, max_version, features, max_frame, nonce }
        ),
        (any::<u16>(), any::<u64>(), any::<u32>(), any::<[u8; 16]>()).prop_map(|(version, features, max_frame, nonce)| Frame::Welcome {
            version,
            features,
            max_frame,
            nonce
        }),
        any::<[u8; 32]>().prop_map(|mac| Frame::Open { mac }),
        (any::<[u8; 16]>(), any::<u64>(), any::<[u8; 32]>()).prop_map(|(session, last_reply, mac)| Frame::Attach {
            session,
            last_reply,
            mac
        }),
        (any::<[u8; 16]>(), any::<u32>(), any::<[u8; 32]>()).prop_map(|(session, max_inflight, mac)| Frame::Opened {
            session,
            max_inflight,
            mac
        }),
        (any::<u64>(), any::<[u8; 32]>()).prop_map(|(last_received, mac)| Frame::Attached { last_received, mac }),
        text(12).prop_map(|reason| Frame::Refused { reason }),
        (any::<u64>(), any::<u64>(), command()).prop_map(|(seq, ack, cmd)| Frame::Command { seq, ack, cmd }),
        (any::<u64>(), outcome()).prop_map(|(seq, outcome)| Frame::Reply { seq, outcome }),
        any::<u64>().prop_map(|upto| Frame::Ack { upto }),
        text(12).prop_map(|reason| Frame::Fatal { reason }),
        (any::<[u8; 16]>(), any::<u32>(), any::<u32>(), any::<[u8; 32]>()).prop_map(|(mesh, from, to, mac)| Frame::PeerOpen {
            mesh,
            from,
            to,
            mac
        }),
        any::<[u8; 32]>().prop_map(|mac| Frame::PeerOpened { mac }),
        (any::<u64>(), any::<u64>()).prop_map(|(event, wait)| Frame::PeerSubscribe { event, wait }),
        (any::<u64>(), any::<bool>()).prop_map(|(event, ok)| Frame::PeerNotice { event, ok }),
        (any::<u64>(), any::<u64>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(transfer, total, offset, data)| Frame::PeerData { transfer, total, offset, data }),
        (any::<u64>(), any::<u64>()).prop_map(|(transfer, received)| Frame::PeerReceived { transfer, received }),
        any::<u64>().prop_map(|transfer| Frame::PeerResume { transfer }),
        (any::<u64>(), any::<u64>(), any::<u32>(), any::<[u8; 32]>(), any::<u64>(), any::<u64>()).prop_map(
            |(transfer, node, pid, half, offset, len)| {
                let mut handle = [0u8; 64];
                handle[..32].copy_from_slice(&half);
                let mut event = [0u8; 64];
                event[32..].copy_from_slice(&half);
                Frame::PeerMemOffer { transfer, node, pid, handle, offset, len, event }
            }
        ),
        (any::<u64>(), any::<[u8; 32]>()).prop_map(|(transfer, half)| {
            let mut event = [9u8; 64];
            event[..32].copy_from_slice(&half);
            Frame::PeerMemDone { transfer, event }
        }),
        (any::<u64>(), any::<bool>(), text(12)).prop_map(|(transfer, permanent, reason)| Frame::PeerMemRefused {
            transfer,
            permanent,
            reason
        }),
        any::<[u8; 32]>().prop_map(|half| {
            let mut handle = [1u8; 64];
            handle[32..].copy_from_slice(&half);
            Frame::PeerMemClose { handle }
        }),
    ]
}

/// Whatever decodes must encode back to the same bytes (the format has one encoding per frame).
fn check_canonical(body: &[u8]) {
    if let Ok(f) = wire::decode(body) {
        assert_eq!(&f.encode()[4..], body, "{f:?} re-encodes differently");
    }
}

proptest! {
    #![proptest_config(cfg(300_000))]
    #[test]
    fn arbitrary_bytes_decode_or_fail_cleanly(body in proptest::collection::vec(any::<u8>(), 0..48)) {
        check_canonical(&body);
        // The same bytes behind a length prefix, with a limit under, at and over their length.
        let mut framed = (body.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(&body);
        let mut buf = Vec::new();
        for limit in [body.len() as u32, body.len() as u32 / 2] {
            let r = wire::read_frame(&mut framed.as_slice(), &mut buf, limit);
            if (limit as usize) < body.len() {
                let too_long = matches!(r, Err(wire::ReadError::Wire(WireError::TooLong { .. })));
                prop_assert!(too_long, "a frame over the limit was not refused");
            }
        }
    }
}

proptest! {
    #![proptest_config(cfg(250_000))]
    #[test]
    fn valid_frames_round_trip(f in frame()) {
        let bytes = f.encode();
        prop_assert_eq!(u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize, bytes.len() - 4);
        let back = wire::decode(&bytes[4..]).unwrap();
        prop_assert_eq!(back.encode(), bytes);
    }
}

proptest! {
    #![proptest_config(cfg(250_000))]
    #[test]
    fn truncated_frames_are_errors(f in frame(), cut in any::<prop::sample::Index>()) {
        let bytes = f.encode();
        let body = &bytes[4..];
        let n = cut.index(body.len()); // 0..len: strictly shorter
        prop_assert!(wire::decode(&body[..n]).is_err(), "{:?} cut to {} of {} bytes decoded", f, n, body.len());
        // A stream that ends inside a frame is an I/O error, not a frame.
        let mut buf = Vec::new();
        prop_assert!(wire::read_frame(&mut &bytes[..4 + n], &mut buf, 1 << 20).is_err());
    }
}

proptest! {
    #![proptest_config(cfg(200_000))]
    #[test]
    fn mutated_frames_decode_or_fail_cleanly(f in frame(), at in any::<prop::sample::Index>(), x in 1u8..=255, claimed in any::<u32>()) {
        let mut bytes = f.encode();
        let i = 4 + at.index(bytes.len() - 4);
        bytes[i] ^= x;
        check_canonical(&bytes[4..]);
        // A length prefix over the limit is refused before anything is allocated for it.
        let limit = 4096;
        let mut wire_bytes = claimed.to_le_bytes().to_vec();
        wire_bytes.extend_from_slice(&bytes[4..]);
        let mut buf = Vec::new();
        let r = wire::read_frame(&mut wire_bytes.as_slice(), &mut buf, limit);
        if claimed > limit {
            prop_assert!(r.is_err());
            prop_assert_eq!(buf.capacity(), 0);
        }
    }
}

/// What `read_peer_frame` makes of `bytes`: the frame, with a data piece's bytes read after
/// its head (as the peer link does), or `None` for an error.
fn read_as_peer(bytes: &[u8], limit: u32) -> Option<Frame> {
    let (mut r, mut buf) = (bytes, Vec::new());
    match wire::read_peer_frame(&mut r, &mut buf, limit).ok()? {
        wire::PeerRead::Frame(f) => Some(f),
        wire::PeerRead::Data(h) => {
            let mut data = vec![0u8; h.len.min(r.len())];
            std::io::Read::read_exact(&mut r, &mut data).ok()?;
            (data.len() == h.len).then_some(Frame::PeerData { transfer: h.transfer, total: h.total, offset: h.offset, data })
        }
    }
}

proptest! {
    #![proptest_config(cfg(100_000))]
    #[test]
    fn the_peer_link_reader_agrees_with_the_decoder(f in frame(), at in any::<prop::sample::Index>(), x in 0u8..=255) {
        // Valid frames read back as themselves; mutated ones as whatever the decoder makes of
        // them, or an error — never a panic, never more than the frame's own bytes allocated.
        let mut bytes = f.encode();
        let i = 4 + at.index(bytes.len() - 4);
        bytes[i] ^= x;
        let want = wire::decode(&bytes[4..]).ok();
        let got = read_as_peer(&bytes, 1 << 20);
        // Compared by their encodings: a float argument may be NaN, which is never equal to
        // itself, while its bits are.
        let encoded = |f: &Option<Frame>| f.as_ref().map(Frame::encode);
        prop_assert_eq!(encoded(&got), encoded(&want), "{:?} mutated at {}", f, i);
        if x == 0 {
            prop_assert_eq!(encoded(&got), Some(f.encode()));
        }
    }
}
