//! One connection to a broker speaking Pulsar's binary protocol: frames in and out, CONNECT
//! and LOOKUP. Commands are ``BaseCommand`` messages whose field number equals their type.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::time::{Duration, Instant};

use crate::proto::{self, Error, Fields};

pub const CONNECT: u32 = 2;
pub const CONNECTED: u32 = 3;
pub const SUBSCRIBE: u32 = 4;
pub const MESSAGE: u32 = 9;
pub const ACK: u32 = 10;
pub const FLOW: u32 = 11;
pub const SUCCESS: u32 = 13;
pub const ERROR: u32 = 14;
pub const CLOSE_CONSUMER: u32 = 16;
pub const PING: u32 = 18;
pub const PONG: u32 = 19;
pub const LOOKUP: u32 = 23;
pub const LOOKUP_RESPONSE: u32 = 24;

const PROTOCOL_VERSION: u64 = 19;
const MAX_FRAME: usize = 128 << 20;
const BUFFER: usize = 4 << 20;

/// How to reach and authenticate to the cluster.
pub struct Endpoint {
    /// ``pulsar://host:port[,host:port...]``
    pub service_url: String,
    /// ``""`` (none) or ``"token"``.
    pub auth_method: String,
    pub auth_data: Vec<u8>,
    pub timeout: Duration,
}

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    next_request: u64,
    timeout: Duration,
}

/// A frame read: the command's type and the byte ranges (into the connection's buffer) of the
/// command and of what follows it (a message's metadata and payload).
pub struct Frame {
    pub kind: u32,
    pub command: Range<usize>,
    pub rest: Range<usize>,
}

fn hosts(url: &str) -> Result<Vec<String>, Error> {
    let rest = url
        .strip_prefix("pulsar://")
        .ok_or_else(|| format!("not a pulsar:// service URL: {url}"))?;
    let rest = rest.split('/').next().unwrap_or("");
    Ok(rest
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| if host.contains(':') { host.to_string() } else { format!("{host}:6650") })
        .collect())
}

impl Conn {
    /// Connects to the first host of ``url`` that answers, and says CONNECT (asking a proxy
    /// there to forward to ``proxy_to``, if given).
    pub fn open(url: &str, endpoint: &Endpoint, proxy_to: Option<&str>) -> Result<Conn, Error> {
        let mut failure = format!("no host in {url}");
        for host in hosts(url)? {
            let addrs = match host.to_socket_addrs() {
                Ok(addrs) => addrs,
                Err(error) => {
                    failure = format!("cannot resolve {host}: {error}");
                    continue;
                }
            };
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, endpoint.timeout) {
                    Ok(stream) => return Conn::handshake(stream, endpoint, proxy_to),
                    Err(error) => failure = format!("cannot connect to {host}: {error}"),
                }
            }
        }
        Err(failure)
    }

    fn handshake(
        stream: TcpStream,
        endpoint: &Endpoint,
        proxy_to: Option<&str>,
    ) -> Result<Conn, Error> {
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut conn = Conn {
            stream,
            buf: vec![0; BUFFER],
            start: 0,
            end: 0,
            next_request: 1,
            timeout: endpoint.timeout,
        };
        let mut connect = Vec::new();
        proto::bytes(&mut connect, 1, b"magnetar-spark-reader");
        proto::uint(&mut connect, 4, PROTOCOL_VERSION);
        if !endpoint.auth_method.is_empty() {
            proto::bytes(&mut connect, 5, endpoint.auth_method.as_bytes());
            proto::bytes(&mut connect, 3, &endpoint.auth_data);
        }
        if let Some(broker) = proxy_to {
            proto::bytes(&mut connect, 6, broker.as_bytes());
        }
        conn.send(CONNECT, &connect)?;
        let frame = conn.answer(|kind| kind == CONNECTED || kind == ERROR)?;
        if frame.kind == ERROR {
            return Err(format!("the broker refused the connection: {}", conn.error_text(&frame)));
        }
        Ok(conn)
    }

    pub fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    pub fn send(&mut self, kind: u32, body: &[u8]) -> Result<(), Error> {
        let mut command = Vec::with_capacity(body.len() + 8);
        proto::uint(&mut command, 1, u64::from(kind));
        proto::bytes(&mut command, kind, body);
        let mut frame = Vec::with_capacity(command.len() + 8);
        frame.extend_from_slice(&(command.len() as u32 + 4).to_be_bytes());
        frame.extend_from_slice(&(command.len() as u32).to_be_bytes());
        frame.extend_from_slice(&command);
        self.stream.write_all(&frame).map_err(|e| format!("cannot write to the broker: {e}"))
    }

    pub fn bytes(&self, range: Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    /// The text of an ERROR command (``CommandError.message``).
    pub fn error_text(&self, frame: &Frame) -> String {
        let mut text = String::from("error");
        for field in Fields::new(self.bytes(frame.command.clone())).flatten() {
            if field.0 == 3 {
                text = String::from_utf8_lossy(field.1.bytes()).into_owned();
            }
        }
        text
    }

    /// Reads frames, answering PINGs, until one ``wanted`` says yes to (within the timeout).
    pub fn answer(&mut self, wanted: impl Fn(u32) -> bool) -> Result<Frame, Error> {
        self.answer_within(self.timeout, wanted)
    }

    pub fn answer_within(
        &mut self,
        timeout: Duration,
        wanted: impl Fn(u32) -> bool,
    ) -> Result<Frame, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next_frame(deadline)? {
                None => return Err("the broker did not answer in time".into()),
                Some(frame) if wanted(frame.kind) => return Ok(frame),
                Some(frame) if frame.kind == PING => self.send(PONG, &[])?,
                Some(_) => {}
            }
        }
    }

    /// Ends the connection the orderly way: no more writes, then what the broker still sends
    /// is read until it closes its side. Closing with unread bytes would answer with a reset,
    /// which pulsar-lite does not clean up after (see magnetar/broker_healer.py).
    pub fn shutdown(&mut self, timeout: Duration) {
        let _ = self.stream.shutdown(Shutdown::Write);
        let deadline = Instant::now() + timeout;
        let mut sink = [0u8; 64 * 1024];
        while Instant::now() < deadline {
            let wait = (deadline - Instant::now()).max(Duration::from_millis(1));
            if self.stream.set_read_timeout(Some(wait)).is_err() {
                return;
            }
            match self.stream.read(&mut sink) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// The next frame, or None if none came before ``deadline``.
    pub fn next_frame(&mut self, deadline: Instant) -> Result<Option<Frame>, Error> {
        if !self.fill(4, deadline)? {
            return Ok(None);
        }
        let total = u32::from_be_bytes(self.buf[self.start..self.start + 4].try_into().unwrap());
        let total = total as usize;
        if !(4..=MAX_FRAME).contains(&total) {
            return Err(format!("frame of {total} bytes from the broker"));
        }
        if !self.fill(4 + total, deadline)? {
            return Ok(None);
        }
        let begin = self.start + 4;
        let size = u32::from_be_bytes(self.buf[begin..begin + 4].try_into().unwrap()) as usize;
        if size + 4 > total {
            return Err("command larger than its frame".into());
        }
        let command = begin + 4..begin + 4 + size;
        let rest = command.end..begin + total;
        self.start = begin + total;
        let mut kind = 0;
        for field in Fields::new(&self.buf[command.clone()]) {
            let (number, value) = field?;
            if number == 1 {
                kind = value.int() as u32;
                break;
            }
        }
        // Only the command of the type's own field matters: narrow to it.
        let mut body = command.clone();
        let whole = &self.buf[command.clone()];
        for field in Fields::new(whole) {
            let (number, value) = field?;
            if number == kind {
                let inner = value.bytes();
                let at = command.start + (inner.as_ptr() as usize - whole.as_ptr() as usize);
                body = at..at + inner.len();
                break;
            }
        }
        Ok(Some(Frame { kind, command: body, rest }))
    }

    /// Makes ``need`` bytes available from ``start``; false on a timeout.
    fn fill(&mut self, need: usize, deadline: Instant) -> Result<bool, Error> {
        if self.end - self.start >= need {
            return Ok(true);
        }
        if self.start + need > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if need > self.buf.len() {
                self.buf.resize(need.max(self.buf.len() * 2), 0);
            }
        }
        while self.end - self.start < need {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let wait = (deadline - now).max(Duration::from_millis(1));
            self.stream.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
            match self.stream.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err("the broker closed the connection".into()),
                Ok(read) => self.end += read,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("cannot read from the broker: {e}")),
            }
        }
        Ok(true)
    }
}

