//! The group coordinator of Kafka's classic consumer protocol: JoinGroup,
//! SyncGroup, Heartbeat and LeaveGroup, for the groups whose members reach
//! this broker.
//!
//! Membership is memory, as in Kafka's own coordinator; committed offsets
//! are not (they are the groups' cursors, `offsets.rs`). A restart forgets
//! the members, whose next heartbeat answers UNKNOWN_MEMBER_ID: they join
//! again and resume from their commits.
//!
//! A group moves through Kafka's four states:
//!
//! - `Empty`: no members.
//! - `Preparing`: a rebalance is open. Every member must join again; the
//!   rebalance completes when all have, or when the longest rebalance
//!   timeout passes (members that did not join are removed). A joining
//!   member waits for that moment.
//! - `Completing`: the generation is decided and the leader (the first
//!   member still present) got the member list; members wait in SyncGroup
//!   for the leader's assignment.
//! - `Stable`: everyone has an assignment; heartbeats keep members in.
//!
//! A member whose heartbeats stop for its session timeout is removed, which
//! opens a rebalance; a leave does the same. The coordinator never looks
//! inside protocol metadata or assignments: the clients assign (range,
//! round-robin, cooperative-sticky), the coordinator carries the bytes.
//!
//! State sits behind one `std::sync::Mutex`, held only for bookkeeping:
//! waiters park on oneshot channels outside it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{broadcast, oneshot};
use super::codes::*;


/// Session timeouts a member may ask for (Kafka's broker defaults).
const SESSION_MIN: Duration = Duration::from_millis(6_000);
const SESSION_MAX: Duration = Duration::from_millis(1_800_000);
/// Most groups, and most members (and ids handed out but not yet used)
/// over all of them, a broker coordinates; past that a join is refused
/// rather than grow memory without bound.
const MAX_GROUPS: usize = 100_000;
const MAX_MEMBERS: usize = 100_000;
/// An id handed out with MEMBER_ID_REQUIRED must come back within this.
const PENDING_TTL: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Empty,
    Preparing,
    Completing,
    Stable,
}

/// What a JoinGroup answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// The leader's view: every member with its metadata for the chosen
    /// protocol (empty for the others).
    pub members: Vec<(String, Option<String>, Bytes)>,
}

impl Joined {
    pub fn error(error: i16, member_id: &str) -> Joined {
        Joined { error, generation: -1, protocol_type: None, protocol: None, leader: String::new(), member_id: member_id.into(), members: vec![] }
    }
}

/// What a SyncGroup answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Synced {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub assignment: Bytes,
}

impl Synced {
    pub fn error(error: i16) -> Synced {
        Synced { error, protocol_type: None, protocol: None, assignment: Bytes::new() }
    }
}

/// A group as DescribeGroups shows it.
pub struct GroupView {
    pub state: State,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberView>,
}

/// One member of a [`GroupView`]: its metadata for the chosen protocol and
/// its assignment.
pub struct MemberView {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// One JoinGroup request, as the coordinator needs it.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub group: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    /// The member's address, as DescribeGroups shows it.
    pub client_host: String,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    /// v4+: a new member first gets MEMBER_ID_REQUIRED and its id.
    pub require_known_id: bool,
}

struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    protocols: Vec<(String, Bytes)>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    last_seen: Instant,
    /// Joined the open rebalance.
    joined: bool,
    join: Option<oneshot::Sender<Joined>>,
    sync: Option<oneshot::Sender<Synced>>,
    assignment: Bytes,
    /// Join order, for the choice of a leader.
    seq: u64,
}

struct Group {
    state: State,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Ids given out with MEMBER_ID_REQUIRED, and when.
    pending: HashMap<String, Instant>,
    /// Which rebalance a timer belongs to.
    rebalance: u64,
    /// An empty group's first rebalance stays open until then.
    hold_until: Option<Instant>,
}

impl Group {
    fn new() -> Group {
        Group {
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: HashMap::new(),
            rebalance: 0,
            hold_until: None,
        }
    }

