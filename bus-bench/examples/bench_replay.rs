//! Embedded replay beside serde_json parsing the same bytes (issue #32).
//!
//! ```text
//! cargo run --release -p bus-bench --example bench_replay -- [--records N] [--rounds N] [--dir DIR]
//! ```
//! Fills one partition (batches of 1,000 of the bench's ~200-byte events),
//! then, rounds alternating, replays it with `fetch(max=1000)` in each of
//! the ways below and parses the very bytes stored (read once into memory)
//! with `serde_json::from_slice::<Value>`. The best round of each counts;
//! the ratios are to serde_json's rate in the same run. The load average
//! is printed before and after (the machine may be shared).
//!
//! - `fetch` (the trait: `StoredEvent`s, values parsed)
//! - `fetch_with_headers` (`StoredRecord`s: the events and their headers)
//! - `fetch_raw` (the stored bytes, checksums verified, not parsed)
//! - `fetch_raw` then `serde_json::from_slice` of each value (the read
//!   path and the parse, apart: where a record's time goes)
#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_wrap,
    missing_docs
)]

use std::path::PathBuf;
use std::time::Instant;

use bus_core::{BatchRecord, EventBus, Manifest, TopicSpec};
use bus_embedded::EmbeddedBus;
use serde_json::{Value, json};

const PAGE: usize = 1_000;

fn event(i: u64) -> Value {
    let mut value = json!({
        "metadata": {"uid": format!("e{i}")},
        "agent": format!("agent-{}", i % 16),
        "kind": "tool_call",
        "seq": i,
        "payload": "",
    });
    let len = serde_json::to_vec(&value).unwrap().len();
    value["payload"] = json!("x".repeat(200usize.saturating_sub(len)));
    value
}

/// An experiment: serde_json's tokenizer building a `Value` whose maps are
/// collected and built in one go (`BTreeMap::from_iter` on sorted keys)
/// instead of inserted key by key as `Value`'s own `Deserialize` does.
mod bulk {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Number, Value};
    use std::fmt;

    pub fn parse(bytes: &[u8]) -> serde_json::Result<Value> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let value = Seed.deserialize(&mut de)?;
        de.end()?;
        Ok(value)
    }

    struct Seed;

    impl<'de> DeserializeSeed<'de> for Seed {
        type Value = Value;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(Build)
        }
    }

    struct Build;

    impl<'de> Visitor<'de> for Build {
        type Value = Value;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(v) = seq.next_element_seed(Seed)? {
                out.push(v);
            }
            Ok(Value::Array(out))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut out: Vec<(String, Value)> = Vec::with_capacity(8);
            while let Some(k) = map.next_key::<String>()? {
                out.push((k, map.next_value_seed(Seed)?));
            }
            Ok(Value::Object(
                out.into_iter().collect::<Map<String, Value>>(),
            ))
        }
    }
}

/// An experiment: a hand-written parser straight to `serde_json::Value`
/// (no serde visitor; strings without escapes copied in one go, maps
/// built in bulk; escapes and non-integer numbers handed to serde_json).
mod hand {
    use serde_json::{Map, Number, Value};

    pub fn parse(text: &str) -> Option<Value> {
        let mut p = P {
            s: text,
            b: text.as_bytes(),
            i: 0,
        };
        let value = p.value(0)?;
        p.ws();
        (p.i == p.b.len()).then_some(value)
    }

