//! The few Protocol Buffers encodings Pulsar's commands need: varints and length-delimited
//! fields, written by hand (no code generator, no crate).

pub type Error = String;

pub fn varint(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buf.push((value as u8) | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

/// A varint field (also how int32/uint64/bool/enum fields are written).
pub fn uint(buf: &mut Vec<u8>, field: u32, value: u64) {
    varint(buf, u64::from(field) << 3);
    varint(buf, value);
}

/// An int32/int64 field: negative numbers as ten-byte varints, as protobuf writes them.
pub fn int(buf: &mut Vec<u8>, field: u32, value: i64) {
    uint(buf, field, value as u64);
}

/// A length-delimited field (string, bytes, embedded message).
pub fn bytes(buf: &mut Vec<u8>, field: u32, value: &[u8]) {
    varint(buf, (u64::from(field) << 3) | 2);
    varint(buf, value.len() as u64);
    buf.extend_from_slice(value);
}

pub enum Value<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

impl<'a> Value<'a> {
    pub fn int(&self) -> u64 {
        match self {
            Value::Int(value) => *value,
            Value::Bytes(_) => 0,
        }
    }

    pub fn bytes(&self) -> &'a [u8] {
        match self {
            Value::Bytes(value) => value,
            Value::Int(_) => &[],
        }
    }
}

/// The fields of one encoded message, in the order written.
pub struct Fields<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Fields<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Fields { data, pos: 0 }
    }

    fn read_varint(&mut self) -> Result<u64, Error> {
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let byte = *self.data.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            value |= u64::from(byte & 0x7F) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
            shift += 7;
            if shift >= 64 {
                return Err("varint longer than 10 bytes".into());
            }
        }
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], Error> {
        let end = self.pos.checked_add(len).filter(|end| *end <= self.data.len());
        let end = end.ok_or("truncated field")?;
        let value = &self.data[self.pos..end];
        self.pos = end;
        Ok(value)
    }

    fn field(&mut self) -> Result<(u32, Value<'a>), Error> {
        let key = self.read_varint()?;
        let number = (key >> 3) as u32;
        let value = match key & 7 {
            0 => Value::Int(self.read_varint()?),
            1 => Value::Int(u64::from_le_bytes(self.take(8)?.try_into().unwrap())),
            2 => {
                let len = self.read_varint()? as usize;
                Value::Bytes(self.take(len)?)
            }
            5 => Value::Int(u64::from(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))),
            wire => return Err(format!("unsupported protobuf wire type {wire}")),
        };
        Ok((number, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.data.len() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.pos = self.data.len();
        }
        Some(field)
    }
}
