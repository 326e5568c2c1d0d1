//! C24 crash safety: an archiver killed (SIGKILL) at random moments leaves
//! nothing half-visible, archives nothing twice and loses nothing — on local
//! files, and on the S3 server when BUS_S3_ENDPOINT is set. The archiver is
//! this test binary run again as a child (`crash_child`).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bus_cold::{ColdLocation, ColdTier};
use common::{records, unique};

const RECORDS: u64 = 3000;
const PER_OBJECT: usize = 40;
const ROUNDS: usize = 12;

/// The child: archives `[0, RECORDS)` of the topic in `BUS_COLD_CRASH_TOPIC`
/// at the location in `BUS_COLD_CRASH_LOCATION`, printing a line before each object.
#[test]
fn crash_child() {
    let (Ok(location), Ok(topic)) = (
        std::env::var("BUS_COLD_CRASH_LOCATION"),
        std::env::var("BUS_COLD_CRASH_TOPIC"),
    ) else {
        return; // run as a plain test: nothing to do
    };
    let tier = ColdTier::open(&ColdLocation::parse(&location).unwrap()).unwrap();
    let all = records(&topic, 0, 0, RECORDS);
    tier.archive_with(&topic, 0, RECORDS, PER_OBJECT, |from, max| {
        println!("reading {from}");
        Ok(all.iter().skip(from as usize).take(max).cloned().collect())
    })
    .unwrap();
    println!("done");
}

/// A pseudo-random number in `0..n` (no rand crate needed for this).
fn random(n: u64) -> u64 {
    u64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap()) % n.max(1)
}

fn run_rounds(location_url: &str, name: &str) {
    let topic = unique("crash");
    let all = records(&topic, 0, 0, RECORDS);
    let location = ColdLocation::parse(location_url).unwrap();
    let mut killed = 0;
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env("BUS_COLD_CRASH_LOCATION", location_url)
            .env("BUS_COLD_CRASH_TOPIC", &topic)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Kill after a random number of objects and a random part of the next.
        let objects = random(RECORDS / PER_OBJECT as u64 / ROUNDS as u64 * 2 + 1);
        let mut seen = 0;
        let mut finished = false;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if line == "done" {
                finished = true;
                break;
            }
            if line.starts_with("reading") {
                seen += 1;
                if seen > objects {
                    break;
                }
            }
        }
        // A random moment inside the write of the next object or manifest
        // (polling a deadline: not a sleep).
        let until = Instant::now() + Duration::from_micros(random(3000));
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        if !finished && !status.success() {
            killed += 1;
        }
        // After each kill: the visible history is a gap-free prefix, exact.
        let tier = ColdTier::open(&location).unwrap();
        let manifest = tier.manifest(&topic, 0).unwrap();
        let end = manifest.end();
        let visible = tier.read(&topic, 0, 0, RECORDS as usize + 10).unwrap();
        assert_eq!(visible.len() as u64, end, "{name} round {round}");
        assert_eq!(
            visible,
            all[..end as usize],
            "{name} round {round}: exact records"
        );
        let covered: u64 = manifest.ranges.iter().map(|r| r.end - r.from).sum();
        assert_eq!(covered, end, "{name} round {round}: nothing twice");
        if end == RECORDS {
            break;
        }
    }
    // Finish in-process: everything archived once, nothing lost.
    let tier = ColdTier::open(&location).unwrap();
    tier.archive_with(&topic, 0, RECORDS, PER_OBJECT, |from, max| {
        Ok(all.iter().skip(from as usize).take(max).cloned().collect())
    })
    .unwrap();
    let manifest = tier.manifest(&topic, 0).unwrap();
    assert_eq!(manifest.end(), RECORDS, "{name}");
    assert_eq!(
        manifest.ranges.iter().map(|r| r.end - r.from).sum::<u64>(),
        RECORDS,
        "{name}"
    );
    assert_eq!(
        tier.read(&topic, 0, 0, RECORDS as usize).unwrap(),
        all,
        "{name}"
    );
    eprintln!(
        "{name}: {killed} archivers killed mid-way, {} objects in {} manifest generations, all {RECORDS} records once",
        manifest.ranges.len(),
        manifest.generation
    );
    assert!(
        killed > 0,
        "{name}: no child was killed mid-archive; the test proved nothing"
    );
}

#[test]
fn an_archiver_killed_at_random_moments_leaves_nothing_half_visible() {
    let dir = tempfile::tempdir().unwrap();
    run_rounds(&format!("file://{}", dir.path().display()), "local");
    if let Some(ColdLocation::S3 { s3, prefix }) = common::s3(&unique("crash")) {
        let endpoint = s3.endpoint.unwrap_or_default();
        run_rounds(
            &format!("s3://{}/{prefix}?endpoint={endpoint}", s3.bucket),
            "s3",
        );
    }
}
