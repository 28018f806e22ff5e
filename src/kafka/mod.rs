//! The Kafka wire-protocol listener (docs/KAFKA.md): Kafka's own clients
//! produce to and consume from Queen queues on a second port of the same
//! process.
//!
//! It is shaped as a translation layer and nothing more. A topic is a queue,
//! a Kafka partition `n` is the Queen partition named `"n"`, an offset is the
//! log offset, a consumer group's committed offsets are its Queen cursors.
//! Produce goes through the push path (`push::push_items`, so the
//! coalescer, the group commit and the wake of long-polls are the HTTP
//! push's), Fetch through the reads by offset (`reads::fetch::fetch_into`),
//! commits through one SQL statement on `queen.consumers`. What only Kafka
//! has, the classic group membership protocol, lives in [`groups`], in
//! memory, as Kafka's own group coordinator keeps it.
//!
//! A connection acts in one tenant (`tenancy`): the one its SASL token's
//! claim names (`QUEEN_TENANT_CLAIM`), else the default. Names are mapped
//! at this edge, as HTTP's routes map them: a topic is the tenant's queue
//! (`Tenant::stored` in, `tenancy::shown` out), a group's membership and a
//! transactional id are keyed by the tenant's stored name, and listings
//! read only the tenant's queues. So two tenants' topic `orders` and group
//! `billing` are strangers, and a foreign name is an unknown one.
//!
//! One task per connection reads a frame, answers it, and reads the next:
//! Kafka clients pipeline requests and expect the answers in order, so a
//! connection is served in order. Request and response schemas are the
//! `kafka-protocol` crate's; record batches are [`batch`]'s.

mod admin;
mod authz;
pub mod codes;
mod configs;
pub mod batch;
mod conn;
mod fetch;
pub mod groups;
pub mod idempotence;
mod nodes;
mod offsets;
mod produce;
pub mod records;
pub mod sasl;
mod topics;
pub mod transactions;
mod versions;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{broadcast, Semaphore};

use crate::config::KafkaConfig;
use self::codes::*;

use crate::http::AppState;

/// Most Kafka connections served at once; one more waits for a slot.
const MAX_CONNECTIONS: usize = 10_000;
/// Request frames all connections together may hold in memory at once, in
/// KiB: a frame is read only once its size fits, so many large requests
/// wait instead of growing the broker past this.
const FRAME_BUDGET_KIB: usize = 1 << 20;
/// How often idle producers are looked for, and most deleted a tick.
const PRODUCER_EXPIRY_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
const PRODUCER_EXPIRY_BATCH: i32 = 1_000;
/// How often transactions open past their timeout are looked for.
const TXN_TIMEOUT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What every connection shares: the broker's state, this node's advertised
/// address, and the group coordinator.
pub struct Kafka {
    pub state: AppState,
    pub config: KafkaConfig,
    /// This broker's node and the other live ones.
    pub nodes: Arc<nodes::Nodes>,
    pub groups: Arc<groups::Coordinator>,
    /// The frame bytes all connections may hold at once ([`FRAME_BUDGET_KIB`]).
    pub frames: Arc<Semaphore>,
}

