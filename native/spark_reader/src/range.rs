//! Reading one range ``(start, end]`` of one topic partition through a non-durable reader
//! subscription, into [`Columns`]: the rules of the Python path (magnetar's ``_ranges.py``),
//! message by message in native code.
//!
//! * Brokers may deliver a message again (pulsar-lite does) but never a new one out of order:
//!   a message whose position is not after the last one taken is skipped.
//! * An end with batch index ``ENTRY_END`` covers its whole entry; the read stops after the
//!   last message of that entry, whose size the entry's metadata gives.
//! * What this reader cannot decode (compressed, encrypted or chunked messages) stops it at
//!   the last position taken, with the reason: the caller reads on from there another way.

use std::time::{Duration, Instant};

use crate::columns::{Columns, Row};
use crate::crc32c::crc32c;
use crate::proto::{self, Error, Fields};
use crate::wire::{self, Conn, Endpoint, Frame};

pub type Position = (i64, i64, i64);
pub const ENTRY_END: i64 = (1 << 31) - 1;
pub const BEFORE_EARLIEST: Position = (-1, -1, -1);

const CONSUMER_ID: u64 = 1;
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
const MAGIC_CHECKSUM: u16 = 0x0e01;
const MAGIC_BROKER_ENTRY: u16 = 0x0e02;

pub struct Spec {
    pub topic: String,
    pub subscription: String,
    pub start: Position,
    pub end: Position,
    /// Publish times kept: ``since <= t < until`` (ms).
    pub since: i64,
    pub until: i64,
    /// Messages the broker may send ahead (FLOW permits).
    pub queue: u32,
    /// The partition index written into message ids (-1: none), as the Python client does.
    pub partition: i32,
}

pub enum Status {
    /// Rows are ready and the range goes on.
    Batch,
    /// The range is read to its end.
    Done,
    /// Nothing came for the stall time.
    Stalled,
    /// A message this reader cannot decode: read on from ``last`` another way.
    Unsupported(String),
}

pub struct RangeReader {
    conn: Conn,
    spec: Spec,
    pub last: Position,
    pub columns: Columns,
    delivered: u32,
    /// The last whole entry taken, not yet acknowledged.
    unacked: Option<(i64, i64)>,
    done: bool,
    unsupported: Option<String>,
    message_id: Vec<u8>,
}

impl RangeReader {
    pub fn open(endpoint: &Endpoint, spec: Spec) -> Result<RangeReader, Error> {
        let mut conn = wire::connect_for(&spec.topic, endpoint)?;
        let request = conn.request_id();
        let mut subscribe = Vec::new();
        proto::bytes(&mut subscribe, 1, spec.topic.as_bytes());
        proto::bytes(&mut subscribe, 2, spec.subscription.as_bytes());
        proto::uint(&mut subscribe, 3, 0); // Exclusive, as readers subscribe
        proto::uint(&mut subscribe, 4, CONSUMER_ID);
        proto::uint(&mut subscribe, 5, request);
        proto::bytes(&mut subscribe, 6, spec.subscription.as_bytes());
        proto::uint(&mut subscribe, 8, 0); // not durable: gone when the connection closes
        // The reader starts at the entry holding ``start`` (the broker sends that entry);
        // what comes before ``start`` in it is skipped here.
        let mut start_id = Vec::new();
        let (ledger, entry) = if spec.start == BEFORE_EARLIEST {
            (-1, -1)
        } else {
            (spec.start.0, spec.start.1)
        };
        proto::int(&mut start_id, 1, ledger);
        proto::int(&mut start_id, 2, entry);
        proto::bytes(&mut subscribe, 9, &start_id);
        proto::uint(&mut subscribe, 11, 0); // not compacted
        proto::uint(&mut subscribe, 13, 1); // initial position: earliest
        conn.send(wire::SUBSCRIBE, &subscribe)?;
        let frame = conn.answer(|kind| kind == wire::SUCCESS || kind == wire::ERROR)?;
        if frame.kind == wire::ERROR {
            return Err(format!("cannot read {}: {}", spec.topic, conn.error_text(&frame)));
        }
        let mut reader = RangeReader {
            conn,
            last: spec.start,
            spec,
            columns: Columns::new(),
            delivered: 0,
            unacked: None,
            done: false,
            unsupported: None,
            message_id: Vec::with_capacity(32),
        };
        reader.flow(reader.spec.queue)?;
        Ok(reader)
    }

