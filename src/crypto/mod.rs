//! Encryption at rest (API.md §2.1, §3.2 flag 4): the AES-256-GCM envelope,
//! the key ring that reads every key it was given and writes under one, and
//! the set of queues whose payloads are sealed.
//!
//! An envelope is what a stored frame with flag 4 carries as its payload:
//!
//! ```text
//! envelope := u8 version (1) | u8[4] key_id | u8[12] nonce | ciphertext | u8[16] tag
//! ```
//!
//! The nonce is random per message: 96 bits from the thread's CSPRNG
//! (ChaCha12, seeded and reseeded from the OS; one `getrandom` call per
//! message cost a system call on every push), so a key can seal far more
//! messages than a queue will ever hold before a repeat is a concern. The associated data binds an envelope to where it belongs (the
//! message id in a segment or a dead letter, the transactionId in the spool),
//! so an envelope copied onto another message does not open. `key_id` is the
//! key check value of the key (the first four bytes of AES-256 of a zero
//! block, as banks label keys): it names the key without revealing it, so a
//! reader picks the right key of its ring instead of trying each, and a
//! reader without it says which one it lacks.
//!
//! Only the payload is sealed. The transactionId, ids and producer subject
//! stay in the clear, because deduplication, acks and the routes that find a
//! message by its transactionId need them, and PostgreSQL never looks inside
//! a segment anyway.
//!
//! This module is pure: the envelope, the ring and the set of sealing
//! queues know nothing of HTTP or PostgreSQL (the set is loaded by
//! `admin::configure::refresh_encrypted`).

use std::collections::HashSet;
use std::sync::Arc;

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::aes::cipher::BlockEncrypt;
use aes_gcm::Aes256Gcm;

/// The first byte of every envelope this broker writes.
const VERSION: u8 = 1;
const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Bytes an envelope adds to the payload it seals.
pub const OVERHEAD: usize = 1 + KEY_ID_LEN + NONCE_LEN + TAG_LEN;

/// A key's short public name: its key check value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; KEY_ID_LEN]);

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl KeyId {
    /// The key check value of a 256-bit key.
    pub fn of(key: &[u8; 32]) -> KeyId {
        let aes = aes_gcm::aes::Aes256::new(key.into());
        let mut block = [0u8; 16].into();
        aes.encrypt_block(&mut block);
        KeyId(block[..KEY_ID_LEN].try_into().expect("4 of 16 bytes"))
    }
}

/// Why an envelope did not open. Never a panic, never garbage: the caller
/// answers an error naming the message's partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("envelope sealed under key {0}, which this broker does not have (QUEEN_ENCRYPTION_KEY / QUEEN_ENCRYPTION_KEYS)")]
    UnknownKey(KeyId),
    #[error("envelope under key {0} does not authenticate (corrupt, or not this message's)")]
    Corrupt(KeyId),
    #[error("envelope is malformed ({0})")]
    Malformed(&'static str),
    #[error("payload is encrypted and this broker has no encryption key")]
    NoKey,
}

/// One key and its cipher.
struct Key {
    id: KeyId,
    cipher: Aes256Gcm,
}

impl Key {
    fn new(bytes: &[u8; 32]) -> Key {
        Key { id: KeyId::of(bytes), cipher: Aes256Gcm::new(bytes.into()) }
    }
}

/// The keys a broker holds: it seals under `current` and opens envelopes of
/// any key it holds, so a rotation is: new key in `QUEEN_ENCRYPTION_KEY`, the
/// old one moved to `QUEEN_ENCRYPTION_KEYS`, restart.
pub struct KeyRing {
    current: Key,
    older: Vec<Key>,
}

impl KeyRing {
    pub fn new(keys: &crate::config::EncryptionKeys) -> KeyRing {
        KeyRing { current: Key::new(&keys.current), older: keys.older.iter().map(Key::new).collect() }
    }

    /// The id envelopes are sealed under now.
    pub fn current_id(&self) -> KeyId {
        self.current.id
    }

