//! One Kafka connection: frames in, answers out, in order.
//!
//! A frame is a big-endian i32 length and that many bytes: the request
//! header (API key, version, correlation id, client id) and the body. The
//! length is checked before anything is read past it, the key and version
//! against the advertised table before the body is decoded, and a frame
//! that fails any check closes the connection with a warning naming the
//! peer: Kafka's protocol has no error answer for a request that cannot be
//! parsed, and its own brokers close too.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::broadcast;

use super::sasl::{self, Session};
use super::{versions, Kafka};
use super::codes;

/// How long a throttled connection sleeps before it looks at its tenant's
/// debt again (the debt can grow meanwhile: another connection of the
/// tenant, or another broker's share coming back).
const THROTTLE_STEP: std::time::Duration = std::time::Duration::from_secs(1);

/// What one request comes to.
pub enum Reply {
    /// An encoded answer (header and body, without the length).
    Send(BytesMut),
    /// No answer: a Produce with `acks=0`.
    Nothing,
    /// The connection is closed; the reason is logged.
    Close(String),
    /// An answer, then the connection is closed (a failed SASL
    /// authentication: Kafka's brokers answer it, then hang up).
    SendThenClose(BytesMut, String),
}

/// The request as the handlers see it.
pub struct Request {
    pub key: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    pub body: Bytes,
    pub peer: SocketAddr,
}

impl Request {
    /// The body decoded as `T` at the request's version.
    pub fn decode<T: Decodable>(&self) -> Result<T, Reply> {
        let mut body = self.body.clone();
        T::decode(&mut body, self.version).map_err(|e| Reply::Close(format!("undecodable {:?} v{} body: {e:#}", self.key, self.version)))
    }

    /// `body` encoded as this request's answer.
    pub fn answer<T: Encodable + HeaderVersion>(&self, body: &T) -> Reply {
        match encode_answer(self.header.correlation_id, self.version, body) {
            Reply::Close(why) => Reply::Close(format!("{:?} v{}: {why}", self.key, self.version)),
            other => other,
        }
    }
}

/// An answer at `version` with its response header.
pub fn encode_answer<T: Encodable + HeaderVersion>(correlation_id: i32, version: i16, body: &T) -> Reply {
    let mut out = BytesMut::with_capacity(256);
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    let encoded = header.encode(&mut out, T::header_version(version)).and_then(|()| body.encode(&mut out, version));
    match encoded {
        Ok(()) => Reply::Send(out),
        Err(e) => Reply::Close(format!("could not encode the answer: {e:#}")),
    }
}

/// Serves one connection until the peer closes it, a frame is refused, or
/// the broker stops (between requests: one in progress is answered).
pub async fn serve<R, W>(kafka: Arc<Kafka>, read: R, mut write: W, peer: SocketAddr, mut stop: broadcast::Receiver<()>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut read = BufReader::with_capacity(64 << 10, read);
    let mut session = Session::new(kafka.state.config.auth.enabled);
    loop {
        // A tenant past its push rate is read no further on any of its
        // connections until its debt is paid (`produce::admit`): throttled,
        // as Kafka's brokers mute a client, and holding no frame budget
        // meanwhile.
        while let Some(debt) = kafka.state.quotas.push_debt(session.tenant) {
            tokio::select! {
                _ = tokio::time::sleep(debt.min(THROTTLE_STEP)) => {}
                _ = stop.recv() => return,
            }
        }
        let len = tokio::select! {
            n = read.read_i32() => match n {
                Ok(n) => n,
                Err(_) => return, // the peer closed
            },
            _ = stop.recv() => return,
        };
        let max = if session.open() { kafka.config.max_frame } else { sasl::PRE_AUTH_FRAME };
        // Key, version and correlation id are 8 bytes; nothing shorter is a
        // request (a bare SASL token after a v0 handshake is not one).
        let min = if session.bare_token_next { 0 } else { 8 };
        if len < min || len as usize > max {
            tracing::warn!(%peer, len, max, "kafka frame length refused; closing the connection");
            return;
        }
        // The frame's share of the broker-wide budget, held until it is answered.
        let kib = (len as usize).div_ceil(1024).clamp(1, super::FRAME_BUDGET_KIB) as u32;
        let Ok(_held) = kafka.frames.acquire_many(kib).await else { return };
        let mut frame = vec![0u8; len as usize];
        if read.read_exact(&mut frame).await.is_err() {
            return;
        }
        let reply = if session.bare_token_next {
            session.bare_token_next = false;
            // SASL v0: the token travels bare and success is an empty token back.
            match super::authenticate(&kafka, &mut session, &frame) {
                Ok(()) => Reply::Send(BytesMut::new()),
                Err(why) => Reply::Close(format!("SASL authentication failed: {why}")),
            }
        } else {
            handle(&kafka, Bytes::from(frame), peer, &mut session).await
        };
        let send = |body: &BytesMut| {
            let mut out = BytesMut::with_capacity(4 + body.len());
            out.put_i32(body.len() as i32);
            out.extend_from_slice(body);
            out
        };
        match reply {
            Reply::Send(body) => {
                if write.write_all(&send(&body)).await.is_err() {
                    return;
                }
            }
            Reply::Nothing => {}
            Reply::Close(reason) => {
                tracing::warn!(%peer, "kafka request refused ({reason}); closing the connection");
                return;
            }
            Reply::SendThenClose(body, reason) => {
                let _ = write.write_all(&send(&body)).await;
                tracing::warn!(%peer, "kafka connection closed ({reason})");
                return;
            }
        }
    }
}

/// Decodes the header, checks the key and version, and dispatches.
async fn handle(kafka: &Kafka, mut frame: Bytes, peer: SocketAddr, session: &mut Session) -> Reply {
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(key) = ApiKey::try_from(raw_key) else {
        return Reply::Close(format!("unknown API key {raw_key} v{version}"));
    };
    let Some(range) = versions::supported(key) else {
        return Reply::Close(format!("{key:?} (key {raw_key}) is not served"));
    };
    if version < range.0 || version > range.1 {
        if key == ApiKey::ApiVersions {
            // Kafka's rule: the answer is v0 with UNSUPPORTED_VERSION and
            // the table, and the client retries at a version it lists.
            return encode_answer(correlation_id, 0, &versions::answer(codes::UNSUPPORTED_VERSION));
        }
        return Reply::Close(format!("{key:?} v{version} is outside v{}-v{}", range.0, range.1));
    }
    let header = match RequestHeader::decode(&mut frame, key.request_header_version(version)) {
        Ok(h) => h,
        Err(e) => return Reply::Close(format!("undecodable {key:?} v{version} header: {e:#}")),
    };
    if !session.open() && !matches!(key, ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) {
        return Reply::Close(format!("{key:?} before SASL authentication"));
    }
    let req = Request { key, version, header, body: frame, peer };
    super::dispatch(kafka, &req, session).await
}
