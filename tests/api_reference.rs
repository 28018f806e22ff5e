//! docs/API.md lists every route the router serves, and nothing else: the
//! table is read against `http::router`'s source, method by method, so a
//! route added or removed without the page fails here (issue 26).

use std::collections::BTreeSet;

/// (method, path) of every `.route(...)` in src/http/mod.rs.
fn routes_in_the_router() -> BTreeSet<(String, String)> {
    let source = include_str!("../src/http/mod.rs");
    let mut routes = BTreeSet::new();
    for call in source.split(".route(\"").skip(1) {
        let path = &call[..call.find('"').unwrap()];
        // The handlers of this route: up to the end of the `.route(` line.
        let line = &call[..call.find('\n').unwrap()];
        for (needle, method) in [("get(", "GET"), ("post(", "POST"), ("delete(", "DELETE"), ("put(", "PUT"), ("patch(", "PATCH")] {
            if line.contains(needle) {
                routes.insert((method.to_string(), path.to_string()));
            }
        }
    }
    routes
}

/// (method, path) of every row of docs/API.md's route table.
fn routes_on_the_page() -> BTreeSet<(String, String)> {
    let page = include_str!("../docs/API.md");
    page.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let method = *cells.get(1)?;
            let path = cells.get(2)?.trim_matches('`');
            (["GET", "POST", "DELETE", "PUT", "PATCH"].contains(&method) && path.starts_with('/'))
                .then(|| (method.to_string(), path.to_string()))
        })
        .collect()
}

#[test]
fn the_api_page_lists_exactly_the_routes_the_router_serves() {
    let served = routes_in_the_router();
    let listed = routes_on_the_page();
    assert!(served.len() > 30, "the scan found the router's routes: {served:?}");
    let unlisted: Vec<_> = served.difference(&listed).collect();
    let unserved: Vec<_> = listed.difference(&served).collect();
    assert!(unlisted.is_empty() && unserved.is_empty(), "served but not in docs/API.md: {unlisted:?}; listed but not served: {unserved:?}");
}

/// The OpenAPI document covers every route the router serves, each with a
/// recorded example answer, and a request body where the route takes one.
#[test]
fn the_openapi_document_has_every_route_with_its_examples() {
    let doc = queen::http::openapi::document();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut missing = Vec::new();
    for (method, path) in routes_in_the_router() {
        let op = &doc["paths"][path.replace("{*", "{")][method.to_lowercase()];
        if op.is_null() {
            missing.push(format!("{method} {path}"));
            continue;
        }
        let responses = op["responses"].as_object().expect("responses");
        let answer = responses.values().next().expect("one response");
        let content = answer["content"].as_object().expect("content").values().next().expect("a media type");
        assert!(!content["example"].is_null(), "{method} {path}: no example answer");
        assert!(!content["schema"].is_null(), "{method} {path}: no answer schema");
        if method == "PUT" {
            assert!(!op["requestBody"].is_null(), "{method} {path}: no request body");
        }
        assert!(op["description"].as_str().is_some_and(|d| d.contains("Access:")), "{method} {path}: no access level");
    }
    assert!(missing.is_empty(), "routes of the router missing from the OpenAPI document: {missing:?}");
    // The push's request body is described field by field.
    let push = &doc["paths"]["/api/v1/push"]["post"]["requestBody"]["content"]["application/json"];
    assert_eq!(push["schema"]["properties"]["items"]["type"], "array");
    assert_eq!(push["example"]["items"][0]["queue"], "orders");
}

/// Every route of the router has the access level docs/API.md gives it:
/// the broker's rule (`auth::level`) is read for a concrete path of each
/// route and compared with the page's Access column (its first word; the
/// rest names a body-dependent level, tested in tests/auth.rs). A route
/// added without a row, or a rule changed without the page, fails here
/// (issue 45).
#[test]
fn every_route_has_the_access_level_the_api_page_gives_it() {
    use queen::http::auth::{level, Level};
    let page = include_str!("../docs/API.md");
    let mut access = std::collections::BTreeMap::new();
    for l in page.lines() {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        if let (Some(m), Some(p), Some(a)) = (cells.get(1), cells.get(2), cells.get(3)) {
            if ["GET", "POST", "DELETE", "PUT", "PATCH"].contains(m) && p.starts_with('`') {
                access.insert((m.to_string(), p.trim_matches('`').to_string()), a.split([' ', ';']).next().unwrap().to_string());
            }
        }
    }
    let word = |l: Level| match l {
        Level::Public => "public",
        Level::ReadOnly => "read-only",
        Level::WriteOnly => "write-only",
        Level::ReadWrite => "read-write",
        Level::Admin => "admin",
    };
    let mut wrong = Vec::new();
    let routes = routes_in_the_router();
    for (method, path) in &routes {
        // A concrete request path: every {param} (and {*rest}) filled in.
        let concrete: String = path
            .split('/')
            .map(|seg| if seg.starts_with('{') { if seg.starts_with("{*") { "a/b" } else { "x1" } } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        let m = axum::http::Method::from_bytes(method.as_bytes()).unwrap();
        let rule = word(level(&m, &concrete));
        match access.get(&(method.clone(), path.clone())) {
            Some(a) if a == rule => {}
            other => wrong.push(format!("{method} {path}: the broker says {rule}, the page {other:?}")),
        }
    }
    assert!(routes.len() > 80, "the scan found the router's routes");
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// With tenancy on, every route the router serves either acts on the whole
/// broker or keeps its data per tenant (issue 49): none is left refused as
/// `tenant_unsupported`, which is only the safety net for a route added
/// without thinking of tenants.
#[test]
fn every_route_is_served_with_tenancy_on() {
    let unserved: Vec<(String, String)> = routes_in_the_router()
        .into_iter()
        .filter(|(method, path)| {
            let concrete: String = path
                .split('/')
                .map(|seg| if seg.starts_with("{*") { "a/b" } else if seg.starts_with('{') { "x" } else { seg })
                .collect::<Vec<_>>()
                .join("/");
            let method: axum::http::Method = method.parse().unwrap();
            !(queen::tenancy::broker_wide(&concrete) || queen::tenancy::isolated(&method, &concrete))
        })
        .collect();
    assert!(unserved.is_empty(), "routes refused with tenancy on: {unserved:?}");
}
