//! Damage matrix (C15): for each state a segment can be in — active after a
//! crash (zeros written ahead, recovery point past every acked record),
//! active after a crash with acked records past the recovery point, active
//! after a crash once its zeros were extended a few times, active after a
//! crash with frames too large for written zeros (a hole ahead), sealed,
//! cleanly closed — remove the zeros and cut it at every byte of its last
//! two frames, cut the zeros alone, append garbage, zero a block in the
//! middle and flip bits. Reopening must give back every acked record or
//! report `Corrupt` naming the segment. Every record here was acked, so
//! any record missing after a reopen that succeeded is counted as silently
//! lost, wherever it stood.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::support::{TOPIC, copy_tree, provision, segments};
use bus_core::{BusError, EventBus};
use bus_embedded::{EmbeddedBus, Options};

/// Records published one by one (one frame each) in every state.
const ACKED: usize = 12;
/// Records published after the last recovery point in the crash-past-point state.
const PAST_POINT: usize = 2;
/// Small records in the grown state: ~60-byte frames past 16 KiB of zeros,
/// so the writer extended its zeros (and stored its extent) a few times.
const GROWN: usize = 900;
/// Records of the large state, each a frame of about 70 KiB.
const LARGE: usize = 5;

fn uid(i: usize) -> String {
    format!("u{i}")
}

/// Small values keep frames short, so cutting at every byte stays cheap.
fn value_for(i: usize) -> serde_json::Value {
    serde_json::json!({ "u": uid(i), "i": i })
}

/// A value whose frame is past the size written zeros are used for.
fn large_value_for(i: usize) -> serde_json::Value {
    serde_json::json!({ "u": uid(i), "i": i, "pad": "x".repeat(70 << 10) })
}

fn publish(bus: &dyn EventBus, from: usize, n: usize) {
    publish_values(bus, from, n, value_for);
}

