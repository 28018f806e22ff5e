//! `GET /api/v1/openapi.json` (issue 31 §3): an OpenAPI 3.1 document of
//! every route, built with utoipa's builders from three things the code
//! already holds, so that it cannot drift from the broker:
//! - the route table (`http::router`; a test fails when a route of the
//!   router is missing here),
//! - each route's access level (`auth::level`, the rule the broker applies),
//! - one real request and answer per route, recorded from the broker itself
//!   by `scripts/openapi-examples.py` into `openapi/examples.json`; the
//!   request and response schemas are derived from those examples,
//!
//! and the prose of docs/API.md (each route's row is its description), the
//! human guide to the same routes.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::Value;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ComponentsBuilder, InfoBuilder, OpenApiBuilder, PathsBuilder, RefOr, ResponseBuilder};

use super::auth::{level, Level};

/// One recorded route: what was sent and what the broker answered.
#[derive(serde::Deserialize)]
pub struct Example {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub request: Option<Value>,
    pub status: u16,
    pub response: Value,
}

const EXAMPLES: &str = include_str!("openapi/examples.json");
const GUIDE: &str = include_str!("../../docs/API.md");

/// The recorded examples.
pub fn examples() -> Vec<Example> {
    serde_json::from_str(EXAMPLES).expect("openapi/examples.json is valid")
}

/// The route table's prose: (method, path) → the "What it does" cell.
fn descriptions() -> HashMap<(String, String), String> {
    GUIDE
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(" | ").map(str::trim).collect();
            let method = cells.first()?.trim_start_matches('|').trim();
            let path = cells.get(1)?.trim_matches('`');
            (["GET", "POST", "DELETE", "PUT"].contains(&method) && path.starts_with('/'))
                .then(|| ((method.to_string(), path.to_string()), cells.get(3).map_or("", |d| d.trim_end_matches('|').trim()).to_string()))
        })
        .collect()
}

/// A schema that `v` satisfies, as precise as one example can tell.
fn schema_of(v: &Value) -> Schema {
    let typed = |t: Type| Schema::Object(ObjectBuilder::new().schema_type(t).build());
    match v {
        Value::Null => typed(Type::Null),
        Value::Bool(_) => typed(Type::Boolean),
        Value::Number(n) if n.is_i64() || n.is_u64() => typed(Type::Integer),
        Value::Number(_) => typed(Type::Number),
        Value::String(_) => typed(Type::String),
        Value::Array(items) => {
            let mut a = ArrayBuilder::new();
            if let Some(first) = items.first() {
                a = a.items(RefOr::T(schema_of(first)));
            }
            Schema::Array(a.build())
        }
        Value::Object(fields) => {
            let mut o = ObjectBuilder::new().schema_type(Type::Object);
            for (k, f) in fields {
                o = o.property(k.clone(), RefOr::T(schema_of(f)));
            }
            Schema::Object(o.build())
        }
    }
}

fn method_of(m: &str) -> HttpMethod {
    match m {
        "POST" => HttpMethod::Post,
        "PUT" => HttpMethod::Put,
        "DELETE" => HttpMethod::Delete,
        _ => HttpMethod::Get,
    }
}

fn access(l: Level) -> &'static str {
    match l {
        Level::Public => "public",
        Level::ReadOnly => "read-only",
        Level::WriteOnly => "write-only",
        Level::ReadWrite => "read-write",
        Level::Admin => "admin",
    }
}

/// The family a path belongs to (the document's tags).
fn tag_of(path: &str) -> String {
    let rest = path.strip_prefix("/api/v1/").or_else(|| path.strip_prefix("/streams/v1/").map(|_| "streams")).unwrap_or("broker");
    let first = rest.split('/').next().unwrap_or("broker");
    match first {
        "pop" | "push" | "ack" | "lease" | "transaction" => "messaging",
        "resources" | "configure" | "consumer-groups" | "stats" => "admin",
        "" => "broker",
        other => other,
    }
    .to_string()
}

/// The path in OpenAPI's template syntax (`{*key}` is `{key}`).
fn openapi_path(path: &str) -> String {
    path.replace("{*", "{")
}

