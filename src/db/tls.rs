//! TLS to PostgreSQL, chosen as libpq chooses it: `sslmode`, `sslrootcert`,
//! `sslcert` and `sslkey` in `QUEEN_DATABASE_URL` (URL query or `key=value`
//! form).
//!
//! Why here and not in tokio-postgres: its parser knows only `disable`,
//! `prefer` and `require` and no certificate paths, while operators copy
//! libpq strings with `verify-full` and a CA file. So these four keys are
//! taken out of the string before tokio-postgres parses the rest, and turned
//! into a rustls client configuration (`tokio-postgres-rustls`) that does
//! what libpq's mode promises:
//!
//! | sslmode | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `allow`, `prefer` (default) | when the server offers it | no |
//! | `require` | always | no; as `verify-ca` when `sslrootcert` is given (libpq does the same) |
//! | `verify-ca` | always | chain to `sslrootcert` |
//! | `verify-full` | always | chain, and the host name (or IP) the broker dialled |
//!
//! `sslrootcert` is a PEM file, or `system` for the machine's trust store;
//! without it the verifying modes read `~/.postgresql/root.crt`, as libpq
//! does, and refuse to start if it is missing. `sslcert` with `sslkey` (PEM)
//! is the client certificate, for servers that authenticate by certificate.
//! Unix-socket connections are never encrypted (PostgreSQL does not offer
//! TLS on them), whatever the mode.
//!
//! Every fault is found at boot: an unknown mode, an unreadable or empty
//! file, a key that does not match. A certificate the server presents and
//! the broker refuses fails each connection, with rustls' reason in the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error as TlsError, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode as PgSslMode;

use super::DbError;

/// What the broker connects with: tokio-postgres-rustls' connector, cheap to
/// clone (the configuration is shared).
pub type Connector = tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, DbError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            // libpq's `allow` tries plain first; encrypting when offered is
            // the stricter reading of it.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(DbError::Config(format!(
                    "sslmode={other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }
}

/// The TLS keys of a connection string, taken out of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsParams {
    pub mode: Option<String>,
    pub root_cert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl TlsParams {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "sslmode" => self.mode = Some(value),
            "sslrootcert" => self.root_cert = Some(value),
            "sslcert" => self.cert = Some(value),
            _ => self.key = Some(value),
        }
    }
}

/// Splits a connection string into what tokio-postgres parses and the TLS
/// keys it does not: a URL (`postgres://…?sslmode=verify-full&…`) loses
/// those query parameters, a `key=value` string those pairs.
pub fn split(conn: &str) -> Result<(String, TlsParams), DbError> {
    let mut tls = TlsParams::default();
    if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        let Some((base, query)) = conn.split_once('?') else { return Ok((conn.to_string(), tls)) };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if TLS_KEYS.contains(&k) {
                let v = percent_decode(v).ok_or_else(|| DbError::Config(format!("{k} in QUEEN_DATABASE_URL is not valid percent-encoding")))?;
                tls.set(k, v);
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
        return Ok((rest, tls));
    }
    // key = value pairs; a value may be 'single quoted' with \ escapes.
    let bytes = conn.as_bytes();
    let mut rest = String::new();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &conn[start..i];
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] != b'=' {
            // Not a pair: tokio-postgres reports it.
            rest.push_str(&conn[start..]);
            break;
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if i < bytes.len() && bytes[i] == b'\'' {
            i += 1;
            let mut closed = false;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' if i + 1 < bytes.len() => {
                        value.push(conn[i + 1..].chars().next().unwrap_or_default());
                        i += 1 + conn[i + 1..].chars().next().map_or(1, char::len_utf8);
                    }
                    b'\'' => {
                        closed = true;
                        i += 1;
                        break;
                    }
                    _ => {
                        let c = conn[i..].chars().next().unwrap_or_default();
                        value.push(c);
                        i += c.len_utf8();
                    }
                }
            }
            if !closed {
                return Err(DbError::Config(format!("{key} in QUEEN_DATABASE_URL has an unterminated quote")));
            }
        } else {
            let vstart = i;
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            value.push_str(&conn[vstart..i]);
        }
        if TLS_KEYS.contains(&key) {
            tls.set(key, value);
        } else {
            if !rest.is_empty() {
                rest.push(' ');
            }
            rest.push_str(&conn[start..i]);
        }
    }
    Ok((rest, tls))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The connector and tokio-postgres' own mode for `params`.
