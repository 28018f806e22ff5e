//! The dashboard's identity routes, as upstream's broker has them:
//! `GET /auth/me`, `GET /auth/login`, `POST /auth/logout` (issue 49).
//!
//! The broker keeps no passwords, sessions or cookies: a caller is who its
//! bearer token says, and signing in is the business of the authenticating
//! proxy in front (docs/OPERATIONS.md). So the routes are public and small:
//! `me` verifies the token itself (a public route gets no principal from
//! the front door) and answers the subject, roles and tenant, or `401
//! auth_required`; without JWT it answers upstream's fixed standalone
//! identity, so the dashboards written for upstream show a signed-in admin.
//! `login` sends the browser to the dashboard, or explains that sign-in is
//! the proxy's; `logout` has nothing to forget and says so with `ok`. The
//! tenant `me` names is the one `tenancy::resolve` chooses for the caller.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Json;
use serde_json::{json, Value};

use super::auth::{self, Level};
use super::AppState;
use crate::tenancy::{self, Tenant};

/// The name of the highest level a caller's roles reach.
fn role_name(p: &auth::Principal) -> &'static str {
    [(Level::Admin, "admin"), (Level::ReadWrite, "read-write"), (Level::ReadOnly, "read-only"), (Level::WriteOnly, "write-only")]
        .into_iter()
        .find(|(l, _)| p.may(*l))
        .map_or("none", |(_, n)| n)
}

/// The answer's fields, upstream's names first (`user_id`, `role`,
/// `clusters`, `standalone`, …), then ours (`subject`, `roles`, `tenant`,
/// whether tenancy is on and whether the caller acts across tenants: the
/// dashboard offers its tenant selector then).
fn identity(state: &AppState, tenant: Tenant, principal: Option<&auth::Principal>, email: Option<&str>, role: &str, roles: Vec<String>) -> Value {
    let subject = principal.and_then(|p| p.sub.as_deref());
    let standalone = !state.config.auth.enabled;
    json!({
        "user_id": subject.unwrap_or("standalone"),
        "email": email,
        "tenant_slug": "local",
        "is_operator": role == "admin",
        "operator_enabled": role == "admin",
        "operator_live": role == "admin",
        "acting_cluster": {"id": "local", "slug": "local"},
        "clusters": [{"id": "local", "slug": "local", "role": role, "tenant_slug": "local", "tenant_id": tenant.to_string(),
                      "status": "active", "cell_slug": state.config.server_id}],
        "act_cluster_header": "x-queen-act-cluster",
        "role": role,
        "cluster": null,
        "standalone": standalone,
        "subject": subject,
        "roles": roles,
        "tenant": tenant.to_string(),
        "tenancy": tenancy::enabled(&state.config),
        "adminAllTenants": tenancy::enabled(&state.config) && tenancy::admin_all(&state.config, principal),
    })
}

fn auth_required(detail: Option<String>) -> Response {
    let mut body = json!({"error": "auth_required", "code": "auth_required"});
    if let Some(d) = detail {
        body["detail"] = json!(d);
    }
    (StatusCode::UNAUTHORIZED, Json(body)).into_response()
}

/// `GET /auth/me`: who the caller is.
pub async fn me(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let cfg = &state.config.auth;
    if !cfg.enabled {
        return match tenancy::resolve(&state.config, true, &headers, None) {
            Ok(tenant) => Json(identity(&state, tenant, None, None, "admin", vec!["admin".into()])).into_response(),
            Err(refused) => refused,
        };
    }
    let raw = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    let token = raw.strip_prefix("Bearer ").or_else(|| raw.strip_prefix("bearer ")).unwrap_or(raw).trim();
    if token.is_empty() {
        return auth_required(None);
    }
    match auth::identity(token, cfg) {
        Ok((principal, roles, email)) => match tenancy::resolve(&state.config, true, &headers, Some(&principal)) {
            Ok(tenant) => Json(identity(&state, tenant, Some(&principal), email.as_deref(), role_name(&principal), roles)).into_response(),
            Err(refused) => refused,
        },
        Err(reason) => auth_required(Some(reason)),
    }
}

/// `GET /auth/login`: to the dashboard when there is nothing to sign in
/// to; with JWT on, a page saying where sign-in happens.
pub async fn login(State(state): State<AppState>) -> Response {
    if !state.config.auth.enabled {
        return Redirect::to("/").into_response();
    }
    Html(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Queen: sign in</title></head><body>\
         <h1>Sign in through your proxy</h1><p>This broker checks bearer tokens (JWT) and keeps no passwords or \
         sessions. Sign in through the authenticating proxy in front of it, which adds \
         <code>Authorization: Bearer &lt;token&gt;</code> to every request, then open the <a href=\"/\">dashboard</a>.</p>\
         </body></html>",
    )
    .into_response()
}

/// `POST /auth/logout`: no session to end.
pub async fn logout() -> Json<Value> {
    Json(json!({"ok": true}))
}
