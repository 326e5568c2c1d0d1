//! The UIDs of one sealed segment as lookups see them (`SealedUids`): its
//! table on disk, loaded on the first lookup and rebuilt from the segment
//! when unfit, or held in memory.

use bus_core::backend::sync::{read, write};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

use bus_core::BusError;

use super::{Filter, HEADER, Table, Unfit, decode_header, encode, read_head};
use crate::fsutil;
use crate::log::segment::{self, LOG, UIDS};
use crate::options::Options;
use crate::uid::index::UidIndex;
use crate::uid::keyed::Key;

/// The UIDs of one sealed segment as lookups see them: its table on disk,
/// loaded on the first lookup, or (a UID too long for a page) held in
/// memory. Also the UIDs of the first `log_len` bytes of the active
/// segment after a clean close (its table written then), so that open
/// need not read them back.
#[derive(Debug)]
pub(crate) struct SealedUids {
    base: u64,
    end: u64,
    log_len: u64,
    log_path: PathBuf,
    table_path: PathBuf,
    /// Whether a table found unfit may be rewritten.
    writable: bool,
    index_interval: u64,
    state: RwLock<State>,
    /// The loaded table's filter, read without a lock: most lookups of a
    /// partition with many segments end here, and a locked instruction per
    /// segment would serialize their cache misses. It stays right when the
    /// table is rebuilt under a new key: it holds the same UIDs, and the
    /// filter hashes with the key it was built with.
    filter: OnceLock<Arc<Filter>>,
}

#[derive(Debug)]
enum State {
    Unloaded,
    Table(Table),
    /// The index, and the list it was built from (for [`SealedUids::entries`]).
    Memory(UidIndex, Vec<(String, u64)>),
}

impl SealedUids {
    /// The UIDs of the sealed segment `base..end` of `log_len` bytes in `dir`.
    pub fn new(dir: &Path, base: u64, end: u64, log_len: u64, options: &Options) -> Self {
        Self::at(dir, base, end, log_len, options, UIDS)
    }

    /// The same, with the table in the file of extension `ext`.
    pub fn at(dir: &Path, base: u64, end: u64, log_len: u64, options: &Options, ext: &str) -> Self {
        Self {
            base,
            end,
            log_len,
            log_path: segment::path(dir, base, LOG),
            table_path: segment::path(dir, base, ext),
            writable: !options.read_only,
            index_interval: options.index_interval_bytes,
            state: RwLock::new(State::Unloaded),
            filter: OnceLock::new(),
        }
    }

    /// Every offset of `uid` in the segment, ascending; `filtered`: ask
    /// the filter first (see [`Table::get_filtered`]).
    pub fn get(&self, uid: &str, filtered: bool) -> Result<Vec<u64>, BusError> {
        if filtered
            && let Some(filter) = self.filter.get()
            && !filter.may_hold(uid.as_bytes())
        {
            return Ok(Vec::new());
        }
        for _ in 0..3 {
            let why = {
                let state = read(&self.state);
                match &*state {
                    State::Memory(index, _) => return Ok(index.all(uid)),
                    State::Table(table) => match table.get_filtered(uid.as_bytes(), filtered) {
                        Ok(found) => {
                            // From now on absent UIDs are answered without the lock.
                            if filtered
                                && self.filter.get().is_none()
                                && let Some(filter) = table.filter.get()
                            {
                                let _ = self.filter.set(Arc::clone(filter));
                            }
                            return Ok(found);
                        }
                        Err(Unfit::Io(error)) => return Err(error.into()),
                        Err(Unfit::Damaged(why)) => Some(why),
                    },
                    State::Unloaded => None,
                }
            };
            let mut state = write(&self.state);
            match (&*state, why) {
                (State::Unloaded, _) => *state = self.load()?,
                // Another lookup may have rebuilt it meanwhile: look again.
                (State::Table(table), Some(why))
                    if table.get_filtered(uid.as_bytes(), filtered).is_err() =>
                {
                    *state = self.rebuild(&why)?;
                }
                _ => {}
            }
        }
        Err(BusError::backend(
            "embedded",
            format!("UID table {} keeps failing", self.table_path.display()),
        ))
    }

    /// Whether the table file's header (of either format) fits the
    /// segment: a cheap check at open (one header read).
    pub fn header_fits(&self) -> bool {
        let Ok(file) = File::open(&self.table_path) else {
            return false;
        };
        let mut head = [0u8; HEADER];
        let Ok(meta) = file.metadata() else {
            return false;
        };
        read_head(&file, &mut head).is_ok_and(|got| {
            decode_header(&head[..got], self.base, self.end, self.log_len, meta.len()).is_some()
        })
    }