    /// Closes the reader (CLOSE_CONSUMER, which removes the non-durable subscription) and its
    /// connection, in order.
    pub fn close(&mut self) {
        let request = self.conn.request_id();
        let mut close = Vec::new();
        proto::uint(&mut close, 1, CONSUMER_ID);
        proto::uint(&mut close, 2, request);
        if self.conn.send(wire::CLOSE_CONSUMER, &close).is_ok() {
            let _ = self.conn.answer_within(CLOSE_TIMEOUT, |kind| {
                kind == wire::SUCCESS || kind == wire::ERROR
            });
        }
        self.conn.shutdown(CLOSE_TIMEOUT);
    }

    fn flow(&mut self, permits: u32) -> Result<(), Error> {
        let mut flow = Vec::new();
        proto::uint(&mut flow, 1, CONSUMER_ID);
        proto::uint(&mut flow, 2, u64::from(permits));
        self.conn.send(wire::FLOW, &flow)
    }

    /// Acknowledges up to the last entry taken, cumulatively, as the Python client's readers
    /// do: pulsar-lite otherwise sends a reader's unacknowledged messages again and again.
    fn acknowledge(&mut self) -> Result<(), Error> {
        let Some((ledger, entry)) = self.unacked.take() else {
            return Ok(());
        };
        let mut id = Vec::new();
        proto::int(&mut id, 1, ledger);
        proto::int(&mut id, 2, entry);
        let mut ack = Vec::new();
        proto::uint(&mut ack, 1, CONSUMER_ID);
        proto::uint(&mut ack, 2, 1); // cumulative
        proto::bytes(&mut ack, 3, &id);
        self.conn.send(wire::ACK, &ack)
    }

    /// Reads until ``max_rows`` rows (give or take an entry) are in ``columns`` (cleared
    /// first), the range ends, no message makes progress for ``stall`` (nothing comes, or
    /// only messages already taken), or a message cannot be decoded.
    pub fn next(&mut self, max_rows: usize, stall: Duration) -> Result<Status, Error> {
        self.columns.clear();
        let mut progress_by = Instant::now() + stall;
        loop {
            if let Some(reason) = self.unsupported.take() {
                return Ok(Status::Unsupported(reason));
            }
            if self.done || self.last >= self.spec.end {
                return Ok(if self.columns.rows > 0 { Status::Batch } else { Status::Done });
            }
            if self.columns.rows >= max_rows {
                return Ok(Status::Batch);
            }
            let Some(frame) = self.conn.next_frame(progress_by)? else {
                return Ok(if self.columns.rows > 0 { Status::Batch } else { Status::Stalled });
            };
            match frame.kind {
                wire::MESSAGE => {
                    let before = self.last;
                    let messages = self.entry(&frame)?;
                    if self.last > before {
                        progress_by = Instant::now() + stall;
                    }
                    self.delivered += messages;
                    if self.delivered >= self.spec.queue / 2 {
                        self.acknowledge()?;
                        self.flow(self.delivered)?;
                        self.delivered = 0;
                    }
                }
                wire::PING => self.conn.send(wire::PONG, &[])?,
                wire::CLOSE_CONSUMER => return Err("the broker closed the reader".into()),
                wire::ERROR => return Err(self.conn.error_text(&frame)),
                _ => {}
            }
        }
    }