/// A bound Kafka port, and its TLS acceptor when it speaks TLS.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Binds the listener the configuration names. `Ok(None)`: the listener is
/// off, or its default address is held by another process (a second broker
/// on one machine), which is logged and skipped; an address the operator
/// set must bind. A TLS certificate or key that does not load fails too.
pub async fn bind(cfg: &KafkaConfig) -> Result<Option<Listener>, std::io::Error> {
    if !cfg.enabled {
        return Ok(None);
    }
    let tls = cfg.tls.as_ref().map(|(cert, key)| tls_acceptor(cert, key)).transpose()?;
    match TcpListener::bind(&cfg.listen).await {
        Ok(tcp) => Ok(Some(Listener { tcp, tls })),
        Err(e) if !cfg.listen_explicit && e.kind() == std::io::ErrorKind::AddrInUse => {
            tracing::warn!(addr = %cfg.listen, "the Kafka port is taken; the Kafka listener is off (set QUEEN_KAFKA_LISTEN to choose another)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// A rustls server of the PEM chain and key.
fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<tokio_rustls::TlsAcceptor, std::io::Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| bad(format!("QUEEN_KAFKA_TLS_CERT {}: {e}", cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(format!("QUEEN_KAFKA_TLS_KEY {}: {e}", key.display())))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| bad(format!("QUEEN_KAFKA_TLS_CERT/KEY: {e}")))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The `host:port` to advertise for a listener bound at `local`.
fn advertised(cfg: &KafkaConfig, local: std::net::SocketAddr) -> (String, i32) {
    if let Some(a) = &cfg.advertised {
        if let Some((h, p)) = a.rsplit_once(':') {
            if let Ok(p) = p.parse::<u16>() {
                return (h.trim_matches(['[', ']']).to_string(), i32::from(p));
            }
        }
        return (a.clone(), i32::from(local.port()));
    }
    let host = if local.ip().is_unspecified() { hostname() } else { local.ip().to_string() };
    (host, i32::from(local.port()))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let name = if rc == 0 { buf.split(|b| *b == 0).next().map(|s| String::from_utf8_lossy(s).into_owned()) } else { None };
    name.filter(|n| !n.is_empty()).unwrap_or_else(|| "localhost".into())
}

/// Serves the listener until `shutdown`: each connection in its own task,
/// at most [`MAX_CONNECTIONS`] at once.
pub async fn spawn(state: AppState, listener: Listener, shutdown: broadcast::Sender<()>) {
    let cfg = state.config.kafka.clone();
    let Listener { tcp: listener, tls } = listener;
    let Ok(local) = listener.local_addr() else { return };
    let (host, port) = advertised(&cfg, local);
    let advertised = format!("{host}:{port}");
    let groups = groups::Coordinator::new(cfg.group_initial_delay);
    groups.spawn_expiry(shutdown.subscribe());
    let (pool, idle, txn_idle) = (state.pool.clone(), cfg.producer_expiry, cfg.transactional_id_expiry);
    crate::maintenance::spawn_service("kafka_producer_expiry", PRODUCER_EXPIRY_EVERY, shutdown.subscribe(), move || {
        let pool = pool.clone();
        async move { idempotence::expire(&pool, idle, txn_idle, PRODUCER_EXPIRY_BATCH).await }
    });
    let pool = state.pool.clone();
    crate::maintenance::spawn_service("kafka_txn_timeout", TXN_TIMEOUT_EVERY, shutdown.subscribe(), move || {
        let pool = pool.clone();
        async move { transactions::expire(&pool, PRODUCER_EXPIRY_BATCH).await }
    });
    let nodes = nodes::Nodes::alone(host, port);
    nodes.start(state.pool.clone(), shutdown.subscribe()).await;
    tracing::info!(%local, %advertised, node = nodes.me().id, tls = tls.is_some(), "kafka listening on {local}");
    let kafka = Arc::new(Kafka { state, config: cfg, nodes, groups, frames: Arc::new(Semaphore::new(FRAME_BUDGET_KIB)) });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut stop = shutdown.subscribe();
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                _ = stop.recv() => return,
            };
            let (stream, peer) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "kafka accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = stop.recv() => return,
            };
            let _ = stream.set_nodelay(true);
            let kafka = kafka.clone();
            let stop = shutdown.subscribe();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => {
                        let (read, write) = stream.into_split();
                        conn::serve(kafka, read, write, peer, stop).await;
                    }
                    Some(acceptor) => {
                        match tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(stream)).await {
                            Ok(Ok(tls)) => {
                                let (read, write) = tokio::io::split(tls);
                                conn::serve(kafka, read, write, peer, stop).await;
                            }
                            Ok(Err(e)) => tracing::warn!(%peer, error = %e, "kafka TLS handshake failed"),
                            Err(_) => tracing::warn!(%peer, "kafka TLS handshake timed out"),
                        }
                    }
                }
                drop(permit);
            });
        }
    });
}


/// What a group's coordinator is chosen by (`nodes::Nodes::owner`).
pub fn coordination_key(group: &str) -> String {
    format!("group\0{group}")
}


/// Checks a SASL PLAIN token and records who authenticated, and the
/// tenant its claim names (the same rule as an HTTP bearer token's).
fn authenticate(kafka: &Kafka, session: &mut sasl::Session, token: &[u8]) -> Result<(), String> {
    let password = sasl::plain_password(token)?;
    let principal = crate::http::auth::principal(password, &kafka.state.config.auth)?;
    let tenant = crate::tenancy::claimed(&kafka.state.config, &principal).map_err(|(why, _)| why.to_string())?.unwrap_or_default();
    if crate::tenancy::reserved(tenant) {
        return Err("this tenant is reserved: no connection acts on it".into());
    }
    session.principal = Some(principal);
    session.tenant = tenant;
    Ok(())
}