pub fn connector(params: &TlsParams) -> Result<(Connector, PgSslMode), DbError> {
    let mode = params.mode.as_deref().map(SslMode::parse).transpose()?.unwrap_or(SslMode::Prefer);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Config(format!("TLS: {e}")))?;
    // `require` with a CA file checks the chain, as libpq does.
    let mode = if mode == SslMode::Require && params.root_cert.is_some() { SslMode::VerifyCa } else { mode };
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(Unverified(provider.clone())),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(roots(params.root_cert.as_deref())?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| DbError::Config(format!("sslrootcert: {e}")))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    let config = match (&params.cert, &params.key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| DbError::Config(format!("sslcert {cert}: {e}")))?;
            if chain.is_empty() {
                return Err(DbError::Config(format!("sslcert {cert} holds no certificate")));
            }
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| DbError::Config(format!("sslkey {key}: {e}")))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| DbError::Config(format!("sslcert/sslkey: {e}")))?
        }
        _ => return Err(DbError::Config("sslcert and sslkey go together".into())),
    };
    let pg_mode = match mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        _ => PgSslMode::Require,
    };
    Ok((Connector::new(config), pg_mode))
}

/// A connector that is never used: `sslmode=disable` (the embedded cluster,
/// on a unix socket).
pub fn disabled() -> Connector {
    let params = TlsParams { mode: Some("disable".into()), ..TlsParams::default() };
    connector(&params).expect("a disabled connector needs no files").0
}

/// The trust anchors of the verifying modes.
fn roots(root_cert: Option<&str>) -> Result<RootCertStore, DbError> {
    let mut store = RootCertStore::empty();
    if root_cert == Some("system") {
        let found = rustls_native_certs::load_native_certs();
        let (added, _ignored) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(DbError::Config("sslrootcert=system: the system trust store holds no certificate".into()));
        }
        return Ok(store);
    }
    let path: PathBuf = match root_cert {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("HOME").map(|h| Path::new(&h).join(".postgresql/root.crt")).ok_or_else(|| {
            DbError::Config("sslmode verify-ca/verify-full needs sslrootcert (no HOME to find ~/.postgresql/root.crt)".into())
        })?,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&path)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| DbError::Config(format!("sslrootcert {}: {e}", path.display())))?;
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(DbError::Config(format!("sslrootcert {} holds no usable certificate", path.display())));
    }
    Ok(store)
}

/// `prefer`/`require` without a CA: encrypted, the certificate not checked
/// (libpq's meaning of those modes), the handshake's signatures still are.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name in the
/// certificate need not be the host dialled.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(TlsError::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_loses_exactly_its_tls_parameters() {
        let (rest, tls) =
            split("postgres://u:p@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem").unwrap();
        assert_eq!(rest, "postgres://u:p@h:5432/db?application_name=x");
        assert_eq!((tls.mode.as_deref(), tls.root_cert.as_deref()), (Some("verify-full"), Some("/etc/ca.pem")));
        let (rest, tls) = split("postgresql://h/db?sslmode=require").unwrap();
        assert_eq!((rest.as_str(), tls.mode.as_deref()), ("postgresql://h/db", Some("require")));
        assert_eq!(split("postgres://h/db").unwrap(), ("postgres://h/db".to_string(), TlsParams::default()));
    }

    #[test]
    fn a_key_value_string_loses_exactly_its_tls_pairs() {
        let (rest, tls) = split("host=h sslmode = verify-ca  dbname=q sslrootcert='/a dir/it\\'s.pem' user=u").unwrap();
        assert_eq!(rest, "host=h dbname=q user=u");
        assert_eq!((tls.mode.as_deref(), tls.root_cert.as_deref()), (Some("verify-ca"), Some("/a dir/it's.pem")));
        assert!(split("host=h sslrootcert='/open").is_err(), "an unterminated quote is refused");
    }

    fn refusal(params: &TlsParams) -> String {
        match connector(params) {
            Ok(_) => panic!("{params:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn modes_are_libpqs_and_files_are_checked_at_boot() {
        let with = |mode: &str| TlsParams { mode: Some(mode.into()), ..TlsParams::default() };
        assert_eq!(connector(&TlsParams::default()).unwrap().1, PgSslMode::Prefer, "prefer by default, as libpq");
        assert_eq!(connector(&with("disable")).unwrap().1, PgSslMode::Disable);
        assert_eq!(connector(&with("require")).unwrap().1, PgSslMode::Require);
        let err = refusal(&with("verify_full"));
        assert!(err.contains("sslmode=\"verify_full\""), "{err}");
        let missing = TlsParams { mode: Some("verify-full".into()), root_cert: Some("/nonexistent/ca.pem".into()), ..TlsParams::default() };
        let err = refusal(&missing);
        assert!(err.contains("sslrootcert /nonexistent/ca.pem"), "{err}");
        let half = TlsParams { cert: Some("/x.pem".into()), ..TlsParams::default() };
        assert!(refusal(&half).contains("go together"));
    }
}