    /// Takes the messages of one MESSAGE frame; returns how many it held (the permits used).
    fn entry(&mut self, frame: &Frame) -> Result<u32, Error> {
        // Borrows: the frame's bytes live in the connection, the rows go to the columns.
        let RangeReader { conn, spec, last, columns, done, unsupported, unacked, message_id, .. } =
            self;
        let (mut ledger, mut entry) = (0i64, 0i64);
        for field in Fields::new(conn.bytes(frame.command.clone())) {
            let (number, value) = field?;
            if number == 2 {
                for id_field in Fields::new(value.bytes()) {
                    let (id_number, id_value) = id_field?;
                    match id_number {
                        1 => ledger = id_value.int() as i64,
                        2 => entry = id_value.int() as i64,
                        _ => {}
                    }
                }
            }
        }
        let (metadata, payload) = split_entry(conn.bytes(frame.rest.clone()))?;
        let meta = Metadata::parse(metadata)?;
        let count = if meta.batched { meta.batch_size.max(0) as u32 } else { 1 };
        if (ledger, entry, ENTRY_END) <= *last || meta.marker {
            return Ok(count); // a redelivery, or a broker's marker (no message of the topic)
        }
        if (ledger, entry, -1) > spec.end {
            *done = true;
            return Ok(count);
        }
        if let Some(reason) = meta.unsupported() {
            *unsupported = Some(reason);
            *done = true;
            return Ok(count);
        }
        let closes_range = spec.end.2 == ENTRY_END && (ledger, entry) == (spec.end.0, spec.end.1);
        let mut take = |batch: i64, row: &Row| -> bool {
            let position = (ledger, entry, batch);
            if position > spec.end {
                *done = true;
                return false;
            }
            if position > *last {
                *last = position;
                if spec.since <= row.publish_ms && row.publish_ms < spec.until {
                    message_id.clear();
                    write_message_id(message_id, position, spec.partition, meta.batch_size);
                    columns.push(row, message_id);
                }
            }
            true
        };
        let mut properties = Vec::new();
        if !meta.batched {
            sorted_properties(&meta.properties, &mut properties);
            let row = Row {
                value: payload,
                key: meta.key,
                publish_ms: meta.publish_ms,
                event_ms: meta.event_ms,
                properties: &properties,
            };
            take(-1, &row);
        } else {
            let mut rest = payload;
            for index in 0..meta.batch_size {
                let size = rest.get(..4).ok_or("batch shorter than its size")?;
                let size = u32::from_be_bytes(size.try_into().unwrap()) as usize;
                let single = rest.get(4..4 + size).ok_or("truncated single message metadata")?;
                let single = Single::parse(single)?;
                let value_end = 4 + size + single.payload_size;
                let value = rest.get(4 + size..value_end).ok_or("truncated batched payload")?;
                rest = &rest[value_end..];
                if single.compacted_out {
                    continue;
                }
                sorted_properties(&single.properties, &mut properties);
                let row = Row {
                    value,
                    key: single.key,
                    publish_ms: meta.publish_ms,
                    event_ms: single.event_ms.unwrap_or(meta.event_ms),
                    properties: &properties,
                };
                if !take(i64::from(index), &row) {
                    break;
                }
            }
        }
        if closes_range {
            *done = true;
        }
        if !*done {
            *unacked = Some((ledger, entry));
        }
        Ok(count)
    }
}

/// An entry's metadata and payload, after the checksum (verified) and any broker metadata.
fn split_entry(data: &[u8]) -> Result<(&[u8], &[u8]), Error> {
    let magic = |at: usize| data.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let word = |at: usize| -> Result<usize, Error> {
        let bytes = data.get(at..at + 4).ok_or("truncated message")?;
        Ok(u32::from_be_bytes(bytes.try_into().unwrap()) as usize)
    };
    let mut at = 0;
    if magic(at) == Some(MAGIC_BROKER_ENTRY) {
        at += 6 + word(at + 2)?;
    }
    if magic(at) == Some(MAGIC_CHECKSUM) {
        let expected = word(at + 2)? as u32;
        at += 6;
        let covered = data.get(at..).ok_or("truncated message")?;
        if crc32c(covered) != expected {
            return Err("a message failed its checksum".into());
        }
    }
    let size = word(at)?;
    let metadata = data.get(at + 4..at + 4 + size).ok_or("truncated message metadata")?;
    Ok((metadata, &data[at + 4 + size..]))
}

