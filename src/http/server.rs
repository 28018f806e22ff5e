//! The connection loop: hyper's HTTP/1 server under the broker's own limits.
//!
//! Written out instead of `axum::serve` because the limits live at the
//! connection level: a cap on open connections (one over the cap is closed at
//! once, so an abuser cannot queue work), and a deadline for a request's
//! headers (a slowloris connection is dropped, not kept forever). Shutdown
//! stops accepting, lets in-flight requests finish, then returns.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connection-level limits.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(listener: TcpListener, app: Router, limits: ConnectionLimits, shutdown: impl Future<Output = ()>) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let Ok(permit) = open.clone().try_acquire_owned() else {
                    metrics::counter!("queen_connections_refused_total").increment(1);
                    drop(stream); // over the cap: closed at once
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(permit);
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open after 30 s; closing them");
    }
}
