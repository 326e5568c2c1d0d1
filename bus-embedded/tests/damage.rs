//! Damage matrix (C15): for each state a segment can be in — active after a
//! crash (zeros written ahead, recovery point past every acked record),
//! active after a crash with acked records past the recovery point, sealed,
//! cleanly closed — cut it at every byte of its last two frames, append
//! garbage, zero a block in the middle and flip bits. Reopening must give
//! back every acked record or report `Corrupt` naming the segment; an acked
//! record may go without a word only past the recovery point of a crashed
//! writer (nothing there was known complete).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use bus_core::{BusError, EventBus};
use bus_embedded::{EmbeddedBus, Options};
use support::{TOPIC, copy_tree, provision, segments};

/// Records published one by one (one frame each) in every state.
const ACKED: usize = 12;
/// Records published after the last recovery point in the crash-past-point state.
const PAST_POINT: usize = 2;

fn uid(i: usize) -> String {
    format!("u{i}")
}

/// Small values keep frames short, so cutting at every byte stays cheap.
fn value_for(i: usize) -> serde_json::Value {
    serde_json::json!({ "u": uid(i), "i": i })
}

fn publish(bus: &dyn EventBus, from: usize, n: usize) {
    for i in from..from + n {
        let ack = bus
            .publish_idempotent(TOPIC, "k", &value_for(i), &uid(i))
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
    /// Records known complete (below the recovery point).
    known: usize,
    bytes: Vec<u8>,
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
    publish(&bus, 0, ACKED);
    let mut acked = ACKED;
    let mut known = ACKED;
    match state {
        State::Crashed | State::CrashedPastPoint => {
            bus.maintenance(now_ms()).unwrap();
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
    let crashed = matches!(state, State::Crashed | State::CrashedPastPoint);
    assert_eq!(
        zeros_ahead, crashed,
        "{state:?}: zeros ahead only while open"
    );
    if state == State::CrashedPastPoint {
        known = ACKED;
    }
    let target = target.strip_prefix(dir.path()).unwrap().to_path_buf();
    Template {
        state,
        dir,
        target,
        acked,
        known,
        bytes,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Recovered,
    Corrupt,
    /// Acked records past the recovery point were dropped as a torn tail.
    TailDropped(usize),
    /// Acked records known complete went without an error.
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
        assert_eq!(event.value, value_for(i), "offset {i}: wrong data");
    }
    let next = bus.offsets(TOPIC, 0).unwrap().next;
    assert_eq!(next, got.len() as u64, "records past the last fetched one");
    match template.acked - got.len() {
        0 => Outcome::Recovered,
        gone if got.len() >= template.known => Outcome::TailDropped(gone),
        gone => Outcome::Lost(gone),
    }
}

/// What a case may end in.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Corrupt,
    Recovered,
    /// Damage past the recovery point: dropped, or refused when a frame after it verifies.
    Unverified,
}

impl Expect {
    fn allows(self, outcome: &Outcome) -> bool {
        match (self, outcome) {
            (_, Outcome::Lost(_)) => false,
            (Self::Corrupt, Outcome::Corrupt) | (Self::Recovered, Outcome::Recovered) => true,
            (Self::Unverified, _) => true,
            _ => false,
        }
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

/// The damage cases for one state's target segment.
fn cases(t: &Template) -> Vec<Case> {
    let (starts, frames_end) = frames(&t.bytes);
    assert!(starts.len() >= 3, "{:?}: {} frames", t.state, starts.len());
    let file_len = t.bytes.len();
    let crashed = matches!(t.state, State::Crashed | State::CrashedPastPoint);
    // Bytes at or past this hold only frames written after the recovery point.
    let point_pos = match t.state {
        State::CrashedPastPoint => starts[starts.len() - PAST_POINT],
        _ => frames_end,
    };
    let in_frames = |pos: usize| {
        if pos >= point_pos {
            Expect::Unverified
        } else {
            Expect::Corrupt
        }
    };
    let mut out = Vec::new();
    for cut in starts[starts.len() - 2]..frames_end {
        out.push(Case {
            kind: "truncate",
            what: format!("cut at byte {cut}"),
            expect: in_frames(cut),
            damage: Box::new(move |b| b[..cut].to_vec()),
        });
    }
    if crashed {
        // Cuts in the zeros written ahead lose no frame.
        for cut in [frames_end, frames_end + 1, file_len - 1] {
            out.push(Case {
                kind: "truncate",
                what: format!("cut at byte {cut} in the zeros"),
                expect: Expect::Recovered,
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
    let mut flips: Vec<(usize, Expect)> = (0..frames_end)
        .step_by(7)
        .map(|pos| (pos, in_frames(pos)))
        .collect();
    if crashed {
        for pos in [frames_end, frames_end + 1000, file_len - 1] {
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
    tails: usize,
    tail_records: usize,
    lost_cases: usize,
    lost_records: usize,
}

impl Tally {
    fn add(&mut self, outcome: &Outcome) {
        self.cases += 1;
        match outcome {
            Outcome::Recovered => self.recovered += 1,
            Outcome::Corrupt => self.corrupt += 1,
            Outcome::TailDropped(n) => {
                self.tails += 1;
                self.tail_records += n;
            }
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
            "{} cases, {} recovered, {} reported as Corrupt, {} unverified tails dropped \
             ({} records past the recovery point), silently lost = {} ({} acked records)",
            self.cases,
            self.recovered,
            self.corrupt,
            self.tails,
            self.tail_records,
            self.lost_cases,
            self.lost_records
        )
    }
}

#[test]
fn damage_matrix_loses_no_acked_record_silently() {
    let mut total = Tally::default();
    let mut per_kind: BTreeMap<(State, &str), Tally> = BTreeMap::new();
    let mut unexpected = Vec::new();
    for state in [
        State::Crashed,
        State::CrashedPastPoint,
        State::Sealed,
        State::Closed,
    ] {
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
    // Both outcomes occur, and dropping is confined to unverified tails.
    assert!(total.recovered > 0 && total.corrupt > 0 && total.tails > 0);
}

/// The crash states really are crash states: reopening the untouched
/// snapshot gives every acked record back.
#[test]
fn untouched_snapshots_recover_everything() {
    for state in [
        State::Crashed,
        State::CrashedPastPoint,
        State::Sealed,
        State::Closed,
    ] {
        let t = template(state);
        assert_eq!(reopen(&t, &<[u8]>::to_vec), Outcome::Recovered, "{state:?}");
    }
}
