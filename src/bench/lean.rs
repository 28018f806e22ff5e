//! A lean HTTP/1.1 client for the one-request-at-a-time scenarios.
//!
//! The small-request cases (push at batch 1, pop + ack, a KV put per call)
//! share the machine's two cores with the broker and PostgreSQL they
//! measure, and their baseline is pgbench, a C client spending a few
//! microseconds a commit. reqwest spends about 30 µs a request here (its
//! pool, its connection task, a channel hop between the two, a waker across
//! threads), which the broker then cannot use. This client is one keep-alive
//! connection driven by hyper's own client connection *inside the caller's
//! task*: the request, the connection's I/O and the answer run in one poll
//! loop, so nothing crosses tasks or threads. A real client runs on another
//! machine; this one keeps out of the way of what it measures.

use std::pin::Pin;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{handshake, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Conn = Connection<TokioIo<TcpStream>, Full<Bytes>>;
/// An open connection: where requests go in, and the connection's own
/// future, which must be polled for anything to move.
type Open = (SendRequest<Full<Bytes>>, Pin<Box<Conn>>);

/// One keep-alive connection to the broker, opened when first needed and
/// opened again after a failure.
pub struct Lean {
    /// `host:port` of the broker.
    addr: String,
    open: Option<Open>,
}

impl Lean {
    /// A client of the broker at `url` (`http://host:port`, localhost only).
    pub fn new(url: &str) -> Lean {
        let addr = url.trim_start_matches("http://").trim_end_matches('/').to_string();
        Lean { addr, open: None }
    }

    /// POSTs `body` to `path` with `content_type` (and one more header when
    /// given): the answer's status and body, or `None` when the connection
    /// failed (it is dropped and opened again on the next call).
    pub async fn post(&mut self, path: &str, content_type: &str, body: impl Into<Bytes>, header: Option<(&str, &str)>) -> Option<(u16, Bytes)> {
        self.send(hyper::Method::POST, path, Some(content_type), body.into(), header).await
    }

    /// GETs `path` (with one more header when given), as [`Lean::post`].
    pub async fn get(&mut self, path: &str, header: Option<(&str, &str)>) -> Option<(u16, Bytes)> {
        self.send(hyper::Method::GET, path, None, Bytes::new(), header).await
    }

    async fn send(&mut self, method: hyper::Method, path: &str, content_type: Option<&str>, body: Bytes, header: Option<(&str, &str)>) -> Option<(u16, Bytes)> {
        if self.open.is_none() {
            let stream = TcpStream::connect(&self.addr).await.ok()?;
            stream.set_nodelay(true).ok()?;
            let (send, conn) = handshake(TokioIo::new(stream)).await.ok()?;
            self.open = Some((send, Box::pin(conn)));
        }
        let (send, conn) = self.open.as_mut()?;
        let mut request = hyper::Request::builder().method(method).uri(path).header("host", &self.addr);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(body)).ok()?;
        let exchange = async {
            send.ready().await.ok()?;
            let response = send.send_request(request).await.ok()?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.ok()?.to_bytes();
            Some((status, body))
        };
        // The connection is polled beside the exchange, in this task: it
        // ends only when the connection does (an error, or the broker
        // closing it), which fails the call.
        let answer = tokio::select! {
            biased;
            answer = exchange => answer,
            _ = conn.as_mut() => None,
        };
        if answer.is_none() {
            self.open = None;
        }
        answer
    }
}
