//! Who is on a Kafka connection: SASL PLAIN where the password is a Queen
//! JWT (the username is only a label), checked by the same function as
//! HTTP's bearer tokens (`http::auth::principal`), so roles mean the same on
//! both ports.
//!
//! With `JWT_ENABLED` off there is no SASL and every connection may do
//! everything, as every HTTP request may. With it on, a connection may send
//! only ApiVersions, SaslHandshake and SaslAuthenticate (in frames of at
//! most [`PRE_AUTH_FRAME`]) until it has authenticated.

use crate::http::auth::{Level, Principal};
use crate::tenancy::Tenant;

/// The largest frame before authentication.
pub const PRE_AUTH_FRAME: usize = 64 << 10;


/// One connection's authentication state.
#[derive(Debug, Default)]
pub struct Session {
    /// SASL is required (JWT is on).
    pub required: bool,
    /// A PLAIN handshake was accepted.
    pub handshaken: bool,
    /// A v0 handshake: the next frame is a bare SASL token.
    pub bare_token_next: bool,
    /// Who authenticated; `None` until then (and always without SASL).
    pub principal: Option<Principal>,
    /// Whose topics, groups and transactional ids the connection acts on:
    /// the tenant its token names (`QUEEN_TENANT_CLAIM`), else the default.
    pub tenant: Tenant,
}

impl Session {
    pub fn new(required: bool) -> Session {
        Session { required, ..Session::default() }
    }

    /// Whether requests other than the SASL exchange may come.
    pub fn open(&self) -> bool {
        !self.required || self.principal.is_some()
    }

    /// Whether the connection's caller reaches `need` (always without SASL).
    pub fn may(&self, need: Level) -> bool {
        need == Level::Public || !self.required || self.principal.as_ref().is_some_and(|p| p.may(need))
    }

    /// The subject stamped on what this connection produces.
    pub fn subject(&self) -> Option<&str> {
        self.principal.as_ref().and_then(|p| p.sub.as_deref())
    }
}

/// The password of a PLAIN token (`authzid NUL authcid NUL password`), or
/// why it is refused. An authorization id, when given, must be the user
/// itself: no one acts as someone else here.
pub fn plain_password(token: &[u8]) -> Result<&str, &'static str> {
    let text = std::str::from_utf8(token).map_err(|_| "the PLAIN token is not UTF-8")?;
    let mut parts = text.split('\0');
    let (Some(authzid), Some(user), Some(password), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err("the PLAIN token is not authzid NUL user NUL password");
    };
    if !authzid.is_empty() && authzid != user {
        return Err("the authorization id must be empty or the user's own");
    }
    if password.is_empty() {
        return Err("the password (a Queen JWT) is empty");
    }
    Ok(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_token_gives_its_password_and_refuses_acting_as_another() {
        assert_eq!(plain_password(b"\0alice\0jwt"), Ok("jwt"));
        assert_eq!(plain_password(b"alice\0alice\0jwt"), Ok("jwt"));
        assert!(plain_password(b"bob\0alice\0jwt").is_err());
        assert!(plain_password(b"\0alice\0").is_err());
        assert!(plain_password(b"alice\0jwt").is_err());
        assert!(plain_password(b"\0a\0b\0c").is_err());
        assert!(plain_password(b"\0a\0\xff").is_err());
    }

    #[test]
    fn without_sasl_everything_is_open_and_with_it_nothing_until_authenticated() {
        let open = Session::new(false);
        assert!(open.open() && open.may(Level::Admin));
        let closed = Session::new(true);
        assert!(!closed.open() && !closed.may(Level::ReadOnly));
        assert!(closed.may(Level::Public), "ApiVersions and the SASL exchange come before authentication");
    }
}