fn publish_values(
    bus: &dyn EventBus,
    from: usize,
    n: usize,
    value: fn(usize) -> serde_json::Value,
) {
    for i in from..from + n {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value(i), &uid(i))
            .unwrap();
        assert_eq!(ack.offset, i as u64);
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Start positions of the frames of a segment, and where the last ends
/// (zeros written ahead may follow).
fn frames(bytes: &[u8]) -> (Vec<usize>, usize) {
    let mut starts = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 8 + len > bytes.len() {
            break;
        }
        starts.push(at);
        at += 8 + len;
    }
    (starts, at)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum State {
    /// Active, the writer killed after a recovery point covering every ack.
    Crashed,
    /// Active, the writer killed with acked records past its recovery point.
    CrashedPastPoint,
    /// Active, the writer killed after extending its zeros a few times.
    CrashedGrown,
    /// Active, the writer killed after frames too large for written zeros.
    CrashedLarge,
    /// A sealed segment (the bus closed cleanly afterwards).
    Sealed,
    /// The active segment of a cleanly closed bus.
    Closed,
}

struct Template {
    state: State,
    dir: tempfile::TempDir,
    /// The damaged segment, relative to `dir`.
    target: PathBuf,
    /// Records acked in the partition.
    acked: usize,
    bytes: Vec<u8>,
}

impl Template {
    fn value(&self, i: usize) -> serde_json::Value {
        if self.state == State::CrashedLarge {
            large_value_for(i)
        } else {
            value_for(i)
        }
    }

    fn crashed(&self) -> bool {
        self.state.crashed()
    }
}

impl State {
    const ALL: [Self; 6] = [
        Self::Crashed,
        Self::CrashedPastPoint,
        Self::CrashedGrown,
        Self::CrashedLarge,
        Self::Sealed,
        Self::Closed,
    ];

    fn crashed(self) -> bool {
        !matches!(self, Self::Sealed | Self::Closed)
    }
}

fn template(state: State) -> Template {
    let live = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = match state {
        State::Sealed => Options::default().segment_bytes(300),
        _ => Options::default(),
    };
    let bus = EmbeddedBus::open_with(live.path(), options).unwrap();
    provision(&bus, 1);
    let mut acked = ACKED;
    match state {
        State::CrashedGrown => {
            publish(&bus, 0, GROWN);
            acked = GROWN;
        }
        State::CrashedLarge => {
            publish_values(&bus, 0, LARGE, large_value_for);
            acked = LARGE;
        }
        _ => publish(&bus, 0, ACKED),
    }
    match state {
        State::Crashed | State::CrashedPastPoint | State::CrashedGrown | State::CrashedLarge => {
            if matches!(state, State::Crashed | State::CrashedPastPoint) {
                bus.maintenance(now_ms()).unwrap();
            }
            if state == State::CrashedPastPoint {
                publish(&bus, ACKED, PAST_POINT);
                acked += PAST_POINT;
            }
            copy_tree(live.path(), dir.path());
            drop(bus);
        }
        State::Sealed | State::Closed => {
            drop(bus);
            copy_tree(live.path(), dir.path());
        }
    }
    let logs = segments(dir.path(), 0);
    let target = match state {
        State::Sealed => {
            assert!(logs.len() >= 3, "{logs:?}");
            logs[logs.len() - 2].clone()
        }
        _ => {
            assert_eq!(logs.len(), 1);
            logs[0].clone()
        }
    };
    let bytes = std::fs::read(&target).unwrap();
    let zeros_ahead = bytes.last() == Some(&0);
    assert_eq!(
        zeros_ahead,
        state.crashed(),
        "{state:?}: zeros ahead only while open"
    );
    let target = target.strip_prefix(dir.path()).unwrap().to_path_buf();
    Template {
        state,
        dir,
        target,
        acked,
        bytes,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Recovered,
    Corrupt,
    /// Acked records went without an error.
    Lost(usize),
}

/// What reopening after `damage` gives.
fn reopen(template: &Template, damage: &dyn Fn(&[u8]) -> Vec<u8>) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(template.dir.path(), dir.path());
    let target = dir.path().join(&template.target);
    std::fs::write(&target, damage(&template.bytes)).unwrap();
    let named = |location: &str, offset: u64| {
        assert!(
            location.ends_with(".log") && offset <= template.acked as u64,
            "Corrupt must name a segment and an offset: {location} @ {offset}"
        );
        Outcome::Corrupt
    };
    let bus = match EmbeddedBus::open(dir.path()) {
        Err(BusError::Corrupt {
            location, offset, ..
        }) => return named(&location, offset),
        Err(other) => panic!("open failed other than with Corrupt: {other:?}"),
        Ok(bus) => bus,
    };
    let mut got = Vec::new();
    loop {
        match bus.fetch(TOPIC, 0, got.len() as u64, 64) {
            Ok(page) if page.is_empty() => break,
            Ok(page) => got.extend(page),
            Err(BusError::Corrupt {
                location, offset, ..
            }) => return named(&location, offset),
            Err(other) => panic!("fetch failed other than with Corrupt: {other:?}"),
        }
    }
    for (i, event) in got.iter().enumerate() {
        assert_eq!(event.offset, i as u64, "hole");
        assert_eq!(event.value, template.value(i), "offset {i}: wrong data");
    }
    let next = bus.offsets(TOPIC, 0).unwrap().next;
    assert_eq!(next, got.len() as u64, "records past the last fetched one");
    match template.acked - got.len() {
        0 => Outcome::Recovered,
        gone => Outcome::Lost(gone),
    }
}

/// What a case may end in.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Corrupt,
    Recovered,
    /// No acked record is touched: refusing the damage and dropping it
    /// with the tail are both right.
    Either,
}

impl Expect {
    fn allows(self, outcome: &Outcome) -> bool {
        matches!(
            (self, outcome),
            (Self::Corrupt | Self::Either, Outcome::Corrupt)
                | (Self::Recovered | Self::Either, Outcome::Recovered)
        )
    }
}

/// Turns a segment's bytes into damaged ones.
type Damage = Box<dyn Fn(&[u8]) -> Vec<u8>>;

struct Case {
    kind: &'static str,
    what: String,
    expect: Expect,
    damage: Damage,
}