/// The document, built once.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let prose = descriptions();
        let mut paths = PathsBuilder::new();
        let mut items: Vec<(String, HttpMethod, utoipa::openapi::path::Operation)> = Vec::new();
        for e in examples() {
            let method = axum::http::Method::from_bytes(e.method.as_bytes()).expect("a method");
            let need = level(&method, &e.path);
            let description = prose.get(&(e.method.clone(), e.path.clone())).cloned().unwrap_or_default();
            let summary: String = description.split([';', '(']).next().unwrap_or("").replace('`', "").chars().take(100).collect();
            let mut op = OperationBuilder::new()
                .operation_id(Some(format!("{} {}", e.method, e.path)))
                .summary(Some(summary.trim().to_string()))
                .description(Some(format!("{description}\n\nAccess: {} (with JWT_ENABLED).", access(need))))
                .tag(tag_of(&e.path));
            for segment in e.path.split('/') {
                if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    let name = name.trim_start_matches('*');
                    op = op.parameter(
                        ParameterBuilder::new().name(name).parameter_in(ParameterIn::Path).required(utoipa::openapi::Required::True)
                            .schema(Some(RefOr::T(schema_of(&Value::String(String::new()))))),
                    );
                }
            }
            for (k, v) in e.query.as_deref().map(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).unwrap_or_default()).unwrap_or_default() {
                op = op.parameter(
                    ParameterBuilder::new().name(k).parameter_in(ParameterIn::Query).required(utoipa::openapi::Required::False)
                        .schema(Some(RefOr::T(schema_of(&Value::String(String::new()))))).example(Some(Value::String(v))),
                );
            }
            if let Some(body) = &e.request {
                op = op.request_body(Some(
                    RequestBodyBuilder::new()
                        .content("application/json", ContentBuilder::new().schema(Some(RefOr::T(schema_of(body)))).example(Some(body.clone())).build())
                        .build(),
                ));
            }
            let (kind, example) = match (&e.response, e.path.as_str()) {
                (Value::String(s), "/") => ("text/html", Value::String(s.clone())),
                (Value::String(s), "/metrics/prometheus") => ("text/plain", Value::String(s.clone())),
                (Value::String(s), p) if p.starts_with("/dashboard/") => ("text/javascript", Value::String(s.clone())),
                (v, _) => ("application/json", v.clone()),
            };
            let content = ContentBuilder::new().schema(Some(RefOr::T(schema_of(&example)))).example(Some(example)).build();
            op = op.response(e.status.to_string(), ResponseBuilder::new().description(format!("answered {}", e.status)).content(kind, content).build());
            if need != Level::Public {
                op = op.security(SecurityRequirement::new("bearer", Vec::<String>::new()));
            }
            items.push((openapi_path(&e.path), method_of(&e.method), op.build()));
        }
        let mut by_path: std::collections::BTreeMap<String, PathItem> = std::collections::BTreeMap::new();
        for (path, method, op) in items {
            let item = by_path.remove(&path).map_or_else(|| PathItem::new(method.clone(), op.clone()), |existing| {
                let mut merged = existing;
                merged.merge_operations(PathItem::new(method.clone(), op.clone()));
                merged
            });
            by_path.insert(path, item);
        }
        for (path, item) in by_path {
            paths = paths.path(path, item);
        }
        let components = ComponentsBuilder::new()
            .security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build()))
            .build();
        let doc = OpenApiBuilder::new()
            .info(
                InfoBuilder::new()
                    .title("Queen")
                    .version(env!("CARGO_PKG_VERSION"))
                    .description(Some(
                        "A partitioned message-queue broker on PostgreSQL. Every example here was recorded from the broker itself; \
                         docs/API.md is the guide to the same routes (semantics, error codes, binary formats).",
                    ))
                    .build(),
            )
            .paths(paths.build())
            .components(Some(components))
            .build();
        serde_json::to_value(doc).expect("the document serializes")
    })
}

/// `GET /api/v1/openapi.json`.
pub async fn openapi() -> axum::Json<&'static Value> {
    axum::Json(document())
}