    /// Appends the envelope of `plaintext`, bound to `aad`, to `out`
    /// (sealed in place: no buffer besides `out`).
    pub fn seal_into(&self, plaintext: &[u8], aad: &[u8], out: &mut Vec<u8>) {
        let mut nonce = [0u8; NONCE_LEN];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut nonce);
        out.reserve(OVERHEAD + plaintext.len());
        out.push(VERSION);
        out.extend_from_slice(&self.current.id.0);
        out.extend_from_slice(&nonce);
        let body = out.len();
        out.extend_from_slice(plaintext);
        let tag = self
            .current
            .cipher
            .encrypt_in_place_detached(&nonce.into(), aad, &mut out[body..])
            .expect("AES-GCM encryption of an in-memory buffer does not fail");
        out.extend_from_slice(&tag);
    }

    /// The envelope of `plaintext`, bound to `aad`.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.seal_into(plaintext, aad, &mut out);
        out
    }

    /// Appends the plaintext of an envelope bound to `aad` to `out` (opened
    /// in place); on an error `out` is as it was.
    pub fn open_into(&self, envelope: &[u8], aad: &[u8], out: &mut Vec<u8>) -> Result<(), OpenError> {
        if envelope.len() < OVERHEAD {
            return Err(OpenError::Malformed("shorter than its header and tag"));
        }
        if envelope[0] != VERSION {
            return Err(OpenError::Malformed("unknown version byte"));
        }
        let id = KeyId(envelope[1..1 + KEY_ID_LEN].try_into().expect("4 bytes"));
        let key = std::iter::once(&self.current)
            .chain(&self.older)
            .find(|k| k.id == id)
            .ok_or(OpenError::UnknownKey(id))?;
        let nonce_end = 1 + KEY_ID_LEN + NONCE_LEN;
        let nonce = aes_gcm::Nonce::from_slice(&envelope[1 + KEY_ID_LEN..nonce_end]);
        let (body, tag) = envelope[nonce_end..].split_at(envelope.len() - nonce_end - TAG_LEN);
        let start = out.len();
        out.extend_from_slice(body);
        key.cipher.decrypt_in_place_detached(nonce, aad, &mut out[start..], tag.into()).map_err(|_| {
            out.truncate(start);
            OpenError::Corrupt(id)
        })
    }

    /// The plaintext of an envelope bound to `aad`.
    pub fn open(&self, envelope: &[u8], aad: &[u8]) -> Result<Vec<u8>, OpenError> {
        let mut out = Vec::new();
        self.open_into(envelope, aad, &mut out)?;
        Ok(out)
    }
}

/// Opens with `ring`, which a broker without a key does not have.
pub fn open(ring: Option<&KeyRing>, envelope: &[u8], aad: &[u8]) -> Result<Vec<u8>, OpenError> {
    ring.ok_or(OpenError::NoKey)?.open(envelope, aad)
}

/// The JSON payload of a stored frame: as stored, or opened when the frame
/// carries an envelope (bound to its message id). Every read path that
/// shows a payload goes through here or through [`write_frame_payload`].
pub fn frame_payload<'a>(ring: Option<&KeyRing>, frame: &crate::log::Frame<'a>) -> Result<std::borrow::Cow<'a, [u8]>, OpenError> {
    if !frame.encrypted {
        return Ok(std::borrow::Cow::Borrowed(frame.payload_json()));
    }
    let mut plain = Vec::with_capacity(frame.payload.len());
    write_frame_payload(ring, frame, &mut plain)?;
    Ok(std::borrow::Cow::Owned(plain))
}

/// [`frame_payload`] appended to `out` (the pop's answer buffer), opened in
/// place without a buffer of its own.
pub fn write_frame_payload(ring: Option<&KeyRing>, frame: &crate::log::Frame<'_>, out: &mut Vec<u8>) -> Result<(), OpenError> {
    if !frame.encrypted {
        out.extend_from_slice(frame.payload_json());
        return Ok(());
    }
    let start = out.len();
    ring.ok_or(OpenError::NoKey)?.open_into(frame.payload, frame.message_id.as_bytes(), out)?;
    if out.len() == start {
        out.extend_from_slice(b"null"); // an empty payload means JSON null, sealed or not
    }
    Ok(())
}

