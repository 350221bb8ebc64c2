//! The Arrow buffers of one record batch, built message by message: offsets, data and
//! validity bitmaps laid out as Arrow's columnar format has them, so that Python wraps them
//! into arrays (``pyarrow.Array.from_buffers``) without touching a row.

/// A variable-size binary column: ``offsets`` (rows + 1, from 0) into ``data``.
pub struct Binary {
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
}

impl Binary {
    fn new() -> Self {
        Binary { offsets: vec![0], data: Vec::new() }
    }

    pub fn push(&mut self, value: &[u8]) {
        self.data.extend_from_slice(value);
        self.offsets.push(self.data.len() as i32);
    }

    fn clear(&mut self) {
        self.offsets.truncate(1);
        self.data.clear();
    }
}

/// A validity bitmap (bit set: the row has a value) and its count of nulls.
pub struct Validity {
    pub bits: Vec<u8>,
    pub nulls: u64,
}

impl Validity {
    fn push(&mut self, row: usize, valid: bool) {
        if row % 8 == 0 {
            self.bits.push(0);
        }
        if valid {
            self.bits[row / 8] |= 1 << (row % 8);
        } else {
            self.nulls += 1;
        }
    }

    fn clear(&mut self) {
        self.bits.clear();
        self.nulls = 0;
    }
}

/// One message's fields, as the columns take them.
pub struct Row<'a> {
    pub value: &'a [u8],
    /// Empty: no key (a null, as the Python path has it).
    pub key: &'a [u8],
    pub publish_ms: i64,
    /// 0: no event time (a null).
    pub event_ms: i64,
    /// Sorted by key, each key once (the first one given).
    pub properties: &'a [(&'a [u8], &'a [u8])],
}

/// The columns every message fills (the topic column is one value for all: Python's).
pub struct Columns {
    pub rows: usize,
    pub value: Binary,
    pub key: Binary,
    pub key_validity: Validity,
    pub message_id: Binary,
    /// Microseconds since the epoch (Spark's timestamps).
    pub publish_us: Vec<i64>,
    pub event_us: Vec<i64>,
    pub event_validity: Validity,
    /// Offsets (rows + 1) into the property keys and values.
    pub property_offsets: Vec<i32>,
    pub property_keys: Binary,
    pub property_values: Binary,
}

impl Columns {
    pub fn new() -> Self {
        Columns {
            rows: 0,
            value: Binary::new(),
            key: Binary::new(),
            key_validity: Validity { bits: Vec::new(), nulls: 0 },
            message_id: Binary::new(),
            publish_us: Vec::new(),
            event_us: Vec::new(),
            event_validity: Validity { bits: Vec::new(), nulls: 0 },
            property_offsets: vec![0],
            property_keys: Binary::new(),
            property_values: Binary::new(),
        }
    }

    pub fn clear(&mut self) {
        self.rows = 0;
        self.value.clear();
        self.key.clear();
        self.key_validity.clear();
        self.message_id.clear();
        self.publish_us.clear();
        self.event_us.clear();
        self.event_validity.clear();
        self.property_offsets.truncate(1);
        self.property_keys.clear();
        self.property_values.clear();
    }

    pub fn push(&mut self, row: &Row, message_id: &[u8]) {
        let index = self.rows;
        self.value.push(row.value);
        self.key.push(row.key);
        self.key_validity.push(index, !row.key.is_empty());
        self.message_id.push(message_id);
        self.publish_us.push(row.publish_ms.saturating_mul(1000));
        self.event_us.push(row.event_ms.saturating_mul(1000));
        self.event_validity.push(index, row.event_ms != 0);
        for (key, value) in row.properties {
            self.property_keys.push(key);
            self.property_values.push(value);
        }
        self.property_offsets.push(self.property_keys.offsets.len() as i32 - 1);
        self.rows += 1;
    }
}