/// The damage cases for one state's target segment. Every frame holds
/// acked records, so damage inside one is `Corrupt`; so is a cut in the
/// zeros a crashed writer had fsynced ahead (they cannot go missing in a
/// crash). A flipped byte where the next frame would start may read as the
/// first piece of a torn frame or as damage.
fn cases(t: &Template) -> Vec<Case> {
    let (starts, frames_end) = frames(&t.bytes);
    assert!(starts.len() >= 3, "{:?}: {} frames", t.state, starts.len());
    let file_len = t.bytes.len();
    let crashed = t.crashed();
    // Large frames are sampled; small ones cut at every byte.
    let step = if t.state == State::CrashedLarge {
        997
    } else {
        1
    };
    let last_two = starts[starts.len() - 2];
    let mut out = Vec::new();
    let mut cuts: Vec<usize> = (last_two..frames_end).step_by(step).collect();
    cuts.push(frames_end - 1);
    for cut in cuts {
        out.push(Case {
            kind: if crashed {
                "zeros removed, frames cut"
            } else {
                "truncate"
            },
            what: format!("cut at byte {cut}"),
            expect: Expect::Corrupt,
            damage: Box::new(move |b| b[..cut].to_vec()),
        });
    }
    if crashed {
        for cut in [frames_end, frames_end + 1, file_len - 1] {
            out.push(Case {
                kind: "truncate",
                what: format!("cut at byte {cut} in the zeros"),
                expect: Expect::Corrupt,
                damage: Box::new(move |b| b[..cut].to_vec()),
            });
        }
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for len in [1usize, 3, 17, 300, 4096] {
        let garbage: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed as u8) | 1
            })
            .collect();
        out.push(Case {
            kind: "garbage",
            what: format!("{len} garbage bytes appended"),
            // Past the end of a cleanly closed or crashed active segment
            // they belong to no acked frame; a sealed segment must be exact.
            expect: if t.state == State::Sealed {
                Expect::Corrupt
            } else {
                Expect::Recovered
            },
            damage: Box::new(move |b| [b, garbage.as_slice()].concat()),
        });
    }
    for (at, len) in [(frames_end / 2, 64usize), (starts[1] + 10, 16)] {
        out.push(Case {
            kind: "zero block",
            what: format!("{len} zeros at byte {at}"),
            expect: Expect::Corrupt,
            damage: Box::new(move |b| {
                let mut b = b.to_vec();
                b[at..at + len].fill(0);
                b
            }),
        });
    }
    // Every 7th byte of small segments; the last two frames (sampled) of
    // the grown and large ones.
    let (from, flip_step) = match t.state {
        State::CrashedLarge => (last_two, 1009),
        State::CrashedGrown => (last_two, 1),
        _ => (0, 7),
    };
    let mut flips: Vec<(usize, Expect)> = (from..frames_end)
        .step_by(flip_step)
        .map(|pos| (pos, Expect::Corrupt))
        .collect();
    if crashed {
        flips.push((frames_end, Expect::Either));
        for pos in [frames_end + 1000, file_len - 1] {
            flips.push((pos, Expect::Recovered));
        }
    }
    for (pos, expect) in flips {
        out.push(Case {
            kind: "bit flip",
            what: format!("bit {} of byte {pos} flipped", pos % 8),
            expect,
            damage: Box::new(move |b| {
                let mut b = b.to_vec();
                b[pos] ^= 1 << (pos % 8);
                b
            }),
        });
    }
    out
}

#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    recovered: usize,
    corrupt: usize,
    lost_cases: usize,
    lost_records: usize,
}

impl Tally {
    fn add(&mut self, outcome: &Outcome) {
        self.cases += 1;
        match outcome {
            Outcome::Recovered => self.recovered += 1,
            Outcome::Corrupt => self.corrupt += 1,
            Outcome::Lost(n) => {
                self.lost_cases += 1;
                self.lost_records += n;
            }
        }
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cases, {} recovered with every acked record, {} reported as Corrupt, \
             silently lost = {} ({} acked records)",
            self.cases, self.recovered, self.corrupt, self.lost_cases, self.lost_records
        )
    }
}

#[test]
fn damage_matrix_loses_no_acked_record_silently() {
    let mut total = Tally::default();
    let mut per_kind: BTreeMap<(State, &str), Tally> = BTreeMap::new();
    let mut unexpected = Vec::new();
    for state in State::ALL {
        let t = template(state);
        for case in cases(&t) {
            let outcome = reopen(&t, &case.damage);
            total.add(&outcome);
            per_kind
                .entry((state, case.kind))
                .or_default()
                .add(&outcome);
            if !case.expect.allows(&outcome) {
                unexpected.push(format!(
                    "{state:?}, {}: {:?}, expected {:?}",
                    case.what, outcome, case.expect
                ));
            }
        }
    }
    for ((state, kind), tally) in &per_kind {
        println!("{state:?} / {kind}: {tally}");
    }
    println!("damage matrix: {total}");
    for line in unexpected.iter().take(20) {
        println!("unexpected: {line}");
    }
    assert_eq!(total.lost_cases, 0, "acked records silently lost");
    assert!(
        unexpected.is_empty(),
        "{} cases ended otherwise than expected",
        unexpected.len()
    );
    // Both outcomes occur.
    assert!(total.recovered > 0 && total.corrupt > 0);
}

/// The crash states really are crash states: reopening the untouched
/// snapshot gives every acked record back.
#[test]
fn untouched_snapshots_recover_everything() {
    for state in State::ALL {
        let t = template(state);
        assert_eq!(reopen(&t, &<[u8]>::to_vec), Outcome::Recovered, "{state:?}");
    }
}