    struct P<'a> {
        s: &'a str,
        b: &'a [u8],
        i: usize,
    }

    impl P<'_> {
        fn ws(&mut self) {
            while matches!(self.b.get(self.i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
                self.i += 1;
            }
        }

        fn eat(&mut self, c: u8) -> Option<()> {
            self.ws();
            (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
        }

        fn value(&mut self, depth: u32) -> Option<Value> {
            if depth > 128 {
                return None;
            }
            self.ws();
            match *self.b.get(self.i)? {
                b'{' => {
                    self.i += 1;
                    let mut out: Vec<(String, Value)> = Vec::new();
                    if self.eat(b'}').is_some() {
                        return Some(Value::Object(Map::new()));
                    }
                    loop {
                        self.ws();
                        let key = self.string()?;
                        self.eat(b':')?;
                        out.push((key, self.value(depth + 1)?));
                        self.ws();
                        match *self.b.get(self.i)? {
                            b',' => self.i += 1,
                            b'}' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                    Some(Value::Object(out.into_iter().collect()))
                }
                b'[' => {
                    self.i += 1;
                    let mut out = Vec::new();
                    if self.eat(b']').is_some() {
                        return Some(Value::Array(out));
                    }
                    loop {
                        out.push(self.value(depth + 1)?);
                        self.ws();
                        match *self.b.get(self.i)? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                    Some(Value::Array(out))
                }
                b'"' => self.string().map(Value::String),
                b't' => self.word("true", Value::Bool(true)),
                b'f' => self.word("false", Value::Bool(false)),
                b'n' => self.word("null", Value::Null),
                _ => self.number(),
            }
        }

        fn word(&mut self, word: &str, value: Value) -> Option<Value> {
            self.b[self.i..].starts_with(word.as_bytes()).then(|| {
                self.i += word.len();
                value
            })
        }

        fn string(&mut self) -> Option<String> {
            if self.b.get(self.i) != Some(&b'"') {
                return None;
            }
            let start = self.i + 1;
            let n = self.b[start..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
            if self.b[start + n] == b'"' {
                self.i = start + n + 1;
                return Some(self.s[start..start + n].to_owned());
            }
            // Escapes: find the end, let serde_json decode.
            let mut j = start + n;
            loop {
                match *self.b.get(j)? {
                    b'\\' => j += 2,
                    b'"' => break,
                    _ => j += 1,
                }
            }
            self.i = j + 1;
            serde_json::from_str(&self.s[start - 1..=j]).ok()
        }

        fn number(&mut self) -> Option<Value> {
            let start = self.i;
            let end = start
                + self.b[start..]
                    .iter()
                    .position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .unwrap_or(self.b.len() - start);
            self.i = end;
            let span = &self.b[start..end];
            let digits = span.strip_prefix(b"-").unwrap_or(span);
            let plain = !digits.is_empty()
                && digits.len() < 19
                && digits.iter().all(u8::is_ascii_digit)
                && (digits[0] != b'0' || digits.len() == 1);
            if plain {
                let n = digits
                    .iter()
                    .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
                return Some(Value::Number(if span[0] == b'-' {
                    Number::from(-(n as i64))
                } else {
                    Number::from(n)
                }));
            }
            serde_json::from_str(&self.s[start..end]).ok()
        }
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Replays the partition page by page with `page`; returns the records seen.
fn replay<T>(mut page: impl FnMut(u64) -> Vec<T>, offset_of: impl Fn(&T) -> u64) -> u64 {
    let (mut offset, mut seen) = (0, 0u64);
    loop {
        let got = page(offset);
        let Some(last) = got.last() else {
            return seen;
        };
        offset = offset_of(last) + 1;
        seen += got.len() as u64;
        std::hint::black_box(got);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let records: u64 = flag("--records").map_or(200_000, |v| v.parse().unwrap());
    let rounds: usize = flag("--rounds").map_or(5, |v| v.parse().unwrap());
    let tmp =
        tempfile::tempdir_in(flag("--dir").map_or_else(std::env::temp_dir, PathBuf::from)).unwrap();
    println!("load average at start: {}", load());
    let bus = EmbeddedBus::open(tmp.path()).unwrap();
    bus.provision(&Manifest::new([TopicSpec::new("replay", 1)]))
        .unwrap();
    let mut i = 0;
    while i < records {
        let n = (records - i).min(1_000);
        let batch: Vec<BatchRecord> = (i..i + n)
            .map(|j| BatchRecord::new("k", event(j)))
            .collect();
        bus.publish_batch("replay", &batch).unwrap();
        i += n;
    }
    // The very bytes stored, for serde_json alone.
    let stored: Vec<Vec<u8>> = {
        let mut all = Vec::new();
        replay(
            |offset| {
                let page = bus.fetch_raw("replay", 0, offset, PAGE).unwrap();
                all.extend(page.iter().map(|r| r.value.clone()));
                page
            },
            |r| r.offset,
        );
        all
    };
    assert_eq!(stored.len() as u64, records);
    let bytes: usize = stored.iter().map(Vec::len).sum();

    let names = [
        "fetch (trait, Value)",
        "fetch_with_headers (Value + headers)",
        "fetch_raw (bytes, verified)",
        "fetch_raw + serde_json::from_slice",
        "serde_json::from_slice, same bytes",
        "bulk-built maps (experiment), same bytes",
        "hand parser (experiment), same bytes",
    ];
    for value in stored.iter().take(1_000) {
        let expected = serde_json::from_slice::<Value>(value).unwrap();
        assert_eq!(bulk::parse(value).unwrap(), expected);
        let text = std::str::from_utf8(value).unwrap();
        assert_eq!(hand::parse(text), Some(expected));
    }
    let mut best = [0f64; 7];
    for _ in 0..rounds {
        let mut run = |slot: usize, work: &mut dyn FnMut() -> u64| {
            let started = Instant::now();
            let seen = work();
            assert_eq!(seen, records, "{}", names[slot]);
            best[slot] = best[slot].max(seen as f64 / started.elapsed().as_secs_f64());
        };
        run(0, &mut || {
            replay(|o| bus.fetch("replay", 0, o, PAGE).unwrap(), |e| e.offset)
        });
        run(1, &mut || {
            replay(
                |o| bus.fetch_with_headers("replay", 0, o, PAGE).unwrap(),
                |r| r.event.offset,
            )
        });
        run(2, &mut || {
            replay(
                |o| bus.fetch_raw("replay", 0, o, PAGE).unwrap(),
                |r| r.offset,
            )
        });
        run(3, &mut || {
            replay(
                |o| {
                    bus.fetch_raw("replay", 0, o, PAGE)
                        .unwrap()
                        .into_iter()
                        .map(|r| {
                            let value: Value = serde_json::from_slice(&r.value).unwrap();
                            (r.offset, value)
                        })
                        .collect::<Vec<_>>()
                },
                |(offset, _)| *offset,
            )
        });
        run(4, &mut || {
            let mut page = Vec::with_capacity(PAGE);
            for value in &stored {
                page.push(serde_json::from_slice::<Value>(value).unwrap());
                if page.len() == PAGE {
                    std::hint::black_box(std::mem::take(&mut page));
                    page.reserve(PAGE);
                }
            }
            std::hint::black_box(page);
            stored.len() as u64
        });
        run(5, &mut || {
            let mut page = Vec::with_capacity(PAGE);
            for value in &stored {
                page.push(bulk::parse(value).unwrap());
                if page.len() == PAGE {
                    std::hint::black_box(std::mem::take(&mut page));
                    page.reserve(PAGE);
                }
            }
            std::hint::black_box(page);
            stored.len() as u64
        });
        run(6, &mut || {
            let mut page = Vec::with_capacity(PAGE);
            for value in &stored {
                let text = std::str::from_utf8(value).unwrap();
                page.push(hand::parse(text).unwrap());
                if page.len() == PAGE {
                    std::hint::black_box(std::mem::take(&mut page));
                    page.reserve(PAGE);
                }
            }
            std::hint::black_box(page);
            stored.len() as u64
        });
    }
    let parse = best[4];
    println!(
        "{records} records, {:.0} bytes each as stored; best of {rounds} rounds",
        bytes as f64 / records as f64
    );
    println!(
        "{:<40} {:>12} {:>9} {:>14}",
        "replay fetch(max=1000)", "rec/s", "ns/rec", "/ serde_json"
    );
    for (name, rate) in names.iter().zip(best) {
        println!(
            "{name:<40} {rate:>12.0} {:>9.0} {:>14.2}",
            1e9 / rate,
            rate / parse
        );
    }
    println!("load average at end: {}", load());
    println!(
        "{}",
        json!({
            "records": records,
            "fetch": best[0], "fetch_with_headers": best[1], "fetch_raw": best[2],
            "fetch_raw_then_parse": best[3], "serde_json": best[4], "bulk_maps": best[5], "hand_parser": best[6],
        })
    );
}