/// The broker's encryption state: the key ring (None without
/// `QUEEN_ENCRYPTION_KEY`) and which queues seal their payloads.
///
/// The set is this broker's view of `queues.encryption_enabled`: a
/// `/configure` here changes it at once, and it is reloaded every
/// `QUEEN_CACHE_REFRESH_INTERVAL_MS` for changes made through other brokers
/// (docs/DECISIONS.md "Encryption at rest"). Without a key the set stays
/// empty and a push pays one atomic load.
///
/// A broker without a key loads the set too: a push to a queue another
/// broker encrypts would otherwise be written in the clear, silently. It is
/// refused instead ([`NoKeyToSeal`]), and said once in the log.
#[derive(Default)]
pub struct Encryption {
    ring: Option<KeyRing>,
    queues: crate::cache::Reloaded<HashSet<String>>,
    /// Whether the missing key was logged already.
    warned: std::sync::atomic::AtomicBool,
}

/// A push to a queue that seals its payloads, on a broker without a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queue {queue:?} encrypts its payloads (encryptionEnabled) and this broker has no encryption key (QUEEN_ENCRYPTION_KEY): nothing was written; push through a broker that has the key")]
pub struct NoKeyToSeal {
    pub queue: String,
}

impl Encryption {
    pub fn new(keys: Option<&crate::config::EncryptionKeys>) -> Arc<Encryption> {
        Arc::new(Encryption { ring: keys.map(KeyRing::new), ..Default::default() })
    }

    /// The key ring, when the broker has a key.
    pub fn ring(&self) -> Option<&KeyRing> {
        self.ring.as_ref()
    }