    /// A protocol every member (and `extra`) supports, in the leader's order of preference.
    fn common_protocol(&self, extra: Option<&[(String, Bytes)]>) -> Option<String> {
        let mut lists: Vec<&[(String, Bytes)]> = self.members.values().map(|m| m.protocols.as_slice()).collect();
        if let Some(e) = extra {
            lists.push(e);
        }
        let leader = self.leader.as_ref().and_then(|l| self.members.get(l)).map(|m| m.protocols.as_slice()).or_else(|| lists.first().copied())?;
        leader.iter().map(|(n, _)| n).find(|n| lists.iter().all(|l| l.iter().any(|(m, _)| m == *n))).cloned()
    }
}

/// The coordinator of this broker's groups.
pub struct Coordinator {
    groups: Mutex<HashMap<String, Group>>,
    initial_delay: Duration,
    next_seq: std::sync::atomic::AtomicU64,
}

impl Coordinator {
    pub fn new(initial_delay: Duration) -> Arc<Coordinator> {
        Arc::new(Coordinator { groups: Mutex::new(HashMap::new()), initial_delay, next_seq: Default::default() })
    }

    /// JoinGroup: waits until the rebalance this join opens (or joins)
    /// completes, and answers the generation.
    pub async fn join(self: &Arc<Self>, req: JoinRequest) -> Joined {
        if req.group.is_empty() {
            return Joined::error(INVALID_GROUP_ID, &req.member_id);
        }
        if req.session_timeout < SESSION_MIN || req.session_timeout > SESSION_MAX {
            return Joined::error(INVALID_SESSION_TIMEOUT, &req.member_id);
        }
        let (rx, member_id, wait) = {
            let mut groups = self.groups.lock().expect("coordinator lock");
            if !groups.contains_key(&req.group) && groups.len() >= MAX_GROUPS {
                return Joined::error(REBALANCE_IN_PROGRESS, &req.member_id);
            }
            let members_everywhere: usize = groups.values().map(|g| g.members.len() + g.pending.len()).sum();
            let g = groups.entry(req.group.clone()).or_insert_with(Group::new);
            let now = Instant::now();
            g.pending.retain(|_, at| now.duration_since(*at) < PENDING_TTL);
            if req.protocols.is_empty()
                || (!g.members.is_empty() && g.protocol_type.as_deref() != Some(req.protocol_type.as_str()))
                || (!g.members.is_empty() && g.common_protocol(Some(&req.protocols)).is_none())
            {
                return Joined::error(INCONSISTENT_GROUP_PROTOCOL, &req.member_id);
            }
            let member_id = if req.member_id.is_empty() {
                let id = format!("{}-{}", req.client_id, uuid::Uuid::new_v4());
                if req.require_known_id {
                    if members_everywhere >= MAX_MEMBERS {
                        return Joined::error(REBALANCE_IN_PROGRESS, "");
                    }
                    g.pending.insert(id.clone(), now);
                    return Joined::error(MEMBER_ID_REQUIRED, &id);
                }
                id
            } else if g.members.contains_key(&req.member_id) || g.pending.remove(&req.member_id).is_some() {
                req.member_id.clone()
            } else {
                return Joined::error(UNKNOWN_MEMBER_ID, &req.member_id);
            };
            if !g.members.contains_key(&member_id) && members_everywhere >= MAX_MEMBERS {
                return Joined::error(REBALANCE_IN_PROGRESS, &member_id);
            }
            let (tx, rx) = oneshot::channel();
            let seq = self.next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let was_empty = g.members.is_empty();
            let m = g.members.entry(member_id.clone()).or_insert_with(|| Member {
                instance_id: None,
                client_id: String::new(),
                client_host: String::new(),
                protocols: Vec::new(),
                session_timeout: req.session_timeout,
                rebalance_timeout: req.rebalance_timeout,
                last_seen: now,
                joined: false,
                join: None,
                sync: None,
                assignment: Bytes::new(),
                seq,
            });
            m.instance_id = req.instance_id.clone();
            m.client_id = req.client_id.clone();
            m.client_host = req.client_host.clone();
            m.protocols = req.protocols.clone();
            m.session_timeout = req.session_timeout;
            m.rebalance_timeout = req.rebalance_timeout;
            m.last_seen = now;
            m.joined = true;
            m.join = Some(tx); // a repeated join replaces the earlier waiter
            g.protocol_type = Some(req.protocol_type.clone());
            if g.state != State::Preparing {
                self.open_rebalance(&req.group, g, Some(&member_id), was_empty);
            }
            self.complete_if_ready(g);
            (rx, member_id, req.rebalance_timeout.max(Duration::from_secs(1)) + self.initial_delay + Duration::from_secs(5))
        };
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(joined)) => joined,
            _ => Joined::error(REBALANCE_IN_PROGRESS, &member_id),
        }
    }

    /// Opens a rebalance: every member but `joiner` must join again;
    /// members waiting in SyncGroup are told to. A timer completes it.
    fn open_rebalance(self: &Arc<Self>, name: &str, g: &mut Group, joiner: Option<&str>, first: bool) {
        for (id, m) in g.members.iter_mut() {
            m.joined = Some(id.as_str()) == joiner;
            if let Some(tx) = m.sync.take() {
                let _ = tx.send(Synced::error(REBALANCE_IN_PROGRESS));
            }
        }
        g.state = State::Preparing;
        g.rebalance += 1;
        let longest = g.members.values().map(|m| m.rebalance_timeout).max().unwrap_or(Duration::ZERO);
        let wait = if first { self.initial_delay } else { longest };
        g.hold_until = (first && !self.initial_delay.is_zero()).then(|| Instant::now() + self.initial_delay);
        let (me, name, rebalance) = (self.clone(), name.to_string(), g.rebalance);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let mut groups = me.groups.lock().expect("coordinator lock");
            if let Some(g) = groups.get_mut(&name) {
                if g.state == State::Preparing && g.rebalance == rebalance {
                    g.hold_until = None;
                    me.complete(g);
                }
            }
        });
    }

    fn complete_if_ready(&self, g: &mut Group) {
        let held = g.hold_until.is_some_and(|t| Instant::now() < t);
        if g.state == State::Preparing && !held && g.members.values().all(|m| m.joined) {
            self.complete(g);
        }
    }

    /// Ends the open rebalance: members that did not join leave, the
    /// generation moves, the leader gets the member list.
    fn complete(&self, g: &mut Group) {
        g.members.retain(|_, m| m.joined);
        g.generation += 1;
        if g.members.is_empty() {
            g.state = State::Empty;
            g.leader = None;
            g.protocol = None;
            return;
        }
        if g.leader.as_ref().is_none_or(|l| !g.members.contains_key(l)) {
            g.leader = g.members.iter().min_by_key(|(_, m)| m.seq).map(|(id, _)| id.clone());
        }
        g.protocol = g.common_protocol(None);
        g.state = State::Completing;
        let leader = g.leader.clone().unwrap_or_default();
        let protocol = g.protocol.clone();
        let list: Vec<(String, Option<String>, Bytes)> = g
            .members
            .iter()
            .map(|(id, m)| {
                let meta = m.protocols.iter().find(|(n, _)| Some(n) == protocol.as_ref()).map(|(_, b)| b.clone()).unwrap_or_default();
                (id.clone(), m.instance_id.clone(), meta)
            })
            .collect();
        let now = Instant::now();
        for (id, m) in g.members.iter_mut() {
            m.last_seen = now;
            m.assignment = Bytes::new();
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Joined {
                    error: NONE,
                    generation: g.generation,
                    protocol_type: g.protocol_type.clone(),
                    protocol: protocol.clone(),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader { list.clone() } else { Vec::new() },
                });
            }
        }
    }

    /// SyncGroup: the leader hands in every member's assignment; each
    /// member waits for its own.
    pub async fn sync(&self, group: &str, generation: i32, member_id: &str, assignments: Vec<(String, Bytes)>, session: Duration) -> Synced {
        let rx = {
            let mut groups = self.groups.lock().expect("coordinator lock");
            let Some(g) = groups.get_mut(group) else { return Synced::error(UNKNOWN_MEMBER_ID) };
            if !g.members.contains_key(member_id) {
                return Synced::error(UNKNOWN_MEMBER_ID);
            }
            if g.state == State::Preparing {
                return Synced::error(REBALANCE_IN_PROGRESS);
            }
            if generation != g.generation {
                return Synced::error(ILLEGAL_GENERATION);
            }
            let ok = |g: &Group, assignment: Bytes| Synced {
                error: NONE,
                protocol_type: g.protocol_type.clone(),
                protocol: g.protocol.clone(),
                assignment,
            };
            if g.state == State::Stable {
                let a = g.members[member_id].assignment.clone();
                return ok(g, a);
            }
            let (tx, rx) = oneshot::channel();
            let m = g.members.get_mut(member_id).expect("checked above");
            m.sync = Some(tx);
            m.last_seen = Instant::now();
            if g.leader.as_deref() == Some(member_id) {
                for (id, a) in assignments {
                    if let Some(m) = g.members.get_mut(&id) {
                        m.assignment = a;
                    }
                }
                g.state = State::Stable;
                let answers: Vec<(oneshot::Sender<Synced>, Bytes)> =
                    g.members.values_mut().filter_map(|m| m.sync.take().map(|tx| (tx, m.assignment.clone()))).collect();
                for (tx, a) in answers {
                    let _ = tx.send(ok(g, a));
                }
            }
            rx
        };
        match tokio::time::timeout(session.max(SESSION_MIN), rx).await {
            Ok(Ok(s)) => s,
            _ => Synced::error(REBALANCE_IN_PROGRESS),
        }
    }

    /// Heartbeat.
    pub fn heartbeat(&self, group: &str, generation: i32, member_id: &str) -> i16 {
        let mut groups = self.groups.lock().expect("coordinator lock");
        let Some(g) = groups.get_mut(group) else { return UNKNOWN_MEMBER_ID };
        let Some(m) = g.members.get_mut(member_id) else { return UNKNOWN_MEMBER_ID };
        m.last_seen = Instant::now();
        match g.state {
            State::Preparing => REBALANCE_IN_PROGRESS,
            _ if generation != g.generation => ILLEGAL_GENERATION,
            _ => NONE,
        }
    }

    /// LeaveGroup of `members`: each one's error code.
    pub fn leave(self: &Arc<Self>, group: &str, members: &[String]) -> Vec<i16> {
        let mut groups = self.groups.lock().expect("coordinator lock");
        let Some(g) = groups.get_mut(group) else { return vec![UNKNOWN_MEMBER_ID; members.len()] };
        let codes: Vec<i16> = members.iter().map(|id| if g.members.remove(id).is_some() { NONE } else { UNKNOWN_MEMBER_ID }).collect();
        if codes.contains(&NONE) {
            self.after_departure(group, g);
        }
        codes
    }

    /// After members left: a rebalance for those who stay, or an empty group.
    fn after_departure(self: &Arc<Self>, name: &str, g: &mut Group) {
        if g.members.is_empty() {
            g.state = State::Empty;
            g.leader = None;
            g.generation += 1;
            return;
        }
        if g.state == State::Preparing {
            self.complete_if_ready(g);
        } else {
            self.open_rebalance(name, g, None, false);
        }
    }

    /// Whether an OffsetCommit of (generation, member) may write: generation
    /// -1 with no member is a commit from outside any group membership.
    pub fn commit_allowed(&self, group: &str, generation: i32, member_id: &str) -> i16 {
        if generation < 0 && member_id.is_empty() {
            return NONE;
        }
        let groups = self.groups.lock().expect("coordinator lock");
        let Some(g) = groups.get(group) else { return UNKNOWN_MEMBER_ID };
        if !g.members.contains_key(member_id) {
            return UNKNOWN_MEMBER_ID;
        }
        if generation != g.generation {
            return ILLEGAL_GENERATION;
        }
        NONE
    }

    /// Every group this broker coordinates: (name, state, protocol type).
    pub fn groups(&self) -> Vec<(String, State, String)> {
        let groups = self.groups.lock().expect("coordinator lock");
        groups.iter().map(|(n, g)| (n.clone(), g.state, g.protocol_type.clone().unwrap_or_default())).collect()
    }

    /// Whether `group` has members here.
    pub fn has_members(&self, group: &str) -> bool {
        let groups = self.groups.lock().expect("coordinator lock");
        groups.get(group).is_some_and(|g| !g.members.is_empty())
    }

    /// A coordinated group as DescribeGroups shows it.
    pub fn describe(&self, group: &str) -> Option<GroupView> {
        let groups = self.groups.lock().expect("coordinator lock");
        let g = groups.get(group)?;
        let protocol = g.protocol.clone().unwrap_or_default();
        Some(GroupView {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            members: g
                .members
                .iter()
                .map(|(id, m)| MemberView {
                    id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: m.protocols.iter().find(|(n, _)| *n == protocol).map(|(_, b)| b.clone()).unwrap_or_default(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
            protocol,
        })
    }

    /// The state of `group` (Empty when this broker does not know it).
    pub fn state(&self, group: &str) -> (State, usize, i32) {
        let groups = self.groups.lock().expect("coordinator lock");
        groups.get(group).map_or((State::Empty, 0, 0), |g| (g.state, g.members.len(), g.generation))
    }

    /// Removes members whose session timed out, once a second, and forgets
    /// empty groups with nothing pending.
    pub fn spawn_expiry(self: &Arc<Self>, mut shutdown: broadcast::Receiver<()>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => me.expire(Instant::now()),
                    _ = shutdown.recv() => return,
                }
            }
        });
    }

    fn expire(self: &Arc<Self>, now: Instant) {
        let mut groups = self.groups.lock().expect("coordinator lock");
        let names: Vec<String> = groups.keys().cloned().collect();
        for name in names {
            let g = groups.get_mut(&name).expect("listed");
            // A member in the open rebalance is judged by the rebalance's
            // timer, not its session.
            let before = g.members.len();
            let preparing = g.state == State::Preparing;
            g.members.retain(|_, m| (preparing && m.joined) || now.duration_since(m.last_seen) < m.session_timeout);
            if g.members.len() < before {
                self.after_departure(&name, g);
            }
            g.pending.retain(|_, at| now.duration_since(*at) < PENDING_TTL);
            if g.members.is_empty() && g.pending.is_empty() {
                groups.remove(&name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(group: &str, member: &str, protocols: &[&str]) -> JoinRequest {
        JoinRequest {
            group: group.into(),
            member_id: member.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            protocol_type: "consumer".into(),
            protocols: protocols.iter().map(|p| (p.to_string(), Bytes::from(format!("meta-{p}")))).collect(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(2),
            require_known_id: true,
        }
    }

    #[tokio::test]
    async fn two_members_join_the_leader_assigns_and_each_gets_its_own_share() {
        let c = Coordinator::new(Duration::ZERO);
        // v4+: the first join only hands out an id.
        let first = c.join(join("g", "", &["range"])).await;
        assert_eq!(first.error, MEMBER_ID_REQUIRED);
        let a = c.join(join("g", &first.member_id, &["range", "roundrobin"])).await;
        assert_eq!((a.error, a.generation, a.leader.as_str()), (NONE, 1, a.member_id.as_str()));
        assert_eq!(a.members.len(), 1);
        // A second member opens a rebalance; the first learns by heartbeat and rejoins.
        let b_id = c.join(join("g", "", &["roundrobin", "range"])).await.member_id;
        let (c2, b_id2) = (c.clone(), b_id.clone());
        let b = tokio::spawn(async move { c2.join(join("g", &b_id2, &["roundrobin", "range"])).await });
        tokio::task::yield_now().await;
        assert_eq!(c.heartbeat("g", 1, &a.member_id), REBALANCE_IN_PROGRESS);
        let a2 = c.join(join("g", &a.member_id, &["range", "roundrobin"])).await;
        let b = b.await.unwrap();
        assert_eq!((a2.generation, b.generation), (2, 2));
        assert_eq!(a2.leader, a.member_id, "the leader stays");
        assert_eq!(a2.protocol.as_deref(), Some("range"), "the leader's preference among the common ones");
        assert_eq!(a2.members.len(), 2);
        assert!(b.members.is_empty(), "only the leader gets the list");
        let meta: Vec<&[u8]> = a2.members.iter().map(|(_, _, m)| m.as_ref()).collect();
        assert_eq!(meta, vec![&b"meta-range"[..]; 2]);
        // The follower waits in sync until the leader assigns.
        let (c3, b_id3) = (c.clone(), b_id.clone());
        let follower = tokio::spawn(async move { c3.sync("g", 2, &b_id3, vec![], Duration::from_secs(10)).await });
        tokio::task::yield_now().await;
        let leader = c.sync("g", 2, &a.member_id, vec![(a.member_id.clone(), Bytes::from("A")), (b_id.clone(), Bytes::from("B"))], Duration::from_secs(10)).await;
        assert_eq!((leader.error, leader.assignment.as_ref()), (NONE, &b"A"[..]));
        let follower = follower.await.unwrap();
        assert_eq!((follower.error, follower.assignment.as_ref()), (NONE, &b"B"[..]));
        assert_eq!(c.heartbeat("g", 2, &b_id), NONE);
        assert_eq!(c.heartbeat("g", 1, &b_id), ILLEGAL_GENERATION);
        assert_eq!(c.commit_allowed("g", 2, &b_id), NONE);
        assert_eq!(c.commit_allowed("g", 1, &b_id), ILLEGAL_GENERATION);
        assert_eq!(c.commit_allowed("g", -1, ""), NONE);
        // A leave opens a rebalance that the one left completes alone.
        assert_eq!(c.leave("g", &[b_id.clone(), "nobody".into()]), vec![NONE, UNKNOWN_MEMBER_ID]);
        assert_eq!(c.heartbeat("g", 2, &a.member_id), REBALANCE_IN_PROGRESS);
        let a3 = c.join(join("g", &a.member_id, &["range"])).await;
        assert_eq!((a3.generation, a3.members.len()), (3, 1));
    }

    #[tokio::test]
    async fn unknown_members_and_protocols_that_do_not_meet_are_refused() {
        let c = Coordinator::new(Duration::ZERO);
        assert_eq!(c.join(join("g", "made-up", &["range"])).await.error, UNKNOWN_MEMBER_ID);
        let mut old = join("g", "", &["range"]);
        old.require_known_id = false; // v0-3: the id comes with the answer
        let a = c.join(old).await;
        assert_eq!((a.error, a.generation), (NONE, 1));
        let mut other = join("g", "", &["sticky"]);
        other.require_known_id = false;
        assert_eq!(c.join(other).await.error, INCONSISTENT_GROUP_PROTOCOL);
        let mut short = join("g", "", &["range"]);
        short.session_timeout = Duration::from_millis(10);
        assert_eq!(c.join(short).await.error, INVALID_SESSION_TIMEOUT);
        assert_eq!(c.heartbeat("nope", 1, "x"), UNKNOWN_MEMBER_ID);
        assert_eq!(c.sync("g", 1, "x", vec![], Duration::from_secs(1)).await.error, UNKNOWN_MEMBER_ID);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_stops_heartbeating_is_removed_after_its_session() {
        let c = Coordinator::new(Duration::ZERO);
        let mut r = join("g", "", &["range"]);
        r.require_known_id = false;
        let a = c.join(r).await;
        c.sync("g", a.generation, &a.member_id, vec![(a.member_id.clone(), Bytes::from("x"))], Duration::from_secs(10)).await;
        c.expire(Instant::now() + Duration::from_secs(5));
        assert_eq!(c.state("g"), (State::Stable, 1, 1));
        c.expire(Instant::now() + Duration::from_secs(11));
        assert_eq!(c.state("g"), (State::Empty, 0, 0), "forgotten once empty");
        assert_eq!(c.heartbeat("g", 1, &a.member_id), UNKNOWN_MEMBER_ID);
    }
}