/// Answers one checked request (`conn::handle` checked its key and version,
/// and that the session may send it).
async fn dispatch(kafka: &Kafka, req: &conn::Request, session: &mut sasl::Session) -> conn::Reply {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    macro_rules! decode {
        ($t:ty) => {
            match req.decode::<$t>() {
                Ok(r) => r,
                Err(reply) => return reply,
            }
        };
    }
    if !session.may(authz::need(req.key)) {
        return authz::denied(req);
    }
    // Group ids and transactional ids are the tenant's: kept (in the
    // coordinator, in queen.kafka_producers) by their stored names.
    let tenant = session.tenant;
    match req.key {
        ApiKey::ApiVersions => req.answer(&versions::answer(codes::NONE)),
        ApiKey::SaslHandshake => {
            let r = decode!(SaslHandshakeRequest);
            let mut a = SaslHandshakeResponse::default();
            if !session.required {
                // No SASL on this broker (JWT is off): nothing to agree on.
                a.error_code = codes::UNSUPPORTED_SASL_MECHANISM;
            } else if session.handshaken {
                a.error_code = codes::ILLEGAL_SASL_STATE;
            } else if r.mechanism.as_str() != "PLAIN" {
                a.error_code = codes::UNSUPPORTED_SASL_MECHANISM;
                a.mechanisms = vec![StrBytes::from_static_str("PLAIN")];
            } else {
                session.handshaken = true;
                session.bare_token_next = req.version == 0;
                a.mechanisms = vec![StrBytes::from_static_str("PLAIN")];
            }
            req.answer(&a)
        }
        ApiKey::SaslAuthenticate => {
            let r = decode!(SaslAuthenticateRequest);
            let mut a = SaslAuthenticateResponse::default();
            if !session.handshaken || session.principal.is_some() {
                a.error_code = codes::ILLEGAL_SASL_STATE;
                a.error_message = Some(StrBytes::from_static_str("SaslAuthenticate comes once, after a PLAIN SaslHandshake"));
                return req.answer(&a);
            }
            match authenticate(kafka, session, &r.auth_bytes) {
                Ok(()) => req.answer(&a),
                Err(why) => {
                    a.error_code = codes::SASL_AUTHENTICATION_FAILED;
                    a.error_message = Some(StrBytes::from_string(format!("Authentication failed: {why}")));
                    match req.answer(&a) {
                        conn::Reply::Send(body) => conn::Reply::SendThenClose(body, format!("SASL authentication failed: {why}")),
                        other => other,
                    }
                }
            }
        }
        ApiKey::Metadata => {
            let r = decode!(MetadataRequest);
            let may_create = session.may(crate::http::auth::Level::WriteOnly);
            req.answer(&topics::metadata(kafka, tenant, &r, req.version, may_create).await)
        }
        ApiKey::Produce => {
            let r = decode!(ProduceRequest);
            match produce::produce(kafka, tenant, &r, session.subject(), req.version).await {
                Some(answer) => req.answer(&answer),
                None => conn::Reply::Nothing,
            }
        }
        ApiKey::Fetch => {
            let r = decode!(FetchRequest);
            req.answer(&fetch::fetch(kafka, tenant, &r, req.version).await)
        }
        ApiKey::ListOffsets => {
            let r = decode!(ListOffsetsRequest);
            req.answer(&topics::list_offsets(kafka, tenant, &r).await)
        }
        ApiKey::FindCoordinator => {
            let r = decode!(FindCoordinatorRequest);
            let mut a = FindCoordinatorResponse::default();
            if req.version >= 4 {
                a.coordinators = r
                    .coordinator_keys
                    .iter()
                    .map(|k| {
                        let owner = kafka.nodes.owner(&coordination_key(&tenant.stored(k)));
                        let mut c = find_coordinator_response::Coordinator::default();
                        c.key = k.clone();
                        c.node_id = BrokerId(owner.id);
                        c.host = StrBytes::from_string(owner.host);
                        c.port = owner.port;
                        c
                    })
                    .collect();
            } else {
                let owner = kafka.nodes.owner(&coordination_key(&tenant.stored(&r.key)));
                a.node_id = BrokerId(owner.id);
                a.host = StrBytes::from_string(owner.host);
                a.port = owner.port;
            }
            req.answer(&a)
        }
        ApiKey::JoinGroup => {
            let r = decode!(JoinGroupRequest);
            let ms = |v: i32| std::time::Duration::from_millis(v.max(0) as u64);
            let group = tenant.stored(&r.group_id.0);
            let joined = if !kafka.nodes.mine(&coordination_key(&group)) {
                groups::Joined::error(NOT_COORDINATOR, &r.member_id)
            } else {
                kafka
                .groups
                .join(groups::JoinRequest {
                    group,
                    member_id: r.member_id.to_string(),
                    instance_id: r.group_instance_id.as_ref().map(|s| s.to_string()),
                    client_id: req.header.client_id.as_ref().map_or_else(|| "consumer".to_string(), |c| c.to_string()),
                    client_host: format!("/{}", req.peer.ip()),
                    protocol_type: r.protocol_type.to_string(),
                    protocols: r.protocols.iter().map(|p| (p.name.to_string(), p.metadata.clone())).collect(),
                    session_timeout: ms(r.session_timeout_ms),
                    // v0 has no rebalance timeout: the session's stands in.
                    rebalance_timeout: ms(if req.version == 0 { r.session_timeout_ms } else { r.rebalance_timeout_ms }),
                    require_known_id: req.version >= 4,
                })
                .await
            };
            let mut a = JoinGroupResponse::default();
            a.error_code = joined.error;
            a.generation_id = joined.generation;
            if req.version >= 7 {
                a.protocol_type = joined.protocol_type.map(StrBytes::from_string);
            }
            a.protocol_name = joined.protocol.map(StrBytes::from_string);
            a.leader = StrBytes::from_string(joined.leader);
            a.member_id = StrBytes::from_string(joined.member_id);
            a.members = joined
                .members
                .into_iter()
                .map(|(id, instance, metadata)| {
                    let mut m = join_group_response::JoinGroupResponseMember::default();
                    m.member_id = StrBytes::from_string(id);
                    m.group_instance_id = instance.filter(|_| req.version >= 5).map(StrBytes::from_string);
                    m.metadata = metadata;
                    m
                })
                .collect();
            if req.version < 7 && a.protocol_name.is_none() {
                a.protocol_name = Some(StrBytes::from_static_str(""));
            }
            req.answer(&a)
        }
        ApiKey::SyncGroup => {
            let r = decode!(SyncGroupRequest);
            let assignments = r.assignments.iter().map(|a| (a.member_id.to_string(), a.assignment.clone())).collect();
            let group = tenant.stored(&r.group_id.0);
            let synced = if !kafka.nodes.mine(&coordination_key(&group)) {
                groups::Synced::error(NOT_COORDINATOR)
            } else {
                kafka.groups.sync(&group, r.generation_id, &r.member_id, assignments, std::time::Duration::from_secs(60)).await
            };
            let mut a = SyncGroupResponse::default();
            a.error_code = synced.error;
            if req.version >= 5 {
                a.protocol_type = synced.protocol_type.map(StrBytes::from_string);
                a.protocol_name = synced.protocol.map(StrBytes::from_string);
            }
            a.assignment = synced.assignment;
            req.answer(&a)
        }
        ApiKey::Heartbeat => {
            let r = decode!(HeartbeatRequest);
            let mut a = HeartbeatResponse::default();
            let group = tenant.stored(&r.group_id.0);
            a.error_code = if !kafka.nodes.mine(&coordination_key(&group)) {
                NOT_COORDINATOR
            } else {
                kafka.groups.heartbeat(&group, r.generation_id, &r.member_id)
            };
            req.answer(&a)
        }
        ApiKey::LeaveGroup => {
            let r = decode!(LeaveGroupRequest);
            let ids: Vec<String> =
                if req.version >= 3 { r.members.iter().map(|m| m.member_id.to_string()).collect() } else { vec![r.member_id.to_string()] };
            let group = tenant.stored(&r.group_id.0);
            let codes = if !kafka.nodes.mine(&coordination_key(&group)) {
                vec![NOT_COORDINATOR; ids.len()]
            } else {
                kafka.groups.leave(&group, &ids)
            };
            let mut a = LeaveGroupResponse::default();
            if req.version >= 3 {
                a.members = r
                    .members
                    .iter()
                    .zip(&codes)
                    .map(|(m, code)| {
                        let mut out = leave_group_response::MemberResponse::default();
                        out.member_id = m.member_id.clone();
                        out.group_instance_id = m.group_instance_id.clone();
                        out.error_code = *code;
                        out
                    })
                    .collect();
            } else {
                a.error_code = codes.first().copied().unwrap_or(codes::UNKNOWN_MEMBER_ID);
            }
            req.answer(&a)
        }
        ApiKey::OffsetCommit => {
            let r = decode!(OffsetCommitRequest);
            req.answer(&offsets::commit(kafka, tenant, &r).await)
        }
        ApiKey::OffsetFetch => {
            let r = decode!(OffsetFetchRequest);
            req.answer(&offsets::fetch(kafka, tenant, &r).await)
        }
        ApiKey::InitProducerId => {
            let r = decode!(InitProducerIdRequest);
            let mut a = InitProducerIdResponse::default();
            a.producer_id = ProducerId(-1);
            a.producer_epoch = -1;
            if let Some(txn) = r.transactional_id.as_ref().filter(|t| !t.0.is_empty()) {
                match transactions::init(&kafka.state.pool, tenant, &txn.0, r.transaction_timeout_ms).await {
                    Ok((id, epoch)) => {
                        a.producer_id = ProducerId(id);
                        a.producer_epoch = epoch;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "kafka init transactional producer failed");
                        a.error_code = COORDINATOR_NOT_AVAILABLE;
                    }
                }
            } else {
                // KIP-360: a producer that names its id and epoch asks for the next epoch.
                let bump = (r.producer_id.0 >= 0 && r.producer_epoch >= 0).then_some((r.producer_id.0, r.producer_epoch));
                match idempotence::init_producer(&kafka.state.pool, tenant, bump).await {
                    Ok(Some((id, epoch))) => {
                        a.producer_id = ProducerId(id);
                        a.producer_epoch = epoch;
                    }
                    Ok(None) => a.error_code = INVALID_PRODUCER_EPOCH,
                    Err(e) => {
                        tracing::warn!(error = %e, "kafka init producer id failed");
                        a.error_code = COORDINATOR_NOT_AVAILABLE;
                    }
                }
            }
            req.answer(&a)
        }
        ApiKey::AddPartitionsToTxn => {
            let r = decode!(AddPartitionsToTxnRequest);
            req.answer(&transactions::add_partitions(kafka, tenant, &r).await)
        }
        ApiKey::AddOffsetsToTxn => {
            let r = decode!(AddOffsetsToTxnRequest);
            req.answer(&transactions::add_offsets(kafka, tenant, &r).await)
        }
        ApiKey::TxnOffsetCommit => {
            let r = decode!(TxnOffsetCommitRequest);
            req.answer(&transactions::offset_commit(kafka, tenant, &r).await)
        }
        ApiKey::EndTxn => {
            let r = decode!(EndTxnRequest);
            req.answer(&transactions::end(kafka, tenant, &r).await)
        }
        ApiKey::DescribeCluster => {
            let live = kafka.nodes.live();
            let mut a = DescribeClusterResponse::default();
            a.endpoint_type = 1; // brokers
            a.cluster_id = StrBytes::from_static_str("queen");
            a.controller_id = BrokerId(live.first().map_or(0, |n| n.id));
            a.brokers = live
                .into_iter()
                .map(|n| {
                    let mut b = describe_cluster_response::DescribeClusterBroker::default();
                    b.broker_id = BrokerId(n.id);
                    b.host = StrBytes::from_string(n.host);
                    b.port = n.port;
                    b
                })
                .collect();
            req.answer(&a)
        }
        ApiKey::DescribeConfigs => {
            let r = decode!(DescribeConfigsRequest);
            req.answer(&configs::describe(kafka, tenant, &r, req.version).await)
        }
        ApiKey::IncrementalAlterConfigs => {
            let r = decode!(IncrementalAlterConfigsRequest);
            req.answer(&configs::alter(kafka, tenant, &r).await)
        }
        ApiKey::CreateTopics => {
            let r = decode!(CreateTopicsRequest);
            req.answer(&admin::create_topics(kafka, tenant, &r, req.version).await)
        }
        ApiKey::DeleteTopics => {
            let r = decode!(DeleteTopicsRequest);
            req.answer(&admin::delete_topics(kafka, tenant, &r, req.version).await)
        }
        ApiKey::CreatePartitions => {
            let r = decode!(CreatePartitionsRequest);
            req.answer(&admin::create_partitions(kafka, tenant, &r).await)
        }
        ApiKey::ListGroups => {
            let r = decode!(ListGroupsRequest);
            req.answer(&admin::list_groups(kafka, tenant, &r).await)
        }
        ApiKey::DescribeGroups => {
            let r = decode!(DescribeGroupsRequest);
            req.answer(&admin::describe_groups(kafka, tenant, &r, req.version).await)
        }
        ApiKey::DeleteGroups => {
            let r = decode!(DeleteGroupsRequest);
            req.answer(&admin::delete_groups(kafka, tenant, &r).await)
        }
        ApiKey::OffsetDelete => {
            let r = decode!(OffsetDeleteRequest);
            req.answer(&admin::offset_delete(kafka, tenant, &r).await)
        }
        other => conn::Reply::Close(format!("{other:?} is not served")),
    }
}