    /// A first-format table's entries (read whole and checked), written
    /// again keyed; rebuilt from the segment when they do not read.
    fn convert(&self, table: &Table) -> Result<State, BusError> {
        match table.entries() {
            Ok(entries) => {
                tracing::debug!(
                    path = %self.table_path.display(),
                    "UID table of the first format: rewriting it keyed"
                );
                self.state_of(&entries)
            }
            Err(Unfit::Io(error)) => Err(error.into()),
            Err(Unfit::Damaged(why)) => self.rebuild(&why),
        }
    }

    /// Every `(UID, offset)`, in offset order (to seal the active segment
    /// whose first bytes this covers).
    pub fn entries(&self) -> Result<Vec<(String, u64)>, BusError> {
        let mut state = write(&self.state);
        if matches!(*state, State::Unloaded) {
            *state = self.load()?;
        }
        let why = match &*state {
            State::Memory(_, list) => return Ok(list.clone()),
            State::Table(table) => match table.entries() {
                Ok(entries) => return Ok(entries),
                Err(Unfit::Io(error)) => return Err(error.into()),
                Err(Unfit::Damaged(why)) => why,
            },
            State::Unloaded => "not loaded".to_owned(),
        };
        *state = self.rebuild(&why)?;
        match &*state {
            State::Memory(_, list) => Ok(list.clone()),
            State::Table(table) => table.entries().map_err(|e| match e {
                Unfit::Io(error) => error.into(),
                Unfit::Damaged(why) => BusError::backend(
                    "embedded",
                    format!(
                        "UID table {} just rebuilt does not read: {why}",
                        self.table_path.display()
                    ),
                ),
            }),
            State::Unloaded => Ok(Vec::new()),
        }
    }

    fn load(&self) -> Result<State, BusError> {
        let why = match File::open(&self.table_path) {
            Ok(file) => match Table::load(file, self.base, self.end, self.log_len) {
                Ok(table) if table.is_first_format() => return self.convert(&table),
                Ok(table) => return Ok(State::Table(table)),
                Err(Unfit::Io(error)) => return Err(error.into()),
                Err(Unfit::Damaged(why)) => why,
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => "missing".to_owned(),
            Err(error) => return Err(error.into()),
        };
        self.rebuild(&why)
    }

    /// Rebuilds the table from the segment, which must verify completely.
    fn rebuild(&self, why: &str) -> Result<State, BusError> {
        tracing::warn!(
            path = %self.table_path.display(),
            why,
            "UID table unfit: rebuilding it from its segment"
        );
        let file = File::open(&self.log_path)?;
        let scan =
            segment::scan_to_mark(&file, self.base, self.index_interval, Some(self.log_len))?;
        // The covered bytes must verify completely and end with offset `end`.
        if scan.end_at_mark != Some(self.end) {
            let reason = match scan.fault {
                Some((pos, reason)) => format!("{reason} at byte {pos}"),
                None => format!(
                    "frames end at offset {} in {} bytes, where its index says {} in {}",
                    scan.end, scan.valid_len, self.end, self.log_len
                ),
            };
            return Err(BusError::Corrupt {
                location: self.log_path.display().to_string(),
                offset: scan.end.min(self.end),
                reason,
            });
        }
        let end = self.end;
        let mut uids = scan.uids;
        uids.retain(|&(_, offset)| offset < end);
        self.state_of(&uids)
    }

    /// Writes the table of `uids` (when writable) and loads it.
    fn state_of(&self, uids: &[(String, u64)]) -> Result<State, BusError> {
        if self.writable
            && let Some(bytes) = encode(Key::random(), self.base, self.end, self.log_len, uids)
        {
            fsutil::write_atomic(&self.table_path, &bytes)?;
            let file = File::open(&self.table_path)?;
            match Table::load(file, self.base, self.end, self.log_len) {
                Ok(table) => return Ok(State::Table(table)),
                Err(Unfit::Io(error)) => return Err(error.into()),
                Err(Unfit::Damaged(why)) => {
                    return Err(BusError::backend(
                        "embedded",
                        format!(
                            "UID table {} just written does not load: {why}",
                            self.table_path.display()
                        ),
                    ));
                }
            }
        }
        let mut index = UidIndex::default();
        for (uid, offset) in uids {
            index.push(uid.clone(), *offset);
        }
        Ok(State::Memory(index, uids.to_vec()))
    }

    /// Writes the table from `uids` now (at seal, or after a scan at open).
    pub fn store(self, uids: &[(String, u64)]) -> Result<Self, BusError> {
        let state = self.state_of(uids)?;
        *write(&self.state) = state;
        Ok(self)
    }
}