type Property<'a> = (&'a [u8], &'a [u8]);

/// Properties as the Python client hands them over (a C++ ``std::map``): sorted by key,
/// the first value of a repeated key.
fn sorted_properties<'a>(given: &[Property<'a>], out: &mut Vec<Property<'a>>) {
    out.clear();
    out.extend_from_slice(given);
    out.sort_by(|a, b| a.0.cmp(b.0)); // stable: the first of equal keys stays first
    out.dedup_by(|later, earlier| later.0 == earlier.0);
}

fn key_value(data: &[u8]) -> Result<Property<'_>, Error> {
    let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
    for field in Fields::new(data) {
        let (number, field_value) = field?;
        match number {
            1 => key = field_value.bytes(),
            2 => value = field_value.bytes(),
            _ => {}
        }
    }
    Ok((key, value))
}

struct Metadata<'a> {
    publish_ms: i64,
    event_ms: i64,
    key: &'a [u8],
    properties: Vec<Property<'a>>,
    batched: bool,
    batch_size: i32,
    compression: u64,
    encrypted: bool,
    chunks: u64,
    marker: bool,
}

impl<'a> Metadata<'a> {
    fn parse(data: &'a [u8]) -> Result<Metadata<'a>, Error> {
        let mut meta = Metadata {
            publish_ms: 0,
            event_ms: 0,
            key: &[],
            properties: Vec::new(),
            batched: false,
            batch_size: 1,
            compression: 0,
            encrypted: false,
            chunks: 0,
            marker: false,
        };
        for field in Fields::new(data) {
            let (number, value) = field?;
            match number {
                3 => meta.publish_ms = value.int() as i64,
                4 => meta.properties.push(key_value(value.bytes())?),
                6 => meta.key = value.bytes(),
                8 => meta.compression = value.int(),
                11 => {
                    meta.batched = true;
                    meta.batch_size = value.int() as i32;
                }
                12 => meta.event_ms = value.int() as i64,
                13 => meta.encrypted = true,
                20 => meta.marker = true,
                27 => meta.chunks = value.int(),
                _ => {}
            }
        }
        Ok(meta)
    }

    fn unsupported(&self) -> Option<String> {
        if self.compression != 0 {
            let codec = match self.compression {
                1 => "LZ4",
                2 => "ZLIB",
                3 => "ZSTD",
                4 => "SNAPPY",
                _ => "unknown",
            };
            return Some(format!("compressed messages ({codec})"));
        }
        if self.encrypted {
            return Some("encrypted messages".into());
        }
        if self.chunks > 1 {
            return Some("chunked messages".into());
        }
        None
    }
}

struct Single<'a> {
    properties: Vec<Property<'a>>,
    key: &'a [u8],
    payload_size: usize,
    compacted_out: bool,
    event_ms: Option<i64>,
}

impl<'a> Single<'a> {
    fn parse(data: &'a [u8]) -> Result<Single<'a>, Error> {
        let mut single = Single {
            properties: Vec::new(),
            key: &[],
            payload_size: 0,
            compacted_out: false,
            event_ms: None,
        };
        for field in Fields::new(data) {
            let (number, value) = field?;
            match number {
                1 => single.properties.push(key_value(value.bytes())?),
                2 => single.key = value.bytes(),
                3 => single.payload_size = value.int() as u32 as usize,
                4 => single.compacted_out = value.int() != 0,
                5 => single.event_ms = Some(value.int() as i64),
                _ => {}
            }
        }
        Ok(single)
    }
}

/// ``MessageIdData`` as the Python (C++) client serializes a received message's id: ledger,
/// entry, then partition, batch index and batch size when they are set.
fn write_message_id(out: &mut Vec<u8>, position: Position, partition: i32, batch_size: i32) {
    proto::int(out, 1, position.0);
    proto::int(out, 2, position.1);
    if partition != -1 {
        proto::int(out, 3, i64::from(partition));
    }
    if position.2 != -1 {
        proto::int(out, 4, position.2);
        proto::int(out, 6, i64::from(batch_size));
    }
}