    /// The ring to seal `queue`'s payloads with when that queue encrypts,
    /// None when it does not; an error when it does and there is no key.
    pub fn sealing(&self, queue: &str) -> Result<Option<&KeyRing>, NoKeyToSeal> {
        if self.queues.read(|set| set.contains(queue).then_some(())).is_none() {
            return Ok(None);
        }
        match &self.ring {
            Some(ring) => Ok(Some(ring)),
            None => {
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::error!(queue, "a queue encrypts its payloads and this broker has no QUEEN_ENCRYPTION_KEY: its pushes are refused (503)");
                }
                Err(NoKeyToSeal { queue: queue.to_string() })
            }
        }
    }

    /// A configure on this broker: effective for the next push.
    pub fn set(&self, queue: &str, on: bool) {
        self.queues.change(|set| {
            if on {
                set.insert(queue.to_string());
            } else {
                set.remove(queue);
            }
        });
    }

    /// The set's generation, for [`Encryption::reload`].
    pub fn generation(&self) -> u64 {
        self.queues.generation()
    }

    /// The queues that encrypt, as the database says now (read at
    /// `generation` `since`): a local `/configure` made meanwhile wins. A
    /// broker without a key loads them too, to refuse their pushes. The
    /// query lives with the option it reads (`admin::configure`), so this
    /// module stays pure.
    pub fn reload(&self, since: u64, queues: HashSet<String>) {
        self.queues.replace_unless_changed(since, queues);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EncryptionKeys;

    fn ring(current: u8, older: &[u8]) -> KeyRing {
        KeyRing::new(&EncryptionKeys { current: [current; 32], older: older.iter().map(|b| [*b; 32]).collect() })
    }

    #[test]
    fn an_envelope_opens_to_its_plaintext_and_hides_it() {
        let r = ring(1, &[]);
        let env = r.seal(br#"{"card":"4111-1111"}"#, b"id-1");
        assert_eq!(env.len(), OVERHEAD + 20);
        assert_eq!(env[0], VERSION);
        assert_eq!(&env[1..5], &r.current_id().0);
        assert!(!env.windows(4).any(|w| w == b"4111"), "no plaintext in the envelope");
        assert_eq!(r.open(&env, b"id-1").unwrap(), br#"{"card":"4111-1111"}"#);
    }

    #[test]
    fn the_same_payload_seals_differently_each_time() {
        let r = ring(1, &[]);
        assert_ne!(r.seal(b"same", b""), r.seal(b"same", b""), "a fresh nonce per message");
    }

    #[test]
    fn an_envelope_does_not_open_on_another_message() {
        let r = ring(1, &[]);
        let env = r.seal(b"x", b"id-1");
        assert_eq!(r.open(&env, b"id-2"), Err(OpenError::Corrupt(r.current_id())));
    }

    #[test]
    fn an_older_key_still_opens_what_it_sealed() {
        let old = ring(1, &[]);
        let env = old.seal(b"before the rotation", b"m");
        let rotated = ring(2, &[1]);
        assert_eq!(rotated.open(&env, b"m").unwrap(), b"before the rotation");
        assert_ne!(rotated.seal(b"after", b"m")[1..5], env[1..5], "new envelopes name the new key");
    }

    #[test]
    fn a_missing_key_is_named_and_a_flipped_bit_is_caught() {
        let env = ring(1, &[]).seal(b"secret", b"m");
        let other = ring(2, &[]);
        assert_eq!(other.open(&env, b"m"), Err(OpenError::UnknownKey(KeyId::of(&[1; 32]))));
        let r = ring(1, &[]);
        for i in 0..env.len() {
            let mut bad = env.clone();
            bad[i] ^= 0x40;
            assert!(r.open(&bad, b"m").is_err(), "bit flipped at byte {i} went unnoticed");
        }
        assert!(matches!(r.open(&env[..10], b"m"), Err(OpenError::Malformed(_))));
        assert_eq!(open(None, &env, b"m"), Err(OpenError::NoKey));
    }

    #[test]
    fn keys_and_their_schedules_are_wiped_on_drop() {
        // Compile-time: each holder of key material implements ZeroizeOnDrop.
        fn wiped<T: zeroize::ZeroizeOnDrop>() {}
        wiped::<EncryptionKeys>();
        wiped::<aes_gcm::aes::Aes256>();
        let mut keys = EncryptionKeys { current: [7; 32], older: vec![[8; 32]] };
        zeroize::Zeroize::zeroize(&mut keys);
        assert_eq!((keys.current, keys.older.len()), ([0; 32], 0));
    }

    #[test]
    fn the_key_id_is_the_published_check_value() {
        // FIPS-197 appendix C.3: AES-256 with key 00..1f encrypts the block
        // 00112233..ff to 8ea2b7ca...; the check value is of a zero block,
        // so compare against a direct computation on a known key instead.
        let key: [u8; 32] = core::array::from_fn(|i| i as u8);
        let aes = aes_gcm::aes::Aes256::new((&key).into());
        let mut block: aes_gcm::aes::Block = core::array::from_fn::<u8, 16, _>(|i| (i as u8) * 0x11).into();
        aes.encrypt_block(&mut block);
        assert_eq!(&block[..4], &[0x8e, 0xa2, 0xb7, 0xca]);
        assert_ne!(KeyId::of(&key), KeyId::of(&[0; 32]));
    }

    #[test]
    fn only_configured_queues_seal_and_a_keyless_broker_refuses_them() {
        let keys = EncryptionKeys { current: [9; 32], older: vec![] };
        let e = Encryption::new(Some(&keys));
        assert!(e.sealing("q").unwrap().is_none());
        e.set("q", true);
        assert!(e.sealing("q").unwrap().is_some());
        assert!(e.sealing("other").unwrap().is_none());
        e.set("q", false);
        assert!(e.sealing("q").unwrap().is_none());
        // Without a key, an encrypting queue is refused, never written in the clear.
        let keyless = Encryption::new(None);
        keyless.set("q", true);
        assert_eq!(keyless.sealing("q").err(), Some(NoKeyToSeal { queue: "q".into() }));
        assert!(keyless.sealing("other").unwrap().is_none());
    }
}
