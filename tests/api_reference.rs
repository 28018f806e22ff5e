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