/// A connection to the broker that serves ``topic``, found by LOOKUP from ``endpoint``.
pub fn connect_for(topic: &str, endpoint: &Endpoint) -> Result<Conn, Error> {
    let mut url = endpoint.service_url.clone();
    let mut conn = Conn::open(&url, endpoint, None)?;
    let mut authoritative = false;
    for _ in 0..16 {
        let request = conn.request_id();
        let mut lookup = Vec::new();
        proto::bytes(&mut lookup, 1, topic.as_bytes());
        proto::uint(&mut lookup, 2, request);
        proto::uint(&mut lookup, 3, u64::from(authoritative));
        conn.send(LOOKUP, &lookup)?;
        let frame = conn.answer(|kind| kind == LOOKUP_RESPONSE || kind == ERROR)?;
        if frame.kind == ERROR {
            return Err(format!("lookup of {topic} failed: {}", conn.error_text(&frame)));
        }
        let (mut broker, mut response, mut proxied, mut message) = (String::new(), 1, false, None);
        for field in Fields::new(conn.bytes(frame.command.clone())) {
            let (number, value) = field?;
            match number {
                1 => broker = String::from_utf8_lossy(value.bytes()).into_owned(),
                3 => response = value.int(),
                5 => authoritative = value.int() != 0,
                7 => message = Some(String::from_utf8_lossy(value.bytes()).into_owned()),
                8 => proxied = value.int() != 0,
                _ => {}
            }
        }
        match response {
            2 => {
                let text = message.unwrap_or_else(|| "failed".into());
                return Err(format!("lookup of {topic} failed: {text}"));
            }
            1 if broker.is_empty() || broker == url => return Ok(conn),
            // Through the service URL, which forwards to the broker (as the Java client does).
            1 if proxied => return Conn::open(&endpoint.service_url, endpoint, Some(&broker)),
            1 => return Conn::open(&broker, endpoint, None),
            _ if broker.is_empty() || broker == url => {}
            _ if proxied => {
                conn = Conn::open(&endpoint.service_url, endpoint, Some(&broker))?;
                url = broker;
            }
            _ => {
                url = broker;
                conn = Conn::open(&url, endpoint, None)?;
            }
        }
    }
    Err(format!("lookup of {topic}: too many redirects"))
}
