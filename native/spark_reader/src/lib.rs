//! Magnetar's native Pulsar range reader: a C ABI that Python loads with ``ctypes``
//! (``magnetar/spark_connector/_native.py``). One call reads a batch of messages of one
//! range into Arrow column buffers; Python wraps them into a ``pyarrow.RecordBatch``.

mod columns;
mod crc32c;
mod proto;
mod range;
mod wire;

use std::ffi::c_char;
use std::ptr;
use std::slice;
use std::time::Duration;

use range::{RangeReader, Spec, Status};
use wire::Endpoint;

/// A buffer lent to Python until the next call on the same reader.
#[repr(C)]
pub struct Buffer {
    pub data: *const u8,
    pub len: usize,
}

fn lend<T>(values: &[T]) -> Buffer {
    Buffer { data: values.as_ptr().cast(), len: std::mem::size_of_val(values) }
}

/// What one ``msr_next`` call hands back (layout mirrored in ``_native.py``).
#[repr(C)]
pub struct Batch {
    pub rows: u64,
    pub last_ledger: i64,
    pub last_entry: i64,
    pub last_batch: i64,
    pub value_offsets: Buffer,
    pub value_data: Buffer,
    pub key_validity: Buffer,
    pub key_nulls: u64,
    pub key_offsets: Buffer,
    pub key_data: Buffer,
    pub id_offsets: Buffer,
    pub id_data: Buffer,
    pub publish_us: Buffer,
    pub event_validity: Buffer,
    pub event_nulls: u64,
    pub event_us: Buffer,
    pub property_offsets: Buffer,
    pub property_key_offsets: Buffer,
    pub property_key_data: Buffer,
    pub property_value_offsets: Buffer,
    pub property_value_data: Buffer,
    /// The error or the reason a message is not supported (UTF-8), when the status says so.
    pub message: Buffer,
}

pub struct Handle {
    reader: RangeReader,
    message: String,
}

pub const BATCH: i32 = 0;
pub const DONE: i32 = 1;
pub const STALLED: i32 = 2;
pub const UNSUPPORTED: i32 = 3;
pub const FAILED: i32 = -1;

/// # Safety
/// ``data`` points to ``len`` readable bytes (or ``len`` is 0).
unsafe fn text(data: *const u8, len: usize) -> String {
    if len == 0 {
        return String::new();
    }
    String::from_utf8_lossy(slice::from_raw_parts(data, len)).into_owned()
}

/// Opens a reader of ``(start, end]`` of ``topic``; null on failure, with the reason in
/// ``error`` (NUL-terminated, at most ``error_len`` bytes).
///
/// # Safety
/// Every pointer/length pair describes readable memory; ``error`` has ``error_len`` bytes.
#[no_mangle]
pub unsafe extern "C" fn msr_open(
    service_url: *const u8,
    service_url_len: usize,
    auth_method: *const u8,
    auth_method_len: usize,
    auth_data: *const u8,
    auth_data_len: usize,
    topic: *const u8,
    topic_len: usize,
    subscription: *const u8,
    subscription_len: usize,
    start: *const i64,
    end: *const i64,
    since_ms: i64,
    until_ms: i64,
    queue: u32,
    partition: i32,
    timeout_ms: u64,
    error: *mut c_char,
    error_len: usize,
) -> *mut Handle {
    let start = slice::from_raw_parts(start, 3);
    let end = slice::from_raw_parts(end, 3);
    let endpoint = Endpoint {
        service_url: text(service_url, service_url_len),
        auth_method: text(auth_method, auth_method_len),
        auth_data: text(auth_data, auth_data_len).into_bytes(),
        timeout: Duration::from_millis(timeout_ms),
    };
    let spec = Spec {
        topic: text(topic, topic_len),
        subscription: text(subscription, subscription_len),
        start: (start[0], start[1], start[2]),
        end: (end[0], end[1], end[2]),
        since: since_ms,
        until: until_ms,
        queue: queue.max(2),
        partition,
    };
    match RangeReader::open(&endpoint, spec) {
        Ok(reader) => Box::into_raw(Box::new(Handle { reader, message: String::new() })),
        Err(message) => {
            if error_len > 0 {
                let bytes = message.as_bytes();
                let len = bytes.len().min(error_len - 1);
                ptr::copy_nonoverlapping(bytes.as_ptr(), error.cast::<u8>(), len);
                *error.add(len) = 0;
            }
            ptr::null_mut()
        }
    }
}

/// Reads the next batch of at most about ``max_rows`` rows into ``out``; the status is one of
/// the constants above. The buffers stay valid until the next call on ``handle``.
///
/// # Safety
/// ``handle`` came from ``msr_open`` and is not closed; ``out`` is writable.
#[no_mangle]
pub unsafe extern "C" fn msr_next(
    handle: *mut Handle,
    max_rows: u64,
    stall_ms: u64,
    out: *mut Batch,
) -> i32 {
    let handle = &mut *handle;
    let result = handle.reader.next(max_rows as usize, Duration::from_millis(stall_ms));
    let status = match result {
        Ok(Status::Batch) => BATCH,
        Ok(Status::Done) => DONE,
        Ok(Status::Stalled) => STALLED,
        Ok(Status::Unsupported(reason)) => {
            handle.message = reason;
            UNSUPPORTED
        }
        Err(message) => {
            handle.message = message;
            FAILED
        }
    };
    let reader = &handle.reader;
    let columns = &reader.columns;
    *out = Batch {
        rows: columns.rows as u64,
        last_ledger: reader.last.0,
        last_entry: reader.last.1,
        last_batch: reader.last.2,
        value_offsets: lend(&columns.value.offsets),
        value_data: lend(&columns.value.data),
        key_validity: lend(&columns.key_validity.bits),
        key_nulls: columns.key_validity.nulls,
        key_offsets: lend(&columns.key.offsets),
        key_data: lend(&columns.key.data),
        id_offsets: lend(&columns.message_id.offsets),
        id_data: lend(&columns.message_id.data),
        publish_us: lend(&columns.publish_us),
        event_validity: lend(&columns.event_validity.bits),
        event_nulls: columns.event_validity.nulls,
        event_us: lend(&columns.event_us),
        property_offsets: lend(&columns.property_offsets),
        property_key_offsets: lend(&columns.property_keys.offsets),
        property_key_data: lend(&columns.property_keys.data),
        property_value_offsets: lend(&columns.property_values.offsets),
        property_value_data: lend(&columns.property_values.data),
        message: lend(handle.message.as_bytes()),
    };
    status
}

/// Closes the reader (its connection, and with it the non-durable subscription).
///
/// # Safety
/// ``handle`` came from ``msr_open`` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn msr_close(handle: *mut Handle) {
    if !handle.is_null() {
        let mut handle = Box::from_raw(handle);
        handle.reader.close();
    }
}
